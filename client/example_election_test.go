package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/client"
)

// The leader-election recipe of docs/RECIPES.md. A candidate campaigns by
// acquiring the election's key with long waits, in a loop, and keeps the
// lock (KeepAlive) while it leads: its token is its term, larger than
// every earlier term. It leads until it resigns (release) or loses the
// lock (Lost: lockd reported the grant's end, or renewals failed). An
// observer asks lockd who leads (Inspect: the holder's token) and waits
// for that term's end (Watch), then asks again.

// campaign blocks until the candidate leads (or ctx ends) and returns
// its leadership: a lock kept alive and watched.
func campaign(ctx context.Context, cl *client.Client, key string) (*client.KeepAlive, error) {
	const lease = 10 * time.Second
	for {
		// The longest wait the protocol has is 255 s; loop to wait longer.
		l, err := cl.Acquire(ctx, key, client.AcquireOptions{Wait: 30 * time.Second, Lease: lease})
		switch {
		case err == nil:
			return cl.KeepAlive(ctx, l, client.KeepAliveOptions{Lease: lease})
		case errors.Is(err, client.ErrTimeout):
			continue // another candidate leads: wait again
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			// An outage (ErrNoConnection), or an acquire that may have been
			// granted (ErrIndeterminate: its lease ends it): pause, retry.
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}

// resign ends a leadership: stop renewing, then release, so that the
// next candidate in lockd's queue leads at once.
func resign(cl *client.Client, lead *client.KeepAlive) error {
	if err := lead.Stop(); err != nil {
		return err // lost already: nothing to release
	}
	return cl.Release(context.Background(), lead.Lock())
}

// leader returns the current term (the leader's token), waiting while
// there is none: lockd can watch a grant, not a free key, so an observer
// polls a free key.
func leader(ctx context.Context, cl *client.Client, key string) (uint64, error) {
	for {
		in, err := cl.Inspect(ctx, key)
		if err != nil {
			return 0, err
		}
		if !in.Free() {
			return in.Token, nil
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func Example_leaderElection() {
	addr, stop := startLockd()
	defer stop()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx := context.Background()
	const key = "leader/reports"

	// Where a leader announces itself, by term (a real service writes its
	// address to a store that keeps the largest term: package fence).
	var mu sync.Mutex
	who := map[uint64]string{}
	announce := func(name string, lead *client.KeepAlive) {
		mu.Lock()
		who[lead.Lock().Token] = name
		mu.Unlock()
	}
	name := func(term uint64) string {
		mu.Lock()
		defer mu.Unlock()
		return who[term]
	}

	a, err := campaign(ctx, cl, key)
	if err != nil {
		fmt.Println("campaign:", err)
		return
	}
	announce("a", a)
	fmt.Println("a leads")

	bLeads := make(chan *client.KeepAlive, 1)
	go func() { // b campaigns too, and waits in lockd's queue
		b, err := campaign(ctx, cl, key)
		if err == nil {
			announce("b", b)
		}
		bLeads <- b
	}()

	// An observer.
	term, err := leader(ctx, cl, key)
	if err != nil {
		fmt.Println("observe:", err)
		return
	}
	fmt.Println("observer: the leader is", name(term))
	w, err := cl.Watch(ctx, client.Lock{Key: key, Token: term})
	if err != nil {
		fmt.Println("watch:", err)
		return
	}

	if err := resign(cl, a); err != nil {
		fmt.Println("resign:", err)
	}
	b := <-bLeads
	if b == nil {
		fmt.Println("b's campaign failed")
		return
	}
	fmt.Println("b leads, in a later term:", b.Lock().Token > term)

	<-w.Done() // the observer learns that a's term ended, and how
	fmt.Println("observer: a's term ended:", w.Reason())
	term, err = leader(ctx, cl, key)
	if err != nil {
		fmt.Println("observe:", err)
		return
	}
	fmt.Println("observer: the leader is", name(term))

	select {
	case <-b.Lost(): // b would stop leading here: b.Err() says why
	default:
	}
	_ = resign(cl, b)
	// Output:
	// a leads
	// observer: the leader is a
	// b leads, in a later term: true
	// observer: a's term ended: released
	// observer: the leader is b
}
