package distlock_test

// Client.LockAll and MultiLease (multi_lease.go), against the redis:// server of with_servers.

import (
	"context"
	"errors"
	"fmt"
	"os"
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
