package client

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// Fault tests against the scripted fake server, where the fault must be
// placed exactly.

// silent answers pings and nothing else.
func silent(fc *fconn, r freq) {
	if r.Op == proto.OpPing {
		fc.auto(r)
	}
}

// deadAddr returns a 127.0.0.1 address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	_ = ln.Close()
	return a
}

func TestConnsPerAddress(t *testing.T) {
	t.Run("one address, two connections", func(t *testing.T) {
		f := newFake(t, nil)
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		time.Sleep(50 * time.Millisecond)
		if n := f.numConns(); n != 2 {
			t.Fatalf("server saw %d connections, want 2", n)
		}
	})
	t.Run("two addresses, one each", func(t *testing.T) {
		f1, f2 := newFake(t, nil), newFake(t, nil)
		cl := newClient(t, fastConfig(f1.addr(), f2.addr()))
		waitUp(t, cl, 2)
		time.Sleep(50 * time.Millisecond)
		if n1, n2 := f1.numConns(), f2.numConns(); n1 != 1 || n2 != 1 {
			t.Fatalf("servers saw %d and %d connections, want 1 and 1", n1, n2)
		}
	})
}

func TestRoundRobin(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 5*time.Second)
	per := map[*fconn]int{}
	for i := 0; i < 20; i++ {
		if _, err := cl.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		per[f.next(time.Second).Conn]++
	}
	if len(per) != 2 {
		t.Fatalf("pings used %d connections, want 2", len(per))
	}
	for _, n := range per {
		if n != 10 {
			t.Fatalf("pings per connection %v, want 10 and 10", per)
		}
	}
}

// TestDropExcludedAndRedialled: a dropped connection gets no more requests
// and is dialled again after ReconnectInterval, not before.
func TestDropExcludedAndRedialled(t *testing.T) {
	f := newFake(t, nil)
	cfg := fastConfig(f.addr())
	cfg.ReconnectInterval = 300 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	first := <-f.accepts
	<-f.accepts
	dropped := time.Now()
	_ = first.nc.Close()
	deadline := time.Now().Add(2 * time.Second)
	for liveConns(cl) != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ctx := ctxT(t, 5*time.Second)
	for i := 0; i < 10; i++ {
		if _, err := cl.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if r := f.next(time.Second); r.Conn == first {
			t.Fatal("request sent on the dropped connection")
		}
	}
	select {
	case <-f.accepts:
		if el := time.Since(dropped); el < 300*time.Millisecond {
			t.Fatalf("redialled after %v, before the 300 ms interval", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not redialled within 5 s")
	}
	waitUp(t, cl, 2)
}

// answerInReverse is a fake server's handler that answers nothing until it
// has read n requests, then answers them all in one write, last first.
func answerInReverse(n int, answer func(out []byte, r freq) []byte) func(fc *fconn, r freq) {
	var mu sync.Mutex
	var got []freq
	return func(fc *fconn, r freq) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r)
		if len(got) < n {
			return
		}
		var out []byte
		for i := n - 1; i >= 0; i-- {
			out = answer(out, got[i])
		}
		fc.send(out)
	}
}

// TestPipelinedOutOfOrder: 50 acquires in flight on one connection,
// answered in reverse order, each matched to its own owner.
func TestPipelinedOutOfOrder(t *testing.T) {
	const n = 50
	f := newFake(t, answerInReverse(n, func(out []byte, r freq) []byte {
		return proto.AppendAcquired(out, r.ID, r.ID^0xabcdef, r.Key)
	}))
	cfg := fastConfig(f.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	ctx := ctxT(t, 5*time.Second)
	tickets := make([]*Ticket, n)
	owners := make([]uint64, n)
	for i := range tickets {
		tickets[i] = cl.AcquireAsync(ctx, "same", AcquireOptions{Wait: 3 * time.Second})
		owners[i] = tickets[i].id
	}
	for i, tk := range tickets {
		l, err := tk.Wait()
		if err != nil {
			t.Fatalf("ticket %d: %v", i, err)
		}
		if l.Token != owners[i]^0xabcdef {
			t.Fatalf("ticket %d got token %x, want %x", i, l.Token, owners[i]^0xabcdef)
		}
	}
}

// TestWireWait asserts the bytes of the wait field: rounded up, capped.
func TestWireWait(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 5*time.Second)
	for _, c := range []struct {
		wait time.Duration
		wire uint8
	}{
		{0, 0},
		{300 * time.Millisecond, 1}, // was 1 ms: unsent by its deadline under load (ErrTimeout), a flake on main
		{time.Second, 1},
		{2500 * time.Millisecond, 3},
		{255 * time.Second, 255},
	} {
		// A grant that comes back after a sub-second wait has ended goes
		// through the delivery gate (released again, ErrIndeterminate):
		// a correct outcome under load, and not what this test checks.
		if _, err := cl.Acquire(ctx, "wire-wait", AcquireOptions{Wait: c.wait, Lease: 7 * time.Second}); err != nil &&
			!(c.wait < time.Second && errors.Is(err, ErrIndeterminate)) {
			t.Fatal(err)
		}
		r := f.next(time.Second)
		for r.Op == proto.OpRelease { // the gate's compensating release
			r = f.next(time.Second)
		}
		if r.Op != proto.OpAcquire || r.Wait != c.wire || r.Lease != 7 || r.Key != "wire-wait" {
			t.Fatalf("Wait %v: server got %c wait=%d lease=%d key=%q, want wait %d", c.wait, r.Op, r.Wait, r.Lease, r.Key, c.wire)
		}
	}
}

// TestMovedFollowsRecomputesWait: M with an address: the client connects
// there, resends with the same owner and the wire wait recomputed from the
// same deadline, and prefers that address from then on.
func TestMovedFollowsRecomputesWait(t *testing.T) {
	active := newFake(t, nil)
	standby := newFake(t, func(fc *fconn, r freq) {
		go func() {
			time.Sleep(1300 * time.Millisecond)
			fc.send(proto.AppendMoved(nil, r.Op, r.ID, active.addr()))
		}()
	})
	cl := newClient(t, fastConfig(standby.addr()))
	ctx := ctxT(t, 15*time.Second)
	l, err := cl.Acquire(ctx, "moved", AcquireOptions{Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	r1 := standby.next(time.Second)
	r2 := active.next(time.Second)
	if r1.Wait != 10 {
		t.Fatalf("first send wait=%d, want 10", r1.Wait)
	}
	// 10 s - ≥1.3 s, rounded up: 9 (8 if this machine stalled ~0.7 s).
	if r2.Wait != 9 && r2.Wait != 8 {
		t.Fatalf("resend wait=%d, want 9", r2.Wait)
	}
	if r2.ID != r1.ID || r2.Key != "moved" {
		t.Fatalf("resend owner %x key %q, want owner %x", r2.ID, r2.Key, r1.ID)
	}
	if l.Token == 0 {
		t.Fatal("no token")
	}
	for i := 0; i < 4; i++ {
		if _, err := cl.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		active.next(time.Second)
	}
	standby.none(50 * time.Millisecond)
}

// TestMovedNoAddress: M without an address: pause, resend with the same
// owner until the deadline; then ErrTimeout and nothing more is sent.
func TestMovedNoAddress(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpAcquire && r.Key == "grant-third" && n.Add(1) >= 3 {
			fc.auto(r)
			return
		}
		fc.send(proto.AppendMoved(nil, r.Op, r.ID, ""))
	})
	cfg := fastConfig(f.addr())
	cfg.RetryPause = 100 * time.Millisecond
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)

	start := time.Now()
	if _, err := cl.Acquire(ctx, "grant-third", AcquireOptions{Wait: 5 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("two pauses took %v, less than 2 × 100 ms", el)
	}
	r0 := f.next(time.Second)
	for i := 0; i < 2; i++ {
		if r := f.next(time.Second); r.ID != r0.ID {
			t.Fatalf("resend %d owner %x, want %x", i, r.ID, r0.ID)
		}
	}

	start = time.Now()
	_, err := cl.Acquire(ctx, "never", AcquireOptions{Wait: 700 * time.Millisecond})
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el < 700*time.Millisecond {
		t.Fatalf("gave up after %v, before the deadline", el)
	}
	owner := f.next(time.Second).ID
	for {
		select {
		case r := <-f.reqs:
			if r.ID != owner {
				t.Fatalf("resend with owner %x, want %x", r.ID, owner)
			}
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
}

// TestShuttingDownRetried: E 4 means not executed: resend, same owner.
func TestShuttingDownRetried(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fconn, r freq) {
		if n.Add(1) == 1 {
			fc.send(proto.AppendError(nil, r.Op, r.ID, proto.CodeShutdown, "shutting down"))
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	if _, err := cl.Acquire(ctxT(t, 5*time.Second), "e4", AcquireOptions{Wait: 3 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if a, b := f.next(time.Second), f.next(time.Second); a.ID != b.ID {
		t.Fatalf("owners %x, %x differ", a.ID, b.ID)
	}
}

// TestDeadlineBeforeSendNotSent: with no connection until after the
// deadline, the request is never sent.
func TestDeadlineBeforeSendNotSent(t *testing.T) {
	addr := deadAddr(t)
	cl := newClient(t, fastConfig(addr))
	start := time.Now()
	_, err := cl.Acquire(ctxT(t, 5*time.Second), "late", AcquireOptions{Wait: 500 * time.Millisecond})
	wantErr(t, err, ErrNoConnection) // an outage, not a timeout: nobody was seen holding it
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Fatalf("ErrNoConnection after %v, before the deadline", el)
	}
	f := newFakeAt(t, addr, nil)
	waitUp(t, cl, 2)
	f.none(300 * time.Millisecond)
}

// TestRetryWhileUnsent: a connection that dies before its writer took the
// request: the same request (owner, deadline) goes out on another one.
func TestRetryWhileUnsent(t *testing.T) {
	var killed atomic.Pointer[conn]
	var owner atomic.Uint64
	testHookBeforeWrite = func(c *conn) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.queue) > 0 && c.queue[0].op == proto.OpAcquire && killed.CompareAndSwap(nil, c) {
			owner.Store(c.queue[0].id)
			return false
		}
		return true
	}
	t.Cleanup(func() { testHookBeforeWrite = nil })
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	if _, err := cl.Acquire(ctxT(t, 5*time.Second), "unsent", AcquireOptions{Wait: 2 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if killed.Load() == nil {
		t.Fatal("hook did not run")
	}
	r := f.next(time.Second)
	if r.ID != owner.Load() {
		t.Fatalf("sent owner %x, want the unsent request's %x", r.ID, owner.Load())
	}
	f.none(100 * time.Millisecond)
}

// TestNoResendAfterPossibleSend: the server reads the acquire and drops the
// connection: ErrIndeterminate, and nothing is sent again.
func TestNoResendAfterPossibleSend(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpAcquire {
			_ = fc.nc.Close()
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 5*time.Second)
	for _, wait := range []time.Duration{2 * time.Second, 0} {
		hear(t, cl, f)
		_, err := cl.Acquire(ctx, "dropped", AcquireOptions{Wait: wait})
		wantErr(t, err, ErrIndeterminate)
		f.next(time.Second)
		f.none(200 * time.Millisecond)
		waitUp(t, cl, 2)
	}
}

// TestDeadlineClosesExactConnection: no answer by the end of the wait:
// ErrTimeout then, at the caller's deadline, with the connection kept;
// once the answer is overdue (wire wait + allowance) the server is taken
// not to answer, and that connection, only it, is closed.
func TestDeadlineClosesExactConnection(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpAcquire {
			fc.auto(r)
		}
	})
	cl := newClient(t, fastConfig(f.addr())) // allowance 300 ms
	waitUp(t, cl, 2)
	hear(t, cl, f)
	start := time.Now()
	_, err := cl.Acquire(ctxT(t, 5*time.Second), "unanswered", AcquireOptions{Wait: 700 * time.Millisecond})
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el < 700*time.Millisecond || el > 1200*time.Millisecond {
		t.Fatalf("ErrTimeout after %v, want at the end of the wait (700 ms)", el)
	}
	r := f.next(time.Second)
	select {
	case <-r.Conn.closed:
		t.Fatal("the connection was closed at the caller's deadline")
	default:
	}
	select {
	case <-r.Conn.closed:
		if el := time.Since(start); el < 1300*time.Millisecond {
			t.Fatalf("closed after %v, before the answer was due (1 s wire wait + 300 ms)", el)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the acquire's connection was not closed once its answer was overdue")
	}
	f.mu.Lock()
	conns := append([]*fconn(nil), f.conns...)
	f.mu.Unlock()
	for _, fc := range conns {
		if fc == r.Conn {
			continue
		}
		select {
		case <-fc.closed:
			t.Fatal("another connection was closed too")
		default:
		}
	}
}

// TestWaitZero: one server attempt, then its own transport deadlines: for
// finding a connection, and for the answer (which closes the connection).
func TestWaitZero(t *testing.T) {
	t.Run("answer deadline", func(t *testing.T) {
		f := newFake(t, silent)
		cfg := fastConfig(f.addr())
		cfg.TransportTimeout = 500 * time.Millisecond
		cl := newClient(t, cfg)
		waitUp(t, cl, 2)
		start := time.Now()
		_, err := cl.Acquire(ctxT(t, 5*time.Second), "w0", AcquireOptions{})
		wantErr(t, err, ErrIndeterminate)
		if el := time.Since(start); el < 500*time.Millisecond {
			t.Fatalf("gave up after %v", el)
		}
		r := f.next(time.Second)
		if r.Wait != 0 {
			t.Fatalf("wire wait %d", r.Wait)
		}
		select {
		case <-r.Conn.closed:
		case <-time.After(2 * time.Second):
			t.Fatal("connection not closed")
		}
		f.none(100 * time.Millisecond)
	})
	t.Run("one deadline for the whole call", func(t *testing.T) {
		// The connection comes up late in the 1 s transport window; the
		// answer deadline is the end of that window, not 1 s after the
		// send: there the exact connection is closed, Indeterminate.
		addr := deadAddr(t)
		cfg := fastConfig(addr)
		cfg.TransportTimeout = time.Second
		cfg.ReconnectInterval = 20 * time.Millisecond
		cl := newClient(t, cfg)
		start := time.Now()
		type result struct {
			err error
			el  time.Duration
		}
		done := make(chan result, 1)
		go func() {
			_, err := cl.Acquire(context.Background(), "w0-late", AcquireOptions{})
			done <- result{err, time.Since(start)}
		}()
		time.Sleep(600 * time.Millisecond)
		newFakeAt(t, addr, silent)
		var res result
		select {
		case res = <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("wait-0 acquire still running after 5 s")
		}
		err, el := res.err, res.el
		wantErr(t, err, ErrIndeterminate)
		if el < time.Second || el > 1400*time.Millisecond {
			t.Fatalf("Indeterminate after %v, want at the 1 s transport deadline", el)
		}
	})
	t.Run("no connection", func(t *testing.T) {
		cfg := fastConfig(deadAddr(t))
		cfg.TransportTimeout = 400 * time.Millisecond
		cl := newClient(t, cfg)
		start := time.Now()
		_, err := cl.Acquire(ctxT(t, 5*time.Second), "w0", AcquireOptions{})
		wantErr(t, err, ErrNoConnection)
		if el := time.Since(start); el < 400*time.Millisecond {
			t.Fatalf("gave up after %v", el)
		}
	})
}

// grantToken answers every acquire with token 777 and records nothing else
// but what newFake records.
func grantToken(fc *fconn, r freq) {
	switch r.Op {
	case proto.OpAcquire:
		fc.send(proto.AppendAcquired(nil, r.ID, 777, r.Key))
	default:
		fc.auto(r)
	}
}

// TestLateGrantCompensated: an A taken at the delivery gate after the
// deadline, or after ctx ended, is released (exact token) and reported as
// what ended the call: ErrTimeout, or ctx's error.
func TestLateGrantCompensated(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		f := newFake(t, grantToken)
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		tk := cl.AcquireAsync(context.Background(), "late-grant", AcquireOptions{Wait: 100 * time.Millisecond})
		f.next(time.Second)
		time.Sleep(300 * time.Millisecond) // past the wait
		_, err := tk.Wait()
		wantErr(t, err, ErrTimeout)
		r := f.next(time.Second)
		if r.Op != proto.OpRelease || r.ID != 777 || r.Key != "late-grant" {
			t.Fatalf("got %c %d %q, want release of 777", r.Op, r.ID, r.Key)
		}
	})
	t.Run("answered after the call's deadline", func(t *testing.T) {
		// Wait 200 ms goes out as wire wait 1 s: the server may grant
		// until then. The call ends with ErrTimeout at 200 ms, keeping
		// its connection; the A that comes 400 ms in is released.
		f := newFake(t, func(fc *fconn, r freq) {
			if r.Op == proto.OpAcquire {
				time.AfterFunc(400*time.Millisecond, func() { fc.send(proto.AppendAcquired(nil, r.ID, 777, r.Key)) })
				return
			}
			fc.auto(r)
		})
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		start := time.Now()
		_, err := cl.Acquire(context.Background(), "late-grant", AcquireOptions{Wait: 200 * time.Millisecond})
		wantErr(t, err, ErrTimeout)
		if el := time.Since(start); el > 350*time.Millisecond {
			t.Fatalf("ErrTimeout after %v, want at the end of the 200 ms wait", el)
		}
		f.next(time.Second) // the acquire
		if r := f.next(time.Second); r.Op != proto.OpRelease || r.ID != 777 {
			t.Fatalf("got %c %d, want release of 777", r.Op, r.ID)
		}
	})
	t.Run("ctx", func(t *testing.T) {
		f := newFake(t, grantToken)
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		ctx, cancel := context.WithCancel(context.Background())
		tk := cl.AcquireAsync(ctx, "late-grant", AcquireOptions{Wait: 3 * time.Second})
		f.next(time.Second)
		waitFor(t, "the A arrives", func() bool { return answered(tk) })
		cancel()
		_, err := tk.Wait()
		wantErr(t, err, context.Canceled)
		if r := f.next(time.Second); r.Op != proto.OpRelease || r.ID != 777 {
			t.Fatalf("got %c %d, want release of 777", r.Op, r.ID)
		}
	})
	t.Run("real server", func(t *testing.T) {
		srv := sharedServer(t)
		cl := newClient(t, fastConfig(srv.Addr()))
		waitUp(t, cl, 2)
		ctx, cancel := context.WithCancel(context.Background())
		tk := cl.AcquireAsync(ctx, "late-grant-real", AcquireOptions{Wait: 3 * time.Second})
		waitFor(t, "the A arrives", func() bool { return answered(tk) })
		cancel()
		_, err := tk.Wait()
		wantErr(t, err, context.Canceled)
		deadline := time.Now().Add(3 * time.Second)
		for srv.lookup(t, "late-grant-real").Held {
			if time.Now().After(deadline) {
				t.Fatal("compensating release did not free the key")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// TestLateTimeoutBusyDefinitive: T and B stay definitive at the gate.
func TestLateTimeoutBusyDefinitive(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		switch r.Key {
		case "t":
			fc.send(proto.AppendTimeout(nil, r.ID, r.Key))
		case "b":
			fc.send(proto.AppendBusy(nil, r.ID, r.Key))
		default:
			fc.auto(r)
		}
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx, cancel := context.WithCancel(context.Background())
	tt := cl.AcquireAsync(ctx, "t", AcquireOptions{Wait: time.Second})
	tb := cl.AcquireAsync(ctx, "b", AcquireOptions{Wait: time.Second})
	f.next(time.Second)
	f.next(time.Second)
	waitFor(t, "the answers arrive", func() bool { return answered(tt) && answered(tb) })
	cancel()
	_, err := tt.Wait()
	wantErr(t, err, ErrTimeout)
	_, err = tb.Wait()
	wantErr(t, err, ErrBusy)
	f.none(100 * time.Millisecond)
}

// TestCtxCancel: ctx.Err(), before the send or after it; a possibly sent
// acquire leaves its connection open (a stand-in takes the answer).
func TestCtxCancel(t *testing.T) {
	t.Run("unsent", func(t *testing.T) {
		cl := newClient(t, fastConfig(deadAddr(t)))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := cl.Acquire(ctx, "ctx", AcquireOptions{Wait: 5 * time.Second})
		wantErr(t, err, context.DeadlineExceeded)
	})
	t.Run("sent", func(t *testing.T) {
		f := newFake(t, silent)
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := cl.Acquire(ctx, "ctx", AcquireOptions{Wait: 5 * time.Second})
		wantErr(t, err, context.DeadlineExceeded)
		r := f.next(time.Second)
		select {
		case <-r.Conn.closed:
			t.Fatal("the connection was closed")
		case <-time.After(300 * time.Millisecond):
		}
		if n := liveConns(cl); n != 2 {
			t.Fatalf("%d connections live, want 2", n)
		}
	})
}

// TestReleaseRetries: a release whose connection drops is sent again after
// the retry interval, on another connection.
func TestReleaseRetries(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpRelease && n.Add(1) == 1 {
			_ = fc.nc.Close()
			return
		}
		fc.auto(r)
	})
	cfg := fastConfig(f.addr())
	cfg.ReleaseRetryInterval = 200 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	hear(t, cl, f)
	if err := cl.Release(ctxT(t, 5*time.Second), Lock{Key: "rel", Token: 42}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	a, b := f.next(time.Second), f.next(time.Second)
	if a.ID != 42 || b.ID != 42 || a.Op != proto.OpRelease || b.Op != proto.OpRelease {
		t.Fatalf("got %c %d, %c %d", a.Op, a.ID, b.Op, b.ID)
	}
	if gap := b.At.Sub(a.At); gap < 200*time.Millisecond {
		t.Fatalf("retried after %v, before 200 ms", gap)
	}
	if a.Conn == b.Conn {
		t.Fatal("retried on the dropped connection")
	}
}

func TestReleaseNoConnection(t *testing.T) {
	cfg := fastConfig(deadAddr(t))
	cfg.ReleaseRetry = 500 * time.Millisecond
	cl := newClient(t, cfg)
	start := time.Now()
	err := cl.Release(ctxT(t, 5*time.Second), Lock{Key: "k", Token: 1})
	wantErr(t, err, ErrNoConnection)
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Fatalf("gave up after %v", el)
	}
}

// TestClose: pending calls fail with ErrClosed (a possibly sent acquire
// also matches ErrIndeterminate), later calls too; goroutines end
// (the leak check in TestMain).
func TestClose(t *testing.T) {
	f := newFake(t, silent)
	cl, err := New(fastConfig(f.addr()))
	if err != nil {
		t.Fatal(err)
	}
	waitUp(t, cl, 2)
	sent := cl.AcquireAsync(context.Background(), "pending", AcquireOptions{Wait: 10 * time.Second})
	f.next(time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := sent.Wait()
		errs <- err
	}()
	dead, err := New(fastConfig(deadAddr(t)))
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := dead.Acquire(context.Background(), "waiting", AcquireOptions{Wait: 10 * time.Second})
		errs <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_ = cl.Close()
	_ = dead.Close()
	wg.Wait()
	for i := 0; i < 2; i++ {
		wantErr(t, <-errs, ErrClosed)
	}
	_, err = cl.Acquire(context.Background(), "after", AcquireOptions{})
	wantErr(t, err, ErrClosed)
	wantErr(t, cl.Release(context.Background(), Lock{Key: "k", Token: 1}), ErrClosed)
	_ = cl.Close() // idempotent
	t.Run("sent acquire is indeterminate too", func(t *testing.T) {
		f := newFake(t, silent)
		cl, err := New(fastConfig(f.addr()))
		if err != nil {
			t.Fatal(err)
		}
		waitUp(t, cl, 2)
		tk := cl.AcquireAsync(context.Background(), "pending", AcquireOptions{Wait: 10 * time.Second})
		f.next(time.Second)
		_ = cl.Close()
		_, err = tk.Wait()
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrIndeterminate) {
			t.Fatalf("err = %v, want ErrClosed and ErrIndeterminate", err)
		}
	})
	t.Run("sent release and renew", func(t *testing.T) {
		f := newFake(t, silent)
		cl, err := New(fastConfig(f.addr()))
		if err != nil {
			t.Fatal(err)
		}
		waitUp(t, cl, 2)
		ctx := context.Background()
		errs := make(chan error, 3)
		go func() { errs <- cl.Release(ctx, Lock{Key: "r", Token: 5}) }()
		go func() { _, err := cl.Renew(ctx, Lock{Key: "k", Token: 6}, time.Second); errs <- err }()
		rel := cl.ReleaseAsync(ctx, Lock{Key: "a", Token: 7})
		go func() { errs <- rel.Wait() }()
		for i := 0; i < 3; i++ {
			f.next(time.Second)
		}
		_ = cl.Close()
		for i := 0; i < 3; i++ {
			select {
			case err := <-errs:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("err = %v, want ErrClosed (the call may have executed: and ErrIndeterminate)", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a pending call did not end at Close")
			}
		}
	})
}

// answered reports whether tk's answer has reached it (before Wait).
func answered(tk *Ticket) bool {
	c := tk.conn
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return tk.state == stDone
}

// TestReleaseAsyncPipelined: releases started with ReleaseAsync are all on
// the wire before the first Wait — the fake server answers none until it
// has read every one, in reverse order — and each Wait gets its own
// answer: R, or N for the token the server says is not held.
func TestReleaseAsyncPipelined(t *testing.T) {
	const n = 40
	f := newFake(t, answerInReverse(n, func(out []byte, r freq) []byte {
		if r.Op != proto.OpRelease {
			t.Errorf("request %q: op %v", r.Key, r.Op)
		}
		if r.ID == 7 {
			return proto.AppendNotHeld(out, proto.OpRelease, r.ID, r.Key)
		}
		return proto.AppendReleased(out, r.ID, r.Key)
	}))
	cfg := fastConfig(f.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	ctx := ctxT(t, 5*time.Second)
	rs := make([]Releasing, n)
	for i := range rs {
		rs[i] = cl.ReleaseAsync(ctx, Lock{Key: "k" + strconv.Itoa(i), Token: uint64(i + 1)})
	}
	for i, r := range rs {
		err := r.Wait()
		if i+1 == 7 {
			wantErr(t, err, ErrNotHeld)
			continue
		}
		if err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	wantErr(t, cl.ReleaseAsync(ctx, Lock{Key: "", Token: 1}).Wait(), ErrInvalidKey)
}

// TestAbandonedRenewAnswerNotReused: a renew given up on (its ctx ended)
// after it was sent leaves its answer outstanding; that late K must not
// be taken as the answer of the next renew of the same token on the same
// connection, which the server answers N.
func TestAbandonedRenewAnswerNotReused(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpRenew {
			fc.auto(r)
			return
		}
		switch n.Add(1) {
		case 1:
			time.AfterFunc(150*time.Millisecond, func() { fc.send(proto.AppendRenewed(nil, r.ID, r.Key)) })
		default:
			time.AfterFunc(300*time.Millisecond, func() { fc.send(proto.AppendNotHeld(nil, proto.OpRenew, r.ID, r.Key)) })
		}
	})
	cfg := fastConfig(f.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	l := Lock{Key: "renewed", Token: 99}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := cl.Renew(ctx, l, time.Second); err == nil {
		t.Fatal("first renew succeeded after its ctx ended")
	}
	_, err := cl.Renew(context.Background(), l, 30*time.Second)
	wantErr(t, err, ErrNotHeld)
	if live := liveConns(cl); live != 1 {
		t.Fatalf("%d live connections, want the one still answering", live)
	}
}

// TestMovedWithoutAddressDropsPreference: the client's only address
// redirects it (M with an address) to a node that then answers M without
// one (it knows no active either). The redirect target stops being
// preferred, and after the pause the request goes back to the first
// node, which has become active and grants.
func TestMovedWithoutAddressDropsPreference(t *testing.T) {
	lost := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpAcquire {
			fc.send(proto.AppendMoved(nil, proto.OpAcquire, r.ID, ""))
			return
		}
		fc.auto(r)
	})
	var first atomic.Bool
	node := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpAcquire && first.CompareAndSwap(false, true) {
			fc.send(proto.AppendMoved(nil, proto.OpAcquire, r.ID, lost.addr()))
			return
		}
		grantToken(fc, r)
	})
	cfg := fastConfig(node.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	l, err := cl.Acquire(ctxT(t, 5*time.Second), "moved", AcquireOptions{Wait: 2 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Token != 777 || lost.numConns() == 0 {
		t.Fatalf("lock %+v, redirect target connections %d: want the grant of the first node after the detour", l, lost.numConns())
	}
	if p := cl.preferred.Load(); p != nil {
		t.Fatalf("still preferring %s after its M without an address", *p)
	}
}

// TestNoConnectionWaitIsNotAHolder: a wait>0 acquire that finds no
// connection before its deadline was not sent: ErrNoConnection (the
// reason), and not ErrTimeout, so a caller can tell an outage from a key
// held by someone else (an outage once matched both, and a cron job
// that treated ErrTimeout as "held elsewhere" skipped silently forever).
func TestNoConnectionWaitIsNotAHolder(t *testing.T) {
	cl := newClient(t, fastConfig(deadAddr(t)))
	_, err := cl.Acquire(ctxT(t, 5*time.Second), "nobody", AcquireOptions{Wait: 300 * time.Millisecond})
	if errors.Is(err, ErrTimeout) || !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err = %v, want ErrNoConnection and not ErrTimeout", err)
	}
}
