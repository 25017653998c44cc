package distlock_test

// The Go module's contract (issue 29 §3 and §4) against real servers (servers_test.go).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"distlock.dev/distlock"
)

// TestMain doubles as the helper processes of the hammer and the loss tests.
func TestMain(m *testing.M) {
	switch os.Getenv("DISTLOCK_GO_HELPER") {
	case "hammer":
		os.Exit(hammerProcess())
	case "hold":
		os.Exit(holdProcess())
	}
	os.Exit(m.Run())
}

func connect(t *testing.T, url string, opts ...distlock.Option) *distlock.Client {
	t.Helper()
	c, err := distlock.Connect(url, opts...)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestBadInputGetsTheLibrarysErrorsAndNoPassword(t *testing.T) {
	_, err := distlock.Connect("nosuch://127.0.0.1:1")
	if !errors.Is(err, distlock.ErrInvalidURL) || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("unknown scheme: %v", err)
	}
	_, err = distlock.Connect("redis://alice:s3cr3tpw@127.0.0.1:notaport")
	if !errors.Is(err, distlock.ErrInvalidURL) || strings.Contains(err.Error(), "s3cr3tpw") {
		t.Fatalf("bad URL: %v", err)
	}
	ctx := context.Background()
	c, err := distlock.Connect("redis://alice:s3cr3tpw@127.0.0.1:1", distlock.WithTimeouts(300*time.Millisecond, 300*time.Millisecond))
	if err == nil {
		_, err = c.TryLock(ctx, "x")
		c.Close()
	}
	if !errors.Is(err, distlock.ErrBackendUnavailable) || strings.Contains(err.Error(), "s3cr3tpw") {
		t.Fatalf("unreachable server: %v", err)
	}
	client := connect(t, "file://"+t.TempDir())
	if _, err := client.Lock(ctx, ""); !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "name") {
		t.Fatalf("empty name: %v", err)
	}
	for _, ttl := range []time.Duration{0, -5 * time.Millisecond} {
		if _, err := client.Lock(ctx, "x", distlock.TTL(ttl)); !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "ttl") {
			t.Fatalf("ttl %v: %v", ttl, err)
		}
	}
	if errors.Is(distlock.ErrBusy, distlock.ErrTimeout) {
		t.Fatal("distinct codes must not match")
	}
}

func TestLockTryLockTokenStatusAndUnlock(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			ctx := context.Background()
			a, other := connect(t, b.url), connect(t, b.url)
			lease, err := a.Lock(ctx, "orders/42", distlock.TTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if lease.Err() != nil || lease.Remaining() <= 0 || !lease.HasToken() {
				t.Fatalf("held lease: err %v remaining %v token %v", lease.Err(), lease.Remaining(), lease.HasToken())
			}
			select {
			case <-lease.Done():
				t.Fatal("Done closed while held")
			default:
			}
			if _, err := other.TryLock(ctx, "orders/42"); !errors.Is(err, distlock.ErrBusy) {
				t.Fatalf("TryLock while held: %v", err)
			}
			start := time.Now()
			if _, err := other.Lock(ctx, "orders/42", distlock.Wait(150*time.Millisecond)); !errors.Is(err, distlock.ErrTimeout) || time.Since(start) < 150*time.Millisecond {
				t.Fatalf("Lock with Wait(150ms): %v after %v", err, time.Since(start))
			}
			info, err := other.Status("orders/42")
			if err != nil || !info.Held || info.Token == nil || *info.Token != lease.Token() {
				t.Fatalf("Status: %+v %v", info, err)
			}
			if err := lease.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			<-lease.Done() // closed by Unlock too
			if !errors.Is(lease.Err(), distlock.ErrUnlocked) || !errors.Is(lease.Unlock(ctx), distlock.ErrUnlocked) {
				t.Fatalf("after Unlock: %v", lease.Err())
			}
			next, err := other.TryLock(ctx, "orders/42")
			if err != nil {
				t.Fatal(err)
			}
			if next.Token() <= lease.Token() {
				t.Fatalf("token %d after %d", next.Token(), lease.Token())
			}
			if err := next.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if left := leftovers(t, b); len(left) != 0 {
				t.Fatalf("left on the server: %q", left)
			}
		})
	}
}

// A wait ended by its context (cancel or deadline) returns promptly with an error matching the
// context's and ErrCancelled, and leaves nothing queued on the server.
func TestContextEndsTheWaitAndLeavesNothingOnTheServer(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			holder, waiter := connect(t, b.url), connect(t, b.url)
			held, err := holder.Lock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			result := make(chan error, 1)
			go func() {
				l, err := waiter.Lock(ctx, "job")
				if l != nil {
					l.Unlock(context.Background())
				}
				result <- err
			}()
			waitQueued(t, holder, "job")
			// The queue: the waiter at position 1 where the backend lists it, nil where not (file).
			queued, err := holder.Status("job")
			if err != nil {
				t.Fatal(err)
			}
			if b.kind == "file" {
				if queued.Queue != nil {
					t.Fatalf("file:// keeps no queue, status listed %+v", queued.Queue)
				}
			} else if len(queued.Queue) != 1 || queued.Queue[0].Position != 1 || queued.Queue[0].Owner == "" {
				t.Fatalf("queue of one waiter: %+v", queued.Queue)
			}
			select {
			case err := <-result:
				t.Fatalf("the wait ended before the cancel: %v", err)
			default:
			}
			start := time.Now()
			cancel()
			var werr error
			select {
			case werr = <-result:
			case <-time.After(5 * time.Second):
				t.Fatal("the cancelled wait did not return within 5 s")
			}
			// Bound: the cancel wakes the wait through a stop callback; 2 s covers a loaded machine.
			if !errors.Is(werr, context.Canceled) || !errors.Is(werr, distlock.ErrCancelled) || time.Since(start) > 2*time.Second {
				t.Fatalf("cancelled wait: %v after %v", werr, time.Since(start))
			}
			// A deadline ends it the same way.
			dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer dcancel()
			start = time.Now()
			_, err = waiter.Lock(dctx, "job")
			if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 200*time.Millisecond || time.Since(start) > 3*time.Second {
				t.Fatalf("deadline: %v after %v", err, time.Since(start))
			}
			if err := held.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			info, err := holder.Status("job")
			if err != nil || info.Held {
				t.Fatalf("after unlock: %+v %v", info, err)
			}
			if left := leftovers(t, b); len(left) != 0 {
				t.Fatalf("left on the server: %q", left)
			}
		})
	}
}

// waitQueued waits (bounded, 5 s) until status counts a waiter where the backend counts them,
// else gives the waiter a moment to start waiting.
func waitQueued(t *testing.T, c *distlock.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		info, err := c.Status(name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Waiters == nil {
			time.Sleep(200 * time.Millisecond)
			return
		}
		if *info.Waiters > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the waiter never showed up in status")
}

// ---- the hammer: 4 processes x 8 goroutines -------------------------------------------------

const (
	hammerProcs      = 4
	hammerGoroutines = 8
	hammerIters      = 63 // 4 * 8 * 63 = 2016 sections
)

func hammerProcess() int {
	url, name, log := os.Getenv("DISTLOCK_GO_URL"), os.Getenv("DISTLOCK_GO_NAME"), os.Getenv("DISTLOCK_GO_LOG")
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	client, err := distlock.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer client.Close()
	var wg sync.WaitGroup
	var failed sync.Once
	rc := 0
	fail := func(err error) { failed.Do(func() { rc = 1; fmt.Fprintln(os.Stderr, err) }) }
	for g := 0; g < hammerGoroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			for i := 0; i < hammerIters; i++ {
				lease, err := client.Lock(ctx, name, distlock.TTL(10*time.Second))
				if err != nil {
					fail(err)
					return
				}
				// One write(2) per line on an O_APPEND file: lines never interleave.
				if _, err := fmt.Fprintf(f, "B %d %d %d\n", os.Getpid(), g, lease.Token()); err != nil {
					fail(err)
				}
				if err := lease.Err(); err != nil {
					fail(fmt.Errorf("lost inside the section: %w", err))
				}
				if _, err := fmt.Fprintf(f, "E %d %d %d\n", os.Getpid(), g, lease.Token()); err != nil {
					fail(err)
				}
				if err := lease.Unlock(ctx); err != nil {
					fail(err)
				}
			}
		}(g)
	}
	wg.Wait()
	return rc
}

func TestHammerOfFourProcessesTimesEightGoroutinesExcludesAndTokensIncrease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "sections.log")
			var procs []*exec.Cmd
			var outs []*strings.Builder
			for p := 0; p < hammerProcs; p++ {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), "DISTLOCK_GO_HELPER=hammer", "DISTLOCK_GO_URL="+b.url,
					"DISTLOCK_GO_NAME=hammer", "DISTLOCK_GO_LOG="+log)
				out := &strings.Builder{}
				cmd.Stdout, cmd.Stderr = out, out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs, outs = append(procs, cmd), append(outs, out)
			}
			for p, cmd := range procs {
				if err := cmd.Wait(); err != nil { // bounded: each goroutine's context ends at 120 s
					t.Errorf("hammer process %d: %v: %s", p, err, outs[p].String())
				}
			}
			f, err := os.Open(log)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			var open []string
			var last uint64
			sections := 0
			pids := map[string]bool{}
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				if len(fields) != 4 {
					t.Fatalf("bad line %q", sc.Text())
				}
				if fields[0] == "B" {
					if open != nil {
						t.Fatalf("two sections at once: %v and %v at section %d", open, fields, sections)
					}
					open = fields
					tok, _ := strconv.ParseUint(fields[3], 10, 64)
					if tok <= last {
						t.Fatalf("token %d after %d at section %d", tok, last, sections)
					}
					last = tok
					pids[fields[1]] = true
				} else {
					if open == nil || open[1] != fields[1] || open[2] != fields[2] || open[3] != fields[3] {
						t.Fatalf("end %v does not close the open section %v", fields, open)
					}
					open = nil
					sections++
				}
			}
			if sections != hammerProcs*hammerGoroutines*hammerIters || len(pids) != hammerProcs {
				t.Fatalf("%d sections from %d processes", sections, len(pids))
			}
			if left := leftovers(t, b); len(left) != 0 {
				t.Fatalf("left on the server: %q", left)
			}
		})
	}
}

// ---- loss: a holder SIGSTOPped past its TTL on redis:// ----------------------------------------

// holdProcess takes the lock (TTL 1 s), prints "held <token>", then every 10 ms writes
// "write <token>" while Err() is nil and Done() is open, stopping itself (SIGSTOP) after the
// third write. On loss it prints "lost <how>", waits
// (bounded) for Done and prints "done", then "unlock <err>".
func holdProcess() int {
	client, err := distlock.Connect(os.Getenv("DISTLOCK_GO_URL"))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ctx := context.Background()
	lease, err := client.Lock(ctx, "ledger", distlock.TTL(time.Second), distlock.Wait(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	writes, err := os.OpenFile(os.Getenv("DISTLOCK_GO_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Printf("held %d\n", lease.Token())
	how, written := "", 0
	for end := time.Now().Add(60 * time.Second); how == "" && time.Now().Before(end); {
		select {
		case <-lease.Done():
			how = "done"
		case <-time.After(10 * time.Millisecond):
			if lease.Err() != nil {
				how = "err"
			} else {
				fmt.Fprintf(writes, "write %d\n", lease.Token())
				// After the third write it stops itself, right after a write and before the
				// next check (a stop between a check and a write would let that one write
				// through: no lock can prevent it; the fencing token is for that).
				if written++; written == 3 {
					syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				}
			}
		}
	}
	fmt.Printf("lost %s: %v\n", how, lease.Err())
	select {
	case <-lease.Done():
		fmt.Println("done")
	case <-time.After(5 * time.Second):
		fmt.Println("Done() was not closed within 5 s")
	}
	fmt.Printf("unlock %v\n", errors.Is(lease.Unlock(ctx), distlock.ErrLost))
	return 0
}

func TestHolderStoppedPastItsTTLSeesTheLossBeforeWritingAndTheNextTokenIsLarger(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=goloss%d", os.Getpid())
	writes := filepath.Join(t.TempDir(), "writes")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DISTLOCK_GO_HELPER=hold", "DISTLOCK_GO_URL="+url, "DISTLOCK_GO_LOG="+writes)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(15 * time.Second):
			t.Fatal("the holder printed nothing for 15 s")
			return ""
		}
	}
	var t1 uint64
	if _, err := fmt.Sscanf(next(), "held %d", &t1); err != nil || t1 == 0 {
		t.Fatalf("holder: %v", err)
	}
	// It stops itself after its third write; wait (bounded) until the kernel says so.
	stopped := func() bool {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		i := strings.LastIndexByte(string(stat), ')')
		return i >= 0 && i+2 < len(stat) && stat[i+2] == 'T'
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !stopped(); time.Sleep(5 * time.Millisecond) {
	}
	if !stopped() {
		t.Fatal("the holder did not stop itself")
	}
	atStop, _ := os.ReadFile(writes)
	if len(atStop) == 0 {
		t.Fatal("the holder never wrote")
	}
	// The next holder gets it once the 1 s TTL ran out on the server.
	client := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	second, err := client.Lock(ctx, "ledger", distlock.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Unlock(context.Background())
	if second.Token() <= t1 {
		t.Fatalf("next token %d after %d", second.Token(), t1)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if l := next(); !strings.HasPrefix(l, "lost ") || !strings.Contains(l, "lost") {
		t.Fatalf("holder after SIGCONT: %q", l)
	}
	if l := next(); l != "done" {
		t.Fatalf("holder: %q", l)
	}
	if l := next(); l != "unlock true" {
		t.Fatalf("holder: %q", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(writes)
	if string(after) != string(atStop) {
		t.Fatalf("the holder wrote after it was stopped past its TTL:\n%s", after[len(atStop):])
	}
}

// ---- semaphore, rw lock, election, ids -------------------------------------------------------

func TestSemaphoreRWLockAndElection(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			ctx := context.Background()
			a, other := connect(t, b.url), connect(t, b.url)
			sem := a.Semaphore("pool", 2)
			p1, err := sem.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p2, err := other.Semaphore("pool", 2).TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Semaphore("pool", 2).TryAcquire(ctx); !errors.Is(err, distlock.ErrBusy) {
				t.Fatalf("third permit of 2: %v", err)
			}
			if _, err := other.Semaphore("pool", 3).TryAcquire(ctx); !errors.Is(err, distlock.ErrInvalidArgument) {
				t.Fatalf("another count: %v", err)
			}
			// Every kind of wait ends with its context (LockOptions::cancel underneath).
			short := func() context.Context { // a fresh 100 ms context per wait
				c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				t.Cleanup(cancel)
				return c
			}
			if _, err := other.Semaphore("pool", 2).Acquire(short()); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, distlock.ErrCancelled) {
				t.Fatalf("semaphore wait past its context: %v", err)
			}
			p1.Unlock(ctx)
			p2.Unlock(ctx)

			r1, err := a.RWLock("cfg", 0).RLock(ctx, distlock.Wait(0))
			if err != nil {
				t.Fatal(err)
			}
			if r1.HasToken() {
				t.Fatal("a reader has no token")
			}
			if _, err := other.RWLock("cfg", 0).Lock(ctx, distlock.Wait(0)); !errors.Is(err, distlock.ErrBusy) {
				t.Fatalf("writer while read: %v", err)
			}
			if _, err := other.RWLock("cfg", 0).Lock(short()); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("writer wait past its context: %v", err)
			}
			r1.Unlock(ctx)
			w, err := other.RWLock("cfg", 0).Lock(ctx, distlock.Wait(2*time.Second))
			if err != nil || !w.HasToken() {
				t.Fatalf("writer: %v", err)
			}
			w.Unlock(ctx)

			e := a.Election("sched")
			lead, err := e.Campaign(ctx, "host-a:8080")
			if err != nil {
				t.Fatal(err)
			}
			leader, err := other.Election("sched").Leader(ctx)
			if err != nil || leader == nil || leader.Value != "host-a:8080" || leader.Term != lead.Token() {
				t.Fatalf("leader: %+v %v", leader, err)
			}
			if _, err := other.Election("sched").Campaign(ctx, "host-b", distlock.Wait(0)); !errors.Is(err, distlock.ErrBusy) {
				t.Fatalf("second campaign: %v", err)
			}
			if _, err := other.Election("sched").Campaign(short(), "host-b"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("campaign past its context: %v", err)
			}
			if err := e.Resign(ctx, lead); err != nil {
				t.Fatal(err)
			}
			if leader, err := other.Election("sched").Leader(ctx); err != nil || leader != nil {
				t.Fatalf("after resign: %+v %v", leader, err)
			}
		})
	}
}

func TestIds(t *testing.T) {
	a, err := distlock.UUID7()
	if errors.Is(err, distlock.ErrNotSupported) {
		t.Skipf("built without the ids component: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, _ := distlock.UUID7()
	if len(a) != 36 || a[14] != '7' || !(a < b) {
		t.Fatalf("uuid7 %q then %q", a, b)
	}
	client := connect(t, redisURL(t))
	sf, err := client.NewSnowflake("go")
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	x, err := sf.Next()
	if err != nil {
		t.Fatal(err)
	}
	y, _ := sf.Next()
	if !(x < y) {
		t.Fatalf("snowflake %d then %d", x, y)
	}
}

func TestRedisDailyIdsAreUniqueIncreasingAndCountedOnTheServer(t *testing.T) {
	if _, err := distlock.UUID7(); errors.Is(err, distlock.ErrNotSupported) {
		t.Skipf("built without the ids component: %v", err)
	}
	url := redisURL(t)
	// Bad input: the library's errors, no password in them.
	if _, err := distlock.NewRedisDaily("redis://alice:s3cr3tpw@127.0.0.1:notaport", "", 0); !errors.Is(err, distlock.ErrInvalidURL) ||
		strings.Contains(err.Error(), "s3cr3tpw") {
		t.Fatalf("bad URL: %v", err)
	}
	if _, err := distlock.NewRedisDaily("file:///tmp", "", 0); err == nil {
		t.Fatal("a file:// URL was accepted for redis-daily ids")
	}
	prefix := fmt.Sprintf("godaily%d", os.Getpid())
	one, err := distlock.NewRedisDaily(url, prefix, 0) // one INCR per id
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	block, err := distlock.NewRedisDaily(url, prefix, 10) // INCRBY 10, then 10 local ids
	if err != nil {
		t.Fatal(err)
	}
	defer block.Close()
	const n = 50
	seen := map[uint64]bool{}
	for _, g := range []*distlock.RedisDaily{one, block} {
		var last uint64
		for i := 0; i < n; i++ {
			id, err := g.Next()
			if err != nil {
				t.Fatal(err)
			}
			if id <= last {
				t.Fatalf("id %d after %d: not increasing", id, last)
			}
			if seen[id] {
				t.Fatalf("id %d issued twice", id)
			}
			seen[id], last = true, id
			// The high 31 bits are seconds since the default epoch (2022-06-12T00:00:00Z).
			const epoch = 1654992000
			if sec := int64(id>>32) + epoch; sec < time.Now().Unix()-600 || sec > time.Now().Unix()+600 {
				t.Fatalf("id %d carries the time %d, not about now", id, sec)
			}
		}
	}
	// The day counters on the server (icr:<prefix>:<yyyy:MM:dd>, beside each its ":epoch" key,
	// docs/ids.md) count what was taken: 50 INCRs and 5 INCRBY 10 (two days if the test ran
	// across midnight UTC).
	total := 0
	for _, k := range redisKeys(t, "icr:"+prefix+":*") {
		if strings.HasSuffix(k, ":epoch") {
			continue
		}
		v, err := strconv.Atoi(redisGet(t, k))
		if err != nil {
			t.Fatalf("counter %s: %v", k, err)
		}
		total += v
	}
	if total != 2*n {
		t.Fatalf("the day counters of %s add up to %d, want %d", prefix, total, 2*n)
	}
	if err := one.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := one.Next(); !errors.Is(err, distlock.ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

func TestElectionProclaimAndObserve(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.kind, func(t *testing.T) {
			ctx := context.Background()
			a, other := connect(t, b.url), connect(t, b.url)
			ea, eb := a.Election("sched"), other.Election("sched")
			// Nobody leads: the Wait passes with no leader and no error.
			if l, err := eb.Observe(ctx, 0, distlock.Wait(200*time.Millisecond)); err != nil || l != nil {
				t.Fatalf("observe with nobody leading: %+v %v", l, err)
			}
			lead, err := ea.Campaign(ctx, "host-a:8080", distlock.Wait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			term := lead.Token()
			l, err := eb.Observe(ctx, 0, distlock.Wait(2*time.Second))
			if err != nil || l == nil || l.Term != term || l.Value != "host-a:8080" || !l.ValueKnown {
				t.Fatalf("observe any leader: %+v %v", l, err)
			}
			if err := ea.Proclaim(ctx, lead, "host-a:9090"); err != nil {
				t.Fatal(err)
			}
			if l, err := eb.Leader(ctx); err != nil || l == nil || l.Term != term || l.Value != "host-a:9090" {
				t.Fatalf("leader after proclaim: %+v %v", l, err)
			}
			if err := a.Election("other").Proclaim(ctx, lead, "x"); !errors.Is(err, distlock.ErrInvalidArgument) {
				t.Fatalf("proclaim in another election: %v", err)
			}
			// Past the current term nothing comes: the context's deadline ends the wait.
			short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			defer cancel()
			if _, err := eb.Observe(short, term); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, distlock.ErrCancelled) {
				t.Fatalf("observe past its context: %v", err)
			}
			// An observer waiting past term wakes for the next leader.
			type result struct {
				l   *distlock.Leader
				err error
			}
			got := make(chan result, 1)
			go func() {
				l, err := eb.Observe(ctx, term, distlock.Wait(10*time.Second))
				got <- result{l, err}
			}()
			if err := ea.Resign(ctx, lead); err != nil {
				t.Fatal(err)
			}
			if err := ea.Proclaim(ctx, lead, "late"); !errors.Is(err, distlock.ErrUnlocked) {
				t.Fatalf("proclaim after resign: %v", err)
			}
			leadB, err := eb.Campaign(ctx, "host-b", distlock.Wait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer leadB.Unlock(ctx)
			if leadB.Token() <= term {
				t.Fatalf("term %d after %d", leadB.Token(), term)
			}
			r := <-got
			if r.err != nil || r.l == nil || r.l.Term != leadB.Token() || r.l.Value != "host-b" {
				t.Fatalf("observer: %+v %v (new term %d)", r.l, r.err, leadB.Token())
			}
		})
	}
}

// Revoke: the holder's Done() closes within its renewal interval (1 s at TTL 3 s) plus 1 s,
// measured on this process's monotonic clock; Err() names the revoke and its reason; the next
// holder's token is larger; a free lock is revoked == false, not an error.
func TestRevokeEndsTheHoldersLeaseWithItsReason(t *testing.T) {
	url := redisURL(t) + fmt.Sprintf("?prefix=gorevoke%d", os.Getpid())
	ctx := context.Background()
	holder := connect(t, url)
	ops := connect(t, url)
	lease, err := holder.Lock(ctx, "job", distlock.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := ops.Revoke("job", "ticket 7")
	if err != nil || !revoked {
		t.Fatalf("Revoke: %v %v", revoked, err)
	}
	at := time.Now()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder was never told")
	}
	if took := time.Since(at); took > 2*time.Second {
		t.Errorf("the holder was told after %v", took)
	}
	if e := lease.Err(); e == nil || !strings.Contains(e.Error(), "revoked") || !strings.Contains(e.Error(), "ticket 7") {
		t.Errorf("Err() = %v", e)
	}
	next, err := ops.Lock(ctx, "job", distlock.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= lease.Token() {
		t.Errorf("next token %d <= revoked token %d", next.Token(), lease.Token())
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if revoked, err := ops.Revoke("job", "again"); err != nil || revoked {
		t.Errorf("Revoke of a free lock: %v %v", revoked, err)
	}
}
