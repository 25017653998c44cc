package distlock_test

// The examples of docs/go.md and of the README, as they are written there, run by the tests.

import (
	"context"
	"errors"
	"testing"
	"time"

	"distlock.dev/distlock"
)

var errTryLater = errors.New("order 42 is busy: try later")

func writeOrder(ctx context.Context, order int, token uint64) error { return nil }

// docs/go.md, "Example".
func payOrder(url string) error {
	client, err := distlock.Connect(url)
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := client.Lock(ctx, "orders/42", distlock.TTL(10*time.Second))
	if errors.Is(err, context.DeadlineExceeded) {
		return errTryLater
	}
	if err != nil {
		return err
	}
	defer lease.Unlock(context.Background())

	select {
	case <-lease.Done(): // lost: stop before writing
		return lease.Err()
	default:
	}
	return writeOrder(ctx, 42, lease.Token()) // the store refuses older tokens
}

// README, "Usage" (Go).
func readmeExample(ctx context.Context) error {
	client, _ := distlock.Connect("") // $DISTLOCK_URL, else host-local
	lease, err := client.Lock(ctx, "orders/42", distlock.TTL(10*time.Second))
	if err != nil {
		return err
	}
	defer lease.Unlock(ctx)
	return writeOrder(ctx, 42, lease.Token()) // <-lease.Done() fires on loss
}

func reindexShard(ctx context.Context, shard int, token uint64, lost <-chan struct{}) {}

// docs/go.md, "Shard groups".
func reindexShards(ctx context.Context, client *distlock.Client) error {
	member, err := client.ShardGroup(ctx, "reindex", 4, distlock.ShardTTL(10*time.Second))
	if err != nil {
		return err
	}
	defer member.Leave()
	now, err := member.Assigned()
	for err == nil && len(now.Shards) < 4 { // alone here: all four come to it
		now, err = member.WaitChange(ctx, now.Version)
	}
	if err != nil {
		return err
	}
	for _, s := range now.Shards {
		reindexShard(ctx, s.Index, s.Token, s.Lost()) // stop at <-s.Lost(); pass s.Token to every write
	}
	return nil
}

func transfer(ctx context.Context, fromToken, toToken uint64, lost <-chan struct{}) error { return nil }

// docs/go.md, "Several locks at once".
func moveMoney(ctx context.Context, client *distlock.Client) error {
	both, err := client.LockAll(ctx, []string{"accounts/7", "accounts/3"}, // any order: taken sorted
		distlock.Wait(5*time.Second),      // bounds the whole call
		distlock.LockDelay(2*time.Second)) // a lost holder keeps both back for 2 s
	if err != nil {
		return err
	}
	defer both.Unlock(context.Background())
	from, _ := both.Token("accounts/7")
	to, _ := both.Token("accounts/3")
	return transfer(ctx, from, to, both.Lost()) // Lost() closes if either name is lost
}

func TestDocExamplesRun(t *testing.T) {
	for _, b := range backends(t) {
		if err := payOrder(b.url); err != nil {
			t.Fatalf("%s: %v", b.kind, err)
		}
		if b.kind != "file" {
			continue
		}
		// Busy past the context's deadline (5 s: once, on file://): the example's own error.
		holder := connect(t, b.url)
		held, err := holder.Lock(context.Background(), "orders/42")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := payOrder(b.url); err != errTryLater || time.Since(start) < 5*time.Second {
			t.Fatalf("%s: payOrder while held: %v after %v", b.kind, err, time.Since(start))
		}
		held.Unlock(context.Background())
	}
	for _, b := range backends(t) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := reindexShards(ctx, connect(t, b.url))
		cancel()
		if err != nil {
			t.Fatalf("%s: reindexShards: %v", b.kind, err)
		}
	}
	for _, b := range backends(t) {
		if b.kind != "redis" { // file:// cannot enforce a lock-delay
			continue
		}
		if err := moveMoney(context.Background(), connect(t, b.url)); err != nil {
			t.Fatalf("%s: moveMoney: %v", b.kind, err)
		}
	}
	t.Setenv("DISTLOCK_URL", "file://"+t.TempDir())
	if err := readmeExample(context.Background()); err != nil {
		t.Fatal(err)
	}
}
