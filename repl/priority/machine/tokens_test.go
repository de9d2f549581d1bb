package machine

import (
	"testing"
	"time"
)

// activeWith is a serving active (member 0 of 2) whose allocator is at
// last with limit, as Local says.
func activeWith(t *testing.T, last, limit uint64) (*Member, int64) {
	t.Helper()
	return activeAmong(t, []string{"m0", "m1"}, last, limit)
}

// activeAmong is activeWith in a cluster of the members peers.
func activeAmong(t *testing.T, peers []string, last, limit uint64) (*Member, int64) {
	t.Helper()
	now := 1000 * ms
	m := New(Config{Self: 0, Peers: peers, Timeout: int64(time.Second), TokenBlock: 1 << 20, Start: last, Now: now, NoWallFloor: true})
	m.promoteAt(1)
	m.begin()
	m.becomeActive(now, "a test", Base{From: None}, 0, false)
	r := find(m.out, ActReserve)[0].Reserve
	m.Step(now, Msg{Kind: MsgReserved, Op: r.Op, Limit: limit, Token: last})
	m.local = Local{TokenLast: last, TokenLimit: limit, Mark: limit}
	if !m.servingNow() || m.limit != limit {
		t.Fatalf("setup: serving %v, limit %d", m.servingNow(), m.limit)
	}
	return m, now
}

// TestActiveRaisesAboveAMembersOwnMark: a member that served on its own
// (the isolated side of a split), was killed before the heal and
// restarted reports its data dir's mark in its heartbeats as a standby;
// the active's counter goes above it (and it reserves), so no token of
// the active undercuts one the member issued. A standby's mark that is
// only this active's reservation moves nothing.
func TestActiveRaisesAboveAMembersOwnMark(t *testing.T) {
	last, limit := uint64(5000), uint64(5000+1<<20)
	m, now := activeWith(t, last, limit)
	acts := m.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Role: RoleStandby, Active: 0, InSync: true, Epoch: 1, Mark: limit}})
	if o := find(acts, ActObserve); len(o) != 0 {
		t.Fatalf("a standby's mark at this active's reservation moved the counter: %+v", o)
	}
	own := limit + 5<<30 // reserved on its own, elsewhere
	acts = m.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Role: RoleStandby, Active: 0, Epoch: 1, Mark: own}})
	o, r := find(acts, ActObserve), find(acts, ActReserve)
	if len(o) != 1 || o[0].Token < own || len(r) != 1 {
		t.Fatalf("after a member reported its own mark %d: observe %+v, reserve %+v: its tokens could be undercut", own, o, r)
	}
}

// TestBusyMemberIsLive: a member a frame of which the driver is processing
// (Local.Busy) counts as heard at the tick.
func TestBusyMemberIsLive(t *testing.T) {
	now := 100 * int64(time.Second)
	m := New(Config{Self: 1, Peers: []string{"m0", "m1"}, Timeout: int64(time.Second), Now: now})
	m.Step(now, Msg{Kind: MsgHeartbeat, From: 0, HB: Heartbeat{Epoch: 1, Role: RoleActive, Active: 0}})
	for at := now + 100*ms; at <= now+3*int64(time.Second); at += 100 * ms {
		m.Tick(at, Local{Busy: 1})
	}
	at := now + 3*int64(time.Second)
	if !m.live(0, at) || m.role != RoleStandby || m.active != 0 {
		t.Fatalf("busy for 3 s: live %v, %v following %d", m.live(0, at), m.role, m.active)
	}
	for at2 := at + 100*ms; at2 <= at+1100*ms; at2 += 100 * ms {
		m.Tick(at2, Local{})
	}
	if m.live(0, at+1100*ms) {
		t.Fatal("live with no frame in hand and nothing heard for over a failover timeout")
	}
}

// TestOwnReservationReportedBackMovesNothing: right after its first
// reservation, before its next tick measures the data dir's mark again, a
// new active hears a standby report that reservation as its mark (the
// snapshot's end carried it). It is this active's own: the counter must
// not jump to it (every acquire got B until the next reservation: found by
// ops' metrics test, a priority cluster's first acquire answered B).
func TestOwnReservationReportedBackMovesNothing(t *testing.T) {
	now := 1000 * ms
	m := New(Config{Self: 0, Peers: []string{"m0", "m1"}, Timeout: int64(time.Second), TokenBlock: 1 << 20, Start: 5000, Now: now, NoWallFloor: true})
	m.Tick(now, Local{TokenLast: 5000, TokenLimit: 5000, Mark: 5000}) // the mark before the reservation
	m.promoteAt(1)
	m.begin()
	m.becomeActive(now, "a test", Base{From: None}, 0, false)
	r := find(m.out, ActReserve)[0].Reserve
	limit := uint64(5000 + 1<<20)
	m.Step(now, Msg{Kind: MsgReserved, Op: r.Op, Limit: limit, Token: 5000})
	acts := m.Step(now+ms, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Mark: limit}})
	if o := find(acts, ActObserve); len(o) != 0 {
		t.Fatalf("the active's own reservation, reported back as a standby's mark, moved its counter: %+v", o)
	}
}

// TestOwnReservationReportedBackEarlyMovesNothing: the same, when the
// standby reports the mark before the reservation's end reaches the
// machine (a standby writes and acknowledges the reservation, and its next
// heartbeat — or the end of a snapshot — carries it, while the executor
// still waits for the other standbys). Before MsgReserving the counter
// jumped to the new limit: the first acquire of a new active got B
// (e2e, 1 start in 3 under load).
func TestOwnReservationReportedBackEarlyMovesNothing(t *testing.T) {
	now := 1000 * ms
	m := New(Config{Self: 0, Peers: []string{"m0", "m1"}, Timeout: int64(time.Second), TokenBlock: 1 << 20, Start: 5000, Now: now, NoWallFloor: true})
	m.Tick(now, Local{TokenLast: 5000, TokenLimit: 5000, Mark: 5000})
	m.promoteAt(1)
	m.begin()
	m.becomeActive(now, "a test", Base{From: None}, 0, false)
	r := find(m.out, ActReserve)[0].Reserve
	limit := uint64(5000 + 1<<20)
	m.Step(now, Msg{Kind: MsgReserving, Op: r.Op, Limit: limit})
	acts := m.Step(now+ms, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Mark: limit}})
	if o := find(acts, ActObserve); len(o) != 0 {
		t.Fatalf("the active's own reservation, reported back before its end, moved its counter: %+v", o)
	}
	m.Step(now+2*ms, Msg{Kind: MsgReserved, Op: r.Op, Limit: limit, Token: 5000})
	// A mark above anything this member reserved still moves it.
	acts = m.Step(now+3*ms, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Mark: limit + 7}})
	if o := find(acts, ActObserve); len(o) != 1 || o[0].Token != limit+7 {
		t.Fatalf("a mark above this member's reservations: observes %+v, want one of %d", o, limit+7)
	}
}

// TestActiveHearingActiveHolds: an active that hears another active whose
// tokens are above its reservation (a healed partition) holds requests
// until a reservation covers the jump, rather than serving with B for
// every acquire that needs a token (B says the server is full, and
// clients take it as final) — and, the other having become active
// earlier, until the other holds and the two are compared. If that
// reservation fails, it serves again once compared: acquires get B as they
// do whenever reserving fails.
func TestActiveHearingActiveHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  string
	}{
		{"reserved", ""},
		{"reserving fails", "no space left on device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			last, limit := uint64(5000), uint64(5000+1<<20)
			m, now := activeWith(t, last, limit)
			other := Heartbeat{Epoch: 1, Role: RoleActive, Active: 1, TokenLast: limit + 10, Reserved: limit + 3<<20}
			acts := m.Step(now+ms, Msg{Kind: MsgHeartbeat, From: 1, HB: other})
			g, o, r := find(acts, ActGate), find(acts, ActObserve), find(acts, ActReserve)
			if len(g) != 1 || g[0].Gate.State != Hold {
				t.Fatalf("gates %+v on hearing an active above this one's reservation: want one hold", g)
			}
			if len(o) != 1 || o[0].Token < other.Reserved || len(r) != 1 {
				t.Fatalf("observe %+v, reserve %+v: the counter must go above the other's reservation", o, r)
			}
			// Another heartbeat of it moves nothing more.
			acts = m.Step(now+2*ms, Msg{Kind: MsgHeartbeat, From: 1, HB: other})
			if g := find(acts, ActGate); len(g) != 0 {
				t.Fatalf("a second heartbeat published %+v", g)
			}
			reply := Msg{Kind: MsgReserved, Op: r[0].Reserve.Op, Limit: o[0].Token + 2<<20, Token: o[0].Token}
			if tc.err != "" {
				reply = Msg{Kind: MsgReserved, Op: r[0].Reserve.Op, Err: tc.err}
			}
			acts = m.Step(now+3*ms, reply)
			if g := find(acts, ActGate); len(g) != 0 || m.servingNow() {
				t.Fatalf("gates %+v after the reservation's end, before the other holds: want the hold kept", g)
			}
			// The other (the earlier active of the two: the same epoch, a
			// lower priority) holds: this one compares, stays, and serves.
			held := other
			held.Held = true
			acts = m.Step(now+4*ms, Msg{Kind: MsgHeartbeat, From: 1, HB: held})
			if g := find(acts, ActGate); len(g) != 1 || g[0].Gate.State != Serve || m.verdict[1] != 1 {
				t.Fatalf("gates %+v, verdict %d once the other holds: want serve and the verdict", g, m.verdict[1])
			}
		})
	}
}

// TestYieldingActiveKeepsItsCounter: an active that hears one that became
// active later — itself, or a standby that follows it — executes nothing
// until the contest ends; its counter and heartbeat stay its own (raising
// them, or reserving above a standby's mark or its counter from a later
// epoch, sent the later active a reservation above its own, above which it
// jumped again), and when it serves again it reserves above everything the
// other issued.
func TestYieldingActiveKeepsItsCounter(t *testing.T) {
	last, limit := uint64(5000), uint64(5000+1<<20)
	for _, tc := range []struct {
		name  string
		from  int
		hb    Heartbeat
		above uint64 // the reservation on serving again starts at least here
	}{
		{"the later active", 1, Heartbeat{Epoch: 2, Role: RoleActive, Active: 1, TokenLast: limit + 10, Reserved: limit + 3<<20, Mark: limit + 3<<20},
			limit + 5<<20},
		{"a standby following it", 2, Heartbeat{Epoch: 2, Role: RoleStandby, Active: 1, InSync: true, StoredEpoch: 2, TokenLast: limit + 10, Reserved: limit + 3<<20, Mark: limit + 3<<20},
			limit + 3<<20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, now := activeAmong(t, []string{"m0", "m1", "m2"}, last, limit)
			acts := m.Step(now+ms, Msg{Kind: MsgHeartbeat, From: tc.from, HB: tc.hb})
			if o, r := find(acts, ActObserve), find(acts, ActReserve); len(o) != 0 || len(r) != 0 {
				t.Fatalf("observe %+v, reserve %+v: the counter of an active that yields moved", o, r)
			}
			if g := find(acts, ActGate); len(g) != 1 || g[0].Gate.State != Redirect || g[0].Gate.To != 1 {
				t.Fatalf("gates %+v: want M naming the later active", g)
			}
			if m.reservedSeen > limit || m.floor > limit {
				t.Fatalf("reservation seen %d, counter %d: echoed back above its own reservation %d", m.reservedSeen, m.floor, limit)
			}
			// The later active (and whoever follows it) goes silent: this one
			// serves again above its tokens.
			var r []Action
			for at := now + 100*ms; at <= now+3*int64(time.Second) && len(r) == 0; at += 100 * ms {
				r = find(m.Tick(at, Local{TokenLast: last, TokenLimit: limit, Mark: limit}), ActReserve)
			}
			if len(r) != 1 || r[0].Reserve.Start < tc.above {
				t.Fatalf("reservations %+v on serving again: want one starting above %d", r, tc.above)
			}
		})
	}
}

// TestHandoffCoversReservationInFlight: an active that hands over while a
// reservation of its is being made (or still to be made) tells the
// successor its end, or a bound on it: the standbys record that
// reservation as their mark after the handover, and a mark above the
// successor's reservation makes it jump and reserve again before it
// gives a token (acquires got B meanwhile before decision 70, and are
// held now: either way a pause the handover need not cause).
func TestHandoffCoversReservationInFlight(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ask       int  // reservations asked for before the handover
		reserving bool // the first one said its end (MsgReserving)
		block     uint64
	}{
		{"none", 0, false, 0},
		{"asked", 1, false, 2 << 20},
		{"being written", 1, true, 2 << 20},
		{"one more asked meanwhile", 2, true, 2 << 20}, // never begun while handing over
	} {
		t.Run(tc.name, func(t *testing.T) {
			last, limit := uint64(5000), uint64(5000+1<<20)
			m, now := activeWith(t, last, limit)
			var reserve []Action
			for range tc.ask {
				reserve = append(reserve, find(m.Step(now, Msg{Kind: MsgWantTokens}), ActReserve)...)
			}
			end := limit + 2<<20
			if tc.reserving {
				m.Step(now, Msg{Kind: MsgReserving, Op: reserve[0].Reserve.Op, Limit: end})
			}
			if !m.offer(1, now+ms, false) {
				t.Fatal("no handover offered")
			}
			h := find(m.out, ActHandoff)
			if len(h) != 1 {
				t.Fatalf("handoffs %+v", h)
			}
			if h[0].Reserve.Block != tc.block {
				t.Fatalf("handoff bound past the reservation: %d, want %d", h[0].Reserve.Block, tc.block)
			}
			if tc.reserving && h[0].Limit < end {
				t.Fatalf("handoff limit %d below the reservation being written, %d", h[0].Limit, end)
			}
		})
	}
}

// TestSuccessorIgnoresOldActivesStaleHeartbeat: a heartbeat the old active
// sent as an active before its offer, read by the successor after it took
// the handover, moves nothing: the Handoff's token and reservation, which
// the successor started above, cover everything in it. Before, the
// successor raised its counter two blocks above that heartbeat's
// reservation, past its own, and answered acquires B until it reserved.
func TestSuccessorIgnoresOldActivesStaleHeartbeat(t *testing.T) {
	a, s, now := pair(t)
	before := say(a)
	before.TokenLast, before.Reserved, before.Mark = 150, 200, 200
	e := offerTo(t, a, 1, now)
	if ans := handoff(s, 0, e, now); ans == nil || !ans.Taken || !s.servingNow() {
		t.Fatalf("handover not taken: %+v", ans)
	}
	acts := s.Step(now+ms, Msg{Kind: MsgHeartbeat, From: 0, HB: before})
	if o, r, g := find(acts, ActObserve), find(acts, ActReserve), find(acts, ActGate); len(o)+len(r)+len(g) != 0 {
		t.Fatalf("a stale heartbeat of the old active: observe %+v, reserve %+v, gates %+v", o, r, g)
	}
	// The same heartbeat from a member this one did not take over from is
	// another active's: its tokens count.
	s.tookFrom = None
	acts = s.Step(now+2*ms, Msg{Kind: MsgHeartbeat, From: 0, HB: before})
	if o := find(acts, ActObserve); len(o) != 1 {
		t.Fatalf("another active's heartbeat: observe %+v", o)
	}
}

// TestHandingOverReservesNothing: an active handing over executes nothing
// and told the successor its reservation and a bound on the one in
// flight; a reservation begun after the offer — the allocator's late ask,
// or the one asked for while another was in flight — went past that
// bound, the standbys recorded it as their mark, and the successor jumped
// above it (found by TestHandoverUnderLoadServesWithTokens: the successor
// answered B while serving, its counter two blocks past its limit).
func TestHandingOverReservesNothing(t *testing.T) {
	last, limit := uint64(5000), uint64(5000+1<<20)
	m, now := activeWith(t, last, limit)
	r := find(m.Step(now, Msg{Kind: MsgWantTokens}), ActReserve)
	if len(r) != 1 {
		t.Fatalf("reservations asked for: %+v", r)
	}
	m.Step(now, Msg{Kind: MsgWantTokens}) // asked for while one is in flight
	if !m.offer(1, now+ms, false) {
		t.Fatal("no handover offered")
	}
	acts := m.Step(now+2*ms, Msg{Kind: MsgWantTokens})
	acts = append(acts, m.Step(now+3*ms, Msg{Kind: MsgReserved, Op: r[0].Reserve.Op, Limit: limit + 2<<20, Token: last})...)
	if r := find(acts, ActReserve); len(r) != 0 {
		t.Fatalf("reservations begun while handing over: %+v", r)
	}
}

// TestLaterActiveHoldsUntilCompared: an active that hears one that became
// active earlier answers nothing until that one holds and the two are
// compared (serving meanwhile, it answered N to renews of locks the other
// held, and granted locks lost when it stepped down a heartbeat later);
// one that does not hold within a failover timeout is served beside.
func TestLaterActiveHoldsUntilCompared(t *testing.T) {
	last, limit := uint64(5000), uint64(1<<40) // far above the other's tokens: no jump
	m, now := activeWith(t, last, limit)
	m.epoch = 2
	m.publish(false)
	earlier := Heartbeat{Epoch: 1, Role: RoleActive, Active: 1, TokenLast: 10, Reserved: 20}
	acts := m.Step(now+ms, Msg{Kind: MsgHeartbeat, From: 1, HB: earlier})
	if g := find(acts, ActGate); len(g) != 1 || g[0].Gate.State != Hold {
		t.Fatalf("gates %+v on hearing an earlier active: want a hold", g)
	}
	local := Local{TokenLast: last, TokenLimit: limit, Mark: limit}
	for at := now + 100*ms; at < now+m.timeout; at += 100 * ms {
		m.Step(at, Msg{Kind: MsgHeartbeat, From: 1, HB: earlier})
		m.Tick(at, local)
		if m.servingNow() {
			t.Fatalf("served %v after hearing an earlier active that does not hold yet", time.Duration(at-now))
		}
	}
	m.Step(now+m.timeout+ms, Msg{Kind: MsgHeartbeat, From: 1, HB: earlier})
	m.Tick(now+m.timeout+ms, local)
	if !m.servingNow() {
		t.Fatal("still holding a failover timeout after hearing an earlier active that never holds")
	}
}
