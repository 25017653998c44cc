package distlock

// Several locks held as one (docs/multi_lock.md): Client.LockAll and MultiLease, over the C
// API's distlock_acquire_all.

/*
#include <stdlib.h>
#include <fcntl.h>
#include <poll.h>
#include "distlock/distlock.h"

static int distlock_go_multi_readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}
static int distlock_go_multi_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }
*/
import "C"

import (
	"context"
	"math"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// MultiLease holds several names as one: taken all or none, each with its own lease and
// fencing token; a loss of any one name is a loss of the whole. All methods may be called
// from any goroutine.
type MultiLease struct {
	mu       sync.RWMutex
	m        *C.distlock_multi_lease
	names    []string
	tokens   map[string]uint64
	hasToken bool
	lost     chan struct{}
	lostOnce sync.Once
	ended    error // ErrUnlocked after Unlock
	lostFile *os.File
	watcher  chan struct{}
}

// LockAll acquires every one of names or none. The names are taken in sorted (bytewise) order
// with duplicates dropped, whatever order they are given in, so two callers whose sets overlap
// cannot deadlock. The Wait option bounds the whole call; a call that cannot have every name by
// then (or whose ctx ends) releases the names it took and returns ErrTimeout (ErrBusy for a
// Wait of 0; an error matching ctx.Err() and ErrCancelled for an ended ctx).
// ErrInvalidArgument for an empty list or an empty name. LockDelay and Traceparent apply to
// every name; QueuePosition is never called (only Lock reports).
func (c *Client) LockAll(ctx context.Context, names []string, opts ...LockOption) (*MultiLease, error) {
	for _, n := range names {
		if strings.IndexByte(n, 0) >= 0 {
			return nil, &Error{Code: ErrInvalidArgument.Code, Message: "distlock: a lock name holds a NUL byte"}
		}
	}
	cnames := make([]*C.char, len(names))
	for i, n := range names {
		cnames[i] = C.CString(n)
	}
	defer func() {
		for _, p := range cnames {
			C.free(unsafe.Pointer(p))
		}
	}()
	// The array of names in C memory (a Go slice of C pointers may not be kept by C, and
	// cgo's pointer rules want C memory for what C reads through a pointer to pointers).
	var carr **C.char
	if len(cnames) > 0 {
		carr = (**C.char)(C.malloc(C.size_t(len(cnames)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		defer C.free(unsafe.Pointer(carr))
		copy(unsafe.Slice(carr, len(cnames)), cnames)
	}
	var out *C.distlock_multi_lease
	err := c.waitOptions(ctx, opts, func(h *C.distlock_client, co *cOptions, e *C.distlock_error) C.int {
		return C.distlock_acquire_all(h, carr, C.size_t(len(cnames)), &co.o, co.ext.ptr(), &out, e)
	})
	if err != nil {
		return nil, err
	}
	return newMultiLease(out), nil
}

func newMultiLease(m *C.distlock_multi_lease) *MultiLease {
	ml := &MultiLease{m: m, tokens: map[string]uint64{}, lost: make(chan struct{}), watcher: make(chan struct{})}
	n := int(C.distlock_multi_lease_count(m))
	var e C.distlock_error
	for i := 0; i < n; i++ {
		cname := C.distlock_multi_lease_name(m, C.size_t(i))
		name := C.GoString(cname)
		ml.names = append(ml.names, name)
		var t C.uint64_t
		if C.distlock_multi_lease_token(m, cname, &t, &e) == C.DISTLOCK_OK {
			ml.tokens[name] = uint64(t)
			ml.hasToken = true
		}
	}
	fd := int(C.distlock_go_multi_dup(C.distlock_multi_lease_lost_fd(m)))
	if fd < 0 {
		close(ml.watcher)
		return ml
	}
	ml.lostFile = os.NewFile(uintptr(fd), "distlock-multi-lost")
	go ml.watch()
	return ml
}

// watch closes lost when the loss descriptor becomes readable; it ends when Unlock closes the
// duplicate (no goroutine outlives the multi-lease's Unlock).
func (ml *MultiLease) watch() {
	defer close(ml.watcher)
	raw, err := ml.lostFile.SyscallConn()
	if err != nil {
		return
	}
	lost := false
	err = raw.Read(func(fd uintptr) bool {
		lost = C.distlock_go_multi_readable(C.int(fd)) != 0
		return lost
	})
	if err == nil && lost {
		ml.lostOnce.Do(func() { close(ml.lost) })
	}
}

// Names are the names held, in the order they were taken (sorted, no duplicates).
func (ml *MultiLease) Names() []string { return append([]string(nil), ml.names...) }

// Tokens maps each name to its fencing token (strictly increasing per name across holders);
// empty where the backend has none (Redlock).
func (ml *MultiLease) Tokens() map[string]uint64 {
	out := make(map[string]uint64, len(ml.tokens))
	for k, v := range ml.tokens {
		out[k] = v
	}
	return out
}

// Token is name's fencing token; false for a name not held here, or where there is none.
func (ml *MultiLease) Token(name string) (uint64, bool) {
	t, ok := ml.tokens[name]
	return t, ok
}

// Lost is closed when any one of the names is lost (the whole is lost then), and at Unlock.
// Err tells which.
func (ml *MultiLease) Lost() <-chan struct{} { return ml.lost }

// Err is nil while every name is held; once one is lost, an error matching ErrLost naming it
// and why; after Unlock, ErrUnlocked. It checks the local deadlines on each call, so it is
// never later than Lost().
func (ml *MultiLease) Err() error {
	ml.mu.RLock()
	defer ml.mu.RUnlock()
	if ml.m == nil {
		return ml.ended
	}
	if C.distlock_multi_lease_owns(ml.m) != 0 {
		return nil
	}
	var e C.distlock_error
	if rc := C.distlock_multi_lease_loss(ml.m, &e); rc != C.DISTLOCK_OK {
		return cError(rc, &e)
	}
	return &Error{Code: ErrLost.Code, Message: "distlock: multi-lease lost: a name's local deadline passed"}
}

// Remaining is the least time left until a name's local deadline (0 once one is lost or after
// Unlock; the largest Duration where leases do not expire, file://).
func (ml *MultiLease) Remaining() time.Duration {
	ml.mu.RLock()
	defer ml.mu.RUnlock()
	if ml.m == nil {
		return 0
	}
	left := int64(C.distlock_multi_lease_remaining_ms(ml.m))
	if left > math.MaxInt64/int64(time.Millisecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(left) * time.Millisecond
}

// Unlock releases every name (the reverse of the order taken), even when one fails: nil,
// ErrLost if a name had been lost, ErrBackendUnavailable if a server could not be reached (that
// name expires by its TTL). A second Unlock returns ErrUnlocked. Bounded by the client's
// command timeout, not by ctx.
func (ml *MultiLease) Unlock(ctx context.Context) error {
	_ = ctx
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if ml.m == nil {
		return ErrUnlocked
	}
	var e C.distlock_error
	err := cError(C.distlock_multi_lease_release(ml.m, &e), &e)
	if ml.lostFile != nil {
		ml.lostFile.Close() // ends the watcher
	}
	<-ml.watcher
	C.distlock_multi_lease_free(ml.m)
	ml.m = nil
	ml.ended = ErrUnlocked
	ml.lostOnce.Do(func() { close(ml.lost) })
	return err
}
