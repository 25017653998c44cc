package distlock_test

// LockDelay, QueuePosition and a per-lock Traceparent (lock_ext.go), against the redis://
// server of with_servers and file://.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"distlock.dev/distlock"
)

// A holder with LockDelay 2.5 s (above its 1-s TTL) is revoked (a loss, not a release): a
// prober trying every 20 ms is granted no earlier than the revoke's start + 2.5 s - 1 ms (the
// server's millisecond expiry) and no later than the revoke's return + TTL + delay + 1 s, on
// this process's monotonic clock. A holder with LockDelay 5 s that unlocks hands the name on at
// once: one attempt right after the Unlock gets it.
func TestLockDelayHoldsTheNameBackAfterALossNotAfterUnlock(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=golockdelay%d", os.Getpid())
	ctx := context.Background()
	holder, other := connect(t, url), connect(t, url)
	const ttl, delay = time.Second, 2500 * time.Millisecond
	held, err := holder.Lock(ctx, "ld/revoked", distlock.TTL(ttl), distlock.LockDelay(delay))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	revoking := time.Now()
	if revoked, err := other.Revoke("ld/revoked", "lock-delay test"); err != nil || !revoked {
		t.Fatalf("Revoke: %v %v", revoked, err)
	}
	revokeTook := time.Since(revoking)
	granted := time.Duration(-1)
	for i := 0; i < 500 && granted < 0; i++ { // 500 x 20 ms = 10 s
		l, err := other.TryLock(ctx, "ld/revoked", distlock.TTL(ttl))
		if err == nil {
			granted = time.Since(revoking)
			l.Unlock(ctx)
			break
		}
		if !errors.Is(err, distlock.ErrBusy) {
			t.Fatalf("TryLock: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("revoked holder with lock-delay %v, ttl %v: next granted %v after the revoke", delay, ttl, granted)
	if granted < 0 {
		t.Fatal("never granted within 10 s")
	}
	if granted < delay-time.Millisecond {
		t.Errorf("granted %v after the revoke, before the lock-delay %v ended", granted, delay)
	}
	if limit := revokeTook + ttl + delay + time.Second; granted > limit {
		t.Errorf("granted %v after the revoke, later than %v", granted, limit)
	}

	released, err := holder.Lock(ctx, "ld/released", distlock.TTL(10*time.Second), distlock.LockDelay(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := other.TryLock(ctx, "ld/released")
	if err != nil {
		t.Fatalf("an Unlock held the name back: %v", err)
	}
	next.Unlock(ctx)
}

// Bad values get the library's errors naming lock_delay; file:// cannot enforce a lock-delay
// and refuses it.
func TestLockDelayBadValuesAndABackendThatCannotEnforceItAreRefused(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=golockdelaybad%d", os.Getpid())
	ctx := context.Background()
	c := connect(t, url)
	for _, d := range []time.Duration{-time.Millisecond, -time.Microsecond, 60*time.Second + time.Millisecond} {
		_, err := c.Lock(ctx, "ld/bad", distlock.LockDelay(d), distlock.Wait(0))
		if !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "lock_delay") {
			t.Errorf("LockDelay(%v): %v", d, err)
		}
	}
	l, err := c.Lock(ctx, "ld/bad", distlock.LockDelay(60*time.Second), distlock.Wait(0))
	if err != nil {
		t.Fatalf("LockDelay(60s): %v", err)
	}
	l.Unlock(ctx)
	local := connect(t, "file://"+t.TempDir())
	if _, err := local.Lock(ctx, "ld/file", distlock.LockDelay(time.Second)); !errors.Is(err, distlock.ErrNotSupported) ||
		!strings.Contains(err.Error(), "lock_delay") {
		t.Errorf("file:// with a lock-delay: %v", err)
	}
}

type positionReport struct {
	position  int
	ahead     uint64
	aheadInfo string
}

// Four waiters queued one after another behind a holder: each one's QueuePosition function first
// reports its place (1..4, the one ahead by its holder info), later reports only move forward,
// and they acquire in that order. Each waiter is listed last in Status's queue before the next
// starts (bounded: 20 s each); the acquisitions are bounded by 60 s.
func TestQueuePositionOfFourWaitersIsTheirAcquisitionOrder(t *testing.T) {
	const waiters = 4
	url := redisURL(t) + fmt.Sprintf("?prefix=goqueue%d", os.Getpid())
	ctx := context.Background()
	holder, observer := connect(t, url), connect(t, url)
	held, err := holder.Lock(ctx, "queue/order", distlock.HolderInfo("holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx) // on a failed check, the waiters end too
	var mu sync.Mutex
	reports := make([][]positionReport, waiters+1)
	var order []int
	errs := make(chan error, waiters)
	for i := 1; i <= waiters; i++ {
		c := connect(t, url)
		go func(i int) {
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			l, err := c.Lock(wctx, "queue/order", distlock.HolderInfo(fmt.Sprintf("waiter=%d", i)),
				distlock.QueuePosition(func(position int, ahead distlock.Waiter) {
					info := "(none)"
					if ahead.HolderInfo != nil {
						info = *ahead.HolderInfo
					}
					mu.Lock()
					reports[i] = append(reports[i], positionReport{position, ahead.Position, info})
					mu.Unlock()
				}))
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			errs <- l.Unlock(ctx)
		}(i)
		mine := fmt.Sprintf("waiter=%d", i)
		listed := false
		for end := time.Now().Add(20 * time.Second); !listed && time.Now().Before(end); {
			info, err := observer.Status("queue/order")
			if err != nil {
				t.Fatal(err)
			}
			q := info.Queue
			listed = len(q) == i && q[i-1].HolderInfo != nil && *q[i-1].HolderInfo == mine
			if !listed {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if !listed {
			t.Fatalf("waiter %d was not listed last in the queue within 20 s", i)
		}
	}
	allReported := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i <= waiters; i++ {
			if len(reports[i]) == 0 {
				return false
			}
		}
		return true
	}
	for end := time.Now().Add(20 * time.Second); !allReported() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if !allReported() {
		t.Fatal("a waiter's QueuePosition function was not called within 20 s")
	}
	mu.Lock()
	for i := 1; i <= waiters; i++ {
		first := reports[i][0]
		wantAhead := "holder"
		if i > 1 {
			wantAhead = fmt.Sprintf("waiter=%d", i-1)
		}
		if first.position != i || first.ahead != uint64(i-1) || first.aheadInfo != wantAhead {
			t.Errorf("waiter %d: first report %+v, want position %d behind %q", i, first, i, wantAhead)
		}
	}
	mu.Unlock()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < waiters; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a waiter did not end within 60 s")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[1 2 3 4]" {
		t.Errorf("acquired in the order %v, not the order reported", order)
	}
	for i := 1; i <= waiters; i++ {
		for r := 1; r < len(reports[i]); r++ {
			if reports[i][r].position >= reports[i][r-1].position {
				t.Errorf("waiter %d: a later report did not move forward: %+v", i, reports[i])
			}
		}
	}
}

// Traceparent sets one lock's parent: its hold span's trace is the given one, not the client's.
func TestTraceparentPerLockIsTheParentOfThatLocksSpans(t *testing.T) {
	const perLock = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var mu sync.Mutex
	var spans []distlock.Span
	c := connect(t, "file://"+t.TempDir(), distlock.WithTraceparent(goParent), distlock.WithTracer(func(s distlock.Span) {
		mu.Lock()
		spans = append(spans, s)
		mu.Unlock()
	}))
	ctx := context.Background()
	lease, err := c.Lock(ctx, "jobs/traced", distlock.Traceparent(perLock))
	if err != nil {
		t.Fatal(err)
	}
	if tp := lease.Traceparent(); !strings.HasPrefix(tp, "00-0af7651916cd43dd8448eb211c80319c-") {
		t.Errorf("lease traceparent %q is not in the lock's trace", tp)
	}
	lease.Unlock(ctx)
	plain, err := c.Lock(ctx, "jobs/plain")
	if err != nil {
		t.Fatal(err)
	}
	if tp := plain.Traceparent(); !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("without Traceparent: %q is not in the client's trace", tp)
	}
	plain.Unlock(ctx)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(spans)
		mu.Unlock()
		if n >= 4 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	seen := 0
	for _, s := range spans {
		if s.LockName != "jobs/traced" {
			continue
		}
		seen++
		if s.TraceID != "0af7651916cd43dd8448eb211c80319c" || s.ParentSpanID != "b7ad6b7169203331" {
			t.Errorf("%s of jobs/traced: trace %s parent %s", s.Name, s.TraceID, s.ParentSpanID)
		}
	}
	if seen != 2 {
		t.Errorf("%d spans of jobs/traced, want the wait and the hold", seen)
	}
}

// The lock options of Lock alone are refused, not dropped, by the calls that cannot take them.
func TestLockOnlyOptionsAreRefusedBySemaphoreRWLockAndElection(t *testing.T) {
	c := connect(t, "file://"+t.TempDir())
	ctx := context.Background()
	for what, call := range map[string]func() error{
		"Semaphore.Acquire": func() error {
			_, err := c.Semaphore("s", 2).Acquire(ctx, distlock.LockDelay(time.Second))
			return err
		},
		"RWLock.Lock": func() error {
			_, err := c.RWLock("rw", 0).Lock(ctx, distlock.Traceparent(goParent))
			return err
		},
		"Election.Campaign": func() error {
			_, err := c.Election("e").Campaign(ctx, "v", distlock.QueuePosition(func(int, distlock.Waiter) {}))
			return err
		},
	} {
		if err := call(); !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "Lock, TryLock and LockAll only") {
			t.Errorf("%s: %v", what, err)
		}
	}
}
