package priority

import (
	"math"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// sim runs the role machines of n members on one fake clock, delivering
// every member's heartbeat to every other member it is connected to.
type sim struct {
	t       *testing.T
	now     int64
	m       []*roles
	down    []bool   // killed or frozen: sends nothing, ticks not
	cut     [][]bool // cut[i][j]: i's heartbeats do not reach j
	changes [][]change
}

func newSim(t *testing.T, n int, stored ...uint64) *sim {
	s := &sim{t: t, now: 1000 * ms, down: make([]bool, n), changes: make([][]change, n)}
	for i := range n {
		var st uint64
		if i < len(stored) {
			st = stored[i]
		}
		s.m = append(s.m, newRoles(i, n, 1000*ms, st, s.now))
		s.cut = append(s.cut, make([]bool, n))
	}
	return s
}

// heartbeat is what member i says.
func (s *sim) heartbeat(i int) peerState {
	r := s.m[i]
	hb := peerState{epoch: r.epoch, role: r.role, follows: r.active, inSync: r.inSync,
		storedEpoch: r.peers[i].storedEpoch}
	if r.leaving && r.role == roleStandby {
		hb.role = roleLeaving // as node.heartbeat says it
	}
	return hb
}

// step advances the clock by d in 100 ms ticks: each live member ticks
// and sends a heartbeat (with its probe, echoing what it heard).
func (s *sim) step(d time.Duration) {
	for end := s.now + int64(d); s.now < end; {
		s.now += 100 * ms
		for i, r := range s.m {
			if s.down[i] {
				continue
			}
			s.record(i, r.tick(s.now))
			probe := r.nextProbe()
			for j, o := range s.m {
				if j == i || s.down[j] || s.cut[i][j] {
					continue
				}
				hb := s.heartbeat(i)
				hb.echo = o.peers[i].echo // unchanged unless set below
				s.record(j, o.heard(s.now, i, hb))
				// j echoes i's probe in its next heartbeat to i.
				if !s.cut[j][i] {
					r.peers[j].echo = max(r.peers[j].echo, probe)
				}
			}
		}
	}
}

// record applies what the machine asked for the way the node would: a
// planned handover completes at once (the successor promotes at the new
// epoch, the old active follows it).
func (s *sim) record(i int, c change) {
	s.changes[i] = append(s.changes[i], c)
	if c.follow >= 0 {
		s.m[i].inSync = true // the snapshot arrives at once in this model
	}
	if c.handover >= 0 {
		e, _ := s.m[i].offer(c.handover, s.now)
		s.m[c.handover].promoteAt(e)
		s.m[i].handedOver(c.handover, e)
		s.m[i].inSync = true
	}
}

func (s *sim) actives() []int {
	var a []int
	for i, r := range s.m {
		if !s.down[i] && r.role == roleActive {
			a = append(a, i)
		}
	}
	return a
}

func (s *sim) wantActive(i int) {
	s.t.Helper()
	a := s.actives()
	if len(a) != 1 || a[0] != i {
		s.t.Fatalf("at %v actives %v, want [%d]", time.Duration(s.now), a, i)
	}
	for j, r := range s.m {
		if j != i && !s.down[j] && r.active != i {
			s.t.Fatalf("member %d follows %d, want %d", j, r.active, i)
		}
	}
}

func TestRolesStartup(t *testing.T) {
	s := newSim(t, 3)
	s.step(500 * time.Millisecond)
	if a := s.actives(); len(a) != 0 {
		t.Fatalf("active %v before a failover timeout of listening", a)
	}
	s.step(time.Second)
	s.wantActive(0)
	if s.m[0].epoch != 1 {
		t.Fatalf("first epoch %d", s.m[0].epoch)
	}
}

func TestRolesStartupPrefersTheLastActive(t *testing.T) {
	// Member 2's data dir says it was active at epoch 5 (the last one
	// standing at a full shutdown): it starts as the active.
	s := newSim(t, 3, 0, 3, 5)
	s.step(1500 * time.Millisecond)
	if a := s.actives(); len(a) != 1 || a[0] != 2 && a[0] != 0 {
		t.Fatalf("actives %v", a)
	}
	// ...and then priority order is restored by a planned handover.
	s.step(2 * time.Second)
	s.wantActive(0)
	if s.m[0].epoch <= 5 {
		t.Fatalf("epoch %d not above the stored 5", s.m[0].epoch)
	}
}

func TestRolesFailover(t *testing.T) {
	tests := []struct {
		name   string
		inSync []bool // of members 1 and 2 when the active dies
		want   int
	}{
		{"both in sync: priority", []bool{true, true}, 1},
		{"only 2 in sync", []bool{false, true}, 2},
		{"none in sync: priority", []bool{false, false}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 3)
			s.step(2 * time.Second)
			s.wantActive(0)
			s.m[1].inSync, s.m[2].inSync = tc.inSync[0], tc.inSync[1]
			s.step(200 * time.Millisecond) // their heartbeats say so
			s.down[0] = true
			s.step(500 * time.Millisecond)
			if a := s.actives(); len(a) != 0 {
				t.Fatalf("promoted %v before the failover timeout", a)
			}
			for range 15 {
				s.step(100 * time.Millisecond)
				if len(s.actives()) > 0 {
					break
				}
			}
			s.wantActive(tc.want)
			if s.m[tc.want].epoch != 2 {
				t.Fatalf("epoch %d after one failover", s.m[tc.want].epoch)
			}
			// Once the others follow it in sync, priority order is
			// restored by a planned handover.
			s.step(time.Second)
			s.wantActive(1)
		})
	}
}

func TestRolesTwoActivesResolve(t *testing.T) {
	for _, tc := range []struct {
		name       string
		e0, e1     uint64
		keep, drop int
	}{
		{"higher epoch stays", 3, 4, 1, 0},
		{"equal epochs: higher priority stays", 4, 4, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 2)
			s.step(2 * time.Second)
			// A partition made both active.
			s.m[0].promoteAt(tc.e0)
			s.m[1].promoteAt(tc.e1)
			s.step(100 * time.Millisecond)
			if a := s.actives(); len(a) != 1 || a[0] != tc.keep {
				t.Fatalf("actives %v, want [%d]", a, tc.keep)
			}
			demoted := false
			for _, c := range s.changes[tc.drop] {
				demoted = demoted || (c.demote && c.follow == tc.keep)
			}
			if !demoted {
				t.Fatalf("member %d did not step down towards %d", tc.drop, tc.keep)
			}
		})
	}
}

func TestRolesRejoinHandsOver(t *testing.T) {
	s := newSim(t, 3)
	s.down[0] = true
	s.step(2500 * time.Millisecond)
	s.wantActive(1)
	// Member 0 restarts: it listens, follows 1, syncs; 1 hands over to it.
	s.m[0] = newRoles(0, 3, 1000*ms, 0, s.now)
	s.down[0] = false
	s.step(500 * time.Millisecond)
	s.wantActive(0)
	if s.m[0].epoch <= 1 {
		t.Fatalf("epoch %d after the handover", s.m[0].epoch)
	}
}

func TestRolesFrozenActive(t *testing.T) {
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.wantActive(0)
	// SIGSTOP member 0 for twice the failover timeout: 1 promotes.
	s.down[0] = true
	s.step(2 * time.Second)
	s.wantActive(1)
	// SIGCONT: 0's first tick sees the gap; it must not serve from its
	// stale state, and steps down once it hears of the newer active.
	s.down[0] = false
	r := s.m[0]
	r.tick(s.now + 100*ms)
	if r.serving() {
		t.Fatal("a resumed active serves before checking with the others")
	}
	s.changes[0] = nil
	s.step(100 * time.Millisecond)
	demoted := false
	for _, c := range s.changes[0] {
		if c.promote || c.handover >= 0 {
			t.Fatalf("resumed active acted from its stale state: %+v", s.changes[0])
		}
		demoted = demoted || c.demote
	}
	if !demoted {
		t.Fatalf("changes after resuming: %+v, want a step-down", s.changes[0])
	}
	// Then it follows 1, syncs, and 1 hands priority back to it.
	s.step(time.Second)
	s.wantActive(0)
	if s.m[0].epoch <= 2 {
		t.Fatalf("epoch %d", s.m[0].epoch)
	}
}

func TestRolesFrozenActiveAlone(t *testing.T) {
	// Every other member died while the active was frozen: it resumes
	// serving after watching them stay silent for a full timeout.
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.down[0], s.down[1], s.down[2] = true, true, true
	s.now += int64(3 * time.Second)
	s.down[0] = false
	s.step(100 * time.Millisecond)
	if s.m[0].serving() {
		t.Fatal("served at once after resuming")
	}
	s.step(500 * time.Millisecond)
	if s.m[0].serving() {
		t.Fatal("served before a full timeout of silence")
	}
	s.step(time.Second)
	if !s.m[0].serving() {
		t.Fatal("not serving after a full timeout alone")
	}
	// It serves again through a resume (the node raises its tokens
	// first: the others' silence may hide a successor that granted).
	resumed := false
	for _, c := range s.changes[0] {
		resumed = resumed || c.resume
	}
	if !resumed {
		t.Fatalf("no resume after a check ended by silence: %+v", s.changes[0])
	}
}

// TestRolesResumeAfterEchoes: a check that ends because every member
// answered resumes too.
func TestRolesResumeAfterEchoes(t *testing.T) {
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.wantActive(0)
	r := s.m[0]
	s.now += int64(700 * time.Millisecond) // a stall past T/2, not a failover
	s.changes[0] = nil
	s.step(300 * time.Millisecond)
	if !r.serving() {
		t.Fatal("not serving after every member answered")
	}
	resumed := false
	for _, c := range s.changes[0] {
		resumed = resumed || c.resume
	}
	if !resumed {
		t.Fatalf("no resume after the check: %+v", s.changes[0])
	}
}

func TestRolesFrozenStandbyDoesNotPromoteAtOnce(t *testing.T) {
	s := newSim(t, 2)
	s.step(2 * time.Second)
	s.wantActive(0)
	// Member 1 freezes for 3 s; the active keeps running. On resuming it
	// must not take the active's silence (which it did not watch) for a
	// failure.
	s.down[1] = true
	s.step(3 * time.Second)
	s.down[1] = false
	s.step(100 * time.Millisecond)
	s.wantActive(0)
	s.step(2 * time.Second)
	s.wantActive(0)
}

func TestRolesLeavingIsNotLive(t *testing.T) {
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.wantActive(0)
	s.m[1].role = roleLeaving
	s.step(100 * time.Millisecond)
	if s.m[0].live(1, s.now) {
		t.Fatal("a leaving member counts as live")
	}
	if got := s.m[0].successor(s.now, 0); got != 2 {
		t.Fatalf("successor %d, want 2", got)
	}
}

// TestRolesFreezeCheckWaitsForEchoes: after resuming, heartbeats that
// were sent before the resumed member's new probe (they sat in its socket
// buffers) do not end the freeze check; only echoes of a probe sent after
// resuming, or a full timeout, do.
func TestRolesFreezeCheckWaitsForEchoes(t *testing.T) {
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.wantActive(0)
	r := s.m[0]
	oldEcho := r.peers[1].echo
	r.tick(s.now + 2*int64(time.Second)) // frozen for 2 s
	s.now += 2 * int64(time.Second)
	if !r.checking() {
		t.Fatal("the gap was not noticed")
	}
	// Stale heartbeats from both standbys, echoing old probes.
	for _, j := range []int{1, 2} {
		hb := s.heartbeat(j)
		hb.echo = oldEcho
		r.heard(s.now, j, hb)
	}
	if r.serving() {
		t.Fatal("stale heartbeats ended the freeze check")
	}
	// Echoes of the first probe after resuming end it.
	probe := r.nextProbe()
	for _, j := range []int{1, 2} {
		hb := s.heartbeat(j)
		hb.echo = probe
		r.heard(s.now, j, hb)
	}
	if !r.serving() {
		t.Fatal("echoes of a probe sent after resuming did not end the check")
	}
}

// TestRolesFrozenAtStartWatchesBeforePromoting: a member frozen before it
// had heard anyone (just restarted, its links still down) must not take
// the silence of its freeze for a failed active on resuming: it listens a
// full timeout, hears the active and follows it. (A chaos run found the
// resumed member promoting 11 ms after SIGCONT beside a live active, with
// tokens above the active's: a token inversion outside any partition.)
func TestRolesFrozenAtStartWatchesBeforePromoting(t *testing.T) {
	s := newSim(t, 3)
	s.down[0] = true // frozen from its start
	s.step(3 * time.Second)
	s.wantActiveAmong(1, 2)
	a := s.actives()[0]
	s.down[0] = false
	s.step(100 * time.Millisecond)
	if s.m[0].role == roleActive {
		t.Fatalf("member 0 promoted at once after resuming, beside active %d", a)
	}
	s.step(2 * time.Second)
	// Then priority order brings it back by a planned handover, never by
	// a promotion of its own.
	for _, c := range s.changes[0] {
		if c.promote {
			t.Fatalf("member 0 promoted itself: %+v", s.changes[0])
		}
	}
}

// TestRolesFrozenLoneActiveWatchesBeforeServing: an active that knew no
// member as live when it froze (a partition had cut it off) does not end
// its freeze check at once on resuming, though nobody is left to ask: it
// watches a full timeout, hears the active promoted meanwhile and steps
// down without serving.
func TestRolesFrozenLoneActiveWatchesBeforeServing(t *testing.T) {
	s := newSim(t, 3)
	s.step(2 * time.Second)
	s.wantActive(0)
	for j := 1; j < 3; j++ {
		s.cut[0][j], s.cut[j][0] = true, true
	}
	s.step(2 * time.Second) // 1 promotes on its side; 0 stays active alone
	if s.m[1].role != roleActive || s.m[0].role != roleActive {
		t.Fatalf("split: roles %v %v", s.m[0].role, s.m[1].role)
	}
	s.down[0] = true
	s.now += int64(3 * time.Second) // frozen; the partition heals meanwhile
	for j := 1; j < 3; j++ {
		s.cut[0][j], s.cut[j][0] = false, false
	}
	s.down[0] = false
	s.changes[0] = nil
	s.step(100 * time.Millisecond)
	if s.m[0].serving() {
		t.Fatal("served at once after resuming with nobody to ask")
	}
	s.step(2 * time.Second)
	demoted := false
	for _, c := range s.changes[0] {
		if c.resume && !demoted {
			t.Fatalf("the resumed active served before stepping down: %+v", s.changes[0][:4])
		}
		demoted = demoted || c.demote
	}
	if !demoted {
		t.Fatal("the resumed active never stepped down for the one promoted meanwhile")
	}
	if len(s.actives()) != 1 {
		t.Fatalf("actives %v after the heal", s.actives())
	}
}

// wantActiveAmong checks that exactly one live member is active, one of
// those given.
func (s *sim) wantActiveAmong(ids ...int) {
	s.t.Helper()
	a := s.actives()
	if len(a) != 1 {
		s.t.Fatalf("at %v actives %v, want one of %v", time.Duration(s.now), a, ids)
	}
	for _, i := range ids {
		if a[0] == i {
			return
		}
	}
	s.t.Fatalf("at %v active %d, want one of %v", time.Duration(s.now), a[0], ids)
}

// TestRolesEpochDoesNotWrap (issue 18): a member that has seen the last
// epoch, 2^64-1 (in a heartbeat, or in its data dir), never promotes at
// epoch 0 — the earliest of all, which every other active would beat — nor
// hands over at it: it refuses and says so (epochSpent).
func TestRolesEpochDoesNotWrap(t *testing.T) {
	tests := []struct {
		name   string
		stored []uint64
		heard  bool // member 1 hears a heartbeat with the last epoch
	}{
		{"in a heartbeat", nil, true},
		{"in the data dir", []uint64{0, math.MaxUint64, 0}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 3, tc.stored...)
			s.step(1500 * time.Millisecond)
			if tc.heard {
				s.wantActive(0)
				hb := s.heartbeat(2)
				hb.epoch = math.MaxUint64
				s.record(1, s.m[1].heard(s.now, 2, hb))
			}
			s.down[0] = true // member 1 is the one to take over
			s.step(3 * time.Second)
			if r := s.m[1]; r.role == roleActive || !r.epochSpent {
				t.Fatalf("member 1 (last epoch seen): role %v epoch %d, refused %v", r.role, r.epoch, r.epochSpent)
			}
			if _, ok := s.m[1].offer(2, s.now); ok {
				t.Fatal("a handover named an epoch above the last")
			}
		})
	}
}

// TestRolesStallNoticedByAHeartbeat (issue 18, found by the chaos run's
// large-state phase): after a stall of the whole machine, the first thing
// a standby does may be to read another member's heartbeat, before its
// ticker runs. That heartbeat must not make it promote on the active's
// "silence", which was its own stall: it starts the freeze check as a tick
// would.
func TestRolesStallNoticedByAHeartbeat(t *testing.T) {
	s := newSim(t, 3)
	s.step(1500 * time.Millisecond)
	s.wantActive(0)
	r := s.m[1]
	if !r.inSync {
		t.Fatal("setup: member 1 not in sync")
	}
	// Member 1 stalls 1.2 × the timeout; the first it does after is to
	// read a heartbeat of member 2.
	s.now += 1200 * ms
	c := r.heard(s.now, 2, s.heartbeat(2))
	if c.promote || r.role != roleStandby {
		t.Fatalf("promoted on a heartbeat read first after its own stall: %+v, %v", c, r.role)
	}
	if !r.checking() {
		t.Fatal("the stall did not start the freeze check")
	}
}

// TestRolesSupersededSecondHand (issue 18, found by the chaos run's quiet
// freezes): an active resumes from a freeze with its links to the member
// promoted meanwhile still reconnecting; the standby it knew answers its
// probe (the freeze check ends) and says it follows the new active at a
// later epoch. The resumed member must step down then, not serve from its
// stale state until it hears the new active itself.
func TestRolesSupersededSecondHand(t *testing.T) {
	s := newSim(t, 3)
	s.step(1500 * time.Millisecond)
	s.wantActive(0)
	a := s.m[0]
	// Member 0 has not heard member 1 lately (a link down): before its
	// freeze it knows only member 2 as live, so member 2's echo alone
	// ends its freeze check.
	s.cut[1][0] = true
	s.step(1500 * time.Millisecond)
	if a.live(1, s.now) || !a.live(2, s.now) {
		t.Fatal("setup: member 0 should know only member 2 as live")
	}
	now := s.now + 3000*ms // frozen 3 s; members 1 and 2 moved on
	a.tick(now)            // the freeze check begins
	if !a.checking() {
		t.Fatal("setup: no freeze check")
	}
	// Member 2 echoes the probe, and follows member 1 at epoch 2.
	c := a.heard(now+10*ms, 2, peerState{epoch: a.epoch + 1, role: roleStandby, follows: 1, inSync: true, echo: a.probe + 1})
	if a.role == roleActive || c.resume || !c.demote || a.active != 1 {
		t.Fatalf("resumed member: %v following %d, change %+v: it served on", a.role, a.active, c)
	}
}

// TestRolesLeavingNeverPromotes (issue 18, hole 3): a member shutting down
// never promotes itself. In chaos (priority, 10 min, seed 20261201) an
// active whose SIGTERM handover was left undecided became a standby with
// no active and, being first in priority, promoted itself by the failover
// rules 7 ms later, then shut down as the active: E 4 beside a live
// successor. The others promote instead, as they would after its exit.
// (The second case, a leaving first successor after a crash, promotes
// without the rule; the first pins the shape of the chaos case.)
func TestRolesLeavingNeverPromotes(t *testing.T) {
	for _, leaving := range []int{0, 1} {
		s := newSim(t, 3)
		s.step(2 * time.Second)
		s.wantActive(0)
		s.m[leaving].leaving = true
		if leaving == 0 {
			// The active's handover was left undecided: a standby with no
			// active, its standbys still following it.
			s.m[0].role, s.m[0].active, s.m[0].inSync = roleStandby, -1, false
		} else {
			s.down[0] = true // the active crashed while the first successor shuts down
		}
		for range 30 {
			s.step(100 * time.Millisecond)
		}
		if s.m[leaving].role == roleActive {
			t.Fatalf("leaving member %d promoted itself (epoch %d)", leaving, s.m[leaving].epoch)
		}
		want := 1
		if leaving == 1 {
			want = 2
		}
		if s.m[want].role != roleActive {
			t.Fatalf("leaving member %d: member %d is %v, want the active", leaving, want, s.m[want].role)
		}
	}
}

// TestRolesFreezeCheckAfterRestart (issue 18, hole 2's guarantee in priority
// mode): a member that restarted numbers its heartbeat probes from
// probeBase, above its earlier lives'; the others echo the probe they
// heard last, and an echo of an earlier life still in their heartbeats must
// not end its freeze check. With probes from 1 (before), the check begun by
// a freeze ended in the same tick (chaos, priority, 10 min, seed 20261201:
// a restarted active frozen 2–4 s answered P, A and N from its stale
// state); TestOpenNumbersProbesFromTheClock checks that Open starts there.
func TestRolesFreezeCheckAfterRestart(t *testing.T) {
	// The highest probe of the member's earlier life, which began a minute
	// ago (and sent fewer probes than nanoseconds passed), echoed by the
	// others.
	oldLife := uint64(time.Now().Add(-time.Minute).UnixNano()) + 600
	now := 1000 * ms
	r := newRoles(0, 3, 1000*ms, 0, now)
	r.probe = probeBase() // as Open does
	r.promote()
	for i := 1; i < 3; i++ {
		r.heard(now, i, peerState{epoch: r.epoch, role: roleStandby, follows: 0, inSync: true, echo: oldLife})
	}
	r.tick(now + 100*ms)
	r.nextProbe()
	now += 2 * time.Second.Nanoseconds() // frozen
	if c := r.tick(now); !r.checking() || c.resume {
		t.Fatalf("after a 2 s freeze: checking %v, resume %v: the check ended in the tick that began it", r.checking(), c.resume)
	}
	// Echoes of the earlier life still arrive: the check goes on.
	r.heard(now+10*ms, 1, peerState{epoch: r.epoch, role: roleStandby, follows: 0, inSync: true, echo: oldLife})
	if !r.checking() {
		t.Fatal("an echo of an earlier life ended the freeze check")
	}
	// Fresh echoes of a probe sent after resuming end it.
	p := r.nextProbe()
	for i := 1; i < 3; i++ {
		r.heard(now+50*ms, i, peerState{epoch: r.epoch, role: roleStandby, follows: 0, inSync: true, echo: p})
	}
	if r.checking() {
		t.Fatal("echoes of a probe sent after resuming did not end the check")
	}
}
