package priority

import (
	"fmt"
	"testing"
	"time"
)

// pair is an active (member 0) and an in-sync standby following it
// (member 1), as their role machines see each other after some heartbeats.
func pair(t *testing.T) (a, s *roles, now int64) {
	t.Helper()
	now = 1000 * ms
	a, s = newRoles(0, 2, 1000*ms, 0, now), newRoles(1, 2, 1000*ms, 0, now)
	a.promote()
	s.heard(now, 0, peerState{epoch: a.epoch, role: roleActive, follows: 0})
	s.inSync = true
	a.heard(now, 1, peerState{epoch: a.epoch, role: roleStandby, follows: 0, inSync: true})
	if s.role != roleStandby || s.active != 0 || a.successor(now, 0) != 1 {
		t.Fatalf("setup: standby %v following %d, successor %d", s.role, s.active, a.successor(now, 0))
	}
	return a, s, now
}

// say is member r's heartbeat as the role machine of another sees it.
func say(r *roles) peerState {
	return peerState{epoch: r.epoch, role: r.role, follows: r.active, inSync: r.inSync, storedEpoch: r.peers[r.self].storedEpoch}
}

func TestRolesHandoverTaken(t *testing.T) {
	a, s, now := pair(t)
	e, _ := a.offer(1, now)
	if a.role != roleHandover || a.serving() || e != 2 {
		t.Fatalf("after the offer: %v serving=%v epoch %d", a.role, a.serving(), e)
	}
	if o, _ := a.handover(); o != handOffered {
		t.Fatalf("outcome %v while offered", o)
	}
	if taken, fresh := s.takeHandoff(0, e, true); !taken || !fresh || s.role != roleActive || s.epoch != e {
		t.Fatalf("successor: taken=%v fresh=%v %v at %d", taken, fresh, s.role, s.epoch)
	}
	if taken, fresh := s.takeHandoff(0, e, true); !taken || fresh {
		t.Fatalf("a repeated Handoff: taken=%v fresh=%v, want taken again", taken, fresh)
	}
	a.handoffAnswer(1, e, true)
	if o, to := a.handover(); o != handTaken || to != 1 || a.role != roleStandby || a.active != 1 || a.epoch != e {
		t.Fatalf("old active: %v/%d, %v following %d at %d", o, to, a.role, a.active, a.epoch)
	}
	if !s.abortHandoff(0, e) {
		t.Fatal("a late HandoffAbort after the take: refused")
	}
}

// TestRolesHandoverAckLost: the successor's Ack never arrives; its
// heartbeat saying it is the active at the offered epoch is the verdict.
func TestRolesHandoverAckLost(t *testing.T) {
	a, s, now := pair(t)
	e, _ := a.offer(1, now)
	s.takeHandoff(0, e, true)
	now += 100 * ms
	a.heard(now, 1, say(s))
	if o, to := a.handover(); o != handTaken || to != 1 || a.active != 1 {
		t.Fatalf("after the successor's heartbeat: %v/%d, following %d", o, to, a.active)
	}
}

// TestRolesHandoverAbortFirst: the Handoff is lost (a link that
// reconnects drops what was queued); the HandoffAbort that follows makes
// the successor refuse the epoch for good; the old active serves again,
// and neither a late Handoff nor any later promotion uses that epoch.
func TestRolesHandoverAbortFirst(t *testing.T) {
	a, s, now := pair(t)
	e, _ := a.offer(1, now)
	if a.askDue(now + 500*ms) {
		t.Fatal("asked to decide before a failover timeout")
	}
	if !a.askDue(now + 1000*ms) {
		t.Fatal("not asked after a failover timeout")
	}
	if a.askDue(now+1200*ms) || !a.askDue(now+1500*ms) {
		t.Fatal("not asked again every half timeout")
	}
	if s.abortHandoff(0, e) {
		t.Fatal("the successor says it took a Handoff it never saw")
	}
	if taken, _ := s.takeHandoff(0, e, true); taken || s.role != roleStandby {
		t.Fatalf("a Handoff after the abort was taken: %v", s.role)
	}
	a.handoffAnswer(1, e, false)
	if o, _ := a.handover(); o != handRefused || !a.serving() || a.epoch != 1 {
		t.Fatalf("after the refusal: %v, serving=%v at %d", o, a.serving(), a.epoch)
	}
	if e2, _ := a.offer(1, now); e2 <= e {
		t.Fatalf("the next offer's epoch %d is not above the refused %d", e2, e)
	}
	s.promote()
	if s.epoch <= e {
		t.Fatalf("the successor promoted at %d, not above the epoch it refused %d", s.epoch, e)
	}
}

func TestRolesHandoverRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(s *roles)
		will bool
	}{
		{"not in sync", func(s *roles) { s.inSync = false }, true},
		{"shutting down", func(*roles) {}, false},
		{"follows another", func(s *roles) { s.active = -1 }, true},
		{"epoch refused before", func(s *roles) { s.refuse(2) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, s, now := pair(t)
			tc.edit(s)
			e, _ := a.offer(1, now)
			if taken, _ := s.takeHandoff(0, e, tc.will); taken || s.role == roleActive {
				t.Fatalf("taken: %v", s.role)
			}
			if s.abortHandoff(0, e) {
				t.Fatal("an abort after a refusal says taken")
			}
		})
	}
}

// answerFrame is successor s's answer to an offer (or an abort) at e, as
// takeOver and abortAsked send it: Ack(handoff) of e, or Ack(refused) of
// the epoch up to which s refuses.
func answerFrame(s *roles, taken bool, e uint64) frameAt {
	if taken {
		return frameAt{msg: "taken", e: e}
	}
	return frameAt{msg: "refused", e: s.refusedUpTo()}
}

// TestRolesHandoverReofferAboveRefused: the successor refused the epoch
// offered because another member had offered it the same one before (a
// handover this active never heard of). Its Ack(refused) says up to which
// epoch it refuses; this active's next offer is above it and is taken.
// Before, every offer of this active stopped at the same epoch, and a
// SIGTERM shut it down as a single node (E 4) beside a live, in-sync
// standby (chaos, seed 7, handovers only).
func TestRolesHandoverReofferAboveRefused(t *testing.T) {
	for _, refusedBefore := range []uint64{0, 1, 5} { // above the epoch this active offers next
		a, s, now := pair(t)
		first, _ := a.nextEpoch()
		s.refuse(first + refusedBefore) // offered by a third member, refused
		e, _ := a.offer(1, now)
		taken, _ := s.takeHandoff(0, e, true)
		if taken {
			t.Fatalf("refused %d before: took %d", first+refusedBefore, e)
		}
		a.handoffAnswer(1, s.refusedUpTo(), false)
		if o, _ := a.handover(); o != handRefused || a.role != roleActive {
			t.Fatalf("refused %d before: the refusal up to %d did not settle the offer of %d: %v, %v", first+refusedBefore, s.refusedUpTo(), e, o, a.role)
		}
		e2, _ := a.offer(1, now)
		if e2 <= s.refusedUpTo() {
			t.Fatalf("refused up to %d: offered %d next", s.refusedUpTo(), e2)
		}
		if taken, _ := s.takeHandoff(0, e2, true); !taken {
			t.Fatalf("the second offer, %d, refused (refused up to %d)", e2, s.refusedUpTo())
		}
		a.handoffAnswer(1, e2, true)
		if o, to := a.handover(); o != handTaken || to != 1 {
			t.Fatalf("second offer: %v/%d", o, to)
		}
	}
}

// TestRolesHandoverStaleRefusal: a refusal below the epoch offered answers
// an earlier offer, not this one; one at it or above settles it.
func TestRolesHandoverStaleRefusal(t *testing.T) {
	a, _, now := pair(t)
	e, _ := a.offer(1, now)
	a.handoffAnswer(1, e-1, false)
	if o, _ := a.handover(); o != handOffered {
		t.Fatalf("a refusal up to %d ended the offer of %d: %v", e-1, e, o)
	}
	a.handoffAnswer(1, e-1, true)
	if o, _ := a.handover(); o != handOffered {
		t.Fatalf("an Ack(handoff) of %d ended the offer of %d: %v", e-1, e, o)
	}
	a.handoffAnswer(1, e+3, false)
	if o, _ := a.handover(); o != handRefused || a.maxEpoch < e+3 {
		t.Fatalf("a refusal up to %d: %v, max epoch %d", e+3, o, a.maxEpoch)
	}
}

// TestRolesHandoverRestartedSuccessor: a successor that took the handoff
// and restarted (its data dir holds the epoch, its memory does not) still
// answers a HandoffAbort with taken: the old active must not serve.
func TestRolesHandoverRestartedSuccessor(t *testing.T) {
	a, _, now := pair(t)
	e, _ := a.offer(1, now)
	restarted := newRoles(1, 2, 1000*ms, e, now)
	if !restarted.abortHandoff(0, e) {
		t.Fatal("a restarted successor with the epoch on disk refused it")
	}
}

// TestRolesHandoverSuccessorSilent: the successor goes silent before a
// verdict: the old active serves nothing, becomes a standby without an
// active, and promotes (at a new epoch) only after watching a full timeout.
func TestRolesHandoverSuccessorSilent(t *testing.T) {
	a, _, now := pair(t)
	e, _ := a.offer(1, now)
	for range 9 {
		now += 100 * ms
		a.tick(now)
		if o, _ := a.handover(); o != handOffered {
			t.Fatalf("%v before the successor was silent a failover timeout", o)
		}
	}
	now += 100 * ms
	a.tick(now)
	if o, to := a.handover(); o != handLost || to != 1 || a.role != roleStandby || a.active != -1 {
		t.Fatalf("after a silent timeout: %v/%d, %v following %d", o, to, a.role, a.active)
	}
	for range 9 {
		now += 100 * ms
		if c := a.tick(now); c.promote {
			t.Fatal("promoted before watching a full timeout")
		}
	}
	now += 200 * ms
	if c := a.tick(now); !c.promote || a.epoch <= e {
		t.Fatalf("no promotion above the offered epoch after watching: %+v at %d", c, a.epoch)
	}
}

// TestRolesHandoverSuperseded: another member becomes the active (later)
// while the handover waits: the old active follows it.
func TestRolesHandoverSuperseded(t *testing.T) {
	now := 1000 * ms
	a := newRoles(0, 3, 1000*ms, 0, now)
	a.promote()
	a.heard(now, 1, peerState{epoch: 1, role: roleStandby, follows: 0, inSync: true})
	e, _ := a.offer(1, now)
	a.heard(now+10*ms, 2, peerState{epoch: e + 3, role: roleActive, follows: 2})
	if o, to := a.handover(); o != handSuperseded || to != 2 || a.active != 2 || a.role != roleStandby {
		t.Fatalf("%v/%d, %v following %d", o, to, a.role, a.active)
	}
}

// lossyLink is one direction of the member link between the two role
// machines: FIFO (TCP), a fixed delay, and outages during which every
// frame sent is lost (a link that reconnects drops what was queued).
type lossyLink struct {
	delay   int64
	outages [][2]int64
	q       []frameAt
}

type frameAt struct {
	at  int64
	msg string
	e   uint64
	hb  peerState
}

func (l *lossyLink) send(now int64, f frameAt) {
	for _, o := range l.outages {
		if now >= o[0] && now < o[1] {
			return
		}
	}
	f.at = now + l.delay
	if n := len(l.q); n > 0 {
		f.at = max(f.at, l.q[n-1].at)
	}
	l.q = append(l.q, f)
}

func (l *lossyLink) due(now int64) []frameAt {
	k := 0
	for k < len(l.q) && l.q[k].at <= now {
		k++
	}
	out := l.q[:k:k]
	l.q = l.q[k:]
	return out
}

// TestRolesHandoverProtocolUnderLoss runs the handover protocol between an
// active and its successor, with every frame (Handoff, HandoffAbort, both
// Acks, heartbeats) delayed and with outages on either direction at every
// point of the exchange, and checks what MEMBER-LINK.md promises: the old
// active never serves at its old epoch once the successor took the
// handover, only the successor ever holds the offered epoch, and the
// handover always ends — taken (the old active follows the successor,
// active at the offered epoch or later: by the Handoff, or by its own
// failover when it heard nothing),
// refused (the successor swore the epoch off; the old active serves), or
// lost (the successor fell silent; the old active serves nothing until the
// failover rules promote someone at a later epoch).
func TestRolesHandoverProtocolUnderLoss(t *testing.T) {
	delays := []time.Duration{0, 300 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond}
	outages := map[string][][2]int64{
		"none":         nil,
		"handoff lost": {{0, 30 * ms}},
		"first ask":    {{900 * ms, 1400 * ms}},
		"asks lost":    {{900 * ms, 4000 * ms}},
		"all lost":     {{0, 60000 * ms}},
	}
	back := map[string][][2]int64{
		"none":       nil,
		"acks lost":  {{0, 3000 * ms}},
		"early lost": {{0, 800 * ms}},
		"dead":       {{0, 60000 * ms}},
	}
	runs := 0
	for _, dAS := range delays {
		for _, dSA := range delays {
			for on, out := range outages {
				for bn, bk := range back {
					name := fmt.Sprintf("a→s %v %s / s→a %v %s", dAS, on, dSA, bn)
					handoverUnderLoss(t, name, &lossyLink{delay: int64(dAS), outages: out}, &lossyLink{delay: int64(dSA), outages: bk})
					runs++
				}
			}
		}
	}
	t.Logf("%d schedules", runs)
}

func handoverUnderLoss(t *testing.T, name string, as, sa *lossyLink) {
	t.Helper()
	a, s, now := pair(t)
	start := now
	rel := func(at int64) int64 { return at + start } // outages are relative to the offer
	for _, l := range []*lossyLink{as, sa} {
		var abs [][2]int64
		for _, o := range l.outages {
			abs = append(abs, [2]int64{rel(o[0]), rel(o[1])})
		}
		l.outages = abs
	}
	e, _ := a.offer(1, now)
	as.send(now, frameAt{msg: "handoff", e: e})
	took := false                        // the successor took the Handoff
	sActive := false                     // the successor was active at the offered epoch or later (taken, or its own failover)
	for step := 0; step < 1500; step++ { // 15 s of 10 ms steps
		now += 10 * ms
		if step%10 == 0 { // heartbeats every 100 ms
			as.send(now, frameAt{msg: "hb", hb: say(a)})
			sa.send(now, frameAt{msg: "hb", hb: say(s)})
		}
		a.tick(now)
		s.tick(now)
		if a.askDue(now) {
			as.send(now, frameAt{msg: "abort", e: a.handEpoch})
		}
		for _, f := range as.due(now) {
			switch f.msg {
			case "hb":
				s.heard(now, 0, f.hb)
			case "handoff":
				taken, _ := s.takeHandoff(0, f.e, true)
				took = took || taken
				sa.send(now, answerFrame(s, taken, f.e))
			case "abort":
				taken := s.abortHandoff(0, f.e)
				sa.send(now, answerFrame(s, taken, f.e))
			}
		}
		for _, f := range sa.due(now) {
			switch f.msg {
			case "hb":
				a.heard(now, 1, f.hb)
			case "taken", "refused":
				a.handoffAnswer(1, f.e, f.msg == "taken")
			}
		}
		sTook := s.tookFrom == 0 && s.tookEpoch == e
		sActive = sActive || s.role == roleActive && s.epoch >= e
		if a.role == roleActive && a.epoch < e && sTook {
			t.Fatalf("%s: at +%v the old active serves at its old epoch %d after the successor took %d",
				name, time.Duration(now-start), a.epoch, e)
		}
		if a.role == roleActive && a.epoch == e {
			t.Fatalf("%s: the old active took the epoch it offered, %d", name, e)
		}
	}
	o, to := a.handover()
	switch o {
	case handTaken:
		if !sActive || to != 1 || a.active != 1 || a.role != roleStandby {
			t.Fatalf("%s: taken, but the successor active=%v, old active %v following %d", name, sActive, a.role, a.active)
		}
	case handRefused:
		if took || s.refused < e || a.epoch != 1 {
			t.Fatalf("%s: refused, but the successor took=%v refused up to %d; old active at %d", name, took, s.refused, a.epoch)
		}
	case handLost:
		if a.role == roleActive && a.epoch <= e {
			t.Fatalf("%s: lost, then active at %d, not above the offered %d", name, a.epoch, e)
		}
	default:
		t.Fatalf("%s: the handover did not end: %v (old active %v)", name, o, a.role)
	}
}

// TestRolesSnapshotAckMakesASuccessor: a standby's Ack(snapshot) of this
// active's snapshot makes it in sync in the active's view at once, whatever
// its last heartbeat from before this epoch said: a SIGTERM right after
// hands over to it instead of shutting down as a single node (E 4). A
// heartbeat newer than the acknowledgement stands.
func TestRolesSnapshotAckMakesASuccessor(t *testing.T) {
	cases := []struct {
		name    string
		last    func(e uint64) peerState // the standby's last heartbeat; e: the active's epoch
		ackAt   func(e uint64) uint64    // the epoch the acknowledged snapshot was sent at
		want    int                      // successor after the ack
		keepsAt func(e uint64) uint64    // the epoch the active keeps for it
	}{
		{"standby of this epoch, not in sync yet",
			func(e uint64) peerState { return peerState{epoch: e, role: roleStandby, follows: 0} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		// The failure chaos found (seed 7, handovers only): member 1 handed
		// over to 0, followed it and applied its snapshot; 0 was signalled
		// before 1's next heartbeat, which still said "active at e-1".
		{"the old active that just handed over to this one",
			func(e uint64) peerState { return peerState{epoch: e - 1, role: roleActive, follows: 1, inSync: false} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		{"a standby of the previous active",
			func(e uint64) peerState { return peerState{epoch: e - 1, role: roleStandby, follows: 2, inSync: true} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		{"an acknowledgement of a snapshot of another epoch",
			func(e uint64) peerState { return peerState{epoch: e - 1, role: roleStandby, follows: 2, inSync: true} },
			func(e uint64) uint64 { return e - 1 }, -1, func(e uint64) uint64 { return e - 1 }},
		{"a heartbeat of a later epoch stands",
			func(e uint64) peerState { return peerState{epoch: e + 1, role: roleActive, follows: 1} },
			func(e uint64) uint64 { return e }, -1, func(e uint64) uint64 { return e + 1 }},
		{"a leaving member stays leaving",
			func(e uint64) peerState { return peerState{epoch: e - 1, role: roleLeaving, follows: 2} },
			func(e uint64) uint64 { return e }, -1, func(e uint64) uint64 { return e - 1 }},
		{"a heartbeat of this epoch following another member stands",
			func(e uint64) peerState { return peerState{epoch: e, role: roleStandby, follows: 2} },
			func(e uint64) uint64 { return e }, -1, func(e uint64) uint64 { return e }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := 1000 * ms
			a := newRoles(0, 3, 1000*ms, 0, now)
			a.promote()
			a.promote() // epoch 2: an epoch below it exists
			e := a.epoch
			a.heard(now, 1, tc.last(e))
			if a.successor(now, 0) != -1 {
				t.Fatal("a successor before the standby applied the snapshot")
			}
			a.snapshotApplied(1, tc.ackAt(e))
			if got := a.successor(now, 0); got != tc.want {
				t.Fatalf("successor after the Ack(snapshot): %d, want %d (%v)", got, tc.want, a.successorViews(now))
			}
			p := a.peers[1]
			if p.epoch != tc.keepsAt(e) || (tc.want == 1 && (!p.inSync || p.role != roleStandby || p.follows != 0)) {
				t.Fatalf("member 1 kept as %+v", p)
			}
		})
	}
}
