package client

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// Tests against a real in-process lockd.

func TestAcquireRelease(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 10*time.Second)
	before := time.Now()
	l, err := cl.Acquire(ctx, "acquire-release", AcquireOptions{Wait: time.Second, Lease: 10 * time.Second})
	after := time.Now()
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Key != "acquire-release" || l.Token == 0 {
		t.Fatalf("lock = %+v", l)
	}
	// Expires is the send instant plus the lease.
	if l.Expires.Before(before.Add(10*time.Second)) || l.Expires.After(after.Add(10*time.Second)) {
		t.Fatalf("Expires %v not within [%v, %v] + 10s", l.Expires, before, after)
	}
	if info := srv.lookup(t, l.Key); !info.Held || info.Token != l.Token {
		t.Fatalf("server: %+v, client: token %d", info, l.Token)
	}
	if err := cl.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantErr(t, cl.Release(ctx, l), ErrNotHeld)
	l2, err := cl.Acquire(ctx, "acquire-release", AcquireOptions{Lease: time.Second})
	if err != nil {
		t.Fatalf("second Acquire: %v", err)
	}
	if l2.Token <= l.Token {
		t.Fatalf("token %d not above %d", l2.Token, l.Token)
	}
	_ = cl.Release(ctx, l2)
}

// TestTimeoutIsDefinitive: a held key gives T (ErrTimeout), no earlier than
// the wait, and wait=0 gives T at once.
func TestTimeoutIsDefinitive(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "timeout", AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Release(ctx, l) }()
	start := time.Now()
	_, err = cl.Acquire(ctx, "timeout", AcquireOptions{Wait: time.Second})
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el < time.Second {
		t.Fatalf("T after %v, before the 1 s wait", el)
	}
	start = time.Now()
	_, err = cl.Acquire(ctx, "timeout", AcquireOptions{})
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el > 900*time.Millisecond {
		t.Fatalf("wait=0 took %v", el)
	}
}

// TestBusyAndServerError: a full queue gives B (ErrBusy); a key the server
// rejects gives a *ServerError with code 2 and the connection stays usable.
func TestBusyAndServerError(t *testing.T) {
	srv := ownServer(t, "--max-key", "8", "--max-waiters-per-key", "1")
	cfg := fastConfig(srv.Addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "busy", AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	queued := cl.AcquireAsync(ctx, "busy", AcquireOptions{Wait: 5 * time.Second})
	waitFor(t, "a waiter queued", func() bool { return srv.lookup(t, "busy").Waiters == 1 })
	_, err = cl.Acquire(ctx, "busy", AcquireOptions{Wait: time.Second})
	wantErr(t, err, ErrBusy)

	_, err = cl.Acquire(ctx, "much-too-long-key", AcquireOptions{})
	var se *ServerError
	if !errors.As(err, &se) || se.Code != proto.CodeBadKey || se.Op != proto.OpAcquire {
		t.Fatalf("err = %v, want ServerError code 2", err)
	}
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatalf("Ping after E 2: %v", err)
	}
	if err := cl.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	l2, err := queued.Wait()
	if err != nil {
		t.Fatalf("queued acquire: %v", err)
	}
	_ = cl.Release(ctx, l2)
}

// TestSameKeyTwoInFlightOneConn: two acquires of one key in flight on one
// connection: the first is granted, the second queued behind it and granted
// on release, each resolved to its own owner.
func TestSameKeyTwoInFlightOneConn(t *testing.T) {
	srv := sharedServer(t)
	cfg := fastConfig(srv.Addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	ctx := ctxT(t, 10*time.Second)
	t1 := cl.AcquireAsync(ctx, "same-key", AcquireOptions{Wait: 5 * time.Second, Lease: 10 * time.Second})
	t2 := cl.AcquireAsync(ctx, "same-key", AcquireOptions{Wait: 5 * time.Second, Lease: 10 * time.Second})
	if t1.conn == nil || t1.conn != t2.conn {
		t.Fatal("the two acquires are not on one connection")
	}
	l1, err := t1.Wait()
	if err != nil {
		t.Fatalf("first: %v", err)
	}
	waitFor(t, "the second acquire queued behind the first", func() bool {
		info := srv.lookup(t, "same-key")
		return info.Token == l1.Token && info.Waiters == 1
	})
	if err := cl.Release(ctx, l1); err != nil {
		t.Fatal(err)
	}
	l2, err := t2.Wait()
	if err != nil {
		t.Fatalf("second: %v", err)
	}
	if l2.Token <= l1.Token {
		t.Fatalf("second token %d not above %d", l2.Token, l1.Token)
	}
	_ = cl.Release(ctx, l2)
}

// TestPipelineFromOneGoroutine: one goroutine keeps hundreds of acquires in
// flight with AcquireAsync.
func TestPipelineFromOneGoroutine(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 10*time.Second)
	const n = 500
	tickets := make([]*Ticket, n)
	for i := range tickets {
		tickets[i] = cl.AcquireAsync(ctx, "pipe/"+strconv.Itoa(i), AcquireOptions{Wait: 2 * time.Second, Lease: 10 * time.Second})
	}
	seen := map[uint64]bool{}
	locks := make([]Lock, n)
	for i, tk := range tickets {
		l, err := tk.Wait()
		if err != nil {
			t.Fatalf("ticket %d: %v", i, err)
		}
		if l.Key != "pipe/"+strconv.Itoa(i) || seen[l.Token] {
			t.Fatalf("ticket %d: %+v (duplicate %v)", i, l, seen[l.Token])
		}
		seen[l.Token] = true
		locks[i] = l
	}
	for _, l := range locks {
		if err := cl.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRenew(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "renew", AcquireOptions{Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	l2, err := cl.Renew(ctx, l, 20*time.Second)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if l2.Token != l.Token || l2.Expires.Before(before.Add(20*time.Second)) {
		t.Fatalf("renewed %+v", l2)
	}
	if err := cl.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
	_, err = cl.Renew(ctx, l2, time.Second)
	wantErr(t, err, ErrNotHeld)
}

func TestPing(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	rtt, err := cl.Ping(ctxT(t, 5*time.Second))
	if err != nil || rtt <= 0 {
		t.Fatalf("Ping = %v, %v", rtt, err)
	}
}

// TestValidation: bad arguments fail before anything is sent.
func TestValidation(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 5*time.Second)
	cases := []struct {
		key  string
		opts AcquireOptions
		want error
	}{
		{"", AcquireOptions{}, ErrInvalidKey},
		{"a\nb", AcquireOptions{}, ErrInvalidKey},
		{"\xff", AcquireOptions{}, ErrInvalidKey},
		{"ab\xffc", AcquireOptions{}, ErrInvalidKey},
		{"clé\n", AcquireOptions{}, ErrInvalidKey},
		{"clé\xff", AcquireOptions{}, ErrInvalidKey},
		{string(make([]byte, proto.MaxKey+1)), AcquireOptions{}, ErrInvalidKey},
		{"k", AcquireOptions{Wait: 256 * time.Second}, ErrInvalidWait},
		{"k", AcquireOptions{Wait: -1}, ErrInvalidWait},
		{"k", AcquireOptions{Lease: 256 * time.Second}, ErrInvalidLease},
		{"k", AcquireOptions{Lease: -time.Second}, ErrInvalidLease},
	}
	for _, c := range cases {
		_, err := cl.Acquire(ctx, c.key, c.opts)
		wantErr(t, err, c.want)
	}
	f.none(100 * time.Millisecond)
	// A valid non-ASCII key is sent as is.
	tk := cl.AcquireAsync(ctx, "clé/ü", AcquireOptions{Wait: time.Second})
	if r := f.next(2 * time.Second); r.Key != "clé/ü" {
		t.Fatalf("sent key %q", r.Key)
	}
	if _, err := tk.Wait(); err != nil {
		t.Fatalf("non-ASCII key: %v", err)
	}
	for _, c := range []Config{{}, {Addrs: []string{"nohost"}}, {Addrs: []string{"127.0.0.1:1"}, DialTimeout: -1}} {
		if _, err := New(c); err == nil {
			t.Fatalf("New(%+v) accepted", c)
		}
	}
}

// TestWithLockRenews: the lease is renewed while fn runs longer than it;
// the key is released at the end.
func TestWithLockRenews(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 20*time.Second)
	var token uint64
	err := cl.WithLock(ctx, "withlock", AcquireOptions{Lease: 2 * time.Second}, func(ctx context.Context, l Lock) error {
		token = l.Token
		for i := 0; i < 5; i++ {
			time.Sleep(600 * time.Millisecond) // 3 s in all, past the 2 s lease
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if info := srv.lookup(t, "withlock"); info.Token != l.Token {
				t.Errorf("at %d: server holds %+v", i, info)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("WithLock: %v", err)
	}
	if info := srv.lookup(t, "withlock"); info.Held {
		t.Fatalf("still held after WithLock: %+v (token %d)", info, token)
	}
}

// TestWithLockLost: when the lock goes (here released behind fn's back),
// the next renew gets N and fn's context is cancelled with ErrLockLost.
func TestWithLockLost(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 20*time.Second)
	err := cl.WithLock(ctx, "withlock-lost", AcquireOptions{Lease: time.Second}, func(fctx context.Context, l Lock) error {
		if err := cl.Release(ctx, l); err != nil {
			return err
		}
		select {
		case <-fctx.Done():
			if !errors.Is(context.Cause(fctx), ErrLockLost) {
				t.Errorf("cause %v", context.Cause(fctx))
			}
			return nil
		case <-time.After(5 * time.Second):
			t.Error("fn's context not cancelled within 5 s")
			return nil
		}
	})
	wantErr(t, err, ErrLockLost)
}

// TestWithLockAfterLongWait: a lock granted after a long wait in the queue
// has little of its conservative lease left (Lock.Expires counts from the
// send); WithLock renews before running fn, so fn keeps the lock.
func TestWithLockAfterLongWait(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 20*time.Second)
	holder, err := cl.Acquire(ctx, "long-wait", AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(2500*time.Millisecond, func() { _ = cl.Release(context.Background(), holder) })
	err = cl.WithLock(ctx, "long-wait", AcquireOptions{Wait: 5 * time.Second, Lease: 3 * time.Second},
		func(ctx context.Context, l Lock) error {
			if left := time.Until(l.Expires); left < 2*time.Second {
				t.Errorf("fn starts with %v of the lease left", left)
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(1500 * time.Millisecond):
				return nil
			}
		})
	if err != nil {
		t.Fatalf("WithLock after a 2.5 s wait: %v", err)
	}
}
