package distlock_test

// The servers the tests run against: file:// in a temporary directory, and redis:// / etcd://
// started by with_servers (bindings/tests/with_servers.cpp) through ctest, whose addresses come
// in DISTLOCK_TEST_REDIS_URL / DISTLOCK_TEST_ETCD_URL. DISTLOCK_TEST_BACKENDS lists the
// backends the build must test: one listed without its URL fails (never skips). Run by hand
// without it, the tests use the backends whose URL is set, and file://.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type backend struct {
	kind   string // file, redis, etcd
	url    string // with a prefix of its own
	prefix string
}

var prefixCounter int64

func backends(t *testing.T) []backend {
	t.Helper()
	listed := os.Getenv("DISTLOCK_TEST_BACKENDS")
	var kinds []string
	if listed != "" {
		kinds = strings.Fields(listed)
	} else {
		kinds = []string{"file"}
		if os.Getenv("DISTLOCK_TEST_REDIS_URL") != "" {
			kinds = append(kinds, "redis")
		}
		if os.Getenv("DISTLOCK_TEST_ETCD_URL") != "" {
			kinds = append(kinds, "etcd")
		}
	}
	var out []backend
	for _, k := range kinds {
		prefix := fmt.Sprintf("go%dt%d", os.Getpid(), atomic.AddInt64(&prefixCounter, 1))
		switch k {
		case "file":
			out = append(out, backend{kind: k, url: "file://" + t.TempDir(), prefix: prefix})
		case "redis", "etcd":
			u := os.Getenv("DISTLOCK_TEST_" + strings.ToUpper(k) + "_URL")
			if u == "" {
				t.Fatalf("%s is listed in DISTLOCK_TEST_BACKENDS but DISTLOCK_TEST_%s_URL is not set (run through with_servers)",
					k, strings.ToUpper(k))
			}
			out = append(out, backend{kind: k, url: u + "?prefix=" + prefix, prefix: prefix})
		default:
			t.Fatalf("unknown backend %q in DISTLOCK_TEST_BACKENDS", k)
		}
	}
	return out
}

// redisURL is the test server's URL. Missing, it fails when the build has redis:// (or, run by
// hand, under CI=true) and skips otherwise.
func redisURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("DISTLOCK_TEST_REDIS_URL")
	listed := os.Getenv("DISTLOCK_TEST_BACKENDS")
	switch {
	case u != "":
		return u
	case strings.Contains(listed, "redis"), listed == "" && os.Getenv("CI") == "true":
		t.Fatal("DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)")
	case listed != "":
		t.Skipf("this build has no redis:// (DISTLOCK_TEST_BACKENDS=%q)", listed)
	default:
		t.Skip("no redis: DISTLOCK_TEST_REDIS_URL is not set")
	}
	return ""
}

// leftovers is what is left on the server under the backend's prefix once every lease is
// gone, but for the never-expiring fence counters (docs/redis.md's key layout).
func leftovers(t *testing.T, b backend) []string {
	t.Helper()
	var keys []string
	switch b.kind {
	case "redis":
		for _, k := range redisKeys(t, b.prefix+":*") {
			if !strings.HasSuffix(k, ":fence") { // the counter <prefix>:{<slot tag>}:fence
				keys = append(keys, k)
			}
		}
	case "etcd":
		cmd := exec.Command("etcdctl", "--endpoints="+os.Getenv("DISTLOCK_TEST_ETCD_ENDPOINT"), "get", "--prefix",
			"--keys-only", b.prefix)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("etcdctl: %v: %s", err, out)
		}
		for _, k := range strings.Split(string(out), "\n") {
			// Tokens are revisions: no counter keys (docs/etcd.md). A session's release mark
			// (%released/, one per session, on its lease: the prefix watch's) is not lock state.
			if k != "" && !strings.Contains(k, "/%released/") {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// redisKeys runs KEYS pattern on the test server over a plain connection (RESP by hand: the
// module has no dependencies).
func redisKeys(t *testing.T, pattern string) []string {
	t.Helper()
	port := os.Getenv("DISTLOCK_TEST_REDIS_PORT")
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 2*time.Second)
	if err != nil {
		t.Fatalf("cannot reach redis on port %q: %v", port, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "*2\r\n$4\r\nKEYS\r\n$%d\r\n%s\r\n", len(pattern), pattern)
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") {
		t.Fatalf("KEYS: unexpected reply %q (%v)", line, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
	keys := make([]string, 0, n)
	for i := 0; i < n; i++ {
		hdr, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(hdr, "$") {
			t.Fatalf("KEYS: unexpected element %q (%v)", hdr, err)
		}
		size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatalf("KEYS: %v", err)
		}
		keys = append(keys, string(buf[:size]))
	}
	return keys
}

// redisGet runs GET key on the test server ("" for a missing key).
func redisGet(t *testing.T, key string) string {
	t.Helper()
	port := os.Getenv("DISTLOCK_TEST_REDIS_PORT")
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 2*time.Second)
	if err != nil {
		t.Fatalf("cannot reach redis on port %q: %v", port, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key)
	r := bufio.NewReader(conn)
	hdr, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(hdr, "$") {
		t.Fatalf("GET: unexpected reply %q (%v)", hdr, err)
	}
	size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
	if size < 0 {
		return ""
	}
	buf := make([]byte, size+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatalf("GET: %v", err)
	}
	return string(buf[:size])
}
