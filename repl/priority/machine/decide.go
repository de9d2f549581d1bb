package machine

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
)

// The role rules (PROTOCOL.md §6.2–6.3):
//
//   - a member is live while it has been heard from within the failover
//     timeout (and has not said it is leaving);
//   - at start a member listens for a failover timeout; an active heard
//     meanwhile is followed at once;
//   - with no live active, the highest-priority live standby that is in
//     sync promotes itself; when none is in sync, the live member whose
//     data dir holds the highest epoch (the last active), ties broken by
//     priority;
//   - two actives: whoever would lose more by stepping down stays
//     (contest.go);
//   - an active hands over to a live, in-sync member of higher priority
//     (rejoin), and on shutdown to the best live in-sync standby
//     (handover.go);
//   - a member whose ticks stopped for more than half the timeout
//     (frozen, stalled) does nothing from its stale view until every
//     member it knew as live has echoed a heartbeat it sent after
//     resuming, or a full timeout has passed since resuming (always the
//     timeout when it knew none): an active executes nothing meanwhile,
//     and no standby counts silence it did not watch (it listens a full
//     timeout again, as at start, before it may promote).

// live reports whether member i (not self) counts as live at now.
func (m *Member) live(i int, now int64) bool {
	p := &m.peers[i]
	return p.known && p.role != RoleLeaving && now-p.heard < m.timeout
}

// mixed reports whether a live member's --peers differs from this
// member's (a rolling change of --peers): the members may then disagree
// on priorities, so every decision several members must make alike orders
// members by their own entries (before), and no active hands over for
// priority.
func (m *Member) mixed(now int64) bool {
	for i := range m.peers {
		if i != m.self && m.differs[i] && m.live(i, now) {
			return true
		}
	}
	return false
}

// before reports whether member i comes before member j in priority: the
// lower index; while the lists are mixed, the smaller own entry (text),
// which every member computes alike whatever its list.
func (m *Member) before(i, j int, mixed bool) bool {
	if mixed && m.names[i] != "" && m.names[j] != "" {
		return m.names[i] < m.names[j]
	}
	return i < j
}

// beats reports whether an active (epoch e1, member i1) became active
// later than (e2, i2): higher epoch, or equal epochs and higher priority.
func (m *Member) beats(e1 uint64, i1 int, e2 uint64, i2 int, mixed bool) bool {
	return e1 > e2 || (e1 == e2 && m.before(i1, i2, mixed))
}

// checking reports whether the freeze check is in progress.
func (m *Member) checking() bool { return m.resumeProbe > 0 }

// serving reports whether this member's role executes requests now
// (its gate also needs ready and no contest).
func (m *Member) serving() bool { return m.role == RoleActive && !m.checking() }

// nextProbe numbers the heartbeat round about to be sent.
func (m *Member) nextProbe() uint64 {
	m.probe++
	return m.probe
}

// heardFrom records that member from said something (any frame, not only
// a heartbeat): it is live, whatever else the link carries (a snapshot of
// any size). What it said last in a heartbeat stands.
func (m *Member) heardFrom(now int64, from int) {
	if from == m.self || from < 0 || from >= m.n {
		return
	}
	if p := &m.peers[from]; p.known {
		if now-p.heard >= m.timeout {
			// Back after a silence (a partition healed, it or this member
			// resumed): what it said before is stale until its next
			// heartbeat. Its position then was no final position now, nor
			// its verdict a verdict on what happened since; a frame that
			// is not a heartbeat (a snapshot) must not let a contest be
			// judged on them.
			p.held, p.verdict = false, 0
		}
		p.heard = max(p.heard, now)
	}
}

// heartbeat takes member from's heartbeat and decides.
func (m *Member) heartbeat(now int64, from int, hb *Heartbeat) {
	m.probeIn[from] = hb.Probe
	if hb.Role == RoleActive && m.role == RoleStandby && m.active == from {
		m.lagNS = int64(hb.LagNS)
	}
	// A heartbeat read first after a stall (before the tick ran) must not
	// decide with the stall counted as the others' silence.
	m.noticeFreeze(now)
	p := &m.peers[from]
	echo, lastKnown := max(p.echo, hb.Echo), p.lastKnown
	*p = peer{known: true, heard: now, epoch: hb.Epoch, role: hb.Role, follows: hb.Active, inSync: hb.InSync,
		echo: echo, storedEpoch: hb.StoredEpoch, token: hb.TokenLast, reserved: hb.Reserved, mark: hb.Mark,
		lastKnown: lastKnown, held: hb.Held, serving: hb.Serving, pos: hb.Pos, verdict: hb.Verdict, lineage: m.known(hb.Lineage), root: hb.Root}
	m.maxEpoch = max(m.maxEpoch, hb.Epoch, hb.StoredEpoch)
	m.tokensHeard(now, from, hb)
	m.decide(now)
	if m.role == RoleActive && hb.Role == RoleStandby && hb.Active == m.self {
		// A standby that follows this active but is not in the stream (its
		// request for a snapshot was lost), or that has said it is out of
		// sync for long, gets a snapshot.
		m.emit(Action{Kind: ActResync, To: from, Stale: true, InSync: hb.InSync})
	}
}

// noticeFreeze starts the freeze check when the ticks stopped for more
// than half the timeout (frozen or stalled), whichever input comes first
// after it — a tick, or a heartbeat read before the tick ran. What this
// member believed about the others is stale: the check begins with the
// next probe, and no silence it did not watch counts (a standby listens a
// full timeout again, as at start, before it may promote). It leaves
// lastTick to Tick: only a tick extends the gate.
func (m *Member) noticeFreeze(now int64) {
	if now-m.lastTick <= m.timeout/2 || m.checking() {
		return
	}
	m.resumeProbe = m.probe + 1
	m.resumeAt = now
	m.started = max(m.started, now)
	for i := range m.peers {
		p := &m.peers[i]
		p.lastKnown = i != m.self && p.known && p.role != RoleLeaving && m.lastTick-p.heard < m.timeout
		if p.lastKnown {
			p.heard = now
		}
	}
	// Serve again only through a resume (the check's end).
	m.ready = false
	m.logf(slog.LevelWarn, "this member was frozen or stalled: executing nothing until the others answer", "gap", time.Duration(now-m.lastTick))
}

// checkResumed ends the freeze check once every member live before it has
// echoed a probe sent after resuming, or a full timeout has passed, and
// reports whether it ended now. A member that knew no other as live has
// nobody to ask: it watches a full timeout (a member promoted meanwhile is
// heard, and this one yields without serving from its stale state).
func (m *Member) checkResumed(now int64) (ended bool) {
	if !m.checking() {
		return false
	}
	if now-m.resumeAt < m.timeout {
		asked := false
		for i := range m.peers {
			p := &m.peers[i]
			if !p.lastKnown || p.role == RoleLeaving {
				continue
			}
			if p.echo < m.resumeProbe {
				return false
			}
			asked = true
		}
		if !asked {
			return false
		}
	}
	m.resumeProbe = 0
	for i := range m.peers {
		m.peers[i].lastKnown = false
	}
	return true
}

// bestActive returns the live member that says it is active and became
// active last, or None.
func (m *Member) bestActive(now int64) int {
	best := None
	mixed := m.mixed(now)
	for i := range m.peers {
		if i == m.self || !m.live(i, now) || m.peers[i].role != RoleActive {
			continue
		}
		if best < 0 || m.beats(m.peers[i].epoch, i, m.peers[best].epoch, best, mixed) {
			best = i
		}
	}
	return best
}

// toFollow is the active a standby follows: the one it follows while that
// one stays a live active — two actives resolve between themselves, and a
// standby's copy of the one that keeps the replicated table must not be
// replaced by the other's meanwhile — else the one that became active
// last.
func (m *Member) toFollow(now int64) int {
	if a := m.active; a >= 0 && a != m.self && m.live(a, now) && m.peers[a].role == RoleActive {
		return a
	}
	return m.bestActive(now)
}

// laterActive returns the active that became active last as the live
// members tell it — one that says it is active (or handing over), or one
// a live standby says it follows (its heartbeat carries that active's
// epoch) — and its epoch, or None. A member may learn of a later active
// second-hand: after a freeze, say, from a standby that follows it before
// the later active itself is heard (its links reconnecting).
func (m *Member) laterActive(now int64) (int, uint64) {
	best, epoch := None, uint64(0)
	mixed := m.mixed(now)
	consider := func(a int, e uint64) {
		if a >= 0 && a < m.n && a != m.self && (best < 0 || m.beats(e, a, epoch, best, mixed)) {
			best, epoch = a, e
		}
	}
	for i := range m.peers {
		p := &m.peers[i]
		if i == m.self || !m.live(i, now) {
			continue
		}
		switch p.role {
		case RoleActive, RoleHandover:
			consider(i, p.epoch)
		case RoleStandby:
			consider(p.follows, p.epoch)
		}
	}
	return best, epoch
}

// decide applies the rules after the view changed.
func (m *Member) decide(now int64) {
	ended := m.checkResumed(now)
	switch m.role {
	case RoleActive:
		if m.yieldsToLater(now) {
			return
		}
		if ended {
			m.resume(now, "the freeze check ended")
		}
		if m.checking() {
			return
		}
		if m.judgeEarlier(now) {
			return
		}
		// Priority order: hand over to a live, in-sync member of higher
		// priority that follows this active — not while shutting down
		// (the shutdown picks its successor), not before the first
		// reservation, and not while the live members' lists differ (they
		// may disagree on the order: handovers would go back and forth).
		if m.stopping || !m.ready || m.mixed(now) {
			return
		}
		for i := 0; i < m.self; i++ {
			if m.inSyncStandby(i, now) {
				m.logf(slog.LevelInfo, "handing over to a member of higher priority", "successor", m.name(i))
				m.offer(i, now, false)
				return
			}
		}
	case RoleHandover:
		m.decideHandover(now)
	case RoleStandby:
		if a := m.toFollow(now); a >= 0 {
			if a != m.active || m.peers[a].epoch != m.epoch {
				m.follow(now, a, m.peers[a].epoch)
				m.logf(slog.LevelInfo, "following the active", "active", m.name(a))
			}
			return
		}
		if m.checking() || now-m.started < m.timeout {
			return
		}
		if m.active >= 0 && m.active != m.self && m.live(m.active, now) && m.peers[m.active].role == RoleHandover {
			return // the active is handing over: wait for it
		}
		if m.waitLater(now) {
			return
		}
		if !m.leaving && m.candidate(now) == m.self {
			m.promote(now)
		}
	}
}

// waitLater reports whether a standby with no live active to follow waits
// for one it knows of only second-hand: a live member follows an active at
// a later epoch than the one this member followed — its active handed
// over to a member whose heartbeats do not reach it yet (their links
// reconnecting after that member's restart). Promoting by the failover
// rules then would make a second active beside one that serves: the
// earlier one executes nothing until the two resolve, clients are sent to
// the later one with M, and that one, having heard the other's tokens,
// answers acquires B until it has reserved above them (planned handovers
// lose nothing, PROTOCOL.md §6.2). The wait is one failover timeout from
// the first such heartbeat: a member that still follows an active this
// member never hears may follow a dead one (its own view stale), and the
// failover rules must decide in the end.
func (m *Member) waitLater(now int64) bool {
	if !m.heardOfLater(now) {
		m.heardLater = 0
		return false
	}
	if m.heardLater == 0 {
		m.heardLater = max(now, 1)
	}
	return now-m.heardLater < m.timeout
}

// heardOfLater reports whether a member heard within the timeout follows
// an active (not this member) at an epoch above this member's: a live one
// (laterActive), or one shutting down after handing over — a leaving
// member counts as not live, but it names its successor until it exits.
func (m *Member) heardOfLater(now int64) bool {
	if _, e := m.laterActive(now); e > m.epoch {
		return true
	}
	for i := range m.peers {
		p := &m.peers[i]
		if i != m.self && p.known && p.role == RoleLeaving && now-p.heard < m.timeout &&
			p.follows >= 0 && p.follows < m.n && p.follows != m.self && p.epoch > m.epoch {
			return true
		}
	}
	return false
}

// follow makes this member a standby of active a at epoch e: it executes
// nothing (M naming a), streams nothing, and asks a for a snapshot. Its
// table stays as it is until that snapshot begins: the snapshot replaces
// it, and until then it is what a failover would promote with.
func (m *Member) follow(now int64, a int, e uint64) {
	m.role, m.active, m.epoch, m.inSync = RoleStandby, a, e, false
	m.heardLater = 0
	m.ready, m.jumped = false, false
	m.endContests()
	m.emit(Action{Kind: ActStream, On: false})
	m.publish(false)
	m.emit(Action{Kind: ActFollow, To: a, Epoch: e})
}

// candidate is the member that should promote itself now that no live
// active is known: the highest-priority live standby in sync, else the
// live member with the highest stored epoch, ties by priority.
func (m *Member) candidate(now int64) int {
	type cand struct {
		i      int
		inSync bool
		stored uint64
	}
	list := []cand{{m.self, m.inSync && m.active >= 0, m.peers[m.self].storedEpoch}}
	for i := range m.peers {
		if i != m.self && m.live(i, now) && m.peers[i].role == RoleStandby {
			list = append(list, cand{i, m.peers[i].inSync, m.peers[i].storedEpoch})
		}
	}
	best := 0
	mixed := m.mixed(now)
	for k, x := range list[1:] {
		b := list[best]
		switch {
		case x.inSync != b.inSync:
			if x.inSync {
				best = k + 1
			}
		case x.inSync:
			if m.before(x.i, b.i, mixed) {
				best = k + 1
			}
		case x.stored != b.stored:
			if x.stored > b.stored {
				best = k + 1
			}
		case m.before(x.i, b.i, mixed):
			best = k + 1
		}
	}
	return list[best].i
}

// nextEpoch is the epoch above every epoch seen. There is none when the
// highest seen is 2^64-1: each promotion adds one, so only a corrupt data
// dir or a forged message brings it there, and one more would wrap to 0,
// the earliest of all. The member then refuses to promote and to hand
// over (epochSpent), and says so.
func (m *Member) nextEpoch() (uint64, bool) {
	if m.maxEpoch == math.MaxUint64 {
		m.epochSpent = true
		return 0, false
	}
	return m.maxEpoch + 1, true
}

// promote makes this member the active by failover, with a new epoch
// above every epoch seen; it refuses when there is none (nextEpoch).
func (m *Member) promote(now int64) {
	e, ok := m.nextEpoch()
	if !ok {
		return
	}
	base, anc, root := m.followedBase()
	m.promoteAt(e)
	m.failovers++
	m.becomeActive(now, "the failover rules", base, 0, true)
	m.ancestors, m.root = anc, root
}

// followedBase is the table this standby holds, as a promotion records
// it: the active it follows at its epoch when it holds all of it (in
// sync: a snapshot that is not complete counts as nothing), else none;
// and that active's lineage and root, as its heartbeats at that epoch gave
// them, which this member's table shares (rootOfBase when not heard).
func (m *Member) followedBase() (Base, Lineage, uint64) {
	if m.role == RoleStandby && m.inSync && m.active >= 0 && m.active != m.self {
		anc, root := noLineage(), uint64(rootOfBase)
		if p := &m.peers[m.active]; p.epoch == m.epoch && (p.role == RoleActive || p.role == RoleHandover) {
			anc, root = inherit(p.lineage[:]), p.root
		}
		return Base{From: m.active, Epoch: m.epoch}, anc, root
	}
	return Base{From: None}, noLineage(), rootOfBase
}

// promoteAt makes this member the active at epoch e.
func (m *Member) promoteAt(e uint64) {
	m.maxEpoch = max(m.maxEpoch, e)
	m.role, m.epoch, m.active, m.hand.to = RoleActive, e, m.self, None
	m.peers[m.self].storedEpoch = e
	m.endContests()
	// A held heartbeat heard before this member became active was no
	// answer to it (an active holds while it reserves at its own
	// promotion, or checks a freeze): the contest waits for one sent since.
	for i := range m.peers {
		m.peers[i].held = false
	}
}

// snapshotApplied records that member from applied this active's snapshot
// sent at epoch e (its Ack(snapshot)): it is a standby of this member at
// e, in sync, as its next heartbeat will say. An active about to hand over
// must not wait for that heartbeat: a member that was just handed the
// role (or that just came back) has standbys whose last heartbeats still
// name the active before it. A heartbeat at an epoch above e, or one at e
// that says something else (leaving, say), is newer than the
// acknowledgement and stands; so does a member's leaving.
func (m *Member) snapshotApplied(from int, e uint64) {
	if from == m.self || from < 0 || from >= m.n || (m.role != RoleActive && m.role != RoleHandover) || e != m.epoch {
		return
	}
	p := &m.peers[from]
	switch {
	case !p.known || p.epoch > e || p.role == RoleLeaving:
		return
	case p.epoch < e:
		p.role, p.follows, p.inSync, p.epoch = RoleStandby, m.self, true, e
	case p.role == RoleStandby && p.follows == m.self:
		p.inSync = true
	}
}

// successor is the live standby an active hands over to on shutdown: the
// highest-priority one that is in sync with it and not in skip (a bit per
// member), or None.
func (m *Member) successor(now int64, skip uint64) int {
	for i := range m.peers {
		if i != m.self && skip&(1<<i) == 0 && m.inSyncStandby(i, now) {
			return i
		}
	}
	return None
}

// inSyncStandby reports whether member i is, in this active's view at now,
// a live standby following it at its epoch, in sync.
func (m *Member) inSyncStandby(i int, now int64) bool {
	p := &m.peers[i]
	return m.live(i, now) && p.role == RoleStandby && p.follows == m.self && p.inSync && p.epoch == m.epoch
}

// successorViews says, for each other member, what this member knows of it
// as a successor at now (why it is not one, or "successor"): the log line
// of a shutdown without a successor.
func (m *Member) successorViews(now int64) []string {
	var out []string
	for i := range m.peers {
		if i == m.self {
			continue
		}
		p := &m.peers[i]
		var why []string
		switch {
		case !p.known:
			why = append(why, "never heard")
		case p.role == RoleLeaving:
			why = append(why, "leaving")
		case now-p.heard >= m.timeout:
			why = append(why, fmt.Sprintf("silent %v", time.Duration(now-p.heard)))
		}
		if p.known {
			if p.role != RoleStandby && p.role != RoleLeaving {
				why = append(why, "role "+p.role.String())
			}
			if p.follows != m.self {
				why = append(why, fmt.Sprintf("follows %d", p.follows))
			}
			if !p.inSync {
				why = append(why, "not in sync")
			}
			if p.epoch != m.epoch {
				why = append(why, fmt.Sprintf("epoch %d, not %d", p.epoch, m.epoch))
			}
		}
		if len(why) == 0 {
			why = append(why, "successor")
		}
		out = append(out, fmt.Sprintf("%d: %s", i, strings.Join(why, ", ")))
	}
	return out
}
