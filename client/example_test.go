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

// A semaphore of two permits, shared by every client of lockd: a third
// holder waits (here: TryAcquire says no at once) until a permit is
// released. Each permit is renewed and watched while held.
func ExampleClient_Semaphore() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	sem := cl.Semaphore("exports/slots", 2, client.HoldOptions{Lease: 10 * time.Second})
	a, err := sem.Acquire(ctx) // waits until ctx is done for a permit
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	b, err := sem.Acquire(ctx)
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	_, err = sem.TryAcquire(ctx)
	fmt.Println("a third permit now:", err == nil)
	in, _ := cl.Inspect(ctx, "exports/slots")
	fmt.Println("holders:", in.Holders, "of", in.Limit)

	// The work under a permit passes its token to the resource and stops
	// when the permit's Context ends (the permit was lost).
	_ = a.Context()
	fmt.Println("release a:", a.Release())
	c, err := sem.TryAcquire(ctx)
	fmt.Println("a permit after a release:", err == nil)
	_ = b.Release()
	_ = c.Release()
	// Output:
	// a third permit now: false
	// holders: 2 of 2
	// release a: <nil>
	// a permit after a release: true
}

// A read/write lock: readers share it; a writer waits for them, and while
// it waits, readers that come after it wait too.
func ExampleClient_RWMutex() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	rw := cl.RWMutex("catalog", client.HoldOptions{Lease: 10 * time.Second})
	r1, _ := rw.RLock(ctx)
	r2, err := rw.RLock(ctx)
	fmt.Println("two readers:", err == nil)

	wrote := make(chan error, 1)
	go func() {
		w, err := rw.Lock(ctx) // waits for both readers
		if err == nil {
			err = w.Release()
		}
		wrote <- err
	}()
	for { // until the writer waits in lockd's queue
		if in, err := cl.Inspect(ctx, "catalog"); err != nil || in.Waiters == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err = rw.TryRLock(ctx)
	fmt.Println("a reader behind a waiting writer:", errors.Is(err, client.ErrTimeout))
	_ = r1.Release()
	_ = r2.Release()
	fmt.Println("the writer wrote:", <-wrote)
	// Output:
	// two readers: true
	// a reader behind a waiting writer: true
	// the writer wrote: <nil>
}

// A protected resource asks lockd whether the token of a request is
// still a current grant before acting (fence.Validating with the client
// as its Validator).
func ExampleClient_Validate() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()

	l, err := cl.Acquire(ctx, "orders/42", client.AcquireOptions{Wait: 5 * time.Second, Lease: 10 * time.Second})
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	resource := &fence.Validating{V: cl, MinRemaining: time.Second}
	write := func(token uint64) {
		err := resource.Do(ctx, "orders/42", token, func(ctx context.Context) error {
			fmt.Println("wrote with the current token")
			return nil
		})
		if err != nil {
			fmt.Println("refused:", errors.Is(err, fence.ErrNotValid), errors.Is(err, client.ErrNotHeld))
		}
	}
	write(l.Token)
	_ = cl.Release(ctx, l)
	write(l.Token) // a holder acting after its release
	// Output:
	// wrote with the current token
	// refused: true true
}
