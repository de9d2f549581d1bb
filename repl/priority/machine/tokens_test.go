package machine

import (
	"testing"
	"time"
)

// activeWith is a serving active (member 0 of 2) whose allocator is at
// last with limit, as Local says.
func activeWith(t *testing.T, last, limit uint64) (*Member, int64) {
	t.Helper()
	now := 1000 * ms
	m := New(Config{Self: 0, Peers: []string{"m0", "m1"}, Timeout: int64(time.Second), TokenBlock: 1 << 20, Start: last, Now: now, NoWallFloor: true})
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
