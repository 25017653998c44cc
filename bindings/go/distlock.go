// Package distlock is the Go binding of distlock, a distributed lock with fencing tokens and
// loss signals over many stores (redis://, etcd://, zk://, postgres://, file:///dir, ...).
//
// It is cgo over the library's C API (include/distlock/distlock.h, libdistlock_c), found with
// pkg-config (package distlock-c). Every lock is a lease renewed in the background; Done()
// is closed when it is lost, and Token() is its fencing token.
//
//	client, err := distlock.Connect("redis://127.0.0.1:6379")
//	lease, err := client.Lock(ctx, "orders/42", distlock.TTL(10*time.Second))
//	defer lease.Unlock(context.Background())
//	writeOrder(ctx, lease.Token())           // pass the fencing token on
//	<-lease.Done()                           // closed if the lock is lost
//
// Thread-safety: a Client, its Semaphores, RWLocks and Elections, and a Lease may be used
// from any number of goroutines at once.
package distlock

/*
#cgo pkg-config: distlock-c
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include "distlock/distlock.h"

static int distlock_go_readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}
static int distlock_go_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }
static int64_t distlock_go_default(void) { return DISTLOCK_DEFAULT; }
*/
import "C"

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"
)

var defaultDuration = int64(C.distlock_go_default())

func cError(code C.int, e *C.distlock_error) error {
	if code == C.DISTLOCK_OK {
		return nil
	}
	return &Error{Code: int(code), Message: C.GoString(&e.message[0])}
}

// ---- client ----------------------------------------------------------------------------

type clientConfig struct {
	ttl, wait, connectTimeout, commandTimeout *time.Duration
	prefix, holderInfo                        *string
	tracer                                    func(Span)
	traceparent                               *string
}

// Option configures Connect.
type Option func(*clientConfig)

// WithTTL sets the default lease length (default 30 s): how long a crashed holder blocks others.
func WithTTL(d time.Duration) Option { return func(c *clientConfig) { c.ttl = &d } }

// WithWait sets the default wait of Lock (default: no limit but the context).
func WithWait(d time.Duration) Option { return func(c *clientConfig) { c.wait = &d } }

// WithPrefix sets the key prefix (the URL's ?prefix=).
func WithPrefix(p string) Option { return func(c *clientConfig) { c.prefix = &p } }

// WithHolderInfo sets the default description of the holder that status and list show.
func WithHolderInfo(s string) Option { return func(c *clientConfig) { c.holderInfo = &s } }

// WithTimeouts sets the connect and per-command timeouts (default 2 s each).
func WithTimeouts(connect, command time.Duration) Option {
	return func(c *clientConfig) { c.connectTimeout, c.commandTimeout = &connect, &command }
}

// Client is a connection to one lock service. Close it when done; leases it gave stay valid.
type Client struct {
	mu     sync.Mutex
	c      *C.distlock_client
	calls  int
	closed bool
	tracer *goTracer // WithTracer's (nil without)
}

func ms(d time.Duration) C.int64_t { return C.int64_t(d / time.Millisecond) }

// Connect connects to the backend named by url ("" is $DISTLOCK_URL, else the host-local
// default). Errors: ErrInvalidURL (bad URL, unknown scheme), ErrBackendUnavailable,
// ErrAuthFailed, ErrInvalidArgument.
func Connect(url string, opts ...Option) (*Client, error) {
	var cfg clientConfig
	for _, o := range opts {
		o(&cfg)
	}
	var co C.distlock_client_options
	C.distlock_client_options_init(&co)
	if cfg.ttl != nil {
		co.ttl_ms = ms(*cfg.ttl)
	}
	if cfg.wait != nil {
		co.wait_ms = ms(*cfg.wait)
	}
	if cfg.connectTimeout != nil {
		co.connect_timeout_ms = ms(*cfg.connectTimeout)
		co.command_timeout_ms = ms(*cfg.commandTimeout)
	}
	if cfg.prefix != nil {
		co.prefix = C.CString(*cfg.prefix)
		defer C.free(unsafe.Pointer(co.prefix))
	}
	if cfg.holderInfo != nil {
		co.holder_info = C.CString(*cfg.holderInfo)
		defer C.free(unsafe.Pointer(co.holder_info))
	}
	curl := C.CString(url)
	defer C.free(unsafe.Pointer(curl))
	var e C.distlock_error
	var c *C.distlock_client
	rc, tracer := connectTraced(curl, &co, &cfg, &c, &e)
	if rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return &Client{c: c, tracer: tracer}, nil
}

// enter counts a call in flight (Close frees the handle after the last one).
func (c *Client) enter() (*C.distlock_client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	c.calls++
	return c.c, nil
}

func (c *Client) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls--
	if c.closed && c.calls == 0 && c.c != nil {
		C.distlock_client_close(c.c)
		c.c = nil
	}
}

// Close closes the client. Calls in progress finish first (the handle is freed after the
// last; Close does not end a wait in progress: cancel its context); later calls return
// ErrClosed. Leases stay valid until unlocked.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.calls == 0 {
		C.distlock_client_close(c.c)
		c.c = nil
	}
	return nil
}

// URL is the client's URL with any password masked.
func (c *Client) URL() (string, error) {
	h, err := c.enter()
	if err != nil {
		return "", err
	}
	defer c.leave()
	var e C.distlock_error
	var s *C.char
	if rc := C.distlock_client_url(h, &s, &e); rc != C.DISTLOCK_OK {
		return "", cError(rc, &e)
	}
	defer C.distlock_string_free(s)
	return C.GoString(s), nil
}

// ---- lock options ------------------------------------------------------------------------

type lockConfig struct {
	ttl, wait, maxHold *time.Duration
	holderInfo         *string
	lockDelay          *time.Duration    // LockDelay (lock_ext.go)
	queuePosition      func(int, Waiter) // QueuePosition
	traceparent        *string           // Traceparent
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig)

// TTL is the lease length on the server (at least 100 ms): how long a crashed holder blocks
// others. The lease is renewed while held.
func TTL(d time.Duration) LockOption { return func(c *lockConfig) { c.ttl = &d } }

// Wait bounds the wait for a busy lock (ErrTimeout after it); 0 is one attempt (ErrBusy).
// Without it, the client's default (no limit): the context ends the wait.
func Wait(d time.Duration) LockOption { return func(c *lockConfig) { c.wait = &d } }

// MaxHold bounds one hold: the lease is lost that long after it was granted.
func MaxHold(d time.Duration) LockOption { return func(c *lockConfig) { c.maxHold = &d } }

// HolderInfo describes the holder for status and list (printable ASCII without '|').
func HolderInfo(s string) LockOption { return func(c *lockConfig) { c.holderInfo = &s } }

type cOptions struct {
	o    C.distlock_lock_options
	free []unsafe.Pointer
	ext  cExt // LockDelay, QueuePosition, Traceparent (lock_ext.go)
}

func makeOptions(opts []LockOption) *cOptions {
	var cfg lockConfig
	for _, o := range opts {
		o(&cfg)
	}
	co := &cOptions{}
	C.distlock_lock_options_init(&co.o)
	if cfg.ttl != nil {
		co.o.ttl_ms = ms(*cfg.ttl)
	}
	if cfg.wait != nil {
		co.o.wait_ms = ms(*cfg.wait)
		if *cfg.wait < 0 {
			co.o.wait_ms = 0
		}
	}
	if cfg.maxHold != nil {
		co.o.max_hold_ms = ms(*cfg.maxHold)
	}
	if cfg.holderInfo != nil {
		s := C.CString(*cfg.holderInfo)
		co.o.holder_info = s
		co.free = append(co.free, unsafe.Pointer(s))
	}
	co.ext.fill(&cfg)
	return co
}

func (co *cOptions) release() {
	for _, p := range co.free {
		C.free(p)
	}
	co.ext.release()
}

// acquire runs one blocking acquisition of the C API, cancelled when ctx ends (see wait).
func (c *Client) acquire(ctx context.Context, opts []LockOption,
	call func(h *C.distlock_client, o *C.distlock_lock_options, out **C.distlock_lease, e *C.distlock_error) C.int,
) (*Lease, error) {
	var out *C.distlock_lease
	err := c.wait(ctx, opts, func(h *C.distlock_client, o *C.distlock_lock_options, e *C.distlock_error) C.int {
		return call(h, o, &out, e)
	})
	if err != nil {
		return nil, err
	}
	return newLease(out), nil
}

// wait runs one blocking call of the C API that takes lock options, cancelled when ctx ends:
// a watcher goroutine requests the wait's cancel source, and the library ends the wait
// leaving nothing queued on the server.
func (c *Client) wait(ctx context.Context, opts []LockOption,
	call func(h *C.distlock_client, o *C.distlock_lock_options, e *C.distlock_error) C.int,
) error {
	return c.waitOptions(ctx, opts, func(h *C.distlock_client, co *cOptions, e *C.distlock_error) C.int {
		if co.ext.e != nil { // the C calls behind wait take no extended options: refused, not dropped
			msg := C.CString("distlock: LockDelay, QueuePosition and Traceparent apply to Lock, TryLock and LockAll only")
			defer C.free(unsafe.Pointer(msg))
			C.strncpy(&e.message[0], msg, C.size_t(len(e.message)-1))
			e.code = C.DISTLOCK_E_INVALID_ARGUMENT
			return C.DISTLOCK_E_INVALID_ARGUMENT
		}
		return call(h, &co.o, e)
	})
}

// waitOptions is wait with the whole of the converted options (the extended ones too).
func (c *Client) waitOptions(ctx context.Context, opts []LockOption,
	call func(h *C.distlock_client, co *cOptions, e *C.distlock_error) C.int,
) error {
	if err := ctx.Err(); err != nil {
		return &ctxError{ctx: err, inner: ErrCancelled}
	}
	h, err := c.enter()
	if err != nil {
		return err
	}
	defer c.leave()
	co := makeOptions(opts)
	defer co.release()
	var e C.distlock_error
	if ctx.Done() != nil {
		var cancel *C.distlock_cancel
		if rc := C.distlock_cancel_new(&cancel, &e); rc != C.DISTLOCK_OK {
			return cError(rc, &e)
		}
		co.o.cancel = cancel
		stop := make(chan struct{})
		watcher := make(chan struct{})
		go func() {
			defer close(watcher)
			select {
			case <-ctx.Done():
				C.distlock_cancel_request(cancel)
			case <-stop:
			}
		}()
		defer func() {
			close(stop)
			<-watcher // no request after the free
			C.distlock_cancel_free(cancel)
		}()
	}
	if rc := call(h, co, &e); rc != C.DISTLOCK_OK {
		return fromContext(ctx, cError(rc, &e))
	}
	return nil
}

func withName(name string, f func(cname *C.char) C.int) C.int {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return f(cname)
}

// Lock acquires name, waiting until it is free, the Wait option runs out (ErrTimeout) or ctx
// ends (an error matching ctx.Err() and ErrCancelled; nothing is left queued on the server).
// LockDelay, QueuePosition and Traceparent apply (lock_ext.go).
func (c *Client) Lock(ctx context.Context, name string, opts ...LockOption) (*Lease, error) {
	var out *C.distlock_lease
	err := c.waitOptions(ctx, opts, func(h *C.distlock_client, co *cOptions, e *C.distlock_error) C.int {
		return withName(name, func(n *C.char) C.int { return C.distlock_acquire_ext(h, n, &co.o, co.ext.ptr(), &out, e) })
	})
	if err != nil {
		return nil, err
	}
	return newLease(out), nil
}

// TryLock makes one attempt: ErrBusy while somebody else holds name. LockDelay and
// Traceparent apply.
func (c *Client) TryLock(ctx context.Context, name string, opts ...LockOption) (*Lease, error) {
	var out *C.distlock_lease
	err := c.waitOptions(ctx, opts, func(h *C.distlock_client, co *cOptions, e *C.distlock_error) C.int {
		co.o.wait_ms = 0 // one attempt, as distlock_try_acquire
		return withName(name, func(n *C.char) C.int { return C.distlock_acquire_ext(h, n, &co.o, co.ext.ptr(), &out, e) })
	})
	if err != nil {
		return nil, err
	}
	return newLease(out), nil
}

// ---- lease -------------------------------------------------------------------------------

// Lease is a held lock (or semaphore permit, read-write lock hold, leadership). Unlock it
// when done. All methods may be called from any goroutine.
type Lease struct {
	mu       sync.RWMutex
	l        *C.distlock_lease
	token    uint64
	hasToken bool
	done     chan struct{}
	doneOnce sync.Once
	ended    error // ErrUnlocked after Unlock
	lostFile *os.File
	watcher  chan struct{}
}

func newLease(l *C.distlock_lease) *Lease {
	le := &Lease{l: l, done: make(chan struct{}), watcher: make(chan struct{})}
	var e C.distlock_error
	var t C.uint64_t
	if C.distlock_lease_token(l, &t, &e) == C.DISTLOCK_OK {
		le.token, le.hasToken = uint64(t), true
	}
	// Wait for the loss descriptor in Go's poller, on a duplicate owned by the lease's
	// goroutine (never read: it is the C lease's signal).
	fd := int(C.distlock_go_dup(C.distlock_lease_lost_fd(l)))
	if fd < 0 {
		close(le.watcher)
		return le
	}
	le.lostFile = os.NewFile(uintptr(fd), "distlock-lost")
	go le.watch()
	return le
}

func (le *Lease) watch() {
	defer close(le.watcher)
	raw, err := le.lostFile.SyscallConn()
	if err != nil {
		return
	}
	lost := false
	err = raw.Read(func(fd uintptr) bool {
		lost = C.distlock_go_readable(C.int(fd)) != 0
		return lost
	})
	if err == nil && lost {
		le.doneOnce.Do(func() { close(le.done) })
	}
}

// Token is the fencing token: strictly increasing per lock name across holders. 0 where the
// backend has none (Redlock) and for a reader's hold of a read-write lock.
func (le *Lease) Token() uint64 { return le.token }

// HasToken tells whether Token is a fencing token.
func (le *Lease) HasToken() bool { return le.hasToken }

// Done is closed when the lease is lost (renewal refused, local deadline passed, session
// gone), like etcd's Session.Done(), and when it is unlocked. Err tells which.
func (le *Lease) Done() <-chan struct{} { return le.done }

// Err is nil while the lease is held; once lost, an error matching ErrLost that says why
// ("the local deadline passed ..."); after Unlock, ErrUnlocked. It checks the lease's local
// deadline on each call, so it is never later than Done().
func (le *Lease) Err() error {
	le.mu.RLock()
	defer le.mu.RUnlock()
	if le.l == nil {
		return le.ended
	}
	if C.distlock_lease_owns(le.l) != 0 {
		return nil
	}
	var e C.distlock_error
	if rc := C.distlock_lease_loss(le.l, &e); rc != C.DISTLOCK_OK {
		return cError(rc, &e)
	}
	// Not held, no loss reason: past its deadline a moment before the watchdog says why.
	return &Error{Code: ErrLost.Code, Message: "distlock: lease lost: its local deadline passed"}
}

// Remaining is the time left until the local deadline (0 once lost or unlocked; the largest
// Duration where leases do not expire, file://).
func (le *Lease) Remaining() time.Duration {
	le.mu.RLock()
	defer le.mu.RUnlock()
	if le.l == nil {
		return 0
	}
	left := int64(C.distlock_lease_remaining_ms(le.l))
	if left > math.MaxInt64/int64(time.Millisecond) {
		return time.Duration(math.MaxInt64) // file:// leases do not expire
	}
	return time.Duration(left) * time.Millisecond
}

// Unlock releases the lease: nil, ErrLost if it had been lost (nothing on the server is
// touched), ErrBackendUnavailable if the server could not be reached (the lease then expires
// by its TTL). A second Unlock returns ErrUnlocked. The release itself is bounded by the
// client's command timeout, not by ctx (a release is not abandoned half-way); an ended ctx
// still releases.
func (le *Lease) Unlock(ctx context.Context) error {
	_ = ctx
	le.mu.Lock()
	if le.l == nil {
		le.mu.Unlock()
		return ErrUnlocked
	}
	var e C.distlock_error
	err := cError(C.distlock_lease_release(le.l, &e), &e)
	le.freeLocked()
	le.mu.Unlock()
	return err
}

func (le *Lease) freeLocked() {
	if le.lostFile != nil {
		le.lostFile.Close() // ends the watcher
	}
	<-le.watcher
	C.distlock_lease_free(le.l)
	le.l = nil
	le.ended = ErrUnlocked
	le.doneOnce.Do(func() { close(le.done) })
}

// ---- semaphore, read-write lock, election --------------------------------------------------

// Semaphore is a counting semaphore: at most Permits holders of its name at once.
type Semaphore struct {
	c       *Client
	name    string
	permits int
}

// Semaphore returns the semaphore name with permits permits (1..1024; the count is stored by
// the first client, another count is ErrInvalidArgument on Acquire).
func (c *Client) Semaphore(name string, permits int) *Semaphore {
	return &Semaphore{c: c, name: name, permits: permits}
}

// Acquire takes one permit, waiting like Client.Lock.
func (s *Semaphore) Acquire(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return s.c.acquire(ctx, opts, func(h *C.distlock_client, o *C.distlock_lock_options, out **C.distlock_lease, e *C.distlock_error) C.int {
		return withName(s.name, func(n *C.char) C.int {
			return C.distlock_semaphore_acquire(h, n, C.int(s.permits), o, out, e)
		})
	})
}

// TryAcquire makes one attempt over every permit: ErrBusy when all are held.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return s.Acquire(ctx, append(opts, Wait(0))...)
}

// RWLock is a read-write lock: many readers or one writer.
type RWLock struct {
	c          *Client
	name       string
	maxReaders int
}

// RWLock returns the read-write lock name (maxReaders reader slots: 0 = the stored value, 32
// for a new lock).
func (c *Client) RWLock(name string, maxReaders int) *RWLock {
	return &RWLock{c: c, name: name, maxReaders: maxReaders}
}

func (rw *RWLock) acquire(ctx context.Context, exclusive int, opts []LockOption) (*Lease, error) {
	return rw.c.acquire(ctx, opts, func(h *C.distlock_client, o *C.distlock_lock_options, out **C.distlock_lease, e *C.distlock_error) C.int {
		return withName(rw.name, func(n *C.char) C.int {
			return C.distlock_rwlock_acquire(h, n, C.int(exclusive), C.int(rw.maxReaders), o, out, e)
		})
	})
}

// Lock takes it exclusively (a writer; Token is the writer's fencing token).
func (rw *RWLock) Lock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return rw.acquire(ctx, 1, opts)
}

// RLock takes it shared (a reader; no token).
func (rw *RWLock) RLock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return rw.acquire(ctx, 0, opts)
}

// Election is a leader election: the leader holds its lock; its term is its fencing token.
type Election struct {
	c    *Client
	name string
}

// Election returns the election name.
func (c *Client) Election(name string) *Election { return &Election{c: c, name: name} }

// Campaign waits (like Client.Lock) until the caller leads, proclaims value for its term and
// returns the leadership lease (Token() is the term). ErrLost, the lease given up, when a newer
// term's value was written before this one's (the lease was lost right after it was won).
func (el *Election) Campaign(ctx context.Context, value string, opts ...LockOption) (*Lease, error) {
	cvalue := C.CString(value)
	defer C.free(unsafe.Pointer(cvalue))
	return el.c.acquire(ctx, opts, func(h *C.distlock_client, o *C.distlock_lock_options, out **C.distlock_lease, e *C.distlock_error) C.int {
		return withName(el.name, func(n *C.char) C.int {
			return C.distlock_election_campaign(h, n, cvalue, o, out, e)
		})
	})
}

// Resign gives up leadership (ErrLost if it had been lost). The lease must be this
// election's; it is unlocked either way.
func (el *Election) Resign(ctx context.Context, leadership *Lease) error {
	_ = ctx
	h, err := el.c.enter()
	if err != nil {
		return err
	}
	defer el.c.leave()
	leadership.mu.Lock()
	defer leadership.mu.Unlock()
	if leadership.l == nil {
		return ErrUnlocked
	}
	var e C.distlock_error
	rc := withName(el.name, func(n *C.char) C.int { return C.distlock_election_resign(h, n, leadership.l, &e) })
	if rc == C.DISTLOCK_E_INVALID_ARGUMENT {
		return cError(rc, &e) // not this election's: left as it is
	}
	leadership.freeLocked()
	return cError(rc, &e)
}

// Leader is who leads an election, as read from the server.
type Leader struct {
	Value        string `json:"value"`
	Term         uint64 `json:"term"`
	Holder       string `json:"holder"`
	ValueKnown   bool   `json:"value_known"`
	TTLRemaining *int64 `json:"ttl_remaining_ms,omitempty"`
}

// Leader tells who leads now (nil: nobody).
func (el *Election) Leader(ctx context.Context) (*Leader, error) {
	_ = ctx
	var out *Leader
	err := el.c.jsonCall(func(h *C.distlock_client, s **C.char, e *C.distlock_error) C.int {
		return withName(el.name, func(n *C.char) C.int { return C.distlock_election_leader(h, n, s, e) })
	}, &out)
	return out, err
}

// Proclaim replaces the leader's value for its term. ErrNotOwner, and nothing written, when
// leadership is no longer held, or when the server finds a newer term's value already written
// (the lease was lost after the local check); ErrInvalidArgument when it is not this election's.
func (el *Election) Proclaim(ctx context.Context, leadership *Lease, value string) error {
	_ = ctx
	h, err := el.c.enter()
	if err != nil {
		return err
	}
	defer el.c.leave()
	leadership.mu.RLock() // not freed meanwhile
	defer leadership.mu.RUnlock()
	if leadership.l == nil {
		return ErrUnlocked
	}
	cvalue := C.CString(value)
	defer C.free(unsafe.Pointer(cvalue))
	var e C.distlock_error
	rc := withName(el.name, func(n *C.char) C.int {
		return C.distlock_election_proclaim(h, n, leadership.l, cvalue, &e)
	})
	return cError(rc, &e)
}

// Observe waits until it reads a leader whose term is greater than afterTerm (0: any leader;
// terms start at 1) and returns it. The wait ends with ctx (an error matching ctx.Err() and
// ErrCancelled) or, given Wait(d), after d with a nil Leader and no error; without either,
// the client's default wait (no limit). Calling it again with the term it returned gives
// leaders in strictly increasing term order; a leader that wins and goes between two calls
// is missed. ErrNotSupported on backends without fencing tokens (redlock://).
func (el *Election) Observe(ctx context.Context, afterTerm uint64, opts ...LockOption) (*Leader, error) {
	var after *C.uint64_t
	if afterTerm != 0 {
		after = (*C.uint64_t)(C.malloc(C.size_t(unsafe.Sizeof(C.uint64_t(0)))))
		defer C.free(unsafe.Pointer(after))
		*after = C.uint64_t(afterTerm)
	}
	var s *C.char
	err := el.c.wait(ctx, opts, func(h *C.distlock_client, o *C.distlock_lock_options, e *C.distlock_error) C.int {
		return withName(el.name, func(n *C.char) C.int { return C.distlock_election_observe(h, n, after, o, &s, e) })
	})
	if err != nil {
		return nil, err
	}
	defer C.distlock_string_free(s)
	var out *Leader
	if err := json.Unmarshal([]byte(C.GoString(s)), &out); err != nil {
		return nil, err
	}
	return out, nil
}

// ---- status, list ------------------------------------------------------------------------------

// LockInfo is what the backend knows about a lock (nil fields: not known).
type LockInfo struct {
	Held           bool    `json:"held"`
	Token          *uint64 `json:"token,omitempty"`
	TTLRemainingMs *int64  `json:"ttl_remaining_ms,omitempty"`
	Holder         *string `json:"holder,omitempty"`
	HolderInfo     *string `json:"holder_info,omitempty"`
	Waiters        *uint64 `json:"waiters,omitempty"`
	// Queue lists the waiters in the order the lock passes to them; nil where the backend
	// does not list its queue (file, postgres, mysql, redis+cluster, redlock).
	Queue []Waiter `json:"queue,omitempty"`
}

// Waiter is one client waiting in a lock's queue (LockInfo.Queue).
type Waiter struct {
	Position           uint64  `json:"position"` // 1: the lock goes to it next
	Owner              string  `json:"owner"`
	HolderInfo         *string `json:"holder_info,omitempty"`
	WaitingSinceUnixMs *int64  `json:"waiting_since_unix_ms,omitempty"` // nil: not recorded
}

// ListedLock is one held lock as List returns it.
type ListedLock struct {
	LockInfo
	Name    string  `json:"name"`
	Base    string  `json:"base"`
	Kind    string  `json:"kind"` // lock, semaphore_permit, rw_writer, rw_reader, election
	Display string  `json:"display"`
	Index   *uint32 `json:"index,omitempty"`
	Of      *uint32 `json:"of,omitempty"`
}

func (c *Client) jsonCall(call func(h *C.distlock_client, s **C.char, e *C.distlock_error) C.int, out interface{}) error {
	h, err := c.enter()
	if err != nil {
		return err
	}
	defer c.leave()
	var e C.distlock_error
	var s *C.char
	if rc := call(h, &s, &e); rc != C.DISTLOCK_OK {
		return cError(rc, &e)
	}
	defer C.distlock_string_free(s)
	return json.Unmarshal([]byte(C.GoString(s)), out)
}

// Status tells what the backend knows about name.
func (c *Client) Status(name string) (*LockInfo, error) {
	var info LockInfo
	err := c.jsonCall(func(h *C.distlock_client, s **C.char, e *C.distlock_error) C.int {
		return withName(name, func(n *C.char) C.int { return C.distlock_status_json(h, n, s, e) })
	}, &info)
	if err != nil {
		return nil, err
	}
	return &info, nil
}

// Revoke ends the lease of whoever holds name now (any process, any host) and passes the lock
// to the next waiter; the holder learns it at its next renewal (its loss reason is "revoked",
// with reason, 1 to 1024 bytes without control characters). It returns true when a lease was ended, false when the lock
// was free (not an error). ErrNotSupported where the backend cannot end another process's
// hold (file://, postgres://, mysql://). The next holder is granted once the revoked lease has
// run out on the server (at most one TTL): the two never overlap (docs/design.md "Revoke").
func (c *Client) Revoke(name, reason string) (bool, error) {
	h, err := c.enter()
	if err != nil {
		return false, err
	}
	defer c.leave()
	if strings.IndexByte(reason, 0) >= 0 {
		return false, &Error{Code: ErrInvalidArgument.Code, Message: "distlock: the revoke reason holds a NUL byte"}
	}
	creason := C.CString(reason)
	defer C.free(unsafe.Pointer(creason))
	var e C.distlock_error
	var revoked C.int
	rc := withName(name, func(n *C.char) C.int { return C.distlock_revoke(h, n, creason, &revoked, &e) })
	if rc != C.DISTLOCK_OK {
		return false, cError(rc, &e)
	}
	return revoked != 0, nil
}

// List returns the locks held now whose name starts with prefix, at most limit, and whether
// there were more. ErrNotSupported where the backend cannot list.
func (c *Client) List(prefix string, limit int) ([]ListedLock, bool, error) {
	var out struct {
		Locks     []ListedLock `json:"locks"`
		Truncated bool         `json:"truncated"`
	}
	err := c.jsonCall(func(h *C.distlock_client, s **C.char, e *C.distlock_error) C.int {
		return withName(prefix, func(p *C.char) C.int { return C.distlock_list_json(h, p, C.size_t(limit), s, e) })
	}, &out)
	return out.Locks, out.Truncated, err
}

// ---- ids -----------------------------------------------------------------------------------

// Snowflake issues snowflake ids with a worker id leased through the client.
type Snowflake struct {
	mu sync.Mutex
	g  *C.distlock_snowflake
}

// NewSnowflake leases a worker id in the id space prefix ("" is "default").
func (c *Client) NewSnowflake(prefix string) (*Snowflake, error) {
	h, err := c.enter()
	if err != nil {
		return nil, err
	}
	defer c.leave()
	var cp *C.char
	if prefix != "" {
		cp = C.CString(prefix)
		defer C.free(unsafe.Pointer(cp))
	}
	var e C.distlock_error
	var g *C.distlock_snowflake
	if rc := C.distlock_snowflake_new(h, cp, &g, &e); rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return &Snowflake{g: g}, nil
}

// Next returns the next id (ErrLost once the worker lease is lost).
func (s *Snowflake) Next() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.g == nil {
		return 0, ErrClosed
	}
	var e C.distlock_error
	var id C.uint64_t
	if rc := C.distlock_snowflake_next(s.g, &id, &e); rc != C.DISTLOCK_OK {
		return 0, cError(rc, &e)
	}
	return uint64(id), nil
}

// Close gives the worker id back.
func (s *Snowflake) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	C.distlock_snowflake_free(s.g)
	s.g = nil
	return nil
}

// RedisDaily issues the redis-daily scheme's ids (31 bits of seconds and a per-day counter
// kept on one Redis server), reserving a block of ids per round trip.
type RedisDaily struct {
	mu sync.Mutex
	g  *C.distlock_redis_daily
}

// NewRedisDaily connects to the Redis server redisURL (redis://...); prefix "" is "id";
// reserve is the ids taken per round trip (0 is 1).
func NewRedisDaily(redisURL, prefix string, reserve uint32) (*RedisDaily, error) {
	curl := C.CString(redisURL)
	defer C.free(unsafe.Pointer(curl))
	var cp *C.char
	if prefix != "" {
		cp = C.CString(prefix)
		defer C.free(unsafe.Pointer(cp))
	}
	var e C.distlock_error
	var g *C.distlock_redis_daily
	if rc := C.distlock_redis_daily_new(curl, cp, C.uint32_t(reserve), &g, &e); rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return &RedisDaily{g: g}, nil
}

// Next returns the next id: ids from one generator strictly increase; across generators on the
// same server and prefix they are unique (errors.Is ErrExhausted when a day's counter is full).
func (r *RedisDaily) Next() (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.g == nil {
		return 0, ErrClosed
	}
	var e C.distlock_error
	var id C.uint64_t
	if rc := C.distlock_redis_daily_next(r.g, &id, &e); rc != C.DISTLOCK_OK {
		return 0, cError(rc, &e)
	}
	return uint64(id), nil
}

// Close frees the generator (ids reserved and not issued are skipped).
func (r *RedisDaily) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	C.distlock_redis_daily_free(r.g)
	r.g = nil
	return nil
}

// Segment issues ids from a database segment (distlock::ids::SegmentGenerator; docs/ids.md):
// plain 1, 2, 3, ... from the row tag of the table distlock_segments in a PostgreSQL or
// MySQL/MariaDB database. It takes the range (max_id, max_id + step] in one committed
// transaction and hands it out from memory, taking the next range in the background when
// 10 % of the current one is left. Ids are unique across every generator and process of a tag
// and strictly increase within one generator; a generator that dies loses the rest of its range
// (gaps, never repeats). Next may be called from any number of goroutines at once.
type Segment struct {
	mu sync.RWMutex // Next holds it shared, Close exclusively
	g  *C.distlock_segment
}

// NewSegment connects to url (postgres://, postgresql:// or mysql://, with an optional
// ?timeout=DUR), creates the table if it is missing and takes the first range of tag.
// step is the ids per range (one round trip each), in [0, 1e9]; 0 takes the row's step column
// (1000 for a row this generator creates). Errors (errors.Is): ErrInvalidArgument (tag, step),
// ErrInvalidURL (not a database URL), ErrAuthFailed, ErrBackendUnavailable (no server within the
// timeouts); the message is the C++ API's and never holds the password.
func NewSegment(url, tag string, step int64) (*Segment, error) {
	curl := C.CString(url)
	defer C.free(unsafe.Pointer(curl))
	ctag := C.CString(tag)
	defer C.free(unsafe.Pointer(ctag))
	var e C.distlock_error
	var g *C.distlock_segment
	if rc := C.distlock_segment_new(curl, ctag, C.int64_t(step), &g, &e); rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return &Segment{g: g}, nil
}

// Next returns the next id (>= 1). It waits for the database only when the range is used up
// and the next one has not arrived; then ErrBackendUnavailable or ErrAuthFailed when that range
// cannot be taken (the next call tries again), ErrExhausted past 2^63 - 1, ErrForked in a child
// after fork(), ErrClosed after Close.
func (s *Segment) Next() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.g == nil {
		return 0, ErrClosed
	}
	var e C.distlock_error
	var id C.uint64_t
	if rc := C.distlock_segment_next(s.g, &id, &e); rc != C.DISTLOCK_OK {
		return 0, cError(rc, &e)
	}
	return uint64(id), nil
}

// SetStep sets the ids per range from the next range taken on (0: the row's step column).
// ErrInvalidArgument outside [0, 1e9] (nothing changes), ErrClosed after Close.
func (s *Segment) SetStep(step int64) error {
	s.mu.Lock() // one SetStep at a time (Next waits for it: it only stores the value)
	defer s.mu.Unlock()
	if s.g == nil {
		return ErrClosed
	}
	var e C.distlock_error
	if rc := C.distlock_segment_set_step(s.g, C.int64_t(step), &e); rc != C.DISTLOCK_OK {
		return cError(rc, &e)
	}
	return nil
}

// Close stops the background fetch and closes the connection (waiting for a Next in progress);
// the rest of the range is lost, never issued by anyone. A second Close does nothing.
func (s *Segment) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	C.distlock_segment_free(s.g)
	s.g = nil
	return nil
}

// UUID7 returns a UUIDv7 in canonical text, strictly increasing within the process.
func UUID7() (string, error) {
	var buf [37]C.char
	var e C.distlock_error
	if rc := C.distlock_uuid7(&buf[0], &e); rc != C.DISTLOCK_OK {
		return "", cError(rc, &e)
	}
	return C.GoString(&buf[0]), nil
}
