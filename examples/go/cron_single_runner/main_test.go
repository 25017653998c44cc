package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"distlock.dev/distlock"
)

// exampleURL is the test redis (with_servers, through ctest), else a file:// directory when the
// build has no redis.
func exampleURL(t *testing.T) string {
	if u := os.Getenv("DISTLOCK_TEST_REDIS_URL"); u != "" {
		return u + fmt.Sprintf("?prefix=cron%d", os.Getpid())
	}
	listed := os.Getenv("DISTLOCK_TEST_BACKENDS")
	if strings.Contains(listed, "redis") || (listed == "" && os.Getenv("CI") == "true") {
		t.Fatal("DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)")
	}
	return "file://" + t.TempDir()
}

// Three runners over three slots of 500 ms: every slot that was run was run exactly once.
func TestThreeRunnersRunEachSlotOnce(t *testing.T) {
	url := exampleURL(t)
	var mu sync.Mutex
	var out strings.Builder
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		client, err := distlock.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var buf strings.Builder
			errs <- runSlots(ctx, client, "report", fmt.Sprint("runner", i), 500*time.Millisecond, 3, &buf,
				func(context.Context, uint64) error { return nil })
			mu.Lock()
			out.WriteString(buf.String())
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	runs := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(line) // ran report slot <ms> by <runner> token <t>
		if len(f) != 8 {
			t.Fatalf("bad line %q in:\n%s", line, out.String())
		}
		runs[f[3]]++
	}
	if len(runs) < 3 {
		t.Fatalf("%d slots run, want at least 3:\n%s", len(runs), out.String())
	}
	for slot, n := range runs {
		if n != 1 {
			t.Fatalf("slot %s ran %d times:\n%s", slot, n, out.String())
		}
	}
}
