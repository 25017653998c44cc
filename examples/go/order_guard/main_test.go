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

func exampleURL(t *testing.T) string {
	if u := os.Getenv("DISTLOCK_TEST_REDIS_URL"); u != "" {
		return u + fmt.Sprintf("?prefix=order%d", os.Getpid())
	}
	listed := os.Getenv("DISTLOCK_TEST_BACKENDS")
	if strings.Contains(listed, "redis") || (listed == "" && os.Getenv("CI") == "true") {
		t.Fatal("DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)")
	}
	return "file://" + t.TempDir()
}

// Eight requests for one order from four clients at once, then two more after: the order is
// paid exactly once; the others are turned away as busy or already paid.
func TestConcurrentRequestsPayAnOrderOnce(t *testing.T) {
	url := exampleURL(t)
	store := NewStore()
	var clients []*distlock.Client
	for i := 0; i < 4; i++ {
		c, err := distlock.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	outcomes := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			o, err := Handle(context.Background(), clients[i%4], store, "42", 300*time.Millisecond)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
		}(i)
	}
	close(start)
	wg.Wait()
	for i := 0; i < 2; i++ {
		o, err := Handle(context.Background(), clients[i], store, "42", 0)
		if err != nil {
			t.Fatal(err)
		}
		outcomes[o]++
	}
	if outcomes[Processed] != 1 || outcomes[Busy]+outcomes[Done] != 9 || outcomes[Done] < 2 {
		t.Fatalf("outcomes %v: want the order paid exactly once", outcomes)
	}
	if store.State("42") != "paid" {
		t.Fatalf("order state %q", store.State("42"))
	}
	// The fenced write: an older token is refused.
	if err := store.Write("42", "refunded", 0); err != ErrStaleToken {
		t.Fatalf("stale write: %v", err)
	}
}
