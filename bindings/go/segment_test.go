package distlock_test

// Segment ids (distlock.Segment over the C API's distlock_segment_*) against the real
// PostgreSQL and MariaDB servers that with_servers starts (--postgres, --mysql), whose URLs come
// in DISTLOCK_TEST_POSTGRES_URL / DISTLOCK_TEST_MYSQL_URL. DISTLOCK_TEST_SEGMENT_DBS (set by
// ctest) lists the databases the build has: one listed without its URL fails, never skips.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"distlock.dev/distlock"
)

type segmentDB struct{ kind, url string }

func segmentDBs(t *testing.T) []segmentDB {
	t.Helper()
	listed, set := os.LookupEnv("DISTLOCK_TEST_SEGMENT_DBS")
	kinds := strings.Fields(listed)
	if !set {
		for _, k := range []string{"postgres", "mysql"} {
			if os.Getenv("DISTLOCK_TEST_"+strings.ToUpper(k)+"_URL") != "" {
				kinds = append(kinds, k)
			}
		}
	}
	var out []segmentDB
	for _, k := range kinds {
		u := os.Getenv("DISTLOCK_TEST_" + strings.ToUpper(k) + "_URL")
		if u == "" {
			t.Fatalf("%s is listed in DISTLOCK_TEST_SEGMENT_DBS but DISTLOCK_TEST_%s_URL is not set (run through with_servers --%s)",
				k, strings.ToUpper(k), k)
		}
		out = append(out, segmentDB{k, u})
	}
	if len(out) == 0 {
		if !set && os.Getenv("CI") == "true" {
			t.Fatal("no segment database: DISTLOCK_TEST_POSTGRES_URL / DISTLOCK_TEST_MYSQL_URL are not set (run through with_servers)")
		}
		t.Skip("no segment database in this build or environment")
	}
	return out
}

// freshTag is a tag no earlier test or run has used on the server (its ids start at 1).
func freshTag(name string) string {
	return fmt.Sprintf("go-%s-%d-%d", name, os.Getpid(), time.Now().UnixNano())
}

func increasing(ids []uint64) bool {
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			return false
		}
	}
	return true
}

func TestSegmentIdsStrictlyIncreaseInOneGenerator(t *testing.T) {
	for _, db := range segmentDBs(t) {
		t.Run(db.kind, func(t *testing.T) {
			g, err := distlock.NewSegment(db.url, freshTag("inc"), 10)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			// A fresh row, one generator: 1, 2, ..., 1000 densely, across 100 ranges.
			for want := uint64(1); want <= 1000; want++ {
				id, err := g.Next()
				if err != nil {
					t.Fatalf("id %d: %v", want, err)
				}
				if id != want {
					t.Fatalf("got id %d, want %d", id, want)
				}
			}
		})
	}
}

func TestSegmentGeneratorsOfOneTagNeverShareAnId(t *testing.T) {
	const goroutines, perGoroutine = 4, 1500
	for _, db := range segmentDBs(t) {
		t.Run(db.kind, func(t *testing.T) {
			tag := freshTag("share")
			a, err := distlock.NewSegment(db.url, tag, 7)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := distlock.NewSegment(db.url, tag, 0) // the row's step (7, its creator's)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			got := make([][]uint64, 2*goroutines)
			errs := make([]error, 2*goroutines)
			var wg sync.WaitGroup
			for i := range got {
				gen := a
				if i%2 == 1 {
					gen = b
				}
				wg.Add(1)
				go func(i int, gen *distlock.Segment) {
					defer wg.Done()
					for n := 0; n < perGoroutine; n++ {
						id, err := gen.Next()
						if err != nil {
							errs[i] = err
							return
						}
						got[i] = append(got[i], id)
					}
				}(i, gen)
			}
			wg.Wait()
			seen := make(map[uint64]int)
			for i, ids := range got {
				if errs[i] != nil {
					t.Fatalf("goroutine %d: %v", i, errs[i])
				}
				if len(ids) != perGoroutine || !increasing(ids) {
					t.Fatalf("goroutine %d: %d ids, increasing %v", i, len(ids), increasing(ids))
				}
				for _, id := range ids {
					if j, dup := seen[id]; dup {
						t.Fatalf("id %d handed out to goroutines %d and %d", id, j, i)
					}
					seen[id] = i
				}
			}
			if len(seen) != 2*goroutines*perGoroutine {
				t.Fatalf("%d distinct ids, want %d", len(seen), 2*goroutines*perGoroutine)
			}
		})
	}
}

func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func TestSegmentBadStepBadURLAndServerDownAreDistinctErrors(t *testing.T) {
	for _, db := range segmentDBs(t) {
		t.Run(db.kind, func(t *testing.T) {
			expect := func(what string, err error, want *distlock.Error, mentions, never string) {
				t.Helper()
				if !errors.Is(err, want) {
					t.Fatalf("%s: got %v, want %v", what, err, want)
				}
				for _, other := range []*distlock.Error{distlock.ErrInvalidArgument, distlock.ErrInvalidURL,
					distlock.ErrBackendUnavailable, distlock.ErrAuthFailed} {
					if other != want && errors.Is(err, other) {
						t.Fatalf("%s: %v also matches %v", what, err, other)
					}
				}
				if !strings.Contains(err.Error(), mentions) {
					t.Fatalf("%s: message %q does not name %q", what, err, mentions)
				}
				if never != "" && strings.Contains(err.Error(), never) {
					t.Fatalf("%s: message %q holds the password", what, err)
				}
			}
			_, err := distlock.NewSegment(db.url, "t", -1)
			expect("step -1", err, distlock.ErrInvalidArgument, "segment step -1 is outside", "")
			_, err = distlock.NewSegment(db.url, "two words", 0)
			expect("tag with a space", err, distlock.ErrInvalidArgument, "tag", "")
			_, err = distlock.NewSegment("redis://127.0.0.1:6379", "t", 0)
			expect("redis URL", err, distlock.ErrInvalidURL, "segment ids need a database URL", "")
			down := fmt.Sprintf("%s://u:pw-down-4k@127.0.0.1:%d/db?timeout=500ms", db.kind, closedPort(t))
			_, err = distlock.NewSegment(down, "t", 0)
			expect("nothing listening", err, distlock.ErrBackendUnavailable, "127.0.0.1", "pw-down-4k")
			wrong := regexp.MustCompile(`^(\w+://[^:]+):[^@]*@`).ReplaceAllString(db.url, "${1}:wrong-pw-8z@")
			if wrong == db.url {
				t.Fatalf("cannot replace the password in %s", db.url)
			}
			_, err = distlock.NewSegment(wrong, "t", 0)
			expect("wrong password", err, distlock.ErrAuthFailed, "", "wrong-pw-8z")

			g, err := distlock.NewSegment(db.url, freshTag("close"), 5)
			if err != nil {
				t.Fatal(err)
			}
			if id, err := g.Next(); err != nil || id != 1 {
				t.Fatalf("first id %d, %v", id, err)
			}
			g.Close()
			g.Close() // harmless
			if _, err := g.Next(); !errors.Is(err, distlock.ErrClosed) {
				t.Fatalf("Next after Close: %v", err)
			}
		})
	}
}

// SetStep: ranges of the new step from the next range taken on; a bad step changes nothing.
func TestSegmentSetStepTakesRangesOfTheNewStep(t *testing.T) {
	for _, db := range segmentDBs(t) {
		t.Run(db.kind, func(t *testing.T) {
			tag := freshTag("setstep")
			a, err := distlock.NewSegment(db.url, tag, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if err := a.SetStep(-1); !errors.Is(err, distlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "step") {
				t.Fatalf("SetStep(-1): %v", err)
			}
			if err := a.SetStep(3); err != nil {
				t.Fatal(err)
			}
			// a took (0, 10] when it was made; its next range is (10, 13]: ids 1..11 from both.
			for want := uint64(1); want <= 11; want++ {
				if id, err := a.Next(); err != nil || id != want {
					t.Fatalf("id %d, %v; want %d", id, err, want)
				}
			}
			// A second generator starts above a's ranges: at 14 (or 17, had a fetched (13, 16]
			// ahead); with the step of 10 a was made with, at 21 or above.
			b, err := distlock.NewSegment(db.url, tag, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if id, err := b.Next(); err != nil || id < 14 || id > 17 {
				t.Fatalf("the second generator's first id %d (%v), want 14..17", id, err)
			}
			a.Close()
			if err := a.SetStep(5); !errors.Is(err, distlock.ErrClosed) {
				t.Fatalf("SetStep after Close: %v", err)
			}
		})
	}
}
