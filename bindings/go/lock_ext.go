package distlock

// The lock options of the C API's distlock_lock_options_ext: LockDelay, QueuePosition and a
// per-lock Traceparent, for Lock, TryLock and LockAll.

/*
#include <stdint.h>
#include <stdlib.h>
#include "distlock/distlock.h"
extern void distlockGoQueuePosition(size_t position, distlock_waiter* ahead, void* user);
static distlock_queue_position_fn distlock_go_queue_fn(void) {
  return (distlock_queue_position_fn)distlockGoQueuePosition;
}
*/
import "C"

import (
	"runtime/cgo"
	"time"
	"unsafe"
)

// LockDelay holds the name back after this holder is lost (killed, partitioned, expired,
// revoked; not after Unlock): nobody is granted it before the loss plus d, to protect
// resources that cannot check fencing tokens (docs/design.md "Lock-delay"). The server
// enforces it; 0 (the default) is off, at most 60 s; a negative d or more than 60 s is
// ErrInvalidArgument naming lock_delay, a backend that cannot enforce it ErrNotSupported.
// Lock, TryLock and LockAll.
func LockDelay(d time.Duration) LockOption { return func(c *lockConfig) { c.lockDelay = &d } }

// QueuePosition calls fn while Lock waits in the lock's queue, each time this waiter's place
// changes: position 1 when it is next, ahead the one just ahead of it (the holder, Position
// 0, when it is next). fn runs on the client's event thread (a C thread, through cgo),
// synchronously, never after Lock returned: keep it short (it delays the client's loss
// signals) and never wait in it for the Lock call to return; send to a buffered channel if
// the work is long. No goroutine is started for it. Only Lock on a backend that lists its
// waiters (redis, redis+sentinel, etcd, zk) reports; elsewhere fn is never called.
func QueuePosition(fn func(position int, ahead Waiter)) LockOption {
	return func(c *lockConfig) { c.queuePosition = fn }
}

// Traceparent sets the W3C trace context this acquisition's wait and hold spans are children
// of (a client WithTracer); "" is the client's WithTraceparent. A malformed value is ignored
// with a warning, never an error.
func Traceparent(tp string) LockOption { return func(c *lockConfig) { c.traceparent = &tp } }

// cExt is a distlock_lock_options_ext and what it holds on to for one call. The struct is in C
// memory: a pointer into the Go object holding it would make cgo check the whole object (the
// options' slice of strings to free is a Go pointer).
type cExt struct {
	e      *C.distlock_lock_options_ext // nil when no extended option was given
	handle cgo.Handle
	user   unsafe.Pointer // C memory holding the handle
	tp     *C.char
}

func (x *cExt) fill(cfg *lockConfig) {
	if cfg.lockDelay == nil && cfg.traceparent == nil && cfg.queuePosition == nil {
		return
	}
	x.e = (*C.distlock_lock_options_ext)(C.malloc(C.size_t(unsafe.Sizeof(C.distlock_lock_options_ext{}))))
	C.distlock_lock_options_ext_init(x.e)
	if cfg.lockDelay != nil {
		v := ms(*cfg.lockDelay)
		if *cfg.lockDelay < 0 && v == 0 {
			v = -1 // a negative delay below a millisecond is still negative
		}
		x.e.lock_delay_ms = v
	}
	if cfg.traceparent != nil && *cfg.traceparent != "" {
		x.tp = C.CString(*cfg.traceparent)
		x.e.traceparent = x.tp
	}
	if cfg.queuePosition != nil {
		x.handle = cgo.NewHandle(cfg.queuePosition)
		x.user = C.malloc(C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
		*(*C.uintptr_t)(x.user) = C.uintptr_t(x.handle)
		x.e.on_queue_position = C.distlock_go_queue_fn()
		x.e.queue_position_user = x.user
	}
}

// ptr is the struct for the C call, nil when no extended option was given.
func (x *cExt) ptr() *C.distlock_lock_options_ext { return x.e }

// release runs after the C call returned: the C API calls the queue-position callback
// during the call only, so the handle can go.
func (x *cExt) release() {
	if x.e != nil {
		C.free(unsafe.Pointer(x.e))
		x.e = nil
	}
	if x.user != nil {
		C.free(x.user)
		x.handle.Delete()
		x.user = nil
	}
	if x.tp != nil {
		C.free(unsafe.Pointer(x.tp))
		x.tp = nil
	}
}
