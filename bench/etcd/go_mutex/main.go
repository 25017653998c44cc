// Baseline for bench/etcd/run.sh: etcd's own Go concurrency.Mutex (the recipe the
// distlock etcd backend follows), uncontended Lock+Unlock on one session, printing
// one JSON line like distlock-bench. Built offline from Debian's golang-go and
// golang-etcd-server-dev (GOPATH mode, GOPATH=/usr/share/gocode).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return float64(sorted[i]) / 1000.0
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd endpoints")
	ops := flag.Int("ops", 2000, "measured Lock+Unlock pairs")
	warmup := flag.Int("warmup", 200, "unmeasured pairs first")
	ttl := flag.Int("ttl", 30, "session TTL in seconds")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	defer cli.Close()
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, "session:", err)
		os.Exit(1)
	}
	defer session.Close()
	mutex := concurrency.NewMutex(session, "bench-go/uncontended")
	ctx := context.Background()
	pair := func() {
		if err := mutex.Lock(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "lock:", err)
			os.Exit(1)
		}
		if err := mutex.Unlock(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "unlock:", err)
			os.Exit(1)
		}
	}
	for i := 0; i < *warmup; i++ {
		pair()
	}
	lat := make([]int64, 0, *ops)
	t0 := time.Now()
	for i := 0; i < *ops; i++ {
		a := time.Now()
		pair()
		lat = append(lat, time.Since(a).Nanoseconds())
	}
	seconds := time.Since(t0).Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	out, _ := json.Marshal(map[string]interface{}{
		"workload":  "uncontended",
		"impl":      "go-concurrency-mutex",
		"endpoints": *endpoints,
		"ops":       *ops,
		"ops_per_s": float64(*ops) / seconds,
		"p50_us":    percentile(lat, 0.50),
		"p99_us":    percentile(lat, 0.99),
		"p999_us":   percentile(lat, 0.999),
	})
	fmt.Println(string(out))
}
