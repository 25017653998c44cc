package distlock

// Shard groups: one job split into M shards run by several members at once, each shard owned
// by exactly one live member, rebalanced as members join, leave or die (docs/sharding.md).
// Over the C API's distlock_shard_group_* (include/distlock/distlock.h).

/*
#include <stdlib.h>
#include <fcntl.h>
#include <poll.h>
#include "distlock/distlock.h"

static int distlock_go_shard_readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}
static int distlock_go_shard_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"
)

type shardConfig struct {
	ttl, maxHold, period *time.Duration
	memberID, info       *string
}

// ShardGroupOption configures Client.ShardGroup.
type ShardGroupOption func(*shardConfig)

// ShardTTL is the lease length of the membership and of each shard (default: the client's).
func ShardTTL(d time.Duration) ShardGroupOption { return func(c *shardConfig) { c.ttl = &d } }

// ShardMaxHold bounds one hold of a shard (default: none).
func ShardMaxHold(d time.Duration) ShardGroupOption { return func(c *shardConfig) { c.maxHold = &d } }

// RebalancePeriod is the member's re-plan and retry period (default 1 s; 10 ms .. 1 h).
// A member that watches its group (redis, redis+sentinel, etcd, zk, postgres) rebalances
// at the watches' events; once a period it re-plans from its view (no round trip) to retry
// a failed rejoin or acquisition, and it re-lists the group every max(100 periods, 30 s).
// Elsewhere (file, mysql, redis+cluster, redlock), or while a watch could not be started,
// it lists the group once a period: a join or a death is then noticed within one period
// (a death after its TTL). See docs/sharding.md.
func RebalancePeriod(d time.Duration) ShardGroupOption { return func(c *shardConfig) { c.period = &d } }

// MemberID is this member's id: 1..64 bytes of [A-Za-z0-9_.-], unique in the group (default
// "<client id>-<n>").
func MemberID(id string) ShardGroupOption { return func(c *shardConfig) { c.memberID = &id } }

// MemberInfo describes the member for status and list (printable ASCII without '|').
func MemberInfo(s string) ShardGroupOption { return func(c *shardConfig) { c.info = &s } }

// ShardGroup is a member of a shard group (Client.ShardGroup). All methods may be called from
// any goroutine. Leave it when done.
type ShardGroup struct {
	mu       sync.Mutex
	g        *C.distlock_shard_group
	calls    int
	left     bool
	job      string
	memberID string

	// One watcher per shard ownership (one acquisition of a shard), shared by every
	// assignment that lists it: a member that reads its assignment after each change keeps
	// one goroutine and one descriptor per owned shard, not one per shard per read (they
	// lived until the shard was lost). Keyed by distlock_shard_assignment_ownership; an entry
	// goes when its watcher sees the shard stop.
	watchMu sync.Mutex
	watches map[uint64]*shardWatch
}

// ShardGroup joins the shard group job of shards (1..65536) shards: it takes the membership
// lock and starts the member's thread; the shards come in the background (Assigned,
// WaitChange). Errors: ErrInvalidArgument (an empty or bad job name, a shard count outside
// 1..65536, a bad option or member id), ErrBusy (the member id is in use), ErrNotSupported (the
// backend cannot list its locks), and an error matching ctx.Err() if ctx already ended. The
// group outlives the client: closing the client does not leave it.
func (c *Client) ShardGroup(ctx context.Context, job string, shards int, opts ...ShardGroupOption) (*ShardGroup, error) {
	if err := ctx.Err(); err != nil {
		return nil, &ctxError{ctx: err, inner: ErrCancelled}
	}
	if shards < 1 || shards > 65536 {
		return nil, &Error{Code: ErrInvalidArgument.Code, Message: fmt.Sprintf("distlock: shard group: shards %d is outside 1..65536", shards)}
	}
	var cfg shardConfig
	for _, o := range opts {
		o(&cfg)
	}
	var o C.distlock_shard_group_options
	C.distlock_shard_group_options_init(&o)
	if cfg.ttl != nil {
		o.ttl_ms = ms(*cfg.ttl)
	}
	if cfg.maxHold != nil {
		o.max_hold_ms = ms(*cfg.maxHold)
	}
	if cfg.period != nil {
		o.rebalance_period_ms = ms(*cfg.period)
	}
	if cfg.memberID != nil {
		o.member_id = C.CString(*cfg.memberID)
		defer C.free(unsafe.Pointer(o.member_id))
	}
	if cfg.info != nil {
		o.info = C.CString(*cfg.info)
		defer C.free(unsafe.Pointer(o.info))
	}
	h, err := c.enter()
	if err != nil {
		return nil, err
	}
	defer c.leave()
	cjob := C.CString(job)
	defer C.free(unsafe.Pointer(cjob))
	var e C.distlock_error
	var g *C.distlock_shard_group
	if rc := C.distlock_shard_group_join(h, cjob, C.uint32_t(shards), &o, &g, &e); rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return &ShardGroup{g: g, job: job, memberID: C.GoString(C.distlock_shard_group_member_id(g))}, nil
}

func (sg *ShardGroup) errLeft() error {
	return &Error{Code: ErrNotOwner.Code, Message: fmt.Sprintf("distlock: shard group %q: this member (%s) has left the group", sg.job, sg.memberID)}
}

// enter counts a call in flight (Leave frees the handle after the last one).
func (sg *ShardGroup) enter() (*C.distlock_shard_group, error) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.left {
		return nil, sg.errLeft()
	}
	sg.calls++
	return sg.g, nil
}

func (sg *ShardGroup) exit() {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	sg.calls--
	if sg.left && sg.calls == 0 && sg.g != nil {
		C.distlock_shard_group_free(sg.g)
		sg.g = nil
	}
}

// MemberID is this member's id (the option's, or the generated one).
func (sg *ShardGroup) MemberID() string { return sg.memberID }

// Job is the group's name.
func (sg *ShardGroup) Job() string { return sg.job }

// Assigned is what this member owns now. After Leave, an error matching ErrNotOwner.
func (sg *ShardGroup) Assigned() (*ShardAssignment, error) {
	h, err := sg.enter()
	if err != nil {
		return nil, err
	}
	defer sg.exit()
	var e C.distlock_error
	var a *C.distlock_shard_assignment
	if rc := C.distlock_shard_group_assigned(h, &a, &e); rc != C.DISTLOCK_OK {
		return nil, cError(rc, &e)
	}
	return sg.newAssignment(a), nil
}

// WaitChange waits until the assignment's version is greater than afterVersion and returns
// it. It ends with an error matching ctx.Err() (and ErrCancelled) when ctx ends first, and one
// matching ErrNotOwner when the member leaves (before or during the wait).
func (sg *ShardGroup) WaitChange(ctx context.Context, afterVersion uint64) (*ShardAssignment, error) {
	if err := ctx.Err(); err != nil {
		return nil, &ctxError{ctx: err, inner: ErrCancelled}
	}
	h, err := sg.enter()
	if err != nil {
		return nil, err
	}
	defer sg.exit()
	var e C.distlock_error
	var cancel *C.distlock_cancel
	if ctx.Done() != nil {
		if rc := C.distlock_cancel_new(&cancel, &e); rc != C.DISTLOCK_OK {
			return nil, cError(rc, &e)
		}
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
	var a *C.distlock_shard_assignment
	if rc := C.distlock_shard_group_wait_change(h, C.uint64_t(afterVersion), -1, cancel, &a, &e); rc != C.DISTLOCK_OK {
		return nil, fromContext(ctx, cError(rc, &e))
	}
	return sg.newAssignment(a), nil
}

// Leave closes every owned shard's Lost channel, releases every shard and the membership at
// once and stops the member's thread; a WaitChange in progress ends with ErrNotOwner.
// Idempotent; a failed release is left to the TTL.
func (sg *ShardGroup) Leave() {
	sg.mu.Lock()
	if sg.left {
		sg.mu.Unlock()
		return
	}
	sg.left = true
	g := sg.g
	sg.calls++ // the handle stays until this call and those in flight end
	sg.mu.Unlock()
	C.distlock_shard_group_leave(g)
	sg.exit()
}

// ShardAssignment is what a member owns as of one moment.
type ShardAssignment struct {
	// Version grows by one at every change; 0 before the first assignment.
	Version uint64
	// Members is the number of live members at the last rebalance.
	Members int
	// Shards, sorted by index.
	Shards []OwnedShard
}

// Indexes are the owned shards' indexes, in order.
func (a *ShardAssignment) Indexes() []int {
	out := make([]int, len(a.Shards))
	for i, s := range a.Shards {
		out[i] = s.Index
	}
	return out
}

// OwnedShard is one shard a member owns.
type OwnedShard struct {
	// Index is 0 .. shards-1.
	Index int
	// Token is the shard lock's fencing token (strictly increasing per shard across owners):
	// pass it to every write the shard makes. 0 when HasToken is false.
	Token    uint64
	HasToken bool
	w        *shardWatch
}

// Lost is closed once this member no longer owns the shard: given up for a rebalance or
// Leave, or its lease lost (at the conservative local deadline, before anyone else can own it).
// Every assignment that lists the same ownership of a shard gives the same channel.
func (s OwnedShard) Lost() <-chan struct{} { return s.w.lost }

// Owns reports whether this member still owns the shard: its lease is held, its conservative
// local deadline has not passed and it was not given up. Read on each call against the
// deadline as renewals move it, so never late: it can turn false before Lost is closed (the
// client's watchdog thread closes that, late in a starved process). Call it right before a
// write that cannot carry the token.
func (s OwnedShard) Owns() bool { return s.w.h.owns(s.w.pos) }

// shardWatch is the watcher of one shard ownership: a goroutine that waits in Go's poller for
// the shard's stop descriptor (a duplicate, never read) of the C assignment h, at position pos,
// and then closes lost.
type shardWatch struct {
	lost chan struct{}
	h    *assignmentHandle
	pos  int
}

// assignmentHandle keeps a C assignment while a reader needs it: while a watcher started from
// it waits (its stop callbacks write the descriptors) and while an OwnedShard reads owns()
// through it. It is freed when the last watcher started from it has seen its shard stop (owns
// is false from then on anyway), or at once when it started none.
type assignmentHandle struct {
	mu      sync.Mutex
	a       *C.distlock_shard_assignment
	pending int
}

func (h *assignmentHandle) owns(pos int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.a == nil {
		return false // freed: every shard watched from it had stopped
	}
	return C.distlock_shard_assignment_owns(h.a, C.size_t(pos)) != 0
}

func (h *assignmentHandle) done() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending--
	if h.pending == 0 && h.a != nil {
		C.distlock_shard_assignment_free(h.a)
		h.a = nil
	}
}

// stopped is a watch whose shard stopped before it could be watched.
var stopped = func() *shardWatch {
	w := &shardWatch{lost: make(chan struct{}), h: &assignmentHandle{}}
	close(w.lost)
	return w
}()

func (sg *ShardGroup) newAssignment(a *C.distlock_shard_assignment) *ShardAssignment {
	h := &assignmentHandle{a: a}
	out := &ShardAssignment{
		Version: uint64(C.distlock_shard_assignment_version(a)),
		Members: int(C.distlock_shard_assignment_members(a)),
	}
	n := int(C.distlock_shard_assignment_count(a))
	h.mu.Lock() // no watcher frees a before every shard is looked at
	for i := 0; i < n; i++ {
		var s C.distlock_owned_shard
		var e C.distlock_error
		// Fills index and token; opens this assignment's descriptor for the shard, which a
		// shared watch does not use (closed with the assignment, freed below when no watcher
		// started from it). A failure to open it (out of descriptors) leaves the shard read
		// as lost (Lost closed, Owns false), never as owned without a signal.
		rc := C.distlock_shard_assignment_shard(a, C.size_t(i), &s, &e)
		id := uint64(C.distlock_shard_assignment_ownership(a, C.size_t(i)))
		sg.watchMu.Lock()
		w := sg.watches[id]
		if w == nil || id == 0 {
			w = stopped
			// Wait for the shard's descriptor in Go's poller, on a duplicate (never read).
			if rc == C.DISTLOCK_OK {
				if fd := int(C.distlock_go_shard_dup(s.stopped_fd)); fd >= 0 {
					w = &shardWatch{lost: make(chan struct{}), h: h, pos: i}
					h.pending++
					if id != 0 {
						if sg.watches == nil {
							sg.watches = make(map[uint64]*shardWatch)
						}
						sg.watches[id] = w
					}
					go sg.watchStopped(os.NewFile(uintptr(fd), "distlock-shard-stopped"), w, id)
				}
			}
		}
		sg.watchMu.Unlock()
		out.Shards = append(out.Shards, OwnedShard{Index: int(s.index), Token: uint64(s.token),
			HasToken: s.has_token != 0, w: w})
	}
	if h.pending == 0 {
		C.distlock_shard_assignment_free(a)
		h.a = nil
	}
	h.mu.Unlock()
	return out
}

func (sg *ShardGroup) watchStopped(f *os.File, w *shardWatch, id uint64) {
	defer w.h.done()
	defer f.Close()
	raw, err := f.SyscallConn()
	if err == nil {
		err = raw.Read(func(fd uintptr) bool { return C.distlock_go_shard_readable(C.int(fd)) != 0 })
	}
	sg.watchMu.Lock()
	if id != 0 && sg.watches[id] == w {
		delete(sg.watches, id)
	}
	sg.watchMu.Unlock()
	if err == nil {
		close(w.lost)
	}
}
