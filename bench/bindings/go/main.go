// Uncontended Lock + Unlock of one key through the Go module, in the JSON shape of
// distlock-bench-bindings (bench/bindings/run.sh runs both).
// Usage: go run . URL OPS ROUNDS
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"distlock.dev/distlock"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: bench URL OPS ROUNDS")
		os.Exit(2)
	}
	url := os.Args[1]
	ops, _ := strconv.Atoi(os.Args[2])
	rounds, _ := strconv.Atoi(os.Args[3])
	client, err := distlock.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	ctx := context.Background()
	var lat []time.Duration
	for r := 0; r < rounds; r++ {
		for i := 0; i < ops; i++ {
			start := time.Now()
			lease, err := client.Lock(ctx, "bench/bindings/go")
			if err == nil {
				err = lease.Unlock(ctx)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			lat = append(lat, time.Since(start))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	u, _ := client.URL()
	fmt.Printf("{\"workload\":\"uncontended\",\"binding\":\"go\",\"url\":%q,\"ops\":%d,\"p50_us\":%.1f,\"p99_us\":%.1f,\"mean_us\":%.1f}\n",
		u, len(lat), us(lat[len(lat)/2]), us(lat[len(lat)*99/100]), us(sum/time.Duration(len(lat))))
}
