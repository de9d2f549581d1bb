package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/fence"
)

// startLockd runs a lockd process for the example; a real program points
// Config.Addrs at its lockd servers.
func startLockd() (addr string, stop func()) { return client.LockdForExamples() }

// Take a lock, act on a fenced resource with its token, release it.
func Example() {
	addr, stop := startLockd()
	defer stop()

	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	var store fence.Checker // the protected resource's side
	l, err := cl.Acquire(ctx, "orders/42", client.AcquireOptions{Wait: 5 * time.Second, Lease: 10 * time.Second})
	switch {
	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrBusy):
		fmt.Println("held elsewhere: not acquired")
		return
	case errors.Is(err, client.ErrNoConnection):
		fmt.Println("lockd unreachable:", err)
		return
	case err != nil: // ErrIndeterminate included: do not enter the critical section
		fmt.Println("error:", err)
		return
	}
	_ = store.Do("orders/42", l.Token, func() error { // check and write in one step
		fmt.Println("wrote orders/42 under the lock")
		return nil
	})
	if err := cl.Release(ctx, l); err != nil {
		fmt.Println("release:", err)
	}

	// WithLock renews the lease while fn runs and releases at the end.
	err = cl.WithLock(ctx, "orders/42", client.AcquireOptions{Wait: 5 * time.Second, Lease: 3 * time.Second},
		func(ctx context.Context, l client.Lock) error {
			return store.Do("orders/42", l.Token, func() error { return nil })
		})
	fmt.Println("WithLock:", err)
	// Output:
	// wrote orders/42 under the lock
	// WithLock: <nil>
}

// One goroutine keeps many acquires in flight, then releases the grants
// the same way: the requests share the connections' writes.
func ExampleClient_AcquireAsync() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	tickets := make([]*client.Ticket, 100)
	for i := range tickets {
		tickets[i] = cl.AcquireAsync(ctx, fmt.Sprintf("jobs/%d", i), client.AcquireOptions{Wait: time.Second, Lease: 10 * time.Second})
	}
	var releases []client.Releasing
	for _, t := range tickets {
		l, err := t.Wait() // each Ticket's Wait exactly once
		if err != nil {
			fmt.Println("acquire:", err)
			continue
		}
		// ... the work under l, fenced with l.Token ...
		releases = append(releases, cl.ReleaseAsync(ctx, l))
	}
	released := 0
	for _, r := range releases {
		if r.Wait() == nil {
			released++
		}
	}
	fmt.Println("released", released)
	// Output:
	// released 100
}

// Acquire, keep the lease alive while working, stop before the lease can
// end, release. Margin leaves time to stop the work (a child process, say)
// before the lease could end on the server.
func ExampleClient_KeepAlive() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	l, err := cl.Acquire(ctx, "backups/db", client.AcquireOptions{Wait: 5 * time.Second, Lease: 3 * time.Second})
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	ka, err := cl.KeepAlive(ctx, l, client.KeepAliveOptions{Lease: 3 * time.Second, Margin: time.Second})
	if err != nil {
		fmt.Println("keep-alive:", err)
		_ = cl.Release(ctx, l)
		return
	}
	work := time.After(4 * time.Second) // longer than the lease: renewals keep it
	select {
	case <-work:
		fmt.Println("work done, still held:", time.Now().Before(ka.StopBy()))
	case <-ka.Lost():
		fmt.Println("lost:", ka.Err()) // stop the work now: StopBy has passed
	}
	if err := ka.Stop(); err != nil {
		fmt.Println("keep-alive ended:", err)
	}
	fmt.Println("release:", cl.Release(ctx, ka.Lock()))
	// Output:
	// work done, still held: true
	// release: <nil>
}

// An outage is not a busy lock: with no lockd listening, the acquire
// fails with ErrNoConnection (and the dial error), never ErrTimeout. A
// command-line tool sets FailFast so that it fails at once.
func Example_outage() {
	cl, err := client.New(client.Config{Addrs: []string{"127.0.0.1:1"}, FailFast: true})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	_, err = cl.Acquire(context.Background(), "reports/nightly", client.AcquireOptions{Wait: 10 * time.Second})
	fmt.Println("no connection:", errors.Is(err, client.ErrNoConnection))
	fmt.Println("timeout:", errors.Is(err, client.ErrTimeout))
	// Output:
	// no connection: true
	// timeout: false
}
