package engine_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// Every cell of PROTOCOL.md §4's request × key-state matrix, over TCP.

func TestAcquireFreeKeyGrants(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	for _, wait := range []uint8{0, 5} {
		key := "free-" + string(rune('a'+wait))
		w.acquire(key, wait, 10, 42)
		f := w.expect(proto.OpAcquire, 42)
		if f.Tail != key || f.Token == 0 {
			t.Fatalf("wait=%d: %+v", wait, f)
		}
	}
}

func TestAcquireWaitZeroOnHeldIsTimeoutNeverQueued(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Table.MaxWaitersPerKey = 1 })
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("k", 30, 1)
	// Queue below limit.
	b.acquire("k", 0, 10, 2)
	b.expect(proto.OpTimeout, 2)
	// Fill the queue; wait=0 still answers T, never B.
	b.acquire("k", 5, 10, 3)
	b.silent(50 * time.Millisecond)
	b.acquire("k", 0, 10, 4)
	b.expect(proto.OpTimeout, 4)
	// The wait=0 request was never queued: release hands to owner 3 only.
	a.release("k", tok)
	a.expect(proto.OpRelease, tok)
	g := b.expect(proto.OpAcquire, 3)
	if g.Token <= tok {
		t.Fatalf("handoff token %d not above %d", g.Token, tok)
	}
	b.silent(100 * time.Millisecond)
}

func TestFIFOHandoffWithLargerTokens(t *testing.T) {
	// One loop: every handoff is flushed by the releasing batch itself;
	// two loops: half of them cross loops through the mailbox and a Wake.
	for _, loops := range []int{1, 2} {
		t.Run("loops="+strconv.Itoa(loops), func(t *testing.T) {
			testFIFOHandoff(t, loops)
		})
	}
}

func testFIFOHandoff(t *testing.T, loops int) {
	ts := startServer(t, func(c *engine.Config) { c.Loops = loops })
	holder := dial(t, ts.Addr())
	tok := holder.grant("fifo", 30, 100)
	const n = 8
	waiters := make([]*wire, n)
	for i := range waiters {
		waiters[i] = dial(t, ts.Addr())
		waiters[i].acquire("fifo", 10, 30, uint64(i+1))
		// Make the arrival order certain: a ping round trip per waiter.
		waiters[i].send(proto.AppendPing(nil, 7))
		waiters[i].expect(proto.OpPing, 7)
	}
	last := tok
	cur := holder
	for i := 0; i < n; i++ {
		cur.release("fifo", last)
		cur.expect(proto.OpRelease, last)
		g := waiters[i].expect(proto.OpAcquire, uint64(i+1))
		if g.Token <= last {
			t.Fatalf("waiter %d got token %d, not above %d", i, g.Token, last)
		}
		for j := i + 1; j < n; j++ {
			waiters[j].silent(time.Millisecond)
		}
		last, cur = g.Token, waiters[i]
	}
	cur.release("fifo", last)
	cur.expect(proto.OpRelease, last)
	// Now free.
	cur.grant("fifo", 5, 999)
}

func TestWaitersOnOneConnectionAnswerOutOfOrder(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("ooo", 30, 1)
	// b queues on "ooo", then asks things that are answered at once.
	b.acquire("ooo", 10, 30, 2)
	b.send(proto.AppendPing(nil, 3))
	b.acquire("other", 0, 30, 4)
	b.expect(proto.OpPing, 3)
	b.expect(proto.OpAcquire, 4)
	a.release("ooo", tok)
	a.expect(proto.OpRelease, tok)
	b.expect(proto.OpAcquire, 2)
}

func TestSameConnectionQueuesBehindItself(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	tok := w.grant("self", 30, 1)
	w.acquire("self", 10, 30, 2) // same key, same connection: queued
	w.silent(50 * time.Millisecond)
	w.release("self", tok)
	// Both answers arrive; the grant to owner 2 is made in the same step.
	got := map[proto.Op]frame{}
	for i := 0; i < 2; i++ {
		f, err := w.next(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got[f.Op] = f
	}
	if r, ok := got[proto.OpRelease]; !ok || r.ID != tok {
		t.Fatalf("no R for %d: %+v", tok, got)
	}
	if g, ok := got[proto.OpAcquire]; !ok || g.ID != 2 || g.Token <= tok {
		t.Fatalf("no handoff to owner 2: %+v", got)
	}
}

func TestSameOwnerTwiceIsTwoAcquires(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	w.grant("dup", 30, 5)
	// Re-sending key and owner neither returns the token nor renews.
	w.acquire("dup", 0, 30, 5)
	w.expect(proto.OpTimeout, 5)
}

func TestReleaseMatrix(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	// Free key: N.
	w.release("nokey", 12345)
	f := w.expect(proto.OpNotHeld, 12345)
	if f.ReqOp != proto.OpRelease || f.Tail != "nokey" {
		t.Fatalf("N frame: %+v", f)
	}
	tok := w.grant("rk", 30, 1)
	// Held, other token: N, and the lock stays.
	w.release("rk", tok+1)
	w.expect(proto.OpNotHeld, tok+1)
	w.release("rk", tok-1)
	w.expect(proto.OpNotHeld, tok-1)
	w.acquire("rk", 0, 30, 2)
	w.expect(proto.OpTimeout, 2)
	// Current token: R, key free.
	w.release("rk", tok)
	f = w.expect(proto.OpRelease, tok)
	if f.Tail != "rk" {
		t.Fatalf("R tail %q", f.Tail)
	}
	// Released twice: N.
	w.release("rk", tok)
	w.expect(proto.OpNotHeld, tok)
	w.grant("rk", 30, 3)
}

func TestReleaseFromAnotherConnection(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("x", 30, 1)
	b.release("x", tok)
	b.expect(proto.OpRelease, tok)
	b.grant("x", 30, 2)
}

func TestRenewMatrix(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	w.renew("nokey", 5, 77)
	f := w.expect(proto.OpNotHeld, 77)
	if f.ReqOp != proto.OpRenew {
		t.Fatalf("N reqop %c", f.ReqOp)
	}
	tok := w.grant("kk", 1, 1)
	w.renew("kk", 5, tok+1)
	w.expect(proto.OpNotHeld, tok+1)
	// Renew before the 1 s lease ends, to 3 s: still held at 1.5 s.
	w.renew("kk", 3, tok)
	if f := w.expect(proto.OpRenew, tok); f.Tail != "kk" {
		t.Fatalf("K tail %q", f.Tail)
	}
	time.Sleep(1500 * time.Millisecond)
	w.acquire("kk", 0, 1, 2)
	w.expect(proto.OpTimeout, 2)
	// The token is unchanged by a renew: release with it works.
	w.release("kk", tok)
	w.expect(proto.OpRelease, tok)
}

func TestLeaseExpiry(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	granted := time.Now()
	tok := a.grant("lease", 1, 1)
	// Still held just before the deadline.
	time.Sleep(800 * time.Millisecond)
	b.acquire("lease", 0, 1, 2)
	b.expect(proto.OpTimeout, 2)
	// A waiter gets it with a new token when the lease ends.
	b.acquire("lease", 5, 1, 3)
	g := b.expect(proto.OpAcquire, 3)
	late := time.Since(granted) - time.Second
	if late < 0 {
		t.Fatalf("lease ended %v early", -late)
	}
	t.Logf("expiry handoff %v after the deadline (contract: ≤ 50 ms)", late)
	if late > 500*time.Millisecond {
		t.Fatalf("lease handoff %v late", late)
	}
	if g.Token <= tok {
		t.Fatalf("token %d not above %d", g.Token, tok)
	}
	// The expired holder's release and renew are N.
	a.release("lease", tok)
	a.expect(proto.OpNotHeld, tok)
	a.renew("lease", 5, tok)
	a.expect(proto.OpNotHeld, tok)
	// Without waiters, the key becomes free.
	time.Sleep(1100 * time.Millisecond)
	a.grant("lease", 5, 4)
}

// TestLeaseEndBeatsWaitEndingJustAfter: a waiter that arrives right after
// the grant with wait = lease is still waiting when the lease ends, a few
// ms before its own wait would: it gets the key, not T, although the timer
// handles both in one tick (docs/PROTOCOL.md decision 13).
func TestLeaseEndBeatsWaitEndingJustAfter(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	for i := uint64(0); i < 3; i++ {
		key := "edge/" + strconv.FormatUint(i, 10)
		tok := a.grant(key, 1, 10+i)
		b.acquire(key, 1, 5, 20+i)
		g, err := b.next(3 * time.Second)
		if err != nil || g.Op != proto.OpAcquire || g.ID != 20+i || g.Token <= tok {
			t.Fatalf("round %d: waiter got %+v, %v; want A with a token above %d", i, g, err, tok)
		}
		a.release(key, g.Token)
		a.expect(proto.OpRelease, g.Token)
	}
}

func TestWaitTimeout(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("wt", 30, 1)
	sent := time.Now()
	b.acquire("wt", 1, 5, 2)
	f := b.expect(proto.OpTimeout, 2)
	took := time.Since(sent)
	if took < time.Second {
		t.Fatalf("T after %v, before the 1 s wait", took)
	}
	t.Logf("T %v after the wait (contract: ≤ 50 ms)", took-time.Second)
	if took > 1500*time.Millisecond {
		t.Fatalf("T after %v", took)
	}
	if f.Tail != "wt" {
		t.Fatalf("T tail %q", f.Tail)
	}
	// Nothing was granted: the holder still holds, and its release frees.
	a.release("wt", tok)
	a.expect(proto.OpRelease, tok)
	b.silent(50 * time.Millisecond)
}

func TestBusyLimits(t *testing.T) {
	t.Run("max-waiters-per-key", func(t *testing.T) {
		ts := startServer(t, func(c *engine.Config) { c.Table.MaxWaitersPerKey = 2 })
		w := dial(t, ts.Addr())
		w.grant("k", 30, 1)
		w.acquire("k", 5, 5, 2)
		w.acquire("k", 5, 5, 3)
		w.acquire("k", 5, 5, 4)
		f := w.expect(proto.OpBusy, 4)
		if f.Tail != "k" {
			t.Fatalf("B tail %q", f.Tail)
		}
		// Another key is unaffected.
		w.grant("k2", 30, 5)
	})
	t.Run("max-waiters", func(t *testing.T) {
		ts := startServer(t, func(c *engine.Config) { c.Table.MaxWaiters = 2 })
		w := dial(t, ts.Addr())
		w.grant("a", 30, 1)
		w.grant("b", 30, 2)
		w.acquire("a", 5, 5, 3)
		w.acquire("b", 5, 5, 4)
		w.acquire("a", 5, 5, 5)
		w.expect(proto.OpBusy, 5)
		w.acquire("b", 0, 5, 6)
		w.expect(proto.OpTimeout, 6)
	})
	t.Run("max-keys", func(t *testing.T) {
		ts := startServer(t, func(c *engine.Config) { c.Table.MaxKeys = 2 })
		w := dial(t, ts.Addr())
		t1 := w.grant("a", 30, 1)
		w.grant("b", 30, 2)
		w.acquire("c", 0, 5, 3)
		w.expect(proto.OpBusy, 3)
		w.acquire("c", 5, 5, 4)
		w.expect(proto.OpBusy, 4)
		// A held key still queues/times out as usual.
		w.acquire("a", 0, 5, 5)
		w.expect(proto.OpTimeout, 5)
		// Freeing one makes room.
		w.release("a", t1)
		w.expect(proto.OpRelease, t1)
		w.grant("c", 30, 6)
	})
}

func TestBadInput(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.MaxKey = 8 })
	holder := dial(t, ts.Addr())
	tok := holder.grant("held", 60, 1)

	keepOpen := []struct {
		name  string
		frame []byte
		op    proto.Op
		id    uint64
		code  uint8
	}{
		{"empty key", proto.AppendAcquire(nil, 0, 5, 11, ""), proto.OpAcquire, 11, proto.CodeBadKey},
		{"key over --max-key", proto.AppendAcquire(nil, 0, 5, 12, "123456789"), proto.OpAcquire, 12, proto.CodeBadKey},
		{"key not utf-8", proto.AppendAcquire(nil, 0, 5, 13, "\xff\xfe"), proto.OpAcquire, 13, proto.CodeBadKey},
		{"lease 0", proto.AppendAcquire(nil, 0, 0, 14, "k"), proto.OpAcquire, 14, proto.CodeBadLease},
		{"bad key before bad lease", proto.AppendAcquire(nil, 0, 0, 15, ""), proto.OpAcquire, 15, proto.CodeBadKey},
		{"release bad key", proto.AppendRelease(nil, tok, ""), proto.OpRelease, tok, proto.CodeBadKey},
		{"renew lease 0 stale token", proto.AppendRenew(nil, 0, 999, "held"), proto.OpRenew, 999, proto.CodeBadLease},
		{"renew lease 0 current token", proto.AppendRenew(nil, 0, tok, "held"), proto.OpRenew, tok, proto.CodeBadLease},
		{"renew bad key", proto.AppendRenew(nil, 5, tok, "\xc3"), proto.OpRenew, tok, proto.CodeBadKey},
	}
	for _, tc := range keepOpen {
		t.Run(tc.name, func(t *testing.T) {
			w := dial(t, ts.Addr())
			w.send(tc.frame)
			f := w.expect(proto.OpError, tc.id)
			if f.ReqOp != tc.op || f.Code != tc.code {
				t.Fatalf("E frame %+v, want op %c code %d", f, tc.op, tc.code)
			}
			// The connection stays open and usable.
			w.send(proto.AppendPing(nil, 1))
			w.expect(proto.OpPing, 1)
		})
	}

	long := strings.Repeat("x", 1025)
	closing := []struct {
		name  string
		frame []byte
		op    proto.Op
		id    uint64
	}{
		{"unknown op", []byte("Z0123456789\n"), 'Z', 0},
		{"newline as op", []byte("\n"), '\n', 0},
		{"tail over 1024 without newline", proto.AppendAcquire(nil, 0, 5, 21, long)[:1+10+1025], proto.OpAcquire, 21},
		{"tail over 1024", proto.AppendAcquire(nil, 0, 5, 22, long), proto.OpAcquire, 22},
		{"ping with tail", append(proto.AppendPing(nil, 23)[:9], "x\n"...), proto.OpPing, 23},
	}
	for _, tc := range closing {
		t.Run(tc.name, func(t *testing.T) {
			w := dial(t, ts.Addr())
			w.send(tc.frame)
			f := w.expect(proto.OpError, tc.id)
			if f.ReqOp != tc.op || f.Code != proto.CodeBadFrame {
				t.Fatalf("E frame %+v, want op %c code 1", f, tc.op)
			}
			w.closed(5 * time.Second)
		})
	}
	// Nothing held was lost.
	holder.acquire("held", 0, 5, 2)
	holder.expect(proto.OpTimeout, 2)
	holder.release("held", tok)
	holder.expect(proto.OpRelease, tok)
}

func TestKeyAtProtocolLimit(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	key := strings.Repeat("é", 512) // 1024 bytes
	w.grant(key, 5, 1)
	w.grant("\x00\x01ctl\t", 5, 2) // NUL and control bytes are legal
}

func TestSplitFramesByteByByte(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	var all []byte
	all = proto.AppendAcquire(all, 0, 10, 0x0A0A0A0A0A0A0A0A, "split\nnot") // owner full of 0x0A
	all = all[:0]
	all = proto.AppendAcquire(all, 0, 10, 0x0A0A0A0A0A0A0A0A, "split")
	all = proto.AppendPing(all, 0x0A)
	for i := range all {
		w.send(all[i : i+1])
		time.Sleep(time.Millisecond)
	}
	g := w.expect(proto.OpAcquire, 0x0A0A0A0A0A0A0A0A)
	w.expect(proto.OpPing, 0x0A)
	rel := proto.AppendRenew(nil, 10, g.Token, "split")
	rel = proto.AppendRelease(rel, g.Token, "split")
	for i := range rel {
		w.send(rel[i : i+1])
	}
	w.expect(proto.OpRenew, g.Token)
	w.expect(proto.OpRelease, g.Token)
}

func TestThousandPipelinedFramesInOneWrite(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	var b []byte
	for i := 0; i < 1000; i++ {
		b = proto.AppendAcquire(b, 0, 10, uint64(i), "p"+string(rune('0'+i%10))+strings.Repeat("k", i%7))
		b = proto.AppendPing(b, uint64(i))
	}
	w.send(b)
	acq, pong := 0, 0
	for i := 0; i < 2000; i++ {
		f, err := w.next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d answers: %v", i, err)
		}
		switch f.Op {
		case proto.OpAcquire, proto.OpTimeout:
			acq++
		case proto.OpPing:
			if f.ID != uint64(pong) {
				t.Fatalf("pong %d out of order, want %d", f.ID, pong)
			}
			pong++
		default:
			t.Fatalf("unexpected %+v", f)
		}
	}
	if acq != 1000 || pong != 1000 {
		t.Fatalf("acquire answers %d, pongs %d", acq, pong)
	}
}
