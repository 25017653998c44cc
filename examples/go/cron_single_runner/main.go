// cron_single_runner: the same cron job on every host, run once per slot by whichever host
// takes the slot's lock first (the Go cron runner of the posts, with a lease instead of
// SETNX). The winner holds the slot's lock until the slot ends, so a host whose clock is a
// little behind cannot run the slot again, and the job's context ends if the lock is lost.
//
// Usage: cron_single_runner -url redis://127.0.0.1:6379 -job report -every 1m -slots 0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"distlock.dev/distlock"
)

// runSlots runs `slots` slots of length `every` (0: until ctx ends) as `instance`, reporting
// each slot it ran to out as "ran <job> slot <unix ms> by <instance> token <token>".
func runSlots(ctx context.Context, client *distlock.Client, job, instance string, every time.Duration, slots int,
	out io.Writer, work func(ctx context.Context, token uint64) error) error {
	for n := 0; slots == 0 || n < slots; n++ {
		start := time.Now().Truncate(every).Add(every) // the next slot boundary
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start)):
		}
		name := fmt.Sprintf("cron/%s/%d", job, start.UnixMilli())
		// One attempt: the slot belongs to whoever took it first. TTL: the slot's length at
		// least, so a crashed runner's slot is not run twice either.
		ttl := every
		if ttl < time.Second {
			ttl = time.Second
		}
		lease, err := client.TryLock(ctx, name, distlock.TTL(ttl))
		if errors.Is(err, distlock.ErrBusy) {
			continue // another host runs this slot
		}
		if err != nil {
			return err
		}
		jobCtx, cancel := context.WithDeadline(ctx, start.Add(every))
		go func() { // the job stops if the lock is lost
			select {
			case <-lease.Done():
				cancel()
			case <-jobCtx.Done():
			}
		}()
		fmt.Fprintf(out, "ran %s slot %d by %s token %d\n", job, start.UnixMilli(), instance, lease.Token())
		err = work(jobCtx, lease.Token())
		<-jobCtx.Done() // keep the slot until it ends
		cancel()
		if uerr := lease.Unlock(context.Background()); err == nil && !errors.Is(uerr, distlock.ErrLost) {
			err = uerr
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	return nil
}

func main() {
	url := flag.String("url", "", "backend URL (default $DISTLOCK_URL, else host-local)")
	job := flag.String("job", "report", "job name")
	every := flag.Duration("every", time.Minute, "slot length")
	slots := flag.Int("slots", 0, "slots to run (0: for ever)")
	flag.Parse()
	client, err := distlock.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	host, _ := os.Hostname()
	instance := fmt.Sprintf("%s/%d", host, os.Getpid())
	err = runSlots(context.Background(), client, *job, instance, *every, *slots, os.Stdout,
		func(ctx context.Context, token uint64) error {
			fmt.Printf("  running %s with fencing token %d\n", *job, token)
			return nil
		})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
