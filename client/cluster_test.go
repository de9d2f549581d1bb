package client

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// Clients against fake cluster members (docs/PROTOCOL.md §7): a member
// that is not the active answers every request with M naming the active,
// or with an empty address while none is known, and executes nothing.

// member is a fake cluster member: it executes requests while it is the
// active (its address equals *active) and otherwise answers M naming the
// active, or M without an address when active is "".
func member(t *testing.T, active *atomic.Pointer[string]) *fake {
	return newFake(t, func(fc *fconn, r freq) {
		self := fc.nc.LocalAddr().String()
		a := ""
		if p := active.Load(); p != nil {
			a = *p
		}
		if a == self {
			fc.auto(r)
			return
		}
		fc.send(proto.AppendMoved(nil, r.Op, r.ID, a))
	})
}

func setActive(p *atomic.Pointer[string], addr string) { p.Store(&addr) }

// drain returns the requests f received so far.
func drain(f *fake) []freq {
	var rs []freq
	for {
		select {
		case r := <-f.reqs:
			rs = append(rs, r)
		default:
			return rs
		}
	}
}

// openConns counts f's connections the client has not closed.
func openConns(f *fake) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fc := range f.conns {
		select {
		case <-fc.closed:
		default:
			n++
		}
	}
	return n
}

// TestClusterFindsActiveAndStays: a client given every member's address
// learns the active from the first M and sends everything there until the
// active answers M itself (a handoff) or dies; then it finds the next one.
func TestClusterFindsActiveAndStays(t *testing.T) {
	var active atomic.Pointer[string]
	ms := []*fake{member(t, &active), member(t, &active), member(t, &active)}
	setActive(&active, ms[2].addr())
	cl := newClient(t, fastConfig(ms[0].addr(), ms[1].addr(), ms[2].addr()))
	waitUp(t, cl, 3)
	ctx := ctxT(t, 20*time.Second)
	pairs := func(prefix string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			l, err := cl.Acquire(ctx, prefix, AcquireOptions{Wait: 2 * time.Second})
			if err != nil {
				t.Fatalf("%s %d: Acquire: %v", prefix, i, err)
			}
			if err := cl.Release(ctx, l); err != nil {
				t.Fatalf("%s %d: Release: %v", prefix, i, err)
			}
		}
	}
	// counts returns the requests each member received since the last call.
	counts := func() [3]int {
		var c [3]int
		for i, m := range ms {
			c[i] = len(drain(m))
		}
		return c
	}

	pairs("stay", 30)
	if c := counts(); c[0]+c[1] > 1 || c[2] != 60 {
		t.Fatalf("requests per member %v: want at most one M from a standby, then all 60 on the active", c)
	}

	// Handoff: the active answers M naming member 0, which is active now.
	setActive(&active, ms[0].addr())
	pairs("handoff", 30)
	if c := counts(); c[0] != 60 || c[1] != 0 || c[2] != 1 {
		t.Fatalf("after the handoff, requests per member %v: want one M from the old active, then all 60 on member 0", c)
	}

	// The active dies; member 1 takes over, member 2 knows it.
	setActive(&active, ms[1].addr())
	ms[0].close()
	waitFor(t, "the client sees the dead active", func() bool { return liveConns(cl) == 2 })
	pairs("failover", 30)
	if c := counts(); c[1] < 60 || c[2] > 1 {
		t.Fatalf("after the failover, requests per member %v: want all 60 on member 1 (at most one M from member 2)", c)
	}
}

// TestClusterEmptyMovedTriesAnother: M without an address (no active known
// there) makes the client pause 50..200 ms and send the same request
// (owner, deadline) to another member.
func TestClusterEmptyMovedTriesAnother(t *testing.T) {
	var none, active atomic.Pointer[string]
	lost := member(t, &none) // knows no active
	act := member(t, &active)
	setActive(&active, act.addr())
	cfg := fastConfig(lost.addr(), act.addr())
	cfg.RetryPause = 100 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	ctx := ctxT(t, 20*time.Second)
	detours := 0
	for i := 0; i < 10 && detours < 3; i++ {
		if _, err := cl.Acquire(ctx, "empty-m", AcquireOptions{Wait: 5 * time.Second}); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		granted := act.next(time.Second)
		for _, r := range drain(lost) {
			if r.ID != granted.ID {
				t.Fatalf("member without an active saw owner %x, the grant went to %x", r.ID, granted.ID)
			}
			gap := granted.At.Sub(r.At)
			if gap < 90*time.Millisecond || gap > time.Second {
				t.Fatalf("resent to another member %v after the empty M, want the 100 ms pause", gap)
			}
			if granted.Wait > r.Wait {
				t.Fatalf("resend wait %d above the first send's %d", granted.Wait, r.Wait)
			}
			detours++
		}
	}
	if detours == 0 {
		t.Fatal("no request went to the member without an active: round-robin not exercised")
	}
}

// TestClusterRedirectSlotsBounded: a stream of M answers naming ever-new
// addresses (none in Config.Addrs) keeps at most MaxRedirectAddrs of them
// connected; the evicted ones' connections are closed, and the request
// follows every hop with one owner.
func TestClusterRedirectSlotsBounded(t *testing.T) {
	const hops = 3 * MaxRedirectAddrs
	last := newFake(t, nil)
	chain := []*fake{last}
	next := last.addr()
	for i := 0; i < hops; i++ {
		to := next
		f := newFake(t, func(fc *fconn, r freq) { fc.send(proto.AppendMoved(nil, r.Op, r.ID, to)) })
		chain = append(chain, f)
		next = f.addr()
	}
	first := chain[len(chain)-1]
	cfg := fastConfig(first.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	l, err := cl.Acquire(ctxT(t, 20*time.Second), "hops", AcquireOptions{Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire through %d redirects: %v", hops, err)
	}
	owner := first.next(time.Second).ID
	for i, f := range chain[:len(chain)-1] {
		if r := f.next(time.Second); r.ID != owner {
			t.Fatalf("hop %d: owner %x, want %x", i, r.ID, owner)
		}
	}
	if n := len(*cl.slots.Load()); n > 1+MaxRedirectAddrs {
		t.Fatalf("%d slots after %d redirects, want at most %d", n, hops, 1+MaxRedirectAddrs)
	}
	waitFor(t, "evicted redirect connections closed", func() bool {
		open := 0
		for _, f := range chain {
			open += openConns(f)
		}
		return open <= 1+MaxRedirectAddrs
	})
	// The grant's node is kept: a release goes there.
	if err := cl.Release(context.Background(), l); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestClusterRetiredSlotFinishesItsRequests: an evicted address's
// connection stays open until the requests sent on it are answered, then
// closes.
func TestClusterRetiredSlotFinishesItsRequests(t *testing.T) {
	hold := make(chan struct{})
	slow := newFake(t, func(fc *fconn, r freq) {
		go func() {
			<-hold
			fc.auto(r)
		}()
	})
	entry := newFake(t, func(fc *fconn, r freq) { fc.send(proto.AppendMoved(nil, r.Op, r.ID, slow.addr())) })
	cfg := fastConfig(entry.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	res := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(ctxT(t, 20*time.Second), "slow", AcquireOptions{Wait: 10 * time.Second})
		res <- err
	}()
	slow.next(5 * time.Second) // sent on the slow node, unanswered
	for i := 0; i < MaxRedirectAddrs; i++ {
		cl.follow(newFake(t, nil).addr()) // as if M answers named them
	}
	for _, s := range *cl.slots.Load() {
		if s.addr == slow.addr() {
			t.Fatal("the slow node is still a slot after MaxRedirectAddrs newer redirects")
		}
	}
	time.Sleep(3 * retirePoll)
	if openConns(slow) != 1 {
		t.Fatal("the evicted connection closed with an acquire awaiting its answer")
	}
	close(hold)
	if err := <-res; err != nil {
		t.Fatalf("the acquire on the evicted connection: %v", err)
	}
	waitFor(t, "the evicted connection closed once idle", func() bool { return openConns(slow) == 0 })
}

// TestClusterMovedToDeadNode: an M naming a node that is down (it died
// after the answering member last heard of it) does not strand the
// request there: after a pause the client asks again, and follows the M
// that names the new active.
func TestClusterMovedToDeadNode(t *testing.T) {
	dead := deadAddr(t)
	var active atomic.Pointer[string]
	setActive(&active, dead)
	standby := member(t, &active)
	next := member(t, &active)
	cfg := fastConfig(standby.addr())
	cfg.ConnsPerAddr = 1
	cfg.RetryPause = 50 * time.Millisecond
	cl := newClient(t, cfg)
	time.AfterFunc(500*time.Millisecond, func() { setActive(&active, next.addr()) })
	start := time.Now()
	if _, err := cl.Acquire(ctxT(t, 10*time.Second), "dead-active", AcquireOptions{Wait: 5 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("granted after %v: the request waited for the dead node", el)
	}
	if len(drain(standby)) < 2 {
		t.Fatal("the standby was not asked again after its M named a dead node")
	}
}

// TestClusterMovedToRestartedNode: an M names a member whose connection
// is down (it restarted and took over): the client dials it again at once
// instead of waiting for the background redial (ReconnectInterval).
func TestClusterMovedToRestartedNode(t *testing.T) {
	later := deadAddr(t)
	var active atomic.Pointer[string]
	setActive(&active, later)
	standby := member(t, &active)
	cfg := fastConfig(standby.addr(), later)
	cfg.ReconnectInterval = 10 * time.Second
	cfg.RetryPause = 50 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)                                            // the standby; the other address refused its dial
	newFakeAt(t, later, func(fc *fconn, r freq) { fc.auto(r) }) // the member is back
	start := time.Now()
	if _, err := cl.Acquire(ctxT(t, 8*time.Second), "after-restart", AcquireOptions{Wait: 5 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("granted after %v: the client waited for its background redial", el)
	}
}

// TestClusterReleaseAndRenewFollowM: releases and renews follow M too,
// addressed at once and empty after the retry interval (Release: 5 s at
// 200 ms, docs/PROTOCOL.md §7).
func TestClusterReleaseAndRenewFollowM(t *testing.T) {
	var active atomic.Pointer[string]
	act := member(t, &active)
	var n atomic.Int32
	standby := newFake(t, func(fc *fconn, r freq) {
		to := act.addr()
		if n.Add(1)%2 == 1 {
			to = "" // every other answer: no active known yet
		}
		fc.send(proto.AppendMoved(nil, r.Op, r.ID, to))
	})
	setActive(&active, act.addr())
	cfg := fastConfig(standby.addr())
	cfg.ConnsPerAddr = 1
	cfg.ReleaseRetryInterval = 200 * time.Millisecond
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	l := Lock{Key: "follow", Token: 4242}

	if err := cl.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	a, b := standby.next(time.Second), standby.next(time.Second)
	r := act.next(time.Second)
	if a.Op != proto.OpRelease || b.Op != proto.OpRelease || r.Op != proto.OpRelease || r.ID != 4242 {
		t.Fatalf("got %c, %c on the standby, %c %d on the active", a.Op, b.Op, r.Op, r.ID)
	}
	if gap := b.At.Sub(a.At); gap < 180*time.Millisecond {
		t.Fatalf("release resent %v after an empty M, want the 200 ms interval", gap)
	}
	if gap := r.At.Sub(b.At); gap > time.Second {
		t.Fatalf("release sent to the active %v after the M naming it", gap)
	}

	cl2 := newClient(t, cfg) // a fresh client: it starts at the standby again
	if _, err := cl2.Renew(ctx, l, 10*time.Second); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	a, b = standby.next(time.Second), standby.next(time.Second)
	if r := act.next(time.Second); a.Op != proto.OpRenew || b.Op != proto.OpRenew || r.Op != proto.OpRenew || r.ID != 4242 {
		t.Fatalf("got %c, %c on the standby, %c %d on the active; want the renewal's detour", a.Op, b.Op, r.Op, r.ID)
	}
}
