package distlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"distlock.dev/distlock"
)

const goParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// The tracer function gets the wait and hold spans of a lock, under the client's
// traceparent, and the lease's Traceparent is the hold span's; a tracer that blocks does
// not hold up Lock or Unlock (it runs on a goroutine of its own): Lock and Unlock return
// while it is blocked, measured against a 2 s bound, and the spans arrive once it is let go.
func TestTracerGetsTheSpansOffTheLockPath(t *testing.T) {
	var mu sync.Mutex
	var spans []distlock.Span
	gate := make(chan struct{})
	got := make(chan struct{}, 16)
	c := connect(t, "file://"+t.TempDir(), distlock.WithTraceparent(goParent), distlock.WithTracer(func(s distlock.Span) {
		<-gate // blocks until the test has locked and unlocked
		mu.Lock()
		spans = append(spans, s)
		mu.Unlock()
		got <- struct{}{}
	}))
	start := time.Now()
	lease, err := c.Lock(context.Background(), "jobs/go")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	tp := lease.Traceparent()
	if err := lease.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Lock and Unlock took %v with the tracer blocked", d)
	}
	close(gate)
	for i := 0; i < 2; i++ {
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of 2 spans within 5 s", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(spans) != 2 || spans[0].Kind != distlock.SpanWait || spans[1].Kind != distlock.SpanHold {
		t.Fatalf("spans: %+v", spans)
	}
	w, h := spans[0], spans[1]
	if w.Outcome != "acquired" || h.Outcome != "released" || h.LockName != "jobs/go" || h.Backend != "file" {
		t.Errorf("wait %+v hold %+v", w, h)
	}
	for _, s := range spans {
		if s.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || s.ParentSpanID != "00f067aa0ba902b7" {
			t.Errorf("%s: trace %s parent %s", s.Name, s.TraceID, s.ParentSpanID)
		}
		if s.End.Sub(s.Start) != s.EndMono-s.StartMono || s.EndMono < s.StartMono {
			t.Errorf("%s: wall length %v, monotonic %v", s.Name, s.End.Sub(s.Start), s.EndMono-s.StartMono)
		}
	}
	if tp != h.Traceparent || !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("lease traceparent %q, hold span %q", tp, h.Traceparent)
	}
	if c.DroppedSpans() != 0 {
		t.Errorf("dropped %d", c.DroppedSpans())
	}
}

// Without a tracer a lease has no traceparent; a malformed client traceparent is no error.
func TestNoTracerNoTraceparentAndAMalformedOneIsNoError(t *testing.T) {
	c := connect(t, "file://"+t.TempDir(), distlock.WithTraceparent("00-NOT-A-TRACEPARENT"))
	lease, err := c.Lock(context.Background(), "jobs/plain")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer lease.Unlock(context.Background())
	if tp := lease.Traceparent(); tp != "" {
		t.Errorf("traceparent %q without a tracer", tp)
	}
}
