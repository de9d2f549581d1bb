package machine

import (
	"math"
	"testing"
	"time"
)

// The role rules, on the simulated cluster (sim_test.go). Ported from the
// role machine's tests before the machine owned the node's decisions too;
// each keeps its assertion.

func TestRolesStartup(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(500 * time.Millisecond)
	if a := c.actives(); len(a) != 0 {
		t.Fatalf("active %v before a failover timeout of listening", a)
	}
	c.step(time.Second)
	c.wantActive(0)
	if c.ms[0].m.epoch != 1 {
		t.Fatalf("first epoch %d", c.ms[0].m.epoch)
	}
	if !c.serving(0) {
		t.Fatal("the active does not serve after its first reservation")
	}
}

func TestRolesStartupPrefersTheLastActive(t *testing.T) {
	// Member 2's data dir says it was active at epoch 5 (the last one
	// standing at a full shutdown): it starts as the active.
	c := newCluster(t, 3, time.Second, 0, 3, 5)
	c.step(1500 * time.Millisecond)
	if a := c.actives(); len(a) != 1 || a[0] != 2 && a[0] != 0 {
		t.Fatalf("actives %v", a)
	}
	// ...and then priority order is restored by a planned handover.
	c.step(2 * time.Second)
	c.wantActive(0)
	if c.ms[0].m.epoch <= 5 {
		t.Fatalf("epoch %d not above the stored 5", c.ms[0].m.epoch)
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
			c := newCluster(t, 3, time.Second)
			c.step(2 * time.Second)
			c.wantActive(0)
			c.ms[1].m.inSync, c.ms[2].m.inSync = tc.inSync[0], tc.inSync[1]
			c.step(200 * time.Millisecond) // their heartbeats say so
			c.ms[0].down = true
			c.step(500 * time.Millisecond)
			if a := c.actives(); len(a) != 0 {
				t.Fatalf("promoted %v before the failover timeout", a)
			}
			for range 15 {
				c.step(100 * time.Millisecond)
				if len(c.actives()) > 0 {
					break
				}
			}
			c.wantActiveAmong(tc.want)
			if c.ms[tc.want].m.epoch != 2 {
				t.Fatalf("epoch %d after one failover", c.ms[tc.want].m.epoch)
			}
			// Once the others follow it in sync, priority order is
			// restored by a planned handover.
			c.step(time.Second)
			c.wantActive(1)
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
			c := newCluster(t, 2, time.Second)
			c.step(2 * time.Second)
			// A partition made both active (neither has changed anything:
			// a tie, which the earlier one loses).
			for i, e := range []uint64{tc.e0, tc.e1} {
				m := c.ms[i].m
				base, _, _ := m.followedBase()
				m.promoteAt(e)
				m.becomeActive(c.now, "a test's split", base, 0, false)
				c.carry(i, m.out)
			}
			c.step(300 * time.Millisecond)
			if a := c.actives(); len(a) != 1 || a[0] != tc.keep {
				t.Fatalf("actives %v, want [%d]", a, tc.keep)
			}
			if m := c.ms[tc.drop].m; m.demotions != 1 || m.active != tc.keep {
				t.Fatalf("member %d did not step down towards %d: demotions %d, follows %d", tc.drop, tc.keep, m.demotions, m.active)
			}
		})
	}
}

func TestRolesRejoinHandsOver(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.ms[0].down = true
	c.step(2500 * time.Millisecond)
	c.wantActive(1)
	// Member 0 restarts: it listens, follows 1, syncs; 1 hands over to it.
	c.start(0)
	c.step(1500 * time.Millisecond)
	c.wantActive(0)
	if c.ms[0].m.epoch <= 1 {
		t.Fatalf("epoch %d after the handover", c.ms[0].m.epoch)
	}
}

func TestRolesFrozenActive(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	// SIGSTOP member 0 for twice the failover timeout: 1 promotes.
	c.ms[0].stalled = c.now + int64(2*time.Second) + 1
	c.step(2 * time.Second)
	c.wantActiveAmong(1)
	c.ms[0].stalled = 0
	// SIGCONT: 0's first tick sees the gap; it must not serve from its
	// stale state, and steps down once the newer active says so (it has
	// served since: here, a tie at no change each, which the earlier
	// loses).
	a := c.ms[0].m
	c.carry(0, a.Tick(c.now+100*ms, c.local(0)))
	if a.serving() || c.ms[0].gate.State == Serve {
		t.Fatal("a resumed active serves before checking with the others")
	}
	c.logs = nil
	c.step(300 * time.Millisecond)
	if c.logged(0, "serving again") || c.logged(0, "handing over") {
		t.Fatalf("resumed active acted from its stale state: %q", c.logs)
	}
	if a.demotions != 1 {
		t.Fatalf("after resuming: %q, want a step-down", c.logs)
	}
	// Then it follows 1, syncs, and 1 hands priority back to it.
	c.step(time.Second)
	c.wantActive(0)
	if a.epoch <= 2 {
		t.Fatalf("epoch %d", a.epoch)
	}
}

func TestRolesFrozenActiveAlone(t *testing.T) {
	// Every other member died while the active was frozen: it resumes
	// serving after watching them stay silent for a full timeout.
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.ms[1].down, c.ms[2].down = true, true
	c.ms[0].stalled = c.now + int64(3*time.Second)
	c.now += int64(3 * time.Second)
	c.logs = nil
	c.step(100 * time.Millisecond)
	if c.serving(0) {
		t.Fatal("served at once after resuming")
	}
	c.step(500 * time.Millisecond)
	if c.serving(0) {
		t.Fatal("served before a full timeout of silence")
	}
	c.step(time.Second)
	if !c.serving(0) {
		t.Fatal("not serving after a full timeout alone")
	}
	// It serves again through a resume (its tokens raised first: the
	// others' silence may hide a successor that granted).
	if !c.logged(0, "serving again") {
		t.Fatalf("no resume after a check ended by silence: %q", c.logs)
	}
}

// TestRolesResumeAfterEchoes: a check that ends because every member
// answered resumes too.
func TestRolesResumeAfterEchoes(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	c.ms[0].stalled = c.now + int64(700*time.Millisecond) // a stall past T/2, not a failover
	c.now += int64(700 * time.Millisecond)
	c.logs = nil
	c.step(300 * time.Millisecond)
	if !c.serving(0) {
		t.Fatal("not serving after every member answered")
	}
	if !c.logged(0, "serving again") {
		t.Fatalf("no resume after the check: %q", c.logs)
	}
}

func TestRolesFrozenStandbyDoesNotPromoteAtOnce(t *testing.T) {
	c := newCluster(t, 2, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	// Member 1 freezes for 3 s; the active keeps running. On resuming it
	// must not take the active's silence (which it did not watch) for a
	// failure.
	c.ms[1].stalled = c.now + int64(3*time.Second)
	c.step(3 * time.Second)
	c.step(100 * time.Millisecond)
	c.wantActive(0)
	c.step(2 * time.Second)
	c.wantActive(0)
}

func TestRolesLeavingIsNotLive(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	c.input(1, Msg{Kind: MsgStop})
	c.step(100 * time.Millisecond)
	if c.ms[0].m.live(1, c.now) {
		t.Fatal("a leaving member counts as live")
	}
	if got := c.ms[0].m.successor(c.now, 0); got != 2 {
		t.Fatalf("successor %d, want 2", got)
	}
	if s := c.ms[1].stopped; len(s) != 1 || s[0] != 0 {
		t.Fatalf("a standby's Stop: requests go to %v, want [0]", s)
	}
}

// TestRolesFreezeCheckWaitsForEchoes: after resuming, heartbeats that
// were sent before the resumed member's new probe (they sat in its socket
// buffers) do not end the freeze check; only echoes of a probe sent after
// resuming, or a full timeout, do.
func TestRolesFreezeCheckWaitsForEchoes(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	r := c.ms[0].m
	oldEcho := r.peers[1].echo
	c.now += 2 * int64(time.Second) // frozen for 2 s
	r.Tick(c.now, c.local(0))
	if !r.checking() {
		t.Fatal("the gap was not noticed")
	}
	// Stale heartbeats from both standbys, echoing old probes.
	for _, j := range []int{1, 2} {
		hb := sayTo(c, j, 0)
		hb.Echo = oldEcho
		r.Step(c.now, Msg{Kind: MsgHeartbeat, From: j, HB: hb})
	}
	if r.checking() {
		// still checking: right
	} else {
		t.Fatal("stale heartbeats ended the freeze check")
	}
	// Echoes of the first probe after resuming end it.
	probe := r.resumeProbe
	for _, j := range []int{1, 2} {
		hb := sayTo(c, j, 0)
		hb.Echo = probe
		r.Step(c.now, Msg{Kind: MsgHeartbeat, From: j, HB: hb})
	}
	if r.checking() {
		t.Fatal("echoes of a probe sent after resuming did not end the check")
	}
}

// sayTo is member j's heartbeat to member to, as its machine would send
// it now.
func sayTo(c *cluster, j, to int) Heartbeat {
	m := c.ms[j].m
	return Heartbeat{Epoch: m.epoch, Role: m.role, Active: m.active, InSync: m.inSync, Echo: m.probeIn[to],
		StoredEpoch: m.peers[j].storedEpoch, Pos: c.ms[j].pos, Held: (m.role == RoleActive || m.role == RoleHandover) && m.held,
		Serving: m.servingNow(), Verdict: m.verdict[to]}
}

// TestRolesFrozenAtStartWatchesBeforePromoting: a member frozen before it
// had heard anyone (just restarted, its links still down) must not take
// the silence of its freeze for a failed active on resuming: it listens a
// full timeout, hears the active and follows it. (A chaos run found the
// resumed member promoting 11 ms after SIGCONT beside a live active, with
// tokens above the active's: a token inversion outside any partition.)
func TestRolesFrozenAtStartWatchesBeforePromoting(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.ms[0].stalled = c.now + int64(3*time.Second) // frozen from its start
	c.step(3 * time.Second)
	c.wantActiveAmong(1, 2)
	a := c.actives()[0]
	c.step(100 * time.Millisecond)
	if c.ms[0].m.failovers != 0 {
		t.Fatalf("member 0 promoted at once after resuming, beside active %d", a)
	}
	c.step(2 * time.Second)
	// Then priority order brings it back by a planned handover, never by
	// a promotion of its own.
	if c.ms[0].m.failovers != 0 {
		t.Fatalf("member 0 promoted itself: %q", c.logs)
	}
}

// TestRolesFrozenLoneActiveWatchesBeforeServing: an active that knew no
// member as live when it froze (a partition had cut it off) does not end
// its freeze check at once on resuming, though nobody is left to ask: it
// watches a full timeout, hears the active promoted meanwhile and steps
// down without serving (that one has served since: it loses more).
func TestRolesFrozenLoneActiveWatchesBeforeServing(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(2 * time.Second)
	c.wantActive(0)
	for j := 1; j < 3; j++ {
		c.cut[0][j], c.cut[j][0] = true, true
	}
	c.step(2 * time.Second) // 1 promotes on its side; 0 stays active alone
	if c.ms[1].m.role != RoleActive || c.ms[0].m.role != RoleActive {
		t.Fatalf("split: roles %v %v", c.ms[0].m.role, c.ms[1].m.role)
	}
	c.grant(1, 10) // it serves on its side
	c.ms[0].stalled = c.now + int64(3*time.Second)
	c.now += int64(3 * time.Second) // frozen; the partition heals meanwhile
	for j := 1; j < 3; j++ {
		c.cut[0][j], c.cut[j][0] = false, false
	}
	c.logs = nil
	c.step(100 * time.Millisecond)
	if c.serving(0) {
		t.Fatal("served at once after resuming with nobody to ask")
	}
	c.step(2 * time.Second)
	if c.logged(0, "serving again") && c.ms[0].m.demotions == 0 {
		t.Fatalf("the resumed active served instead of stepping down: %q", c.logs)
	}
	if c.ms[0].m.demotions == 0 {
		t.Fatal("the resumed active never stepped down for the one promoted meanwhile")
	}
	if len(c.actives()) != 1 {
		t.Fatalf("actives %v after the heal", c.actives())
	}
}

// TestRolesEpochDoesNotWrap: a member that has seen the last epoch, 2^64-1
// (in a heartbeat, or in its data dir), never promotes at epoch 0 — the
// earliest of all, which every other active would beat — nor hands over
// at it: it refuses and says so (epochSpent).
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
			c := newCluster(t, 3, time.Second, tc.stored...)
			c.step(1500 * time.Millisecond)
			if tc.heard {
				c.wantActive(0)
				hb := sayTo(c, 2, 1)
				hb.Epoch = math.MaxUint64
				c.input(1, Msg{Kind: MsgHeartbeat, From: 2, HB: hb})
			}
			c.ms[0].down = true // member 1 is the one to take over
			c.step(3 * time.Second)
			if m := c.ms[1].m; m.role == RoleActive || !m.epochSpent {
				t.Fatalf("member 1 (last epoch seen): role %v epoch %d, refused %v", m.role, m.epoch, m.epochSpent)
			}
			if !c.logged(1, "no epoch left") {
				t.Fatal("the refusal was not logged")
			}
			if _, ok := c.ms[1].m.nextEpoch(); ok {
				t.Fatal("a handover could name an epoch above the last")
			}
		})
	}
}

// TestRolesStallNoticedByAHeartbeat: after a stall of the whole machine,
// the first thing a standby does may be to read another member's
// heartbeat, before its tick runs. That heartbeat must not make it promote
// on the active's "silence", which was its own stall: it starts the
// freeze check as a tick would.
func TestRolesStallNoticedByAHeartbeat(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(1500 * time.Millisecond)
	c.wantActive(0)
	r := c.ms[1].m
	if !r.inSync {
		t.Fatal("setup: member 1 not in sync")
	}
	// Member 1 stalls 1.2 × the timeout; the first it does after is to
	// read a heartbeat of member 2.
	c.now += 1200 * ms
	r.Step(c.now, Msg{Kind: MsgHeartbeat, From: 2, HB: sayTo(c, 2, 1)})
	if r.role != RoleStandby || r.failovers != 0 {
		t.Fatalf("promoted on a heartbeat read first after its own stall: %v", r.role)
	}
	if !r.checking() {
		t.Fatal("the stall did not start the freeze check")
	}
}

// TestRolesLaterActiveSecondHand: an active resumes from a freeze with its
// links to the member promoted meanwhile still reconnecting; the standby
// it knew answers its probe (the freeze check ends) and says it follows the
// new active at a later epoch. The resumed member must not serve from its
// stale state until it hears the new active itself: it answers M naming
// it. It no longer steps down on hearsay (PROTOCOL.md §6.3, "Whoever would
// lose more stays": only the later active can tell which of the two would
// lose more); it does once that one, heard, says so.
func TestRolesLaterActiveSecondHand(t *testing.T) {
	c := newCluster(t, 3, time.Second)
	c.step(1500 * time.Millisecond)
	c.wantActive(0)
	a := c.ms[0].m
	// Member 0 has not heard member 1 lately (a link down): before its
	// freeze it knows only member 2 as live, so member 2's echo alone
	// ends its freeze check.
	c.cut[1][0] = true
	c.step(1500 * time.Millisecond)
	if a.live(1, c.now) || !a.live(2, c.now) {
		t.Fatal("setup: member 0 should know only member 2 as live")
	}
	now := c.now + 3000*ms // frozen 3 s; members 1 and 2 moved on
	c.carry(0, a.Tick(now, c.local(0)))
	if !a.checking() {
		t.Fatal("setup: no freeze check")
	}
	// Member 2 echoes the probe, and follows member 1 at epoch 2.
	c.carry(0, a.Step(now+10*ms, Msg{Kind: MsgHeartbeat, From: 2,
		HB: Heartbeat{Epoch: a.epoch + 1, Role: RoleStandby, Active: 1, InSync: true, Echo: a.resumeProbe}}))
	if c.ms[0].gate.State != Redirect || c.ms[0].gate.To != 1 || a.ready {
		t.Fatalf("resumed member: %v following %d, gate %s: it served on", a.role, a.active, gateText(c.ms[0].gate))
	}
	// Member 1, heard at last, says 0 steps down.
	c.carry(0, a.Step(now+20*ms, Msg{Kind: MsgHeartbeat, From: 1,
		HB: Heartbeat{Epoch: a.epoch + 1, Role: RoleActive, Active: 1, Serving: true, Verdict: a.epoch}}))
	if a.role != RoleStandby || a.active != 1 || a.demotions != 1 {
		t.Fatalf("after the later active's verdict: %v following %d", a.role, a.active)
	}
}

// TestRolesContestNotJudgedOnAStaleHeartbeat: an active's heartbeats say
// "held" while it reserves at its own promotion; a member that heard one
// then, and promoted itself later (a partition), must not judge "whoever
// would lose more" on that heartbeat when the partition heals and a frame
// other than a heartbeat (a snapshot) arrives first: the old active's
// position then (0) is not its position now. In e2e's
// TestPriorityPartitionHeals the old active, with 600 grants made during
// the split against the new side's 20, was told to step down.
func TestRolesContestNotJudgedOnAStaleHeartbeat(t *testing.T) {
	c := newCluster(t, 2, time.Second)
	c.step(1500 * time.Millisecond)
	c.wantActive(0)
	b := c.ms[1].m
	// A held heartbeat of member 0 (position 0), as during its promotion.
	c.carry(1, b.Step(c.now, Msg{Kind: MsgHeartbeat, From: 0,
		HB: Heartbeat{Epoch: c.ms[0].m.epoch, Role: RoleActive, Active: 0, Held: true, Pos: 0}}))
	// Partition: member 1 hears nothing for longer than the timeout and
	// promotes itself, then makes 20 changes.
	c.cut[0][1], c.cut[1][0] = true, true
	c.step(2500 * time.Millisecond)
	if b.role != RoleActive || !b.ready {
		t.Fatalf("setup: member 1 %v, ready %v: it should have promoted", b.role, b.ready)
	}
	l := c.local(1)
	l.Pos = b.base.Pos + 20
	c.carry(1, b.Tick(c.now, l))
	// The heal: a snapshot frame of member 0 arrives before its heartbeat.
	c.carry(1, b.Step(c.now+ms, Msg{Kind: MsgHeard, From: 0}))
	l.Pos = b.base.Pos + 20
	c.carry(1, b.Tick(c.now+2*ms, l))
	if b.verdict[0] != 0 || b.role != RoleActive {
		t.Fatalf("member 1 judged the contest on member 0's heartbeat from before the split: verdict %d, role %v", b.verdict[0], b.role)
	}
	// Member 0's fresh held heartbeat with its real position decides:
	// member 1, with fewer changes, steps down.
	c.carry(1, b.Step(c.now+3*ms, Msg{Kind: MsgHeartbeat, From: 0,
		HB: Heartbeat{Epoch: c.ms[0].m.epoch, Role: RoleActive, Active: 0, Held: true, Serving: false, Pos: 601}}))
	if b.role != RoleStandby || b.active != 0 {
		t.Fatalf("member 1 (20 changes) against member 0 (601): %v following %d, want a standby of 0", b.role, b.active)
	}
}

// TestRolesLeavingNeverPromotes: a member shutting down never promotes
// itself. In chaos (priority, 10 min, seed 20261201) an active whose
// SIGTERM handover was left undecided became a standby with no active
// and, being first in priority, promoted itself by the failover rules
// 7 ms later, then shut down as the active: E 4 beside a live successor.
// The others promote instead, as they would after its exit.
func TestRolesLeavingNeverPromotes(t *testing.T) {
	for _, leaving := range []int{0, 1} {
		c := newCluster(t, 3, time.Second)
		c.step(2 * time.Second)
		c.wantActive(0)
		c.ms[leaving].m.leaving, c.ms[leaving].m.stopping = true, true // as Stop sets them
		if leaving == 0 {
			// The active's handover was left undecided: a standby with no
			// active, its standbys still following it.
			m := c.ms[0].m
			m.role, m.active, m.inSync = RoleStandby, None, false
		} else {
			c.ms[0].down = true // the active crashed while the first successor shuts down
		}
		c.step(3 * time.Second)
		if c.ms[leaving].m.role == RoleActive {
			t.Fatalf("leaving member %d promoted itself (epoch %d)", leaving, c.ms[leaving].m.epoch)
		}
		want := 1
		if leaving == 1 {
			want = 2
		}
		if c.ms[want].m.role != RoleActive {
			t.Fatalf("leaving member %d: member %d is %v, want the active", leaving, want, c.ms[want].m.role)
		}
	}
}

// TestRolesFreezeCheckAfterRestart: a member that restarted numbers its
// heartbeat probes from Config.Probe (the driver's probeBase, above its
// earlier lives'); the others echo the probe they heard last, and an echo
// of an earlier life still in their heartbeats must not end its freeze
// check. With probes from 1, the check begun by a freeze ended in the same
// tick (chaos, priority, 10 min, seed 20261201: a restarted active frozen
// 2–4 s answered P, A and N from its stale state).
func TestRolesFreezeCheckAfterRestart(t *testing.T) {
	oldLife := uint64(1e18) + 600
	now := 1000 * ms
	r := New(Config{Self: 0, Peers: []string{"a", "b", "c"}, Timeout: 1000 * ms, TokenBlock: 10, Probe: oldLife - 600 + 1e12, Now: now})
	r.promoteAt(1)
	for i := 1; i < 3; i++ {
		r.Step(now, Msg{Kind: MsgHeartbeat, From: i, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Echo: oldLife}})
	}
	r.Tick(now+100*ms, Local{})
	now += 2 * time.Second.Nanoseconds() // frozen
	r.Tick(now, Local{})
	if !r.checking() {
		t.Fatal("after a 2 s freeze: not checking, or the check ended in the tick that began it")
	}
	// Echoes of the earlier life still arrive: the check goes on.
	r.Step(now+10*ms, Msg{Kind: MsgHeartbeat, From: 1, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Echo: oldLife}})
	if !r.checking() {
		t.Fatal("an echo of an earlier life ended the freeze check")
	}
	// Fresh echoes of a probe sent after resuming end it.
	p := r.resumeProbe
	for i := 1; i < 3; i++ {
		r.Step(now+50*ms, Msg{Kind: MsgHeartbeat, From: i, HB: Heartbeat{Epoch: 1, Role: RoleStandby, Active: 0, InSync: true, Echo: p}})
	}
	if r.checking() {
		t.Fatal("echoes of a probe sent after resuming did not end the check")
	}
}
