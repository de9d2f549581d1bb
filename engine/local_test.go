package engine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
)

// local drives an engine.LocalConn as the HTTP front does: frames in,
// answers parsed out.
type local struct {
	t   testing.TB
	c   *engine.LocalConn
	buf []byte
}

func openLocal(t testing.TB, s *testServer, cn string) *local {
	t.Helper()
	c, err := s.OpenLocal(cn, "test")
	if err != nil {
		t.Fatalf("OpenLocal: %v", err)
	}
	t.Cleanup(c.Close)
	return &local{t: t, c: c}
}

func (l *local) send(b []byte) {
	l.t.Helper()
	if err := l.c.Send(b); err != nil {
		l.t.Fatalf("Send: %v", err)
	}
}

// next returns the next answer within d; closed reports that the
// connection closed with no answer left.
func (l *local) next(d time.Duration) (f frame, closed, ok bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		l.buf = l.c.Take(l.buf)
		if len(l.buf) > 0 {
			var r proto.Response
			n, err := proto.ParseResponse(l.buf, &r)
			if err != nil {
				l.t.Fatalf("the engine wrote a bad frame %q: %v", l.buf, err)
			}
			f = frame{Op: r.Op, ReqOp: r.ReqOp, ID: r.ID, Token: r.Token, Code: r.Code, Tail: string(r.Tail),
				Reason: r.Reason, Remaining: r.Remaining, Holders: r.Holders, Limit: r.Limit, Waiters: r.Waiters}
			l.buf = l.buf[n:]
			return f, false, true
		}
		select {
		case <-l.c.Ready():
		case <-l.c.Done():
			if l.buf = l.c.Take(l.buf); len(l.buf) == 0 {
				return frame{}, true, false
			}
		case <-deadline.C:
			return frame{}, false, false
		}
	}
}

func (l *local) expect(op proto.Op, id uint64) frame {
	l.t.Helper()
	f, closed, ok := l.next(5 * time.Second)
	if !ok {
		l.t.Fatalf("waiting for %c id=%d: closed=%v", op, id, closed)
	}
	if f.Op != op || f.ID != id {
		l.t.Fatalf("got %c id=%d (reqop %c code %d tail %q), want %c id=%d", f.Op, f.ID, f.ReqOp, f.Code, f.Tail, op, id)
	}
	return f
}

func (l *local) silent(d time.Duration) {
	l.t.Helper()
	if f, closed, ok := l.next(d); ok || closed {
		l.t.Fatalf("unexpected %+v (closed %v)", f, closed)
	}
}

// inspect asks w for key's state.
func inspect(w *wire, key string) frame {
	w.t.Helper()
	w.send(proto.AppendInspect(nil, 99, key))
	return w.expect(proto.OpInspect, 99)
}

// TestLocalServesEveryRequest: the answers of a local connection are the
// engine's, request for request, as on a socket.
func TestLocalServesEveryRequest(t *testing.T) {
	s := startServer(t, nil)
	l := openLocal(t, s, "")
	l.send(proto.AppendAcquire(nil, 0, 5, 1, "k"))
	tok := l.expect(proto.OpAcquire, 1).Token
	l.send(proto.AppendAcquire(nil, 0, 5, 2, "k"))
	l.expect(proto.OpTimeout, 2)
	l.send(proto.AppendValidate(nil, tok, "k"))
	if f := l.expect(proto.OpValidate, tok); f.Remaining == 0 || f.Remaining > 5000 {
		t.Fatalf("V remaining %d", f.Remaining)
	}
	l.send(proto.AppendRenew(nil, 7, tok, "k"))
	l.expect(proto.OpRenew, tok)
	l.send(proto.AppendInspect(nil, 3, "k"))
	if f := l.expect(proto.OpInspect, 3); f.Holders != 1 || f.Token != tok {
		t.Fatalf("I: %+v", f)
	}
	l.send(proto.AppendRelease(nil, tok, "k"))
	l.expect(proto.OpRelease, tok)
	l.send(proto.AppendRelease(nil, tok, "k"))
	if f := l.expect(proto.OpNotHeld, tok); f.ReqOp != proto.OpRelease {
		t.Fatalf("N: %+v", f)
	}
	l.send(proto.AppendAcquire(nil, 0, 0, 4, "k"))
	if f := l.expect(proto.OpError, 4); f.Code != proto.CodeBadLease {
		t.Fatalf("E: %+v", f)
	}
}

// TestLocalHandoffAndWatch: answers made elsewhere — a handoff, a pushed L
// — reach a local connection through its mailbox and driver.
func TestLocalHandoffAndWatch(t *testing.T) {
	s := startServer(t, nil)
	w := dial(t, s.Addr())
	tok := w.grant("k", 30, 1)
	l := openLocal(t, s, "")
	l.send(proto.AppendWatch(nil, tok, "k"))
	l.expect(proto.OpWatch, tok)
	l.send(proto.AppendAcquire(nil, 10, 5, 7, "k"))
	l.silent(50 * time.Millisecond)
	w.release("k", tok)
	w.expect(proto.OpRelease, tok)
	var got [2]frame
	for i := range got {
		f, _, ok := l.next(5 * time.Second)
		if !ok {
			t.Fatalf("answer %d missing", i)
		}
		got[i] = f
	}
	if got[0].Op == proto.OpAcquire {
		got[0], got[1] = got[1], got[0]
	}
	if got[0].Op != proto.OpLost || got[0].Reason != 1 || got[1].Op != proto.OpAcquire || got[1].ID != 7 {
		t.Fatalf("after the release: %+v", got)
	}
}

// TestLocalCloseWithdrawsWaiters: closing a local connection takes its
// queued acquire out of the queue (PROTOCOL.md §4), so the release hands
// the key to nobody.
func TestLocalCloseWithdrawsWaiters(t *testing.T) {
	s := startServer(t, nil)
	w := dial(t, s.Addr())
	tok := w.grant("k", 30, 1)
	l := openLocal(t, s, "")
	l.send(proto.AppendAcquire(nil, 30, 5, 7, "k"))
	l.silent(20 * time.Millisecond)
	if f := inspect(w, "k"); f.Waiters != 1 {
		t.Fatalf("waiters %d, want 1", f.Waiters)
	}
	l.c.Close()
	w.release("k", tok)
	w.expect(proto.OpRelease, tok)
	if f := inspect(w, "k"); f.Holders != 0 || f.Waiters != 0 {
		t.Fatalf("after the close and the release: %+v", f)
	}
	if err := l.c.Send(proto.AppendPing(nil, 1)); !errors.Is(err, engine.ErrLocalClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
}

// TestLocalGrantNotTakenIsReleased: a grant the front did not take when
// the connection closes was not delivered: the close releases it (no
// phantom lock), hands the key to the next waiter, and Take never returns
// it.
func TestLocalGrantNotTakenIsReleased(t *testing.T) {
	s := startServer(t, nil)
	w := dial(t, s.Addr())
	tok := w.grant("k", 30, 1)
	c, err := s.OpenLocal("", "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(proto.AppendAcquire(nil, 30, 60, 7, "k")); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(proto.AppendPing(nil, 8)); err != nil {
		t.Fatal(err)
	}
	// The ping's answer is there when Send returns: take it, so that the
	// next signal is the grant's.
	<-c.Ready()
	var r proto.Response
	if out := c.Take(nil); len(out) == 0 {
		t.Fatal("no answer to the ping")
	} else if _, err := proto.ParseResponse(out, &r); err != nil || r.Op != proto.OpPing {
		t.Fatalf("the ping's answer: %+v, %v", r, err)
	}
	w2 := dial(t, s.Addr())
	w2.acquire("k", 30, 5, 9) // queued behind the local waiter
	lockdtest.WaitFor(t, "two waiters on k", func() bool { return inspect(w, "k").Waiters == 2 })
	w.release("k", tok)
	w.expect(proto.OpRelease, tok)
	// The handoff to the local connection lands in its output: wait for
	// it without taking it.
	select {
	case <-c.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("the handoff's grant never reached the local connection")
	}
	c.Close()
	// The undelivered grant was released: the next waiter has the key at
	// once (not when its 60 s lease ends).
	f, err := w2.next(time.Second)
	if err != nil || f.Op != proto.OpAcquire || f.ID != 9 || f.Token <= tok {
		t.Fatalf("w2 after the close: %+v, %v", f, err)
	}
	rest := c.Take(nil)
	for len(rest) > 0 {
		n, err := proto.ParseResponse(rest, &r)
		if err != nil {
			t.Fatal(err)
		}
		if r.Op == proto.OpAcquire {
			t.Fatalf("Take after the close returned the released grant %d", r.Token)
		}
		rest = rest[n:]
	}
}

// TestLocalACL: with an ACL a local connection is judged as a socket is:
// E 5 without an identity (and the close, whose E 5 is still taken), a
// hello, or a client certificate's Common Name.
func TestLocalACL(t *testing.T) {
	s := startACL(t, nil)

	l := openLocal(t, s, "")
	l.send(proto.AppendAcquire(nil, 0, 5, 1, "orders/1"))
	if f := l.expect(proto.OpError, 1); f.Code != proto.CodeUnauthenticated {
		t.Fatalf("%+v", f)
	}
	if _, closed, _ := l.next(5 * time.Second); !closed {
		t.Fatal("not closed after E 5")
	}

	l = openLocal(t, s, "")
	l.send(proto.AppendHello(nil, 1, "orders", secrets["orders"]))
	l.expect(proto.OpHello, 1)
	l.send(proto.AppendAcquire(nil, 0, 5, 2, "billing/1"))
	if f := l.expect(proto.OpError, 2); f.Code != proto.CodePermissionDenied {
		t.Fatalf("%+v", f)
	}
	l.send(proto.AppendAcquire(nil, 0, 5, 3, "orders/1"))
	tok := l.expect(proto.OpAcquire, 3).Token

	// Another identity's release of that grant is N; the certificate's
	// identity is that of the Common Name.
	b := openLocal(t, s, "certonly")
	b.send(proto.AppendRelease(nil, tok, "orders/1"))
	b.expect(proto.OpNotHeld, tok)
	b.send(proto.AppendAcquire(nil, 0, 5, 4, "x"))
	b.expect(proto.OpAcquire, 4)
}

// TestLocalShutdown: a local connection's queued acquire gets E 4 at the
// shutdown, its watch L 4, and the connection closes when the engine
// stops; OpenLocal then fails.
func TestLocalShutdown(t *testing.T) {
	s := startServer(t, func(c *engine.Config) { c.Drain = 50 * time.Millisecond })
	w := dial(t, s.Addr())
	tok := w.grant("k", 30, 1)
	l := openLocal(t, s, "")
	l.send(proto.AppendWatch(nil, tok, "k"))
	l.expect(proto.OpWatch, tok)
	l.send(proto.AppendAcquire(nil, 30, 5, 7, "k"))
	done := s.shutdownAsync()
	var sawE, sawL bool
	for !sawE || !sawL {
		f, closed, ok := l.next(5 * time.Second)
		if !ok {
			t.Fatalf("closed=%v before E 4 and L 4 (E %v, L %v)", closed, sawE, sawL)
		}
		switch {
		case f.Op == proto.OpError && f.ID == 7 && f.Code == proto.CodeShutdown:
			sawE = true
		case f.Op == proto.OpLost && f.ID == tok && f.Reason == 4:
			sawL = true
		default:
			t.Fatalf("unexpected %+v", f)
		}
	}
	s.waitShutdown(done)
	select {
	case <-l.c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not closed once the engine stopped")
	}
	if _, err := s.OpenLocal("", "test"); !errors.Is(err, engine.ErrLocalClosed) {
		t.Fatalf("OpenLocal after the shutdown: %v", err)
	}
}
