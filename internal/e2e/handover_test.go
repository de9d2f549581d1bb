package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/faultproxy"
	"github.com/lockd-dev/lockd/proto"
)

// delayMemberLinks delays every member link of c by d in both directions
// (the client paths are left alone).
func delayMemberLinks(c *clustertest.Cluster, d time.Duration) {
	for j := range c.Members() {
		for k := range c.Members() {
			if p := c.Link(j, k).Member; p != nil {
				p.Delay(faultproxy.Both, d)
			}
		}
	}
}

// TestPrioritySIGTERMHandoverDelayedLinks: SIGTERM of
// the active while every member link is delayed 1.5 s, longer than the
// failover timeout: the successor's confirmation of the handover comes
// late. The handover must still complete — no request is answered E 4
// (PROTOCOL.md §6.2: a live, in-sync successor exists), the queued
// acquires are answered M naming the successor, and the successor holds
// every lock with its token.
func TestPrioritySIGTERMHandoverDelayedLinks(t *testing.T) {
	c, _ := startPriority(t, 3, true)
	conn := dial(t, c, 0)
	held := map[string]uint64{}
	for i := range 20 {
		key := fmt.Sprintf("held/%d", i)
		held[key] = grant(t, conn, key, 120, uint64(i+1))
	}
	time.Sleep(200 * time.Millisecond) // replicated
	// Raise the delay in steps of half the failover timeout: each step
	// leaves a gap of 0.5 s in every link's heartbeats, less than the
	// failover timeout, so the members stay live and in sync; then
	// heartbeats flow, 1.5 s late.
	for _, d := range []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond} {
		delayMemberLinks(c, d)
		time.Sleep(d + time.Second)
	}
	waitActiveIs(t, c, 0, "the active changed while the delay was raised")
	st, err := c.Member(0).Status()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) == 0 || !st.Members[0].Live || !st.Members[0].InSync {
		t.Fatalf("member 1 not live and in sync as the active sees it under the delay: %+v", st.Members)
	}

	// Acquires queued on held keys, answered at the handover.
	const queued = 5
	for i := range queued {
		if err := conn.Send(proto.AppendAcquire(nil, 60, 10, uint64(100+i), fmt.Sprintf("held/%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A client sending every 5 ms: not one E 4.
	var e4, answers atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ticker := dial(t, c, 0)
	ticker.SetTimeout(10 * time.Second)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r, err := ticker.Do(proto.AppendAcquire(nil, 0, 5, uint64(1000+i), fmt.Sprintf("tick/%d", i)))
			if err != nil {
				return // the old active closed the connection
			}
			answers.Add(1)
			if r.Op == proto.OpError && r.Code == proto.CodeShutdown {
				e4.Add(1)
			}
			if r.Op == proto.OpAcquire {
				if r, err = ticker.Do(proto.AppendRelease(nil, r.Token, fmt.Sprintf("tick/%d", i))); err != nil {
					return
				}
				if r.Op == proto.OpError && r.Code == proto.CodeShutdown {
					e4.Add(1)
				}
			}
		}
	})
	time.Sleep(100 * time.Millisecond)
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	succ := c.Peers(0)[1] // member 1 as member 0 names it: through its proxy
	for range queued {
		r, err := conn.Read()
		if err != nil {
			t.Fatalf("a queued acquire was not answered: %v", err)
		}
		if r.Op != proto.OpMoved || string(r.Tail) != succ {
			t.Fatalf("queued acquire (owner %d) at the handover: %c code %d %q, want M naming %s", r.ID, r.Op, r.Code, r.Tail, succ)
		}
	}
	code, err := c.Member(0).Wait(20 * time.Second)
	close(stop)
	wg.Wait()
	if err != nil || code != 0 {
		t.Fatalf("the old active's exit: %d, %v", code, err)
	}
	t.Logf("the ticking client got %d answers", answers.Load())
	if n := e4.Load(); n > 0 {
		t.Fatalf("%d answers were E 4 during a planned handover to a live, in-sync successor", n)
	}
	delayMemberLinks(c, 0)
	waitActiveIs(t, c, 1, "the successor is not the active")
	for key, tok := range held {
		if ok, got := keyState(t, c, 1, key); !ok || got != tok {
			t.Fatalf("%s on the successor: held %v token %d, want %d", key, ok, got, tok)
		}
	}
}

// TestPrioritySIGTERMJustAfterTakingOver (a residual case
// chaos found): the first member restarts, syncs and takes the active role
// back by a planned handover; the old active, now its standby, applies its
// snapshot — and the new active is terminated within milliseconds, before
// that standby's next heartbeat (every tenth of the failover timeout) says
// it follows the new active. The standby's Ack(snapshot) already says so:
// the SIGTERM must hand over to it (M naming it, never E 4), not shut down
// as a single node.
func TestPrioritySIGTERMJustAfterTakingOver(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	if err := c.Member(0).Kill(); err != nil {
		t.Fatal(err)
	}
	waitActive(t, c, 3*time.Second, 0)
	if err := c.Member(0).Restart(); err != nil {
		t.Fatal(err)
	}
	// Member 1 in sync with member 0 as the active: read as often as the
	// admin endpoint answers, to signal inside the heartbeat's interval.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := c.Member(1).Status()
		if err == nil && st.InSync && st.Active == c.Peers(1)[0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member 1 never in sync with the restarted member 0: %+v, %v", st, err)
		}
		time.Sleep(time.Millisecond)
	}
	holder, waiter := dial(t, c, 0), dial(t, c, 0)
	grant(t, holder, "held", 60, 1)
	if err := waiter.Send(proto.AppendAcquire(nil, 30, 10, 2, "held")); err != nil {
		t.Fatal(err)
	}
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r, err := waiter.Read()
	if err != nil {
		t.Fatalf("the queued acquire was not answered: %v", err)
	}
	if succ := c.Peers(0)[1]; r.Op != proto.OpMoved || string(r.Tail) != succ {
		t.Fatalf("queued acquire at the SIGTERM just after taking over: %c code %d %q, want M naming %s\n%s",
			r.Op, r.Code, r.Tail, succ, c.Member(0).Logs())
	}
	if code, err := c.Member(0).Wait(20 * time.Second); err != nil || code != 0 {
		t.Fatalf("member 0's exit: %d, %v", code, err)
	}
	waitActiveIs(t, c, 1, "member 1 is not the active after the handover")
}

// TestPrioritySuccessorServesAtTheM: PROTOCOL.md §6.2, the planned
// handover: the old active has the successor take over "and only then"
// answers with M naming it. A client that follows that M at once — a fresh
// connection to the successor, right after the M — must be served there,
// never sent back by an M naming the old active (the successor had said it
// took the handover before it served, and its gate still named the old
// active for a few milliseconds). Each round: SIGTERM of the active holding
// a lock and queued acquires, the M read on the queued acquire, a ping on a
// new connection to the member it names; then the old active restarts and
// takes over again by priority.
func TestPrioritySuccessorServesAtTheM(t *testing.T) {
	c, a := startPriority(t, 3, false)
	if a != 0 {
		t.Fatalf("active %d at start, want the first member", a)
	}
	rounds := env("LOCKD_HANDOVER_ROUNDS", 4)
	for round := range rounds {
		conn := dial(t, c, 0)
		key := fmt.Sprintf("held/%d", round)
		grant(t, conn, key, 60, 1)
		const queued = 4
		for i := range queued {
			if err := conn.Send(proto.AppendAcquire(nil, 30, 10, uint64(2+i), key)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond) // replicated, the acquires queued
		if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r, err := conn.Read()
		if err != nil {
			t.Fatalf("round %d: the queued acquire was not answered: %v", round, err)
		}
		if r.Op != proto.OpMoved || len(r.Tail) == 0 {
			t.Fatalf("round %d: queued acquire at the handover: %c code %d %q, want M naming the successor", round, r.Op, r.Code, r.Tail)
		}
		succ := string(r.Tail)
		nc, err := c.Dial(succ)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetTimeout(10 * time.Second)
		p, err := nc.Do(proto.AppendPing(nil, 7))
		nc.Close()
		if err != nil {
			t.Fatalf("round %d: ping on the successor %s right after the M: %v", round, succ, err)
		}
		if p.Op != proto.OpPing {
			t.Fatalf("round %d: ping on the successor %s right after the M naming it: %c %q, want P (the old active answered M before the successor served)",
				round, succ, p.Op, p.Tail)
		}
		if code, err := c.Member(0).Wait(20 * time.Second); err != nil || code != 0 {
			t.Fatalf("round %d: the old active's exit: %d, %v", round, code, err)
		}
		if err := c.Member(0).Restart(); err != nil {
			t.Fatal(err)
		}
		waitActiveIs(t, c, 0, "the restarted first member did not take over again")
	}
}
