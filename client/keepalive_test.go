package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// countRenews drains f's requests for d and counts the renewals of token.
func countRenews(f *fake, token uint64, d time.Duration) int {
	n := 0
	end := time.After(d)
	for {
		select {
		case r := <-f.reqs:
			if r.Op == proto.OpRenew && r.ID == token {
				n++
			}
		case <-end:
			return n
		}
	}
}

// TestKeepAliveRenewsUntilStop: renewals every Every with the asked
// lease, Expires moving with each; Stop ends them and cancels Context
// without a loss.
func TestKeepAliveRenewsUntilStop(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka", AcquireOptions{Wait: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.next(time.Second) // the acquire
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second, Every: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	if n := countRenews(f, l.Token, time.Second); n < 2 || n > 7 {
		t.Fatalf("%d renewals in 1 s at 200 ms", n)
	}
	if got := ka.Lock(); got.Token != l.Token || !got.Expires.After(l.Expires.Add(500*time.Millisecond)) {
		t.Fatalf("Lock() = %+v, want token %d and Expires moved past %v", got, l.Token, l.Expires)
	}
	if by := ka.StopBy(); !by.Equal(ka.Lock().Expires) {
		t.Fatalf("StopBy %v, want Expires %v with no margin", by, ka.Lock().Expires)
	}
	if err := ka.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := ka.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	select {
	case <-ka.Context().Done():
	default:
		t.Fatal("Context not done after Stop")
	}
	if c := context.Cause(ka.Context()); errors.Is(c, ErrLockLost) {
		t.Fatalf("cause after Stop %v: not a loss", c)
	}
	select {
	case <-ka.Lost():
		t.Fatal("Lost closed by Stop")
	default:
	}
	if n := countRenews(f, l.Token, 500*time.Millisecond); n != 0 {
		t.Fatalf("%d renewals after Stop", n)
	}
}

// TestKeepAliveMarginLoss: renewals that get no answer lose the lock at
// StopBy = Expires - Margin, not before, and well before Expires; every
// failed renewal is reported to OnRenewError.
func TestKeepAliveMarginLoss(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpRenew {
			fc.auto(r)
		}
	})
	cfg := fastConfig(f.addr())
	cfg.TransportTimeout = 300 * time.Millisecond
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka-margin", AcquireOptions{Wait: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var failures atomic.Int32
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{
		Lease: 3 * time.Second, Every: 300 * time.Millisecond, Retry: 100 * time.Millisecond, Margin: 1500 * time.Millisecond,
		OnRenewError: func(error) { failures.Add(1) },
	})
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	defer ka.Stop()
	stopBy := ka.StopBy()
	if want := l.Expires.Add(-1500 * time.Millisecond); !stopBy.Equal(want) {
		t.Fatalf("StopBy %v, want %v", stopBy, want)
	}
	select {
	case <-ka.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost within 5 s")
	}
	now := time.Now()
	if now.Before(stopBy) {
		t.Fatalf("lost %v before StopBy", stopBy.Sub(now))
	}
	if !now.Before(l.Expires) {
		t.Fatalf("lost %v after the lease's end; the margin is 1.5 s", now.Sub(l.Expires))
	}
	err = ka.Err()
	if !errors.Is(err, ErrLockLost) || errors.Is(err, ErrNotHeld) {
		t.Fatalf("Err = %v, want ErrLockLost (deadline), not ErrNotHeld", err)
	}
	if c := context.Cause(ka.Context()); !errors.Is(c, ErrLockLost) {
		t.Fatalf("Context cause %v", c)
	}
	if failures.Load() == 0 {
		t.Fatal("OnRenewError never called")
	}
	if err := ka.Stop(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Stop after loss = %v", err)
	}
}

// TestKeepAliveNotHeld: a renewal answered N ends it at once, with an error
// matching ErrLockLost and ErrNotHeld.
func TestKeepAliveNotHeld(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpRenew {
			fc.send(proto.AppendNotHeld(nil, proto.OpRenew, r.ID, r.Key))
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka-n", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var failures atomic.Int32
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second, Every: 100 * time.Millisecond,
		OnRenewError: func(error) { failures.Add(1) }})
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	select {
	case <-ka.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost within 5 s")
	}
	<-ka.Lost()
	if err := ka.Stop(); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Stop = %v, want ErrLockLost and ErrNotHeld", err)
	}
	if failures.Load() != 0 {
		t.Fatalf("OnRenewError called %d times for an N", failures.Load())
	}
}

// TestKeepAliveRenewsFirst: a lock with less than two intervals left
// before StopBy is renewed before KeepAlive returns; an N to that renewal
// is returned and nothing is started.
func TestKeepAliveRenewsFirst(t *testing.T) {
	var refuse atomic.Bool
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpRenew && refuse.Load() {
			fc.send(proto.AppendNotHeld(nil, proto.OpRenew, r.ID, r.Key))
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 10*time.Second)
	// As after a long wait: 500 ms of a 3 s lease left.
	l := Lock{Key: "ka-first", Token: 99, Expires: time.Now().Add(500 * time.Millisecond)}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second})
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	if r := f.next(time.Second); r.Op != proto.OpRenew || r.ID != 99 || r.Lease != 3 {
		t.Fatalf("first request %c token %d lease %d, want a renewal of 99 for 3 s", r.Op, r.ID, r.Lease)
	}
	if left := time.Until(ka.Lock().Expires); left < 2*time.Second {
		t.Fatalf("%v left after the first renewal", left)
	}
	if err := ka.Stop(); err != nil {
		t.Fatal(err)
	}

	refuse.Store(true)
	ka, err = cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second})
	if ka != nil || !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("KeepAlive = %v, %v; want nil and ErrLockLost+ErrNotHeld", ka, err)
	}
}

// TestKeepAliveClientClosed: closing the client loses the lock (ErrClosed).
func TestKeepAliveClientClosed(t *testing.T) {
	f := newFake(t, nil)
	cl, err := New(fastConfig(f.addr()))
	if err != nil {
		t.Fatal(err)
	}
	l := Lock{Key: "ka-close", Token: 5, Expires: time.Now().Add(30 * time.Second)}
	ka, err := cl.KeepAlive(context.Background(), l, KeepAliveOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = cl.Close()
	select {
	case <-ka.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost after Close")
	}
	if err := ka.Stop(); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrClosed) {
		t.Fatalf("Stop = %v", err)
	}
	if _, err := cl.KeepAlive(context.Background(), l, KeepAliveOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("KeepAlive on a closed client: %v", err)
	}
}

func TestKeepAliveValidation(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	l := Lock{Key: "ka-valid", Token: 5, Expires: time.Now().Add(30 * time.Second)}
	for _, tc := range []struct {
		opts KeepAliveOptions
		want error
	}{
		{KeepAliveOptions{Lease: 5 * time.Second, Margin: 5 * time.Second}, ErrInvalidKeepAlive},
		{KeepAliveOptions{Every: -time.Second}, ErrInvalidKeepAlive},
		{KeepAliveOptions{Retry: -time.Second}, ErrInvalidKeepAlive},
		{KeepAliveOptions{Margin: -time.Second}, ErrInvalidKeepAlive},
		{KeepAliveOptions{Lease: 256 * time.Second}, ErrInvalidLease},
	} {
		if _, err := cl.KeepAlive(context.Background(), l, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.opts, err, tc.want)
		}
	}
	if _, err := cl.KeepAlive(context.Background(), Lock{Token: 5}, KeepAliveOptions{}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
}

// TestKeepAliveFrozenMember: a member that stops answering (frozen, as
// by SIGSTOP: its connections stay up) takes renewals and answers none.
// Each renewal has a window of half the interval, not the transport
// timeout (here longer than the lease): one unanswered in it closes its
// connection, and the next goes to the other member, in time. A 3 s lock
// is kept for 5 s while every other renewal lands on the frozen member.
func TestKeepAliveFrozenMember(t *testing.T) {
	frozen := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpRenew {
			fc.auto(r)
		}
	})
	live := newFake(t, nil)
	cfg := fastConfig(frozen.addr(), live.addr())
	cfg.TransportTimeout = 5 * time.Second
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	ctx := ctxT(t, 20*time.Second)
	l, err := cl.Acquire(ctx, "frozen", AcquireOptions{Wait: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second, OnRenewError: func(error) { failed.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ka.Lost():
		t.Fatalf("lock lost: %v (%d renewals failed)", ka.Err(), failed.Load())
	case <-time.After(5 * time.Second):
	}
	if err := ka.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n := countRenews(frozen, l.Token, 10*time.Millisecond); n == 0 {
		t.Fatal("no renewal went to the frozen member: the test proves nothing")
	}
	if failed.Load() == 0 {
		t.Fatal("no renewal failed")
	}
}
