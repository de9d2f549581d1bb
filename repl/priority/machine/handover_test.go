package machine

import (
	"fmt"
	"testing"
	"time"
)

// The planned handover between two machines passed by hand (ported from
// the role machine's tests; each keeps its assertion). A successor's
// Ack(handoff) now leaves once it serves: its reservation completes at
// once here (settle), so the answer follows the Handoff in the same call.

// settle completes member m's reservations at once, as the driver's
// executor would, and returns every other action (including those the
// completions asked for).
func settle(m *Member, now int64, acts []Action) []Action {
	var out []Action
	queue := append([]Action(nil), acts...)
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		if a.Kind != ActReserve {
			out = append(out, a)
			continue
		}
		limit := a.Reserve.Start + a.Reserve.Block + 1000
		queue = append(queue, m.Step(now, Msg{Kind: MsgReserved, Op: a.Reserve.Op, Limit: limit, Token: a.Reserve.Start})...)
	}
	return out
}

// find returns the actions of kind k.
func find(acts []Action, k ActionKind) []Action {
	var out []Action
	for _, a := range acts {
		if a.Kind == k {
			out = append(out, a)
		}
	}
	return out
}

// pair is an active (member 0) and an in-sync standby following it
// (member 1), as their machines see each other after some heartbeats.
func pair(t *testing.T) (a, s *Member, now int64) {
	t.Helper()
	now = 1000 * ms
	cfg := func(self int) Config {
		return Config{Self: self, Peers: []string{"m0", "m1"}, Timeout: 1000 * ms, TokenBlock: 10, Now: now, NoWallFloor: true}
	}
	a, s = New(cfg(0)), New(cfg(1))
	a.promoteAt(1)
	settle(a, now, func() []Action { a.becomeActive(now, "test", Base{From: None}, 0, false); return a.out }())
	s.Step(now, Msg{Kind: MsgHeartbeat, From: 0, HB: say(a)})
	s.Step(now, Msg{Kind: MsgSynced, From: 0, Epoch: 1})
	a.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: say(s)})
	if s.role != RoleStandby || s.active != 0 || !s.inSync || a.successor(now, 0) != 1 || !a.servingNow() {
		t.Fatalf("setup: standby %v following %d, successor %d", s.role, s.active, a.successor(now, 0))
	}
	return a, s, now
}

// say is member m's heartbeat as another sees it.
func say(m *Member) Heartbeat {
	return Heartbeat{Epoch: m.epoch, Role: m.role, Active: m.active, InSync: m.inSync, StoredEpoch: m.peers[m.self].storedEpoch,
		Serving: m.servingNow(), Held: (m.role == RoleActive || m.role == RoleHandover) && m.lastGate.State != Serve}
}

// offerTo makes a offer the handover to s and returns the Handoff's epoch.
func offerTo(t *testing.T, a *Member, s int, now int64) uint64 {
	t.Helper()
	a.begin()
	if !a.offer(s, now, false) {
		t.Fatal("no offer")
	}
	h := find(a.out, ActHandoff)
	if len(h) != 1 || h[0].To != s || len(find(a.out, ActFlush)) != 1 {
		t.Fatalf("offer's actions: %+v", a.out)
	}
	return h[0].Epoch
}

// handoff delivers a Handoff at e from member from to s and returns s's
// answer (nil: none yet).
func handoff(s *Member, from int, e uint64, now int64) *Action {
	acts := settle(s, now, s.Step(now, Msg{Kind: MsgHandoff, From: from, Epoch: e, Token: 100, Limit: 200}))
	if ans := find(acts, ActAnswer); len(ans) > 0 {
		return &ans[len(ans)-1]
	}
	return nil
}

func TestRolesHandoverTaken(t *testing.T) {
	a, s, now := pair(t)
	e := offerTo(t, a, 1, now)
	if a.role != RoleHandover || a.servingNow() || e != 2 {
		t.Fatalf("after the offer: %v serving=%v epoch %d", a.role, a.servingNow(), e)
	}
	if a.hand.outcome != HandOffered {
		t.Fatalf("outcome %v while offered", a.hand.outcome)
	}
	ans := handoff(s, 0, e, now)
	if ans == nil || !ans.Taken || ans.Epoch != e || s.role != RoleActive || s.epoch != e || !s.servingNow() {
		t.Fatalf("successor: answer %+v, %v at %d", ans, s.role, s.epoch)
	}
	if ans := handoff(s, 0, e, now); ans == nil || !ans.Taken {
		t.Fatalf("a repeated Handoff: %+v, want taken again", ans)
	}
	a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: true, Epoch: e})
	if a.hand.outcome != HandTaken || a.hand.result != 1 || a.role != RoleStandby || a.active != 1 || a.epoch != e {
		t.Fatalf("old active: %v/%d, %v following %d at %d", a.hand.outcome, a.hand.result, a.role, a.active, a.epoch)
	}
	if ans := find(s.Step(now, Msg{Kind: MsgHandoffAbort, From: 0, Epoch: e}), ActAnswer); len(ans) != 1 || !ans[0].Taken {
		t.Fatalf("a late HandoffAbort after the take: %+v", ans)
	}
}

// TestRolesHandoverAnswersOnceServing: the successor's
// Ack(handoff) says it serves. Until its first reservation is done it
// holds requests (never M naming the old active) and owes the answer; the
// old active, meanwhile, takes no heartbeat that says "active" without
// "serving" for the verdict.
func TestRolesHandoverAnswersOnceServing(t *testing.T) {
	a, s, now := pair(t)
	e := offerTo(t, a, 1, now)
	acts := s.Step(now, Msg{Kind: MsgHandoff, From: 0, Epoch: e, Token: 100, Limit: 200})
	if len(find(acts, ActAnswer)) != 0 {
		t.Fatalf("answered before serving: %+v", acts)
	}
	g := find(acts, ActGate)
	if len(g) == 0 || g[len(g)-1].Gate.State != Hold {
		t.Fatalf("the successor's gate after taking the epoch: %+v, want hold", g)
	}
	a.Step(now+10*ms, Msg{Kind: MsgHeartbeat, From: 1, HB: say(s)})
	if a.hand.outcome != HandOffered {
		t.Fatalf("the old active took a heartbeat of an active that does not serve yet for the verdict: %v", a.hand.outcome)
	}
	r := find(acts, ActReserve)
	if len(r) != 1 {
		t.Fatalf("reservations: %+v", r)
	}
	acts = s.Step(now+20*ms, Msg{Kind: MsgReserved, Op: r[0].Reserve.Op, Limit: 5000, Token: 200})
	gi, ai := -1, -1
	for k, x := range acts {
		switch {
		case x.Kind == ActGate && x.Gate.State == Serve:
			gi = k
		case x.Kind == ActAnswer && x.Taken && x.Epoch == e:
			ai = k
		}
	}
	if gi < 0 || ai < gi {
		t.Fatalf("the answer does not follow the serving gate: %+v", acts)
	}
}

// TestRolesHandoverAckLost: the successor's Ack never arrives; its
// heartbeat saying it is the serving active at the offered epoch is the
// verdict.
func TestRolesHandoverAckLost(t *testing.T) {
	a, s, now := pair(t)
	e := offerTo(t, a, 1, now)
	handoff(s, 0, e, now)
	now += 100 * ms
	a.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: say(s)})
	if a.hand.outcome != HandTaken || a.hand.result != 1 || a.active != 1 {
		t.Fatalf("after the successor's heartbeat: %v/%d, following %d", a.hand.outcome, a.hand.result, a.active)
	}
}

// TestRolesHandoverAbortFirst: the Handoff is lost (a link that
// reconnects drops what was queued); the HandoffAbort that follows makes
// the successor refuse the epoch for good; the old active serves again,
// and neither a late Handoff nor any later promotion uses that epoch.
func TestRolesHandoverAbortFirst(t *testing.T) {
	a, s, now := pair(t)
	e := offerTo(t, a, 1, now)
	asks := func(at int64) bool { return len(find(a.Tick(at, Local{}), ActHandoffAbort)) > 0 }
	heard := func(at int64) { a.Step(at, Msg{Kind: MsgHeartbeat, From: 1, HB: say(s)}) }
	heard(now + 500*ms)
	if asks(now + 500*ms) {
		t.Fatal("asked to decide before a failover timeout")
	}
	heard(now + 1000*ms)
	if !asks(now + 1000*ms) {
		t.Fatal("not asked after a failover timeout")
	}
	heard(now + 1200*ms)
	heard(now + 1500*ms)
	if asks(now+1200*ms) || !asks(now+1500*ms) {
		t.Fatal("not asked again every half timeout")
	}
	if ans := find(s.Step(now, Msg{Kind: MsgHandoffAbort, From: 0, Epoch: e}), ActAnswer); len(ans) != 1 || ans[0].Taken {
		t.Fatalf("the successor says it took a Handoff it never saw: %+v", ans)
	}
	if ans := handoff(s, 0, e, now); ans == nil || ans.Taken || s.role != RoleStandby {
		t.Fatalf("a Handoff after the abort was taken: %v", s.role)
	}
	a.Step(now+1500*ms, Msg{Kind: MsgAnswer, From: 1, Taken: false, Epoch: e})
	if a.hand.outcome != HandRefused || a.role != RoleActive || a.epoch != 1 {
		t.Fatalf("after the refusal: %v, %v at %d", a.hand.outcome, a.role, a.epoch)
	}
	if e2, _ := a.nextEpoch(); e2 <= e {
		t.Fatalf("the next offer's epoch %d is not above the refused %d", e2, e)
	}
	if e3, _ := s.nextEpoch(); e3 <= e {
		t.Fatalf("the successor would promote at %d, not above the epoch it refused %d", e3, e)
	}
}

func TestRolesHandoverRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(s *Member)
	}{
		{"not in sync", func(s *Member) { s.inSync = false }},
		{"shutting down", func(s *Member) { s.stopping = true }},
		{"follows another", func(s *Member) { s.active = None }},
		{"epoch refused before", func(s *Member) { s.refuse(2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, s, now := pair(t)
			tc.edit(s)
			e := offerTo(t, a, 1, now)
			if ans := handoff(s, 0, e, now); ans == nil || ans.Taken || s.role == RoleActive {
				t.Fatalf("taken: %+v, %v", ans, s.role)
			}
			if ans := find(s.Step(now, Msg{Kind: MsgHandoffAbort, From: 0, Epoch: e}), ActAnswer); len(ans) != 1 || ans[0].Taken {
				t.Fatal("an abort after a refusal says taken")
			}
		})
	}
}

// TestRolesHandoverReofferAboveRefused: the successor refused the epoch
// offered because another member had offered it the same one before (a
// handover this active never heard of). Its Ack(refused) says up to which
// epoch it refuses; this active's next offer is above it and is taken.
// Before, every offer of this active stopped at the same epoch, and a
// SIGTERM shut it down as a single node (E 4) beside a live, in-sync
// standby (chaos, seed 7, handovers only).
func TestRolesHandoverReofferAboveRefused(t *testing.T) {
	for _, refusedBefore := range []uint64{0, 1, 5} {
		a, s, now := pair(t)
		first, _ := a.nextEpoch()
		s.refuse(first + refusedBefore) // offered by a third member, refused
		e := offerTo(t, a, 1, now)
		ans := handoff(s, 0, e, now)
		if ans == nil || ans.Taken {
			t.Fatalf("refused %d before: took %d", first+refusedBefore, e)
		}
		a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: false, Epoch: ans.Epoch})
		if a.hand.outcome != HandRefused || a.role != RoleActive {
			t.Fatalf("refused %d before: the refusal up to %d did not settle the offer of %d: %v, %v", first+refusedBefore, ans.Epoch, e, a.hand.outcome, a.role)
		}
		e2 := offerTo(t, a, 1, now)
		if e2 <= s.refused {
			t.Fatalf("refused up to %d: offered %d next", s.refused, e2)
		}
		if ans := handoff(s, 0, e2, now); ans == nil || !ans.Taken {
			t.Fatalf("the second offer, %d, refused (refused up to %d)", e2, s.refused)
		}
		a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: true, Epoch: e2})
		if a.hand.outcome != HandTaken || a.hand.result != 1 {
			t.Fatalf("second offer: %v/%d", a.hand.outcome, a.hand.result)
		}
	}
}

// TestRolesHandoverStaleRefusal: a refusal below the epoch offered answers
// an earlier offer, not this one; one at it or above settles it.
func TestRolesHandoverStaleRefusal(t *testing.T) {
	a, _, now := pair(t)
	e := offerTo(t, a, 1, now)
	a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: false, Epoch: e - 1})
	if a.hand.outcome != HandOffered {
		t.Fatalf("a refusal up to %d ended the offer of %d: %v", e-1, e, a.hand.outcome)
	}
	a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: true, Epoch: e - 1})
	if a.hand.outcome != HandOffered {
		t.Fatalf("an Ack(handoff) of %d ended the offer of %d: %v", e-1, e, a.hand.outcome)
	}
	a.Step(now, Msg{Kind: MsgAnswer, From: 1, Taken: false, Epoch: e + 3})
	if a.hand.outcome != HandRefused || a.maxEpoch < e+3 {
		t.Fatalf("a refusal up to %d: %v, max epoch %d", e+3, a.hand.outcome, a.maxEpoch)
	}
}

// TestRolesHandoverRestartedSuccessor: a successor that took the handoff
// and restarted (its data dir holds the epoch, its memory does not) still
// answers a HandoffAbort with taken: the old active must not serve.
func TestRolesHandoverRestartedSuccessor(t *testing.T) {
	a, _, now := pair(t)
	e := offerTo(t, a, 1, now)
	restarted := New(Config{Self: 1, Peers: []string{"m0", "m1"}, Timeout: 1000 * ms, StoredEpoch: e, Now: now})
	if ans := find(restarted.Step(now, Msg{Kind: MsgHandoffAbort, From: 0, Epoch: e}), ActAnswer); len(ans) != 1 || !ans[0].Taken {
		t.Fatal("a restarted successor with the epoch on disk refused it")
	}
}

// TestRolesHandoverSuccessorSilent: the successor goes silent before a
// verdict: the old active serves nothing, becomes a standby without an
// active, and promotes (at a new epoch) only after watching a full timeout.
func TestRolesHandoverSuccessorSilent(t *testing.T) {
	a, _, now := pair(t)
	e := offerTo(t, a, 1, now)
	for range 9 {
		now += 100 * ms
		a.Tick(now, Local{})
		if a.hand.outcome != HandOffered {
			t.Fatalf("%v before the successor was silent a failover timeout", a.hand.outcome)
		}
	}
	now += 100 * ms
	a.Tick(now, Local{})
	if a.hand.outcome != HandLost || a.hand.result != 1 || a.role != RoleStandby || a.active != None || a.servingNow() {
		t.Fatalf("after a silent timeout: %v/%d, %v following %d", a.hand.outcome, a.hand.result, a.role, a.active)
	}
	for range 9 {
		now += 100 * ms
		if a.Tick(now, Local{}); a.role == RoleActive {
			t.Fatal("promoted before watching a full timeout")
		}
	}
	now += 200 * ms
	if a.Tick(now, Local{}); a.role != RoleActive || a.epoch <= e {
		t.Fatalf("no promotion above the offered epoch after watching: %v at %d", a.role, a.epoch)
	}
}

// TestRolesHandoverSuperseded: another member became active later while
// the handover waits: the old active follows it once that member says
// which of the two steps down (PROTOCOL.md §6.3, "Whoever would lose more
// stays"); until then, the handover still waits.
func TestRolesHandoverSuperseded(t *testing.T) {
	now := 1000 * ms
	a := New(Config{Self: 0, Peers: []string{"m0", "m1", "m2"}, Timeout: 1000 * ms, Now: now})
	a.promoteAt(1)
	settle(a, now, func() []Action { a.becomeActive(now, "test", Base{From: None}, 0, false); return a.out }())
	a.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true}})
	e := offerTo(t, a, 1, now)
	a.Step(now+10*ms, Msg{Kind: MsgHeartbeat, From: 2, HB: Heartbeat{Epoch: e + 3, Role: RoleActive, Active: 2, Serving: true}})
	if a.hand.outcome != HandOffered {
		t.Fatalf("superseded on a later active's heartbeat with no verdict: %v", a.hand.outcome)
	}
	a.Step(now+20*ms, Msg{Kind: MsgHeartbeat, From: 2, HB: Heartbeat{Epoch: e + 3, Role: RoleActive, Active: 2, Serving: true, Verdict: 1}})
	if a.hand.outcome != HandSuperseded || a.hand.result != 2 || a.active != 2 || a.role != RoleStandby {
		t.Fatalf("%v/%d, %v following %d", a.hand.outcome, a.hand.result, a.role, a.active)
	}
}

// lossyLink is one direction of the member link between the two
// machines: FIFO (TCP), a fixed delay, and outages during which every
// frame sent is lost (a link that reconnects drops what was queued).
type lossyLink struct {
	delay   int64
	outages [][2]int64
	q       []frameAt
}

type frameAt struct {
	at  int64
	msg Msg
}

func (l *lossyLink) send(now int64, msg Msg) {
	for _, o := range l.outages {
		if now >= o[0] && now < o[1] {
			return
		}
	}
	at := now + l.delay
	if n := len(l.q); n > 0 {
		at = max(at, l.q[n-1].at)
	}
	l.q = append(l.q, frameAt{at: at, msg: msg})
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
// failover when it heard nothing), refused (the successor swore the epoch
// off; the old active serves), or lost (the successor fell silent; the old
// active serves nothing until the failover rules promote someone at a
// later epoch).
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
	for _, l := range []*lossyLink{as, sa} {
		var abs [][2]int64 // outages are relative to the offer
		for _, o := range l.outages {
			abs = append(abs, [2]int64{o[0] + start, o[1] + start})
		}
		l.outages = abs
	}
	// route sends what a machine asked on its link.
	route := func(l *lossyLink, acts []Action) {
		for _, x := range acts {
			switch x.Kind {
			case ActHeartbeat:
				l.send(now, Msg{Kind: MsgHeartbeat, HB: x.HB})
			case ActHandoff:
				l.send(now, Msg{Kind: MsgHandoff, Epoch: x.Epoch, Token: 100, Limit: 200})
			case ActHandoffAbort:
				l.send(now, Msg{Kind: MsgHandoffAbort, Epoch: x.Epoch})
			case ActAnswer:
				l.send(now, Msg{Kind: MsgAnswer, Taken: x.Taken, Epoch: x.Epoch})
			}
		}
	}
	a.begin()
	if !a.offer(1, now, false) {
		t.Fatal("no offer")
	}
	e := a.hand.epoch
	route(as, a.out)
	sActive := false                     // the successor was active at the offered epoch or later
	for step := 0; step < 1500; step++ { // 15 s of 10 ms steps
		now += 10 * ms
		if step%10 == 0 { // ticks and heartbeats every 100 ms
			route(as, settle(a, now, a.Tick(now, Local{})))
			route(sa, settle(s, now, s.Tick(now, Local{})))
		}
		for _, f := range as.due(now) {
			f.msg.From = 0
			route(sa, settle(s, now, s.Step(now, f.msg)))
		}
		for _, f := range sa.due(now) {
			f.msg.From = 1
			route(as, settle(a, now, a.Step(now, f.msg)))
		}
		sTook := s.tookFrom == 0 && s.tookEpoch == e
		sActive = sActive || s.role == RoleActive && s.epoch >= e
		if a.role == RoleActive && a.epoch < e && sTook {
			t.Fatalf("%s: at +%v the old active serves at its old epoch %d after the successor took %d",
				name, time.Duration(now-start), a.epoch, e)
		}
		if a.role == RoleActive && a.epoch == e {
			t.Fatalf("%s: the old active took the epoch it offered, %d", name, e)
		}
	}
	switch a.hand.outcome {
	case HandTaken:
		if !sActive || a.hand.result != 1 || a.active != 1 || a.role != RoleStandby {
			t.Fatalf("%s: taken, but the successor active=%v, old active %v following %d", name, sActive, a.role, a.active)
		}
	case HandRefused:
		if s.tookEpoch == e || s.refused < e || a.epoch != 1 {
			t.Fatalf("%s: refused, but the successor took=%v refused up to %d; old active at %d", name, s.tookEpoch == e, s.refused, a.epoch)
		}
	case HandLost:
		if a.role == RoleActive && a.epoch <= e {
			t.Fatalf("%s: lost, then active at %d, not above the offered %d", name, a.epoch, e)
		}
	default:
		t.Fatalf("%s: the handover did not end: %v (old active %v)", name, a.hand.outcome, a.role)
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
		last    func(e uint64) Heartbeat // the standby's last heartbeat; e: the active's epoch
		ackAt   func(e uint64) uint64    // the epoch the acknowledged snapshot was sent at
		want    int                      // successor after the ack
		keepsAt func(e uint64) uint64    // the epoch the active keeps for it
	}{
		{"standby of this epoch, not in sync yet",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e, Role: RoleStandby, Active: 0} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		// The failure chaos found (seed 7, handovers only): member 1 handed
		// over to 0, followed it and applied its snapshot; 0 was signalled
		// before 1's next heartbeat, which still said "active at e-1".
		{"the old active that just handed over to this one",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e - 1, Role: RoleActive, Active: 1} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		{"a standby of the previous active",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e - 1, Role: RoleStandby, Active: 2, InSync: true} },
			func(e uint64) uint64 { return e }, 1, func(e uint64) uint64 { return e }},
		{"an acknowledgement of a snapshot of another epoch",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e - 1, Role: RoleStandby, Active: 2, InSync: true} },
			func(e uint64) uint64 { return e - 1 }, None, func(e uint64) uint64 { return e - 1 }},
		{"a heartbeat of a later epoch stands",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e + 1, Role: RoleStandby, Active: 2} },
			func(e uint64) uint64 { return e }, None, func(e uint64) uint64 { return e + 1 }},
		{"a leaving member stays leaving",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e - 1, Role: RoleLeaving, Active: 2} },
			func(e uint64) uint64 { return e }, None, func(e uint64) uint64 { return e - 1 }},
		{"a heartbeat of this epoch following another member stands",
			func(e uint64) Heartbeat { return Heartbeat{Epoch: e, Role: RoleStandby, Active: 2} },
			func(e uint64) uint64 { return e }, None, func(e uint64) uint64 { return e }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := 1000 * ms
			a := New(Config{Self: 0, Peers: []string{"m0", "m1", "m2"}, Timeout: 1000 * ms, Now: now})
			a.promoteAt(2) // epoch 2: an epoch below it exists
			e := a.epoch
			a.Step(now, Msg{Kind: MsgHeartbeat, From: 1, HB: tc.last(e)})
			if a.successor(now, 0) != None {
				t.Fatal("a successor before the standby applied the snapshot")
			}
			a.Step(now, Msg{Kind: MsgSnapshotAcked, From: 1, Epoch: tc.ackAt(e)})
			if got := a.successor(now, 0); got != tc.want {
				t.Fatalf("successor after the Ack(snapshot): %d, want %d (%v)", got, tc.want, a.successorViews(now))
			}
			p := a.peers[1]
			if p.epoch != tc.keepsAt(e) || (tc.want == 1 && (!p.inSync || p.role != RoleStandby || p.follows != 0)) {
				t.Fatalf("member 1 kept as %+v", p)
			}
		})
	}
}

// lin is a lineage of the tables bs, the rest naming none.
func lin(bs ...Base) Lineage {
	l := noLineage()
	copy(l[:], bs)
	return l
}

// TestSuccessorTakesTheHandedLineage: the Handoff carries the old
// active's lineage (its base first), and the successor takes it as its
// own, the base's position included (not measured again when its first
// reservation is done), so a contest counts the changes of the whole
// chain of handovers (PROTOCOL.md §6.3); an entry naming no member of this
// cluster names nothing. An old active whose base is not measured yet
// sends its position now.
func TestSuccessorTakesTheHandedLineage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sent      Lineage
		base      Base
		ancestors Lineage
	}{
		{"a member's whole table", lin(Base{From: 0, Epoch: 1, Pos: 40}), Base{From: 0, Epoch: 1, Pos: 40}, lin()},
		{"no whole table", lin(Base{From: None, Pos: 7}), Base{From: None, Pos: 7}, lin()},
		{"no member of this cluster", lin(Base{From: 9, Epoch: 3, Pos: 7}, Base{From: 5, Epoch: 2, Pos: 1}), Base{From: None, Epoch: 3, Pos: 7}, lin()},
		{"a lineage", lin(Base{From: 0, Epoch: 3, Pos: 40}, Base{From: 1, Epoch: 2, Pos: 30}, Base{From: 0, Epoch: 1, Pos: 10}),
			Base{From: 0, Epoch: 3, Pos: 40}, lin(Base{From: 1, Epoch: 2, Pos: 30}, Base{From: 0, Epoch: 1, Pos: 10})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s, now := pair(t)
			settle(s, now, s.Step(now, Msg{Kind: MsgHandoff, From: 0, Epoch: 5, Token: 100, Limit: 200, Lineage: tc.sent, Root: 3}))
			if !s.servingNow() {
				t.Fatal("handover not taken")
			}
			if s.root != 3 {
				t.Fatalf("successor's root %d, want the handed 3", s.root)
			}
			if s.base != tc.base || !s.baseKnown || s.ancestors != tc.ancestors {
				t.Fatalf("successor's base %+v (known %v), ancestors %+v; want %+v, %+v", s.base, s.baseKnown, s.ancestors, tc.base, tc.ancestors)
			}
			if got := s.ownLineage(); got[0] != tc.base || got[1] != tc.ancestors[0] {
				t.Fatalf("successor's heartbeat lineage %+v", got)
			}
		})
	}
	for _, known := range []bool{true, false} {
		a, _, now := pair(t)
		a.base, a.baseKnown, a.local.Pos = Base{From: 1, Epoch: 4, Pos: 30}, known, 55
		a.ancestors, a.root = lin(Base{From: 0, Epoch: 2, Pos: 20}), 9
		offerTo(t, a, 1, now)
		want := lin(Base{From: 1, Epoch: 4, Pos: 30}, Base{From: 0, Epoch: 2, Pos: 20})
		if !known {
			want[0].Pos = 55
		}
		if h := find(a.out, ActHandoff); h[0].Lineage != want || h[0].Root != 9 {
			t.Fatalf("base known %v: Handoff's lineage %+v root %d, want %+v root 9", known, h[0].Lineage, h[0].Root, want)
		}
	}
}

// TestLineageInherited: a standby that promotes with its active's whole
// table takes that active's lineage (from its heartbeats at the epoch it
// follows) as its base's; the oldest entries past LineageLen are
// forgotten, and a heartbeat of another epoch gives none.
func TestLineageInherited(t *testing.T) {
	full := Lineage{{From: 1, Epoch: 9, Pos: 90}, {From: 0, Epoch: 7, Pos: 70}, {From: 1, Epoch: 5, Pos: 50}, {From: 0, Epoch: 3, Pos: 30}}
	a, s, now := pair(t)
	hb := say(a)
	hb.Lineage, hb.Root = full, 11
	s.Step(now, Msg{Kind: MsgHeartbeat, From: 0, HB: hb})
	want := Lineage{full[0], full[1], full[2], {From: None}}
	if base, anc, root := s.followedBase(); base.From != 0 || base.Epoch != 1 || anc != want || root != 11 {
		t.Fatalf("followed base %+v, ancestors %+v, root %d; want %+v, root 11", base, anc, root, want)
	}
	// Heard last at another epoch (the driver's view moved on): none, and
	// the root is not known.
	s.peers[0].epoch = 2
	if base, anc, root := s.followedBase(); base.From != 0 || anc != noLineage() || root != rootOfBase {
		t.Fatalf("heard at another epoch: followed base %+v, ancestors %+v, root %d; want none", base, anc, root)
	}
}

// TestSharedAndRoot: what a later active counts against an earlier one
// (PROTOCOL.md §6.3, docs/PROTOCOL.md decision 71) — the position up to
// which their tables are the same, and the root below which its own table
// counts as nothing.
func TestSharedAndRoot(t *testing.T) {
	for _, tc := range []struct {
		name      string
		base      Base
		ancestors Lineage
		root      uint64
		other     Lineage // the earlier active's (member 1 at epoch 5)
		shared    uint64
		ownRoot   uint64
	}{
		{"its table is the base", Base{From: 1, Epoch: 5, Pos: 500}, lin(), 0, lin(), 500, 0},
		{"its table is in the lineage", Base{From: 2, Epoch: 6, Pos: 600}, lin(Base{From: 1, Epoch: 5, Pos: 450}), 0, lin(), 450, 0},
		{"at another epoch", Base{From: 1, Epoch: 4, Pos: 500}, lin(), 0, lin(), 0, 0},
		{"a third member's table both hold", Base{From: 2, Epoch: 6, Pos: 600}, lin(Base{From: 0, Epoch: 3, Pos: 300}), 0,
			lin(Base{From: 0, Epoch: 3, Pos: 250}), 250, 0},
		{"nothing shared, promoted without a whole table", Base{From: None, Pos: 40}, lin(), rootOfBase, lin(Base{From: 0, Epoch: 3, Pos: 250}), 0, 40},
		{"a whole base whose root is known", Base{From: 2, Epoch: 6, Pos: 600}, lin(), 70, lin(), 0, 70},
		{"a whole base whose root is not known", Base{From: 2, Epoch: 6, Pos: 600}, lin(), rootOfBase, lin(), 0, 600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := activeAmong(t, []string{"m0", "m1", "m2"}, 5000, 5000+1<<20)
			m.base, m.ancestors, m.root = tc.base, tc.ancestors, tc.root
			p := &peer{epoch: 5, lineage: tc.other}
			if got := m.shared(1, p); got != tc.shared {
				t.Errorf("shared %d, want %d", got, tc.shared)
			}
			if got := m.ownRoot(); got != tc.ownRoot {
				t.Errorf("root %d, want %d", got, tc.ownRoot)
			}
		})
	}
}
