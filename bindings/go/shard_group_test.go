package distlock_test

// Shard groups (Client.ShardGroup, docs/sharding.md) on every backend of the build (file://,
// and redis:// / etcd:// from with_servers): two members split the shards evenly, disjoint and
// covering all, each with the token its lock shows; one leaves and the other owns everything
// within period + 1.5 s (measured with time.Since, Go's monotonic clock); a shard whose lock is
// taken away on the server is signalled on its Lost channel; bad input and a left group get
// clear errors.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"distlock.dev/distlock"
)

const (
	shardTTL    = 2 * time.Second
	shardPeriod = 100 * time.Millisecond
	// One rebalance period plus the round trips of a list, a release and an acquisition on a
	// loaded 2-core machine (docs/sharding.md).
	leaveBound = shardPeriod + 1500*time.Millisecond
)

func join(t *testing.T, c *distlock.Client, job string, shards int, id string) *distlock.ShardGroup {
	t.Helper()
	g, err := c.ShardGroup(context.Background(), job, shards, distlock.ShardTTL(shardTTL),
		distlock.RebalancePeriod(shardPeriod), distlock.MemberID(id))
	if err != nil {
		t.Fatalf("ShardGroup(%s): %v", id, err)
	}
	t.Cleanup(g.Leave)
	return g
}

// waitFor returns the first assignment of g for which pred holds, waiting on its changes until
// the timeout; the last one read otherwise.
func waitFor(t *testing.T, g *distlock.ShardGroup, timeout time.Duration, pred func(*distlock.ShardAssignment) bool) *distlock.ShardAssignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a, err := g.Assigned()
	if err != nil {
		t.Fatalf("Assigned: %v", err)
	}
	for !pred(a) {
		next, err := g.WaitChange(ctx, a.Version)
		if errors.Is(err, context.DeadlineExceeded) {
			return a
		}
		if err != nil {
			t.Fatalf("WaitChange: %v", err)
		}
		a = next
	}
	return a
}

func tokens(a *distlock.ShardAssignment) map[int]uint64 {
	out := map[int]uint64{}
	for _, s := range a.Shards {
		out[s.Index] = s.Token
	}
	return out
}

func TestShardGroupTwoMembersSplitEvenlyAndALeaveHandsOver(t *testing.T) {
	const m = 8
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			ca, cb := connect(t, b.url), connect(t, b.url)
			a, bm := join(t, ca, "reindex", m, "a"), join(t, cb, "reindex", m, "b")
			half := func(x *distlock.ShardAssignment) bool { return len(x.Shards) == m/2 && x.Members == 2 }
			var sa, sb *distlock.ShardAssignment
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
				sa, sb = waitFor(t, a, 5*time.Second, half), waitFor(t, bm, 5*time.Second, half)
				if half(sa) && half(sb) {
					break
				}
			}
			if !half(sa) || !half(sb) {
				t.Fatalf("not split evenly: a %v, b %v", sa.Indexes(), sb.Indexes())
			}
			ta, tb := tokens(sa), tokens(sb)
			all := map[int]bool{}
			for i := range ta {
				all[i] = true
			}
			for i := range tb {
				if _, dup := ta[i]; dup {
					t.Fatalf("shard %d owned by both members", i)
				}
				all[i] = true
			}
			if len(all) != m {
				t.Fatalf("shards owned: %v and %v", sa.Indexes(), sb.Indexes())
			}
			for _, s := range append(append([]distlock.OwnedShard{}, sa.Shards...), sb.Shards...) {
				if !s.HasToken || !s.Owns() {
					t.Fatalf("shard %d: token %v, owns %v", s.Index, s.HasToken, s.Owns())
				}
				st, err := ca.Status(fmt.Sprintf("reindex/shard/%d", s.Index))
				if err != nil {
					t.Fatal(err)
				}
				if st.Token == nil || *st.Token != s.Token {
					t.Fatalf("shard %d: token %d, the lock shows %+v", s.Index, s.Token, st)
				}
			}

			leftAt := time.Now()
			bm.Leave()
			for _, s := range sb.Shards { // stopped by the time Leave returns
				if s.Owns() {
					t.Fatalf("shard %d still owned by b after Leave", s.Index)
				}
				select {
				case <-s.Lost():
				case <-time.After(2 * time.Second):
					t.Fatalf("shard %d: Lost not closed within 2 s of Leave", s.Index)
				}
			}
			whole := waitFor(t, a, 10*time.Second, func(x *distlock.ShardAssignment) bool { return len(x.Shards) == m })
			took := time.Since(leftAt)
			t.Logf("[%s] a leave was balanced in %v (bound %v)", b.kind, took, leaveBound)
			if len(whole.Shards) != m {
				t.Fatalf("a owns %v after b left", whole.Indexes())
			}
			if took > leaveBound {
				t.Fatalf("a leave was balanced in %v, over the bound %v", took, leaveBound)
			}
			tw := tokens(whole)
			for i, tok := range tb {
				if tw[i] <= tok {
					t.Fatalf("shard %d: token %d after b's %d", i, tw[i], tok)
				}
			}
			for i, tok := range ta {
				if tw[i] != tok {
					t.Fatalf("shard %d moved from a (token %d -> %d): not sticky", i, tok, tw[i])
				}
			}
			if _, err := bm.Assigned(); !errors.Is(err, distlock.ErrNotOwner) || !strings.Contains(err.Error(), "has left the group") {
				t.Fatalf("Assigned after Leave: %v", err)
			}
		})
	}
}

func TestShardGroupBadInputAndALeftGroupGetClearErrors(t *testing.T) {
	c := connect(t, "file://"+t.TempDir())
	ctx := context.Background()
	cases := []struct {
		job    string
		shards int
		opts   []distlock.ShardGroupOption
		want   string
	}{
		{"jobs", 0, nil, "shards 0"},
		{"jobs", -1, nil, "shards -1"},
		{"", 4, nil, "job name is empty"},
		{"jobs", 4, []distlock.ShardGroupOption{distlock.MemberID("no spaces")}, "member_id"},
		{"jobs", 4, []distlock.ShardGroupOption{distlock.RebalancePeriod(time.Millisecond)}, "rebalance_period"},
	}
	for _, tc := range cases {
		_, err := c.ShardGroup(ctx, tc.job, tc.shards, tc.opts...)
		if !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("ShardGroup(%q, %d): %v, want ErrInvalidArgument naming %q", tc.job, tc.shards, err, tc.want)
		}
	}
	g := join(t, c, "jobs", 4, "m1")
	if _, err := c.ShardGroup(ctx, "jobs", 4, distlock.MemberID("m1")); !errors.Is(err, distlock.ErrBusy) {
		t.Fatalf("the same member id twice: %v, want ErrBusy", err)
	}
	full := waitFor(t, g, 10*time.Second, func(x *distlock.ShardAssignment) bool { return len(x.Shards) == 4 })
	if len(full.Shards) != 4 {
		t.Fatalf("the only member owns %v", full.Indexes())
	}
	// Nothing changes: the context's deadline ends the wait.
	start := time.Now() // before the deadline is set: the wait cannot end before start + 150 ms
	short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	if _, err := g.WaitChange(short, full.Version); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, distlock.ErrCancelled) {
		t.Fatalf("WaitChange past its deadline: %v", err)
	}
	if time.Since(start) < 150*time.Millisecond || time.Since(start) > 2*time.Second {
		t.Fatalf("WaitChange ended after %v, want 150 ms .. 2 s", time.Since(start))
	}
	// A wait in progress ends when another goroutine leaves.
	done := make(chan error, 1)
	go func() {
		_, err := g.WaitChange(context.Background(), full.Version)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // lets the wait start; the result is the same if it has not
	g.Leave()
	select {
	case err := <-done:
		if !errors.Is(err, distlock.ErrNotOwner) {
			t.Fatalf("WaitChange across Leave: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitChange did not end within 5 s of Leave")
	}
	for _, s := range full.Shards {
		select {
		case <-s.Lost():
		case <-time.After(2 * time.Second):
			t.Fatalf("shard %d: Lost not closed after Leave", s.Index)
		}
	}
	g.Leave() // idempotent
}

// redisDel runs DEL key on the test server over a plain connection; returns the count.
func redisDel(t *testing.T, key string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+os.Getenv("DISTLOCK_TEST_REDIS_PORT"), 2*time.Second)
	if err != nil {
		t.Fatalf("cannot reach redis: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n", len(key), key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("DEL: %v", err)
	}
	return strings.TrimSpace(line)
}

// A shard whose lock is taken away on the server (its key deleted, as a server-side expiry
// would) is signalled: its renewal is refused and Lost is closed within TTL + 1 s, and the member
// owns it again later with a larger token.
func TestShardGroupAShardWhoseLockIsGoneOnTheServerIsSignalled(t *testing.T) {
	base := redisURL(t)
	prefix := fmt.Sprintf("goshardloss%d", os.Getpid())
	c := connect(t, base+"?prefix="+prefix)
	g := join(t, c, "etl", 2, "solo")
	both := waitFor(t, g, 10*time.Second, func(x *distlock.ShardAssignment) bool { return len(x.Shards) == 2 })
	if len(both.Shards) != 2 {
		t.Fatalf("owns %v", both.Indexes())
	}
	s0 := both.Shards[0]
	if got := redisDel(t, prefix+":{etl/shard/0}"); got != ":1" {
		t.Fatalf("DEL the shard's key: %q", got)
	}
	deleted := time.Now()
	select {
	case <-s0.Lost():
		t.Logf("[redis] a shard whose lock was deleted was signalled in %v", time.Since(deleted))
	case <-time.After(shardTTL + time.Second):
		t.Fatalf("shard 0 not signalled within %v", shardTTL+time.Second)
	}
	if s0.Owns() || !both.Shards[1].Owns() {
		t.Fatalf("after the loss: shard 0 owns %v, shard 1 owns %v", s0.Owns(), both.Shards[1].Owns())
	}
	again := waitFor(t, g, 10*time.Second, func(x *distlock.ShardAssignment) bool {
		return len(x.Shards) == 2 && x.Shards[0].Token != s0.Token
	})
	if len(again.Shards) != 2 || again.Shards[0].Token <= s0.Token {
		t.Fatalf("shard 0 not owned again with a larger token: %+v", again.Shards)
	}
}

// Owns is never late: once the server froze (SIGSTOP: renewals go unanswered), the last renewal
// that can have been confirmed was sent before the freeze, so the shard's local deadline is at
// most freeze + TTL. Every call that starts at or after that must be false, whenever the
// watchdog closes Lost. Read every ~1 ms until freeze + TTL + 300 ms on Go's monotonic clock
// (the library's CLOCK_BOOTTIME runs at the same rate).
func TestShardGroupOwnsIsFalseFromTheShardsDeadlineOnWhenTheServerFreezes(t *testing.T) {
	base := redisURL(t)
	pid, err := strconv.Atoi(os.Getenv("DISTLOCK_TEST_REDIS_PID"))
	if err != nil {
		t.Fatalf("DISTLOCK_TEST_REDIS_PID is not set (run through with_servers --redis): %v", err)
	}
	c := connect(t, base+fmt.Sprintf("?prefix=goshardfreeze%d", os.Getpid()))
	g := join(t, c, "etl", 1, "solo")
	one := waitFor(t, g, 10*time.Second, func(x *distlock.ShardAssignment) bool { return len(x.Shards) == 1 })
	if len(one.Shards) != 1 {
		t.Fatalf("owns %v", one.Indexes())
	}
	s0 := one.Shards[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the server: %v", err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer thaw()
	frozen := time.Now()
	bound := frozen.Add(shardTTL)
	var firstFalse time.Duration = -1
	after, late := 0, 0
	for {
		start := time.Now()
		if !start.Before(bound.Add(300 * time.Millisecond)) {
			break
		}
		owns := s0.Owns()
		if !owns && firstFalse < 0 {
			firstFalse = start.Sub(frozen)
		}
		if !start.Before(bound) {
			after++
			if owns {
				late++
			}
		}
		time.Sleep(time.Millisecond)
	}
	thaw()
	if firstFalse < 0 {
		t.Fatal("Owns never turned false after the server froze")
	}
	t.Logf("[redis] Owns turned false %v after the server froze (bound: TTL %v); %d reads after the bound",
		firstFalse, shardTTL, after)
	if after == 0 || late != 0 {
		t.Fatalf("%d of %d reads past the shard's latest possible local deadline answered true", late, after)
	}
	if s0.Owns() {
		t.Fatal("Owns is true after the loop")
	}
}

// The example of docs/go.md and docs/sharding.md: one member of the group "reindex" of 4 shards,
// alone, owns all four; Leave closes each shard's Lost channel.
func ExampleClient_ShardGroup() {
	dir, _ := os.MkdirTemp("", "distlock-example")
	defer os.RemoveAll(dir)
	client, err := distlock.Connect("file://" + dir) // or "redis://127.0.0.1:6379", ...
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	member, err := client.ShardGroup(ctx, "reindex", 4, distlock.ShardTTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Wait until this member owns its share (here: all four, it is alone).
	now, err := member.Assigned()
	for err == nil && len(now.Shards) < 4 {
		now, err = member.WaitChange(ctx, now.Version)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range now.Shards {
		// Each shard's work: stop at <-s.Lost(); pass s.Token to every write.
		fmt.Println("shard", s.Index, "fenced:", s.HasToken)
	}
	member.Leave()
	lost := 0
	for _, s := range now.Shards {
		<-s.Lost()
		lost++
	}
	fmt.Println("released", lost)
	// Output:
	// shard 0 fenced: true
	// shard 1 fenced: true
	// shard 2 fenced: true
	// shard 3 fenced: true
	// released 4
}

// openFDs counts this process's open descriptors (/proc/self/fd).
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(entries)
}

// A member that reads its assignment again and again (a poll loop, or WaitChange after each of
// many rebalances) while it keeps its shards holds one watcher per owned shard: 500 reads of 8
// owned shards add no goroutine and no descriptor that outlives the read (before, each read
// added a goroutine and two descriptors per shard until the shard was lost: 4,000 and 8,000
// here). Every read's Lost is the same channel for the same ownership, and it still closes when
// the shard is lost (Leave).
func TestShardGroupReadingTheAssignmentAgainAddsNoWatcherPerRead(t *testing.T) {
	const m, reads = 8, 500
	c := connect(t, "file://"+t.TempDir())
	g := join(t, c, "poll", m, "solo")
	first := waitFor(t, g, 10*time.Second, func(x *distlock.ShardAssignment) bool { return len(x.Shards) == m })
	if len(first.Shards) != m {
		t.Fatalf("owns %v, want all %d", first.Indexes(), m)
	}
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	var last *distlock.ShardAssignment
	for i := 0; i < reads; i++ {
		a, err := g.Assigned()
		if err != nil {
			t.Fatalf("Assigned: %v", err)
		}
		if a.Version != first.Version || len(a.Shards) != m {
			t.Fatalf("read %d: version %d (first %d), shards %v: the assignment changed under a lone member",
				i, a.Version, first.Version, a.Indexes())
		}
		for k, s := range a.Shards {
			if s.Lost() != first.Shards[k].Lost() {
				t.Fatalf("read %d: shard %d has a Lost channel of its own for the same ownership", i, s.Index)
			}
			if !s.Owns() {
				t.Fatalf("read %d: shard %d does not read as owned", i, s.Index)
			}
		}
		last = a
	}
	if d := runtime.NumGoroutine() - goroutines; d > 2 {
		t.Errorf("%d reads added %d goroutines (one watcher per shard per read?)", reads, d)
	}
	if d := openFDs(t) - fds; d > 2 {
		t.Errorf("%d reads left %d more descriptors open", reads, d)
	}
	g.Leave()
	for _, s := range last.Shards {
		select {
		case <-s.Lost():
		case <-time.After(5 * time.Second):
			t.Fatalf("shard %d: Lost not closed within 5 s of Leave", s.Index)
		}
		if s.Owns() {
			t.Fatalf("shard %d still reads as owned after Leave", s.Index)
		}
	}
}
