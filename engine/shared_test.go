package engine_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// PROTOCOL.md §9 over TCP: every row of §9.2's table, validate, watch with
// each reason of its L, inspect, and the rulings of §9.6.

func (w *wire) shared(key string, wait, lease uint8, owner uint64, limit uint16) {
	w.t.Helper()
	w.send(proto.AppendShared(nil, wait, lease, owner, limit, key))
}

// grantShared acquires key shared with limit (wait 0) and returns the
// token, failing otherwise.
func (w *wire) grantShared(key string, lease uint8, owner uint64, limit uint16) uint64 {
	w.t.Helper()
	w.shared(key, 0, lease, owner, limit)
	f := w.expect(proto.OpAcquire, owner)
	if f.Tail != key || f.Token == 0 {
		w.t.Fatalf("shared grant of %q: %+v", key, f)
	}
	return f.Token
}

// sync makes sure that what w sent before has been executed: a ping round
// trip (requests on one connection execute in order).
func (w *wire) sync() {
	w.t.Helper()
	w.send(proto.AppendPing(nil, 0xfeed))
	w.expect(proto.OpPing, 0xfeed)
}

// inspect sends an I and returns its answer.
func (w *wire) inspect(key string) frame {
	w.t.Helper()
	w.send(proto.AppendInspect(nil, 0x1d, key))
	f := w.expect(proto.OpInspect, 0x1d)
	if f.Tail != key {
		w.t.Fatalf("I tail %q, want %q", f.Tail, key)
	}
	return f
}

// valid sends a V and returns its answer, V or N.
func (w *wire) valid(key string, token uint64) frame {
	w.t.Helper()
	w.send(proto.AppendValidate(nil, token, key))
	f, err := w.next(5 * time.Second)
	if err != nil {
		w.t.Fatalf("V %d: %v", token, err)
	}
	if f.ID != token || f.Tail != key || (f.Op != proto.OpValidate && (f.Op != proto.OpNotHeld || f.ReqOp != proto.OpValidate)) {
		w.t.Fatalf("V %d %q answered %+v", token, key, f)
	}
	return f
}

// watch registers a watch of token and fails unless it is answered W.
func (w *wire) watch(key string, token uint64) {
	w.t.Helper()
	w.send(proto.AppendWatch(nil, token, key))
	if f := w.expect(proto.OpWatch, token); f.Tail != key {
		w.t.Fatalf("W tail %q", f.Tail)
	}
}

// lost reads the L of the watch of token and checks its reason.
func (w *wire) lost(key string, token uint64, reason shard.Reason) {
	w.t.Helper()
	f := w.expect(proto.OpLost, token)
	if f.Reason != uint8(reason) || f.Tail != key {
		w.t.Fatalf("L for %d on %q: reason %d tail %q, want reason %d (%s)", token, key, f.Reason, f.Tail, reason, reason)
	}
}

// notHeld reads an N for (op, token).
func (w *wire) notHeld(op proto.Op, token uint64) {
	w.t.Helper()
	if f := w.expect(proto.OpNotHeld, token); f.ReqOp != op {
		w.t.Fatalf("N for %c %d: %+v", op, token, f)
	}
}

// TestSharedTable walks every row of PROTOCOL.md §9.2 (docs/PROTOCOL.md
// §9.2's table) over TCP, one key per case.
func TestSharedTable(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Table.MaxWaitersPerKey = 2 })
	addr := ts.Addr()

	t.Run("S on a free key grants and sets the limit", func(t *testing.T) {
		w := dial(t, addr)
		tok := w.grantShared("free", 30, 1, 3)
		if f := w.inspect("free"); f.Holders != 1 || f.Limit != 3 || f.Token != tok || f.Waiters != 0 {
			t.Fatalf("I after one shared grant: %+v", f)
		}
	})
	t.Run("S with room and nobody queued grants another holder", func(t *testing.T) {
		w := dial(t, addr)
		t1 := w.grantShared("room", 30, 1, 3)
		t2 := w.grantShared("room", 30, 2, 3)
		t3 := w.grantShared("room", 30, 3, 3)
		if !(t1 < t2 && t2 < t3) {
			t.Fatalf("tokens %d %d %d not increasing", t1, t2, t3)
		}
		if f := w.inspect("room"); f.Holders != 3 || f.Limit != 3 || f.Token != t3 {
			t.Fatalf("I: %+v, want 3 holders, limit 3, newest %d", f, t3)
		}
	})
	t.Run("S on a full key: T at wait 0, queued, B when the queue is full", func(t *testing.T) {
		w, q := dial(t, addr), dial(t, addr)
		t1 := w.grantShared("full", 30, 1, 2)
		w.grantShared("full", 30, 2, 2)
		w.shared("full", 0, 30, 3, 2)
		w.expect(proto.OpTimeout, 3)
		q.shared("full", 10, 30, 4, 2)
		q.shared("full", 10, 30, 5, 2)
		q.shared("full", 10, 30, 6, 2)
		q.expect(proto.OpBusy, 6)
		w.release("full", t1)
		w.expect(proto.OpRelease, t1)
		if g := q.expect(proto.OpAcquire, 4); g.Token <= t1 {
			t.Fatalf("handoff token %d", g.Token)
		}
		q.silent(50 * time.Millisecond) // owner 5 waits: the key is full again
	})
	t.Run("S with room behind a queued A waits: no overtaking", func(t *testing.T) {
		r, wr, late := dial(t, addr), dial(t, addr), dial(t, addr)
		tr := r.grantShared("rw", 30, 1, 65535)
		wr.acquire("rw", 10, 30, 2) // a writer at the head
		wr.sync()
		late.shared("rw", 0, 30, 3, 65535) // room, but someone queued: T (decision 44)
		late.expect(proto.OpTimeout, 3)
		late.shared("rw", 10, 30, 4, 65535)
		late.sync()
		if f := late.inspect("rw"); f.Holders != 1 || f.Waiters != 2 {
			t.Fatalf("I: %+v, want 1 holder and 2 waiters", f)
		}
		r.release("rw", tr)
		r.expect(proto.OpRelease, tr)
		tw := wr.expect(proto.OpAcquire, 2).Token
		late.silent(50 * time.Millisecond) // the writer holds the key alone
		wr.release("rw", tw)
		wr.expect(proto.OpRelease, tw)
		if g := late.expect(proto.OpAcquire, 4); g.Token <= tw {
			t.Fatalf("reader after the writer: token %d not above %d", g.Token, tw)
		}
	})
	t.Run("S on an exclusive key queues whatever its limit, never E 7", func(t *testing.T) {
		a, s := dial(t, addr), dial(t, addr)
		ta := a.grant("excl", 30, 1)
		for i, limit := range []uint16{1, 7, 65535} {
			s.shared("excl", 0, 30, uint64(10+i), limit)
			s.expect(proto.OpTimeout, uint64(10+i))
		}
		s.shared("excl", 10, 30, 20, 7)
		s.sync()
		a.release("excl", ta)
		a.expect(proto.OpRelease, ta)
		s.expect(proto.OpAcquire, 20)
		if f := s.inspect("excl"); f.Limit != 7 || f.Holders != 1 {
			t.Fatalf("a queued S set the freed key's limit: %+v", f)
		}
	})
	t.Run("S with another limit is E 7 whatever its wait and the queue", func(t *testing.T) {
		w, q := dial(t, addr), dial(t, addr)
		w.grantShared("mismatch", 30, 1, 1)
		q.shared("mismatch", 10, 30, 2, 1)
		q.shared("mismatch", 10, 30, 3, 1) // the queue (2) is full
		q.sync()
		for i, wait := range []uint8{0, 10} {
			w.shared("mismatch", wait, 30, uint64(5+i), 2)
			w.expectE(proto.OpShared, uint64(5+i), proto.CodeLimitMismatch)
		}
		if f := w.inspect("mismatch"); f.Holders != 1 || f.Waiters != 2 || f.Limit != 1 {
			t.Fatalf("an E 7 changed the key: %+v", f)
		}
	})
	t.Run("S with limit 0 is E 7", func(t *testing.T) {
		w := dial(t, addr)
		w.shared("zero", 0, 30, 9, 0)
		w.expectE(proto.OpShared, 9, proto.CodeLimitMismatch)
		if f := w.inspect("zero"); f.Holders != 0 {
			t.Fatalf("limit 0 granted: %+v", f)
		}
	})
	t.Run("A on a shared key: T, queued, B", func(t *testing.T) {
		s, a := dial(t, addr), dial(t, addr)
		ts1 := s.grantShared("writer", 30, 1, 4)
		a.acquire("writer", 0, 30, 2)
		a.expect(proto.OpTimeout, 2)
		a.acquire("writer", 10, 30, 3)
		a.acquire("writer", 10, 30, 4)
		a.acquire("writer", 10, 30, 5)
		a.expect(proto.OpBusy, 5)
		s.release("writer", ts1)
		s.expect(proto.OpRelease, ts1)
		a.expect(proto.OpAcquire, 3)
	})
	t.Run("a release serves every waiter that fits in one step", func(t *testing.T) {
		ts := startServer(t, nil)
		a, s := dial(t, ts.Addr()), dial(t, ts.Addr())
		ta := a.grant("serve", 30, 1)
		for i := range 3 {
			s.shared("serve", 10, 30, uint64(10+i), 3)
		}
		s.sync()
		a.acquire("serve", 10, 30, 2) // a writer behind them
		a.sync()
		s.shared("serve", 10, 30, 13, 3)
		s.sync()
		a.release("serve", ta)
		a.expect(proto.OpRelease, ta)
		var toks []uint64
		for i := range 3 {
			g := s.expect(proto.OpAcquire, uint64(10+i))
			if g.Token <= ta {
				t.Fatalf("reader %d: token %d", i, g.Token)
			}
			toks = append(toks, g.Token)
		}
		if f := s.inspect("serve"); f.Holders != 3 || f.Waiters != 2 {
			t.Fatalf("after the release: %+v, want 3 holders and 2 waiters", f)
		}
		for i, tok := range toks {
			s.release("serve", tok)
			s.expect(proto.OpRelease, tok)
			if i < 2 {
				a.silent(20 * time.Millisecond)
			}
		}
		tw := a.expect(proto.OpAcquire, 2).Token
		s.silent(50 * time.Millisecond)
		a.release("serve", tw)
		a.expect(proto.OpRelease, tw)
		s.expect(proto.OpAcquire, 13)
	})
	t.Run("a queued S of another limit waits at the head until the key is free", func(t *testing.T) {
		a, s := dial(t, addr), dial(t, addr)
		ta := a.grant("head", 30, 1)
		s.shared("head", 10, 30, 2, 2)
		s.shared("head", 10, 30, 3, 3)
		s.sync()
		a.release("head", ta)
		a.expect(proto.OpRelease, ta)
		t2 := s.expect(proto.OpAcquire, 2).Token
		a.shared("head", 0, 30, 4, 2) // limit 2 with room, but owner 3 is queued
		a.expect(proto.OpTimeout, 4)
		s.release("head", t2)
		s.expect(proto.OpRelease, t2)
		s.expect(proto.OpAcquire, 3)
		if f := s.inspect("head"); f.Limit != 3 {
			t.Fatalf("limit %d after the head's grant, want 3", f.Limit)
		}
	})
	t.Run("R K V W act on their own holder only", func(t *testing.T) {
		w := dial(t, addr)
		h1 := w.grantShared("own", 30, 1, 5)
		h2 := w.grantShared("own", 30, 2, 5)
		other := w.grantShared("own2", 30, 3, 5)
		for _, tok := range []uint64{other, h2 + 1000, 1} {
			w.release("own", tok)
			w.notHeld(proto.OpRelease, tok)
			w.renew("own", 10, tok)
			w.notHeld(proto.OpRenew, tok)
			if f := w.valid("own", tok); f.Op != proto.OpNotHeld {
				t.Fatalf("V of token %d on another key's holder: %+v", tok, f)
			}
			w.send(proto.AppendWatch(nil, tok, "own"))
			w.notHeld(proto.OpWatch, tok)
		}
		w.renew("own", 3, h1)
		w.expect(proto.OpRenew, h1)
		if f := w.valid("own", h1); f.Op != proto.OpValidate || f.Remaining > 3000 || f.Remaining < 2000 {
			t.Fatalf("V of the renewed holder: %+v", f)
		}
		if f := w.valid("own", h2); f.Op != proto.OpValidate || f.Remaining < 20000 {
			t.Fatalf("V of the other holder after the first's renew: %+v", f)
		}
		w.release("own", h1)
		w.expect(proto.OpRelease, h1)
		if f := w.valid("own", h1); f.Op != proto.OpNotHeld {
			t.Fatalf("V of a released holder: %+v", f)
		}
		if f := w.valid("own", h2); f.Op != proto.OpValidate {
			t.Fatalf("V of the holder left: %+v", f)
		}
	})
	t.Run("each holder's lease ends on its own", func(t *testing.T) {
		w := dial(t, addr)
		short := w.grantShared("lease", 1, 1, 2)
		long := w.grantShared("lease", 30, 2, 2)
		w.watch("lease", short)
		w.watch("lease", long)
		w.lost("lease", short, shard.ReasonExpired)
		if f := w.valid("lease", long); f.Op != proto.OpValidate {
			t.Fatalf("the other holder after one expiry: %+v", f)
		}
		if f := w.inspect("lease"); f.Holders != 1 || f.Token != long {
			t.Fatalf("I after one expiry: %+v", f)
		}
		w.silent(50 * time.Millisecond) // no L for the holder that stays
	})
}

// TestSharedMaxHolders: the key's first holder counts toward --max-keys,
// every further one toward --max-holders; an S beyond it is B, nothing
// queued (docs/PROTOCOL.md decision 45).
func TestSharedMaxHolders(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Table.MaxHolders = 1; c.Table.MaxKeys = 1 })
	w := dial(t, ts.Addr())
	w.grantShared("k", 30, 1, 5)
	t2 := w.grantShared("k", 30, 2, 5)
	w.shared("k", 10, 30, 3, 5)
	w.expect(proto.OpBusy, 3)
	if f := w.inspect("k"); f.Holders != 2 || f.Waiters != 0 {
		t.Fatalf("I: %+v", f)
	}
	w.release("k", t2)
	w.expect(proto.OpRelease, t2)
	w.grantShared("k", 30, 4, 5)
	if m := ts.Metrics(); m.Keys != 1 || m.Holders != 1 {
		t.Fatalf("metrics: keys %d, further holders %d; want 1 and 1", m.Keys, m.Holders)
	}
}

// TestValidate: V answers the holder's own lease left, changes nothing (no
// renew), and is N for a stale token or a free key.
func TestValidate(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	if f := w.valid("v", 42); f.Op != proto.OpNotHeld {
		t.Fatalf("V on a free key: %+v", f)
	}
	tok := w.grant("v", 2, 1)
	f := w.valid("v", tok)
	if f.Op != proto.OpValidate || f.Remaining > 2000 || f.Remaining < 1500 {
		t.Fatalf("V of a 2 s grant: %+v", f)
	}
	time.Sleep(2100 * time.Millisecond) // V renewed nothing: the lease ended
	if f := w.valid("v", tok); f.Op != proto.OpNotHeld {
		t.Fatalf("V after the lease: %+v", f)
	}
}

// TestInspect: I answers the key's holders, limit, waiters and newest
// holder, and changes nothing.
func TestInspect(t *testing.T) {
	ts := startServer(t, nil)
	w, q := dial(t, ts.Addr()), dial(t, ts.Addr())
	if f := w.inspect("i"); f.Holders != 0 || f.Limit != 0 || f.Waiters != 0 || f.Token != 0 || f.Remaining != 0 {
		t.Fatalf("I of a free key: %+v", f)
	}
	tok := w.grant("i", 10, 1)
	q.acquire("i", 10, 10, 2)
	q.shared("i", 10, 10, 3, 4)
	q.sync()
	f := w.inspect("i")
	if f.Holders != 1 || f.Limit != 1 || f.Waiters != 2 || f.Token != tok || f.Remaining > 10000 || f.Remaining < 9000 {
		t.Fatalf("I of an exclusive key with two waiters: %+v", f)
	}
	s1 := w.grantShared("i1", 10, 4, 1)
	if f := w.inspect("i1"); f.Holders != 1 || f.Limit != 1 || f.Token != s1 {
		t.Fatalf("I of a key shared with limit 1 (reads like an exclusive one): %+v", f)
	}
	w.release("i", tok)
	w.expect(proto.OpRelease, tok)
	q.expect(proto.OpAcquire, 2)
}

// TestWatchReasons: each way a grant ends pushes exactly one L per watch,
// with its reason: 1 released (from any connection), 2 expired, 3 forced
// (the admin endpoint's release; an admin identity's is in the ACL tests),
// 4 shutdown. Two W of one grant are two registrations, two Ls.
func TestWatchReasons(t *testing.T) {
	ts := startServer(t, nil)
	holder, watcher := dial(t, ts.Addr()), dial(t, ts.Addr())

	tok := holder.grantShared("w/released", 30, 1, 2)
	watcher.watch("w/released", tok)
	watcher.watch("w/released", tok)
	holder.release("w/released", tok)
	holder.expect(proto.OpRelease, tok)
	watcher.lost("w/released", tok, shard.ReasonReleased)
	watcher.lost("w/released", tok, shard.ReasonReleased)

	tok = holder.grant("w/expired", 1, 2)
	watcher.watch("w/expired", tok)
	watcher.lost("w/expired", tok, shard.ReasonExpired)

	tok = holder.grant("w/forced", 30, 3)
	watcher.watch("w/forced", tok)
	if _, err := ts.AdminRelease(context.Background(), []byte("w/forced"), tok, ""); err != nil {
		t.Fatal(err)
	}
	watcher.lost("w/forced", tok, shard.ReasonForced)

	// A watch on the releasing connection itself: its L follows the R.
	tok = holder.grant("w/self", 30, 4)
	holder.watch("w/self", tok)
	holder.release("w/self", tok)
	holder.expect(proto.OpRelease, tok)
	holder.lost("w/self", tok, shard.ReasonReleased)
	watcher.silent(50 * time.Millisecond)

	tok = holder.grant("w/shutdown", 30, 5)
	watcher.watch("w/shutdown", tok)
	done := ts.shutdownAsync()
	watcher.lost("w/shutdown", tok, shard.ReasonCannotTell)
	ts.waitShutdown(done)
	m := ts.Metrics()
	if m.Lost != [5]uint64{0, 3, 1, 1, 1} {
		t.Fatalf("L by reason %v, want [0 3 1 1 1]", m.Lost)
	}
	if m.Watches != 0 {
		t.Fatalf("%d watches left", m.Watches)
	}
}

// TestWatchBound: a W beyond --max-watches-per-conn is E 8, before its
// token is looked at (a stale token at the bound is E 8, not N); the bound
// frees as the watches' Ls are sent, and another connection has its own.
func TestWatchBound(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Table.MaxWatchesPerConn = 2 })
	w, other := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := w.grant("b", 30, 1)
	w.watch("b", tok)
	w.watch("b", tok)
	w.send(proto.AppendWatch(nil, tok, "b"))
	w.expectE(proto.OpWatch, tok, proto.CodeLimitReached)
	w.send(proto.AppendWatch(nil, 12345, "b"))
	w.expectE(proto.OpWatch, 12345, proto.CodeLimitReached)
	other.watch("b", tok)
	w.release("b", tok)
	w.expect(proto.OpRelease, tok)
	w.lost("b", tok, shard.ReasonReleased)
	w.lost("b", tok, shard.ReasonReleased)
	other.lost("b", tok, shard.ReasonReleased)
	tok = w.grant("b", 30, 2)
	w.watch("b", tok)
	if m := ts.Metrics(); m.Watches != 1 || m.Errors[proto.CodeLimitReached] != 2 {
		t.Fatalf("watches %d, E 8 sent %d", m.Watches, m.Errors[proto.CodeLimitReached])
	}
}

// TestWatchEndsWithItsConnection: a watch whose connection closes is
// dropped silently (no L to anyone, the count goes down).
func TestWatchEndsWithItsConnection(t *testing.T) {
	ts := startServer(t, nil)
	holder, watcher := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := holder.grant("c", 30, 1)
	watcher.watch("c", tok)
	watcher.c.Close()
	lockdtest.WaitFor(t, "the watch to go", func() bool { return ts.Metrics().Watches == 0 })
	holder.release("c", tok)
	holder.expect(proto.OpRelease, tok)
	holder.silent(50 * time.Millisecond)
	if m := ts.Metrics(); m.Lost != [5]uint64{} {
		t.Fatalf("L sent for a closed connection's watch: %v", m.Lost)
	}
}

// TestWatchGateRedirect: when the node's gate leaves Serve for Redirect (a
// step-down, a demotion, a planned handover, a lost leadership) every
// watch gets L 4 at once, a queued S gets M (op S), and requests after it
// are M; a gate that holds
// (a handover in progress, a lapsed lease: a frozen member) keeps the
// watches, which end as usual once the node serves again.
func TestWatchGateRedirect(t *testing.T) {
	ts, node := startCommitting(t)
	holder, watcher := dial(t, ts.Addr()), dial(t, ts.Addr())
	holder.send(proto.AppendAcquire(nil, 0, 30, 1, "g"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	ts.Committed(1)
	tok := holder.expect(proto.OpAcquire, 1).Token
	watcher.watch("g", tok)

	// Hold, then serve again: the watch stays, its L is an ordinary one.
	node.gate.Store(&repl.Gate{State: repl.Hold})
	ts.GateChanged()
	watcher.silent(100 * time.Millisecond)
	node.gate.Store(nil)
	ts.GateChanged()
	holder.release("g", tok)
	lockdtest.WaitFor(t, "the release's record", func() bool { return node.Barrier() >= 2 })
	ts.Committed(node.Barrier())
	holder.expect(proto.OpRelease, tok)
	watcher.lost("g", tok, shard.ReasonReleased)

	holder.send(proto.AppendAcquire(nil, 0, 30, 2, "g"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() >= 3 })
	ts.Committed(node.Barrier())
	tok = holder.expect(proto.OpAcquire, 2).Token
	watcher.watch("g", tok)
	q := dial(t, ts.Addr())
	q.shared("g", 10, 30, 3, 2)
	q.sync()
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	watcher.lost("g", tok, shard.ReasonCannotTell)
	if f := q.expect(proto.OpMoved, 3); f.ReqOp != proto.OpShared || f.Tail != "127.0.0.1:1" {
		t.Fatalf("the queued S when the gate redirects: %+v, want M for S 3", f)
	}
	watcher.send(proto.AppendWatch(nil, tok, "g"))
	if f := watcher.expect(proto.OpMoved, tok); f.ReqOp != proto.OpWatch || f.Tail != "127.0.0.1:1" {
		t.Fatalf("W after the redirect: %+v", f)
	}
	if m := ts.Metrics(); m.Watches != 0 || m.Lost[shard.ReasonCannotTell] != 1 {
		t.Fatalf("watches %d, L 4 sent %d", m.Watches, m.Lost[shard.ReasonCannotTell])
	}
}

// TestSharedShutdown (PROTOCOL.md §9.6): a queued S is answered E 4 (op S,
// id its owner), like a queued A; new S, V, W and I get E 4; every watch
// gets L 4 before its connection closes.
func TestSharedShutdown(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Drain = time.Second })
	w, q := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := w.grantShared("s", 30, 1, 1)
	q.shared("s", 10, 30, 2, 1)
	q.watch("s", tok)
	done := ts.shutdownAsync()
	got := map[proto.Op]frame{}
	for range 2 {
		f, err := q.next(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got[f.Op] = f
	}
	if f := got[proto.OpError]; f.ReqOp != proto.OpShared || f.ID != 2 || f.Code != proto.CodeShutdown {
		t.Fatalf("the queued S at shutdown: %+v, want E 4 for S 2", f)
	}
	if f := got[proto.OpLost]; f.ID != tok || f.Reason != uint8(shard.ReasonCannotTell) {
		t.Fatalf("the watch at shutdown: %+v, want L 4 for %d", f, tok)
	}
	for _, c := range []struct {
		frame []byte
		op    proto.Op
		id    uint64
	}{
		{proto.AppendShared(nil, 0, 30, 3, 1, "t"), proto.OpShared, 3},
		{proto.AppendValidate(nil, tok, "s"), proto.OpValidate, tok},
		{proto.AppendWatch(nil, tok, "s"), proto.OpWatch, tok},
		{proto.AppendInspect(nil, 4, "s"), proto.OpInspect, 4},
	} {
		w.send(c.frame)
		w.expectE(c.op, c.id, proto.CodeShutdown)
	}
	ts.waitShutdown(done)
}

// TestSharedValidationOrder: the order of PROTOCOL.md §8.3 and §9.6 for
// S, V, W and I — E 1, E 5, E 2, E 3, E 7 for limit 0, E 6, E 4, M, then
// E 7 for another limit and E 8, then N, T, B — one case per pair of
// neighbours, each with everything after it wrong too.
func TestSharedValidationOrder(t *testing.T) {
	ts := startACL(t, func(c *engine.Config) { c.Table.MaxWatchesPerConn = 1; c.Table.MaxWaitersPerKey = 1 })
	owner := dial(t, ts.Addr())
	owner.login("orders")
	held := owner.grantShared("orders/held", 30, 1, 2)
	q := dial(t, ts.Addr())
	q.login("orders-b")
	ta := q.grant("orders/excl", 30, 3)
	q.acquire("orders/excl", 10, 30, 4) // that queue is full now
	q.sync()

	long := make([]byte, 1025)
	for i := range long {
		long[i] = 'k'
	}
	cases := []struct {
		name  string
		login string // "" for none
		frame []byte
		op    proto.Op
		id    uint64
		want  uint8 // E code; 0: the answer in wantOp
		// wantOp is the answer when want is 0.
		wantOp proto.Op
	}{
		{"E 1 before E 5", "", proto.AppendShared(nil, 0, 0, 5, 0, string(long)), proto.OpShared, 5, proto.CodeBadFrame, 0},
		{"E 5 before E 2", "", proto.AppendShared(nil, 0, 0, 6, 0, ""), proto.OpShared, 6, proto.CodeUnauthenticated, 0},
		{"E 5 for V", "", proto.AppendValidate(nil, held, "orders/held"), proto.OpValidate, held, proto.CodeUnauthenticated, 0},
		{"E 5 for W", "", proto.AppendWatch(nil, held, "orders/held"), proto.OpWatch, held, proto.CodeUnauthenticated, 0},
		{"E 5 for I", "", proto.AppendInspect(nil, 7, "orders/held"), proto.OpInspect, 7, proto.CodeUnauthenticated, 0},
		{"E 2 before E 3", "orders", proto.AppendShared(nil, 0, 0, 8, 0, ""), proto.OpShared, 8, proto.CodeBadKey, 0},
		{"E 2 for V", "orders", proto.AppendValidate(nil, 9, "\xff"), proto.OpValidate, 9, proto.CodeBadKey, 0},
		{"E 3 before E 7", "orders", proto.AppendShared(nil, 0, 0, 10, 0, "billing/x"), proto.OpShared, 10, proto.CodeBadLease, 0},
		{"E 7 (limit 0) before E 6", "orders", proto.AppendShared(nil, 0, 30, 11, 0, "billing/x"), proto.OpShared, 11, proto.CodeLimitMismatch, 0},
		{"E 6 outside the prefixes", "orders", proto.AppendShared(nil, 0, 30, 12, 2, "billing/x"), proto.OpShared, 12, proto.CodePermissionDenied, 0},
		{"E 6 for a monitor's S", "prom", proto.AppendShared(nil, 0, 30, 13, 2, "orders/held"), proto.OpShared, 13, proto.CodePermissionDenied, 0},
		{"E 6 for V outside the prefixes", "billing", proto.AppendValidate(nil, held, "orders/held"), proto.OpValidate, held, proto.CodePermissionDenied, 0},
		{"E 6 for W outside the prefixes", "billing", proto.AppendWatch(nil, held, "orders/held"), proto.OpWatch, held, proto.CodePermissionDenied, 0},
		{"E 6 for I outside the prefixes", "billing", proto.AppendInspect(nil, 14, "orders/held"), proto.OpInspect, 14, proto.CodePermissionDenied, 0},
		{"E 6 before E 7 (another limit)", "billing", proto.AppendShared(nil, 0, 30, 15, 3, "orders/held"), proto.OpShared, 15, proto.CodePermissionDenied, 0},
		{"E 7 (another limit) before T", "orders", proto.AppendShared(nil, 0, 30, 16, 3, "orders/held"), proto.OpShared, 16, proto.CodeLimitMismatch, 0},
		{"T for S on an exclusive key with the queue full", "orders", proto.AppendShared(nil, 0, 30, 17, 3, "orders/excl"), proto.OpShared, 17, 0, proto.OpTimeout},
		{"B for S on an exclusive key with the queue full", "orders", proto.AppendShared(nil, 10, 30, 18, 3, "orders/excl"), proto.OpShared, 18, 0, proto.OpBusy},
		{"N for V of a stale token", "orders", proto.AppendValidate(nil, held+1000, "orders/held"), proto.OpValidate, held + 1000, 0, proto.OpNotHeld},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := dial(t, ts.Addr())
			if c.login != "" {
				w.login(c.login)
			}
			w.send(c.frame)
			if c.want != 0 {
				w.expectE(c.op, c.id, c.want)
				if c.want == proto.CodeBadFrame || c.want == proto.CodeUnauthenticated {
					w.closed(5 * time.Second)
					return
				}
			} else if f, err := w.next(5 * time.Second); err != nil || f.Op != c.wantOp || f.ID != c.id {
				t.Fatalf("answer %+v, %v; want %c id=%d", f, err, c.wantOp, c.id)
			}
			w.sync() // the connection stays open
		})
	}
	t.Run("E 8 before N", func(t *testing.T) {
		a := dial(t, ts.Addr())
		a.login("ops")
		a.watch("orders/held", held)
		a.send(proto.AppendWatch(nil, held+1000, "orders/held"))
		a.expectE(proto.OpWatch, held+1000, proto.CodeLimitReached)
	})
	t.Run("E 6 before E 4", func(t *testing.T) {
		dts := startACL(t, func(c *engine.Config) { c.Drain = time.Second })
		w := dial(t, dts.Addr())
		w.login("orders")
		done := dts.shutdownAsync()
		lockdtest.WaitFor(t, "the drain", dts.Draining)
		w.send(proto.AppendShared(nil, 0, 30, 30, 2, "billing/x"))
		w.expectE(proto.OpShared, 30, proto.CodePermissionDenied)
		w.send(proto.AppendShared(nil, 0, 30, 31, 2, "orders/x"))
		w.expectE(proto.OpShared, 31, proto.CodeShutdown)
		dts.waitShutdown(done)
	})
	t.Run("E 6 before M, M before E 7", func(t *testing.T) {
		cts, node := startCommitting(t, func(c *engine.Config) {
			c.ACL = parseACL(t, aclText)
			c.Table.MaxWatchesPerConn = 1
		})
		w := dial(t, cts.Addr())
		w.login("orders")
		w.shared("orders/a", 0, 30, 19, 2)
		lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
		cts.Committed(1)
		tok := w.expect(proto.OpAcquire, 19).Token
		w.watch("orders/a", tok) // the connection's bound
		node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
		cts.GateChanged()
		w.lost("orders/a", tok, shard.ReasonCannotTell)
		w.send(proto.AppendShared(nil, 0, 30, 20, 3, "billing/x"))
		w.expectE(proto.OpShared, 20, proto.CodePermissionDenied)
		for _, f := range [][]byte{
			proto.AppendShared(nil, 0, 30, 21, 3, "orders/a"), // would be E 7
			proto.AppendValidate(nil, 21, "orders/a"),
			proto.AppendWatch(nil, 21, "orders/a"),
			proto.AppendInspect(nil, 21, "orders/a"),
		} {
			w.send(f)
			if r := w.expect(proto.OpMoved, 21); r.ReqOp != proto.Op(f[0]) || r.Tail != "127.0.0.1:1" {
				t.Fatalf("M for %c: %+v", f[0], r)
			}
		}
	})
	q.release("orders/excl", ta)
	q.expect(proto.OpRelease, ta)
	q.expect(proto.OpAcquire, 4)
}

// TestSharedACL (PROTOCOL.md §8.3, §9.2, §9.6): each holder of a shared key
// is bound to the identity it was granted to; R and K of another
// identity's holder are N unless from an admin (forced: L 3 to its
// watches); an identity's own release is L 1; a monitor validates,
// watches and inspects keys its prefixes allow.
func TestSharedACL(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.ACL = parseACL(t, aclText+line("guard", "orders/", "monitor")) })
	a, b, ops, guard := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	a.login("orders")
	b.login("orders-b")
	ops.login("ops")
	guard.login("guard")
	ta := a.grantShared("orders/sem", 30, 1, 3)
	tb := b.grantShared("orders/sem", 30, 2, 3)
	to := ops.grantShared("orders/sem", 30, 3, 3)
	if d := ts.KeyDetail([]byte("orders/sem")); len(d.Holders) != 3 || d.Holders[0].Ident != "orders" ||
		d.Holders[1].Ident != "orders-b" || d.Holders[2].Ident != "ops" {
		t.Fatalf("holders' identities: %+v", d.Holders)
	}
	// The monitor checks anyone's tokens.
	if f := guard.valid("orders/sem", ta); f.Op != proto.OpValidate {
		t.Fatalf("a monitor's V: %+v", f)
	}
	if f := guard.inspect("orders/sem"); f.Holders != 3 || f.Limit != 3 || f.Token != to {
		t.Fatalf("a monitor's I: %+v", f)
	}
	guard.watch("orders/sem", ta)
	guard.watch("orders/sem", tb)
	guard.watch("orders/sem", to)
	guard.shared("orders/sem", 0, 30, 9, 3)
	guard.expectE(proto.OpShared, 9, proto.CodePermissionDenied)

	// Another identity's holder: N for R and K, nothing changes.
	b.release("orders/sem", ta)
	b.notHeld(proto.OpRelease, ta)
	b.renew("orders/sem", 10, ta)
	b.notHeld(proto.OpRenew, ta)
	// Its own: R, L 1.
	b.release("orders/sem", tb)
	b.expect(proto.OpRelease, tb)
	guard.lost("orders/sem", tb, shard.ReasonReleased)
	// An admin's release of another identity's holder: forced, L 3.
	ops.release("orders/sem", ta)
	ops.expect(proto.OpRelease, ta)
	guard.lost("orders/sem", ta, shard.ReasonForced)
	// An admin's release of its own holder: L 1.
	ops.release("orders/sem", to)
	ops.expect(proto.OpRelease, to)
	guard.lost("orders/sem", to, shard.ReasonReleased)
	if m := ts.Metrics(); m.Table.ForcedReleases != 1 || m.Table.RefusedReleases != 1 || m.Table.RefusedRenews != 1 {
		t.Fatalf("forced %d, refused %d/%d", m.Table.ForcedReleases, m.Table.RefusedReleases, m.Table.RefusedRenews)
	}
	// A queued S keeps the identity it was sent under.
	tx := a.grant("orders/q", 30, 10)
	b.shared("orders/q", 10, 30, 11, 2)
	b.sync()
	a.release("orders/q", tx)
	a.expect(proto.OpRelease, tx)
	tq := b.expect(proto.OpAcquire, 11).Token
	if d := ts.KeyDetail([]byte("orders/q")); len(d.Holders) != 1 || d.Holders[0].Ident != "orders-b" || d.Holders[0].Token != tq {
		t.Fatalf("the handed-off holder: %+v", d.Holders)
	}
}

// TestAdminReleaseShared: the admin endpoint's release of a shared key
// without a token releases every holder it has (each L 3, and the queue
// served), with a token only that holder (docs/PROTOCOL.md decision 50).
func TestAdminReleaseShared(t *testing.T) {
	ts := startServer(t, nil)
	w, q := dial(t, ts.Addr()), dial(t, ts.Addr())
	h := []uint64{w.grantShared("a", 30, 1, 3), w.grantShared("a", 30, 2, 3), w.grantShared("a", 30, 3, 3)}
	for _, tok := range h {
		w.watch("a", tok)
	}
	q.acquire("a", 10, 30, 4)
	q.sync()
	ctx := context.Background()
	rel, err := ts.AdminRelease(ctx, []byte("a"), h[1], "")
	if err != nil || rel.Token != h[1] || len(rel.All) != 1 {
		t.Fatalf("release of one holder: %+v %v", rel, err)
	}
	w.lost("a", h[1], shard.ReasonForced)
	rel, err = ts.AdminRelease(ctx, []byte("a"), 0, "")
	if err != nil || len(rel.All) != 2 || rel.All[0].Token != h[0] || rel.All[1].Token != h[2] || rel.Token != h[2] {
		t.Fatalf("release of every holder: %+v %v", rel, err)
	}
	w.lost("a", h[0], shard.ReasonForced) // in the order they were released
	w.lost("a", h[2], shard.ReasonForced)
	if g := q.expect(proto.OpAcquire, 4); g.Token <= h[2] {
		t.Fatalf("the writer's token %d", g.Token)
	}
	if _, err := ts.AdminRelease(ctx, []byte("nothing"), 0, ""); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("release of a free key: %v", err)
	}
	if m := ts.Metrics(); m.AdminReleases != 3 {
		t.Fatalf("admin releases %d, want 3", m.AdminReleases)
	}
}

// TestSharedUndeliveredGrantReleased: an S granted on a connection that
// closes before the grant reached its socket (behind megabytes of answers
// it never read) is released at once and the key handed on (PROTOCOL.md
// §4: no phantom lock, for a shared holder as for an exclusive one).
func TestSharedUndeliveredGrantReleased(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.MaxOutbound = 256 << 20 })
	const pings = 2_000_000 // 20 MB of pongs: far more than the sockets hold
	s := dial(t, ts.Addr())
	var req []byte
	for range pings {
		req = proto.AppendPing(req, 7)
	}
	req = proto.AppendShared(req, 0, 30, 1, 1, "u")
	go func() { _, _ = s.c.Write(req) }()
	lockdtest.WaitFor(t, "the grant", func() bool { return ts.Table().Lookup([]byte("u")).Held })
	q := dial(t, ts.Addr())
	q.shared("u", 10, 30, 2, 1)
	q.sync()
	s.c.Close()
	if g := q.expect(proto.OpAcquire, 2); g.Token == 0 {
		t.Fatalf("handoff %+v", g)
	}
	if f := q.inspect("u"); f.Holders != 1 {
		t.Fatalf("I after the undelivered grant's release: %+v", f)
	}
}

// TestSharedRestart: a graceful shutdown keeps every holder of a shared
// key — token, lease, identity — and the key's limit; the next start on
// the same data dir holds them all (PROTOCOL.md §4, §9.2): V is valid for
// each, the limit is in force (E 7 for another, T when full), and each
// holder is still its identity's alone.
func TestSharedRestart(t *testing.T) {
	ts := startACL(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	a.login("orders")
	b.login("orders-b")
	ta := a.grantShared("orders/sem", 60, 1, 2)
	tb := b.grantShared("orders/sem", 60, 2, 2)
	tx := a.grant("orders/excl", 60, 3)
	ts.shutdown()

	ts2 := startWith(t, ts.cfg)
	a, b = dial(t, ts2.Addr()), dial(t, ts2.Addr())
	a.login("orders")
	b.login("orders-b")
	if f := a.inspect("orders/sem"); f.Holders != 2 || f.Limit != 2 || f.Token != tb || f.Remaining < 50000 {
		t.Fatalf("I after the restart: %+v", f)
	}
	for _, tok := range []uint64{ta, tb, tx} {
		key := map[bool]string{true: "orders/excl", false: "orders/sem"}[tok == tx]
		if f := a.valid(key, tok); f.Op != proto.OpValidate || f.Remaining < 50000 {
			t.Fatalf("V of %d after the restart: %+v", tok, f)
		}
	}
	a.shared("orders/sem", 0, 30, 4, 3)
	a.expectE(proto.OpShared, 4, proto.CodeLimitMismatch)
	a.shared("orders/sem", 0, 30, 5, 2)
	a.expect(proto.OpTimeout, 5)
	a.shared("orders/excl", 0, 30, 6, 2)
	a.expect(proto.OpTimeout, 6)
	a.release("orders/sem", tb) // b's holder: N for a
	a.notHeld(proto.OpRelease, tb)
	b.release("orders/sem", tb)
	b.expect(proto.OpRelease, tb)
	a.release("orders/sem", ta)
	a.expect(proto.OpRelease, ta)
	if t2 := a.grantShared("orders/sem", 30, 7, 5); t2 <= tx {
		t.Fatalf("token %d after the restart, not above %d", t2, tx)
	}
}

// TestWatchRenewAway (docs/PROTOCOL.md decision 46): a grant that an admin
// renewed (another identity's: forced) and whose lease then ends is L 3,
// the admin set the lease it died of; its own identity's renew since
// clears that, and its end is L 2.
func TestWatchRenewAway(t *testing.T) {
	ts := startACL(t, nil)
	a, ops := dial(t, ts.Addr()), dial(t, ts.Addr())
	a.login("orders")
	ops.login("ops")
	forced := a.grantShared("orders/r", 30, 1, 2)
	cleared := a.grantShared("orders/r", 30, 2, 2)
	for _, tok := range []uint64{forced, cleared} {
		ops.watch("orders/r", tok)
		ops.renew("orders/r", 1, tok) // forced: another identity's holder
		ops.expect(proto.OpRenew, tok)
	}
	a.renew("orders/r", 1, cleared) // its own identity's renew
	a.expect(proto.OpRenew, cleared)
	got := map[uint64]uint8{}
	for range 2 {
		f, err := ops.next(5 * time.Second)
		if err != nil || f.Op != proto.OpLost {
			t.Fatalf("waiting for an L: %+v %v", f, err)
		}
		got[f.ID] = f.Reason
	}
	if got[forced] != uint8(shard.ReasonForced) || got[cleared] != uint8(shard.ReasonExpired) {
		t.Fatalf("reasons %v: want %d for the admin's lease, %d after the owner's renew", got, shard.ReasonForced, shard.ReasonExpired)
	}
}

// TestSharedPendingGrantsCap: a connection with --max-pending-grants grants
// it has not taken gets B for an S as for an A — but E 7 for an S whose
// limit differs from the key's holders', which comes before every B
// (docs/PROTOCOL.md decision 44).
func TestSharedPendingGrantsCap(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) {
		c.MaxOutbound = 64 << 20
		c.MaxPendingGrants = 1
	})
	other := dial(t, ts.Addr())
	other.grantShared("pin/shared", 30, 1, 4) // shared with limit 4
	nc, err := net.DialTimeout("tcp", ts.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// 10 MB of pongs, more than loopback's socket buffers hold: the grant
	// after them stays in the server's outbound buffer.
	req := bytes.Repeat(proto.AppendPing(nil, 0), 1<<20)
	req = proto.AppendShared(req, 0, 30, 10, 2, "pin/a")      // granted, not taken
	req = proto.AppendShared(req, 0, 30, 11, 4, "pin/shared") // B: one grant pending
	req = proto.AppendShared(req, 0, 30, 12, 3, "pin/shared") // E 7: another limit
	req = proto.AppendShared(req, 0, 30, 13, 0, "pin/shared") // E 7: limit 0 (the parser's)
	writeErr := make(chan error, 1)
	go func() {
		_ = nc.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_, err := nc.Write(req)
		writeErr <- err
	}()
	// Read nothing until every request is written: a reader that drained
	// the pongs meanwhile could let the grant of 10 reach the socket before
	// 11 is read (on a loaded machine the last frames come in a later
	// batch), and 11 would then be granted, not B. Unread, the pongs stay
	// in the server's outbound buffer (MaxOutbound is 64 MiB), and so does
	// the grant behind them.
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	// The write ending says the requests are in the server's socket, not
	// that it has read them: once we read, the pongs drain, and the grant
	// of 10 could be taken before 11 is read. Wait until the last request
	// (13's E 7, after 12's) has been answered first.
	wait.For(t, "the server to answer the last request", func() bool {
		return ts.Metrics().Errors[proto.CodeLimitMismatch] >= 2
	})
	w := &wire{t: t, c: nc}
	want := map[uint64]frame{10: {Op: proto.OpAcquire}, 11: {Op: proto.OpBusy}, 12: {Op: proto.OpError, Code: proto.CodeLimitMismatch},
		13: {Op: proto.OpError, Code: proto.CodeLimitMismatch}}
	for len(want) > 0 {
		f, err := w.next(10 * time.Second)
		if err != nil {
			t.Fatalf("waiting for %v: %v", want, err)
		}
		if f.Op == proto.OpPing {
			continue
		}
		if x, ok := want[f.ID]; !ok || x.Op != f.Op || x.Code != f.Code {
			t.Fatalf("owner %d answered %c code %d, want %+v", f.ID, f.Op, f.Code, x)
		}
		delete(want, f.ID)
	}
}
