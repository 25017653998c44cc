package distlock_test

// Client.LockAll and MultiLease (multi_lease.go), against the redis:// server of with_servers.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"distlock.dev/distlock"
)

// LockAll: sorted names with duplicates dropped, one token per name; a revoke of one name is a
// loss of the whole (Lost() closed within 5 s, Err naming the name, Unlock ErrLost); bad input
// gets the library's errors; a busy name fails the whole call with nothing left held.
func TestLockAllOneTokenPerNameAndALossOfOneIsALossOfTheWhole(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=gomulti%d", os.Getpid())
	ctx := context.Background()
	c, other := connect(t, url), connect(t, url)
	if _, err := c.LockAll(ctx, nil); !errors.Is(err, distlock.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "the list of names is empty") {
		t.Errorf("LockAll(nil): %v", err)
	}
	if _, err := c.LockAll(ctx, []string{"a", ""}); !errors.Is(err, distlock.ErrInvalidArgument) {
		t.Errorf("LockAll with an empty name: %v", err)
	}
	if _, err := c.LockAll(ctx, []string{"a", "b"}, distlock.LockDelay(-time.Second)); !errors.Is(err, distlock.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "lock_delay") {
		t.Errorf("LockAll with a negative lock-delay: %v", err)
	}

	m, err := c.LockAll(ctx, []string{"m/c", "m/a", "m/b", "m/a"}, distlock.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	if got := fmt.Sprint(m.Names()); got != "[m/a m/b m/c]" {
		t.Errorf("Names() = %s", got)
	}
	tokens := m.Tokens()
	if len(tokens) != 3 {
		t.Errorf("Tokens() = %v", tokens)
	}
	for _, n := range []string{"m/a", "m/b", "m/c"} {
		if tok, ok := m.Token(n); !ok || tok == 0 || tok != tokens[n] {
			t.Errorf("Token(%s) = %d %v", n, tok, ok)
		}
	}
	if _, ok := m.Token("m/z"); ok {
		t.Error("Token of a name not held")
	}
	if m.Err() != nil || m.Remaining() <= 0 {
		t.Errorf("fresh multi-lease: Err %v Remaining %v", m.Err(), m.Remaining())
	}

	if _, err := other.LockAll(ctx, []string{"m/d", "m/b"}, distlock.Wait(0)); !errors.Is(err, distlock.ErrBusy) {
		t.Errorf("LockAll over a held name: %v", err)
	}
	if d, err := other.TryLock(ctx, "m/d"); err != nil {
		t.Errorf("m/d was left held: %v", err)
	} else {
		d.Unlock(ctx)
	}

	if revoked, err := other.Revoke("m/b", "multi test"); err != nil || !revoked {
		t.Fatalf("Revoke: %v %v", revoked, err)
	}
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost() was not closed within 5 s of the revoke of one name")
	}
	if err := m.Err(); !errors.Is(err, distlock.ErrLost) || !strings.Contains(err.Error(), `"m/b" lost (revoked)`) {
		t.Errorf("Err() = %v", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, distlock.ErrLost) || !strings.Contains(err.Error(), "m/b") {
		t.Errorf("Unlock() = %v", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, distlock.ErrUnlocked) {
		t.Errorf("second Unlock() = %v", err)
	}
	if a, err := other.TryLock(ctx, "m/a"); err != nil {
		t.Errorf("m/a is still held after Unlock: %v", err)
	} else {
		a.Unlock(ctx)
	}
}

// Neither LockAll nor QueuePosition leaves a goroutine behind: after 20 rounds of LockAll +
// Unlock and of a queued Lock with a QueuePosition function + Unlock, the number of goroutines
// comes back to where it was (bounded: 5 s; the watcher of each multi-lease ends at Unlock).
func TestLockAllAndQueuePositionLeaveNoGoroutine(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=gomultileak%d", os.Getpid())
	ctx := context.Background()
	c, holder := connect(t, url), connect(t, url)
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		m, err := c.LockAll(ctx, []string{"leak/a", "leak/b"})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		held, err := holder.Lock(ctx, "leak/q")
		if err != nil {
			t.Fatal(err)
		}
		reported := make(chan int, 16)
		done := make(chan error, 1)
		go func() {
			l, err := c.Lock(ctx, "leak/q", distlock.Wait(30*time.Second),
				distlock.QueuePosition(func(p int, _ distlock.Waiter) { reported <- p }))
			if err == nil {
				err = l.Unlock(ctx)
			}
			done <- err
		}()
		select {
		case p := <-reported:
			if p != 1 {
				t.Errorf("round %d: position %d", i, p)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: no queue position within 20 s", i)
		}
		held.Unlock(ctx)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after 20 rounds, %d before", n, before)
	}
}
