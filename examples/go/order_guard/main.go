// order_guard: the order re-entry guard of the posts. A client retries, a user double-clicks,
// two workers pick up the same message: several requests for one order arrive at once. Each
// takes the order's lock with one attempt; the one that gets it processes the order and
// writes its result with the lock's fencing token, the others are turned away (ErrBusy: "being
// processed"). The store refuses a write whose token is older than one it has seen, so a
// holder that lost its lock (paused past its TTL) cannot overwrite a newer holder's result,
// and an order already paid is not paid again by a request that comes after.
//
// Usage: order_guard -url redis://127.0.0.1:6379 -order 42 -requests 8
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"distlock.dev/distlock"
)

// Store is the order database: it keeps, per order, the state and the highest fencing token
// that wrote it, and refuses older tokens (the fenced write).
type Store struct {
	mu     sync.Mutex
	state  map[string]string
	tokens map[string]uint64
}

func NewStore() *Store { return &Store{state: map[string]string{}, tokens: map[string]uint64{}} }

var ErrStaleToken = errors.New("store: a newer lock holder has written this order")

func (s *Store) State(order string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[order]
}

func (s *Store) Write(order, state string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.tokens[order] {
		return ErrStaleToken
	}
	s.tokens[order], s.state[order] = token, state
	return nil
}

// Outcome of one request.
const (
	Processed = "processed"
	Busy      = "busy: being processed"
	Done      = "already paid"
)

// Handle is one request for `order`: the re-entry guard around the payment.
func Handle(ctx context.Context, client *distlock.Client, store *Store, order string, work time.Duration) (string, error) {
	lease, err := client.TryLock(ctx, "order/"+order, distlock.TTL(10*time.Second))
	if errors.Is(err, distlock.ErrBusy) {
		return Busy, nil
	}
	if err != nil {
		return "", err
	}
	defer lease.Unlock(context.Background())
	if store.State(order) == "paid" {
		return Done, nil
	}
	select { // the payment provider's call; stops if the lock is lost
	case <-time.After(work):
	case <-lease.Done():
		return "", lease.Err()
	}
	if err := store.Write(order, "paid", lease.Token()); err != nil {
		return "", err
	}
	return Processed, nil
}

func main() {
	url := flag.String("url", "", "backend URL (default $DISTLOCK_URL, else host-local)")
	order := flag.String("order", "42", "order id")
	requests := flag.Int("requests", 8, "concurrent requests for the order")
	flag.Parse()
	client, err := distlock.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	store := NewStore()
	var wg sync.WaitGroup
	for i := 0; i < *requests; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			outcome, err := Handle(context.Background(), client, store, *order, 200*time.Millisecond)
			if err != nil {
				outcome = err.Error()
			}
			fmt.Printf("request %d: %s\n", i, outcome)
		}(i)
	}
	wg.Wait()
}
