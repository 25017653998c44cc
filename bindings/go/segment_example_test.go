//go:build distlock_segment

package distlock_test

// Run with -tags distlock_segment and DISTLOCK_TEST_POSTGRES_URL or DISTLOCK_TEST_MYSQL_URL set
// (run_tests.sh does when the build has a segment database): an Example cannot skip.

import (
	"fmt"
	"os"
	"time"

	"distlock.dev/distlock"
)

func ExampleNewSegment() {
	url := os.Getenv("DISTLOCK_TEST_POSTGRES_URL") // e.g. "postgres://app:pw@db:5432/shop"
	if url == "" {
		url = os.Getenv("DISTLOCK_TEST_MYSQL_URL") // or "mysql://app:pw@db:3306/shop"
	}
	tag := fmt.Sprintf("orders-%d", time.Now().UnixNano()) // a new row: its ids start at 1
	orders, err := distlock.NewSegment(url, tag, 1000)     // one round trip per 1000 ids
	if err != nil {
		fmt.Println(err)
		return
	}
	defer orders.Close()
	for i := 0; i < 3; i++ {
		id, err := orders.Next()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(id)
	}
	// Output:
	// 1
	// 2
	// 3
}
