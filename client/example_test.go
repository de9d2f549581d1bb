package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/fence"
)

// startLockd runs an in-process lockd for the example; a real program
// points Config.Addrs at its lockd servers.
func startLockd() (addr string, stop func()) {
	dir, _ := os.MkdirTemp("", "lockd-example-")
	cfg := engine.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.Loops = 1
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := engine.New(cfg)
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve() }()
	<-srv.Ready()
	return srv.Addr(), func() { _ = srv.Close(); <-srv.Done(); _ = os.RemoveAll(dir) }
}

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
		fmt.Println("not acquired")
		return
	case err != nil: // ErrIndeterminate included: do not enter the critical section
		fmt.Println("error:", err)
		return
	}
	if err := store.Check("orders/42", l.Token); err == nil {
		fmt.Println("wrote orders/42 under the lock")
	}
	if err := cl.Release(ctx, l); err != nil {
		fmt.Println("release:", err)
	}

	// WithLock renews the lease while fn runs and releases at the end.
	err = cl.WithLock(ctx, "orders/42", client.AcquireOptions{Wait: 5 * time.Second, Lease: 3 * time.Second},
		func(ctx context.Context, l client.Lock) error {
			return store.Check("orders/42", l.Token)
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
