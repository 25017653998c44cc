package distlock

// Tracing (docs/tracing.md, docs/go.md): WithTracer hands every span of the client's locks
// to a Go function, on a goroutine of its own: the C callback (on the thread of an acquire,
// a release or the client's event thread) only queues the span, so a slow or blocking
// function delays neither a lock call nor a renewal.

/*
#include <stdint.h>
#include <stdlib.h>
#include "distlock/distlock.h"
extern void distlockGoSpan(distlock_span* span, void* user);
extern void distlockGoTracerRelease(void* user);
static distlock_tracer_fn distlock_go_tracer_fn(void) { return (distlock_tracer_fn)distlockGoSpan; }
typedef void (*distlock_go_release_t)(void*);
static distlock_go_release_t distlock_go_release_fn(void) { return distlockGoTracerRelease; }
*/
import "C"

import (
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// SpanKind says what a span measured.
type SpanKind int

// The span kinds (docs/tracing.md).
const (
	SpanWait    SpanKind = iota // the acquire call to its outcome
	SpanHold                    // the grant to the release or the loss
	SpanRenewal                 // one renewal round of one lease
	SpanLoss                    // zero length, when the loss is declared
)

// Span is one finished span (distlock::Span): ids as lowercase hex.
type Span struct {
	Kind                                       SpanKind
	Name                                       string // "distlock.wait", "distlock.hold", ...
	TraceID, SpanID, ParentSpanID, Traceparent string // ParentSpanID "" for a root
	Sampled                                    bool
	Start, End                                 time.Time     // wall clock; End-Start is the length
	StartMono, EndMono                         time.Duration // the client's clock (CLOCK_BOOTTIME)
	LockName                                   string
	HasToken                                   bool
	Token                                      uint64
	Owner, HolderInfo, Backend                 string
	Outcome                                    string // "acquired", "busy", "timed_out", "released", "lost", "renewed", ...
	Err                                        error  // an *Error for the outcomes "error" and "failed"
	LossReason, Detail                         string
	BatchSize                                  uint32
}

// TracerQueue is how many spans wait for the tracer function at most; past it, spans are
// dropped and counted (Client.DroppedSpans).
const TracerQueue = 4096

type goTracer struct {
	fn      func(Span)
	mu      sync.Mutex // orders enqueue and close
	closed  bool
	ch      chan Span
	dropped atomic.Uint64
	done    chan struct{}
}

func newGoTracer(fn func(Span)) *goTracer {
	t := &goTracer{fn: fn, ch: make(chan Span, TracerQueue), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		for s := range t.ch {
			t.fn(s)
		}
	}()
	return t
}

func (t *goTracer) enqueue(s Span) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	select {
	case t.ch <- s:
	default:
		t.dropped.Add(1)
	}
}

func (t *goTracer) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.ch)
	}
}

// WithTracer hands every span of the client's locks (wait, hold, renewal, loss) to fn, one
// at a time, on a goroutine of the client's: fn may block without delaying a lock call or a
// renewal. Spans queued past TracerQueue are dropped (Client.DroppedSpans). The goroutine
// ends once the client is closed and its last lease released.
func WithTracer(fn func(Span)) Option { return func(c *clientConfig) { c.tracer = fn } }

// WithTraceparent sets the parent (a W3C traceparent) of every acquisition's spans; a
// malformed one is ignored (never an error).
func WithTraceparent(tp string) Option { return func(c *clientConfig) { c.traceparent = &tp } }

// DroppedSpans is how many spans WithTracer's queue dropped (0 without a tracer).
func (c *Client) DroppedSpans() uint64 {
	if c.tracer == nil {
		return 0
	}
	return c.tracer.dropped.Load()
}

// connectTraced is Connect's call of the C API with a tracer.
func connectTraced(curl *C.char, co *C.distlock_client_options, cfg *clientConfig, out **C.distlock_client,
	e *C.distlock_error) (C.int, *goTracer) {
	var tp *C.char
	if cfg.traceparent != nil {
		tp = C.CString(*cfg.traceparent)
		defer C.free(unsafe.Pointer(tp))
	}
	if cfg.tracer == nil {
		return C.distlock_connect_traced(curl, co, nil, nil, nil, tp, out, e), nil
	}
	t := newGoTracer(cfg.tracer)
	user := C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
	*(*C.uintptr_t)(user) = C.uintptr_t(cgo.NewHandle(t))
	// release_user_data (distlockGoTracerRelease) frees user and ends the goroutine, on a
	// failed connect too.
	return C.distlock_connect_traced(curl, co, C.distlock_go_tracer_fn(), user, C.distlock_go_release_fn(), tp, out,
		e), t
}

// Traceparent is the lease's hold span's W3C traceparent, for the work done under the lock
// ("" without a tracer).
func (le *Lease) Traceparent() string {
	le.mu.RLock()
	defer le.mu.RUnlock()
	if le.l == nil {
		return ""
	}
	var out *C.char
	var e C.distlock_error
	if C.distlock_lease_traceparent(le.l, &out, &e) != C.DISTLOCK_OK || out == nil {
		return ""
	}
	defer C.distlock_string_free(out)
	return C.GoString(out)
}
