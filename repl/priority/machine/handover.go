package machine

import (
	"log/slog"
	"time"
)

// A planned handover (docs/MEMBER-LINK.md, "Planned handover") is decided
// by the successor alone, and once: the old active offers an epoch above
// every epoch it has seen and executes nothing until the successor says
// it took it and serves (its Ack, or its heartbeat saying it is the
// serving active at that epoch or later), or refused it. A successor asked
// to decide (HandoffAbort) before it saw the offer refuses that epoch for
// good. When the successor goes silent first, the old active becomes a
// standby without an active and the failover rules decide (it never serves
// again from the handover's side).
//
// The successor's Ack(handoff) leaves only once its gate serves: an old
// active that answers M naming it sends clients to a member that serves
// them (PROTOCOL.md §6.2: "and only then answers … with M"). From the
// moment it takes the epoch its gate holds requests (never M naming the
// old active), so a client that learns of it another way waits, then is
// served.

// offer starts a planned handover of this active to member s: gate Hold,
// the last batch cut, the Handoff sent. It reports false (nothing
// changed) when this member is not a serving active or no epoch is left.
func (m *Member) offer(s int, now int64, shutdown bool) bool {
	if m.role != RoleActive || m.checking() || m.contest != None {
		return false
	}
	e, ok := m.nextEpoch()
	if !ok {
		return false
	}
	m.maxEpoch = e
	m.role = RoleHandover
	m.hand = handover{to: s, epoch: e, since: now, outcome: HandOffered, result: None, shutdown: shutdown,
		giveUp: now + 10*m.timeout}
	if shutdown && m.stop.deadline > now {
		m.hand.giveUp = now + (m.stop.deadline-now)/2
	}
	m.publish(false) // Hold: nothing executes from here
	m.emit(Action{Kind: ActFlush})
	// A reservation in flight still completes after this: the standbys
	// record it as their mark, which the successor must be above (a mark
	// above its reservation makes it jump and reserve again before it
	// serves acquires). One asked for meanwhile (wantMore) is never begun
	// while handing over (reserveSoon).
	var pending uint64
	if m.steadyOp != 0 {
		pending = 2 * m.cfg.TokenBlock
	}
	m.emit(Action{Kind: ActHandoff, To: s, Epoch: e, Limit: max(m.reservedSeen, m.reserving), Reserve: Reserve{Block: pending}, Lineage: m.ownLineage(), Root: m.ownRoot()})
	return true
}

// handedBase is the base a Handoff gives the successor: this member's own.
// The successor holds this member's whole table, so every change made
// since that base is in it: the handover's chain is one active for a
// contest (contest.go). Before its first reservation is done (a shutdown
// may hand over then) the base's position is not measured yet; nothing
// has executed since it became active, so the position now stands in.
func (m *Member) handedBase() Base {
	b := m.base
	if !m.baseKnown {
		b.Pos = m.local.Pos
	}
	return b
}

// tickHandover asks the successor to decide once the offer has waited a
// failover timeout, and again every half timeout; past giveUp, with the
// successor still live, it leaves the handover undecided.
func (m *Member) tickHandover(now int64) {
	if m.role != RoleHandover || m.hand.outcome != HandOffered {
		return
	}
	h := &m.hand
	if now-h.since >= m.timeout && (h.asked == 0 || now-h.asked >= m.timeout/2) {
		h.asked = now
		m.logf(slog.LevelWarn, "handover not confirmed yet: asking the successor to decide",
			"successor", m.name(h.to), "epoch", h.epoch, "waited", time.Duration(now-h.since))
		m.emit(Action{Kind: ActHandoffAbort, To: h.to, Epoch: h.epoch})
	}
	if now > h.giveUp {
		m.endHandover(now, HandUndecided, h.to, h.epoch)
	}
}

// handoffAnswer takes the successor's verdict on the offer in progress:
// Ack(handoff) of its epoch when taken (and serving); Ack(refused)
// otherwise, whose value is the epoch up to which the successor refuses
// every handoff (at least the one it refused: it never takes one at or
// below it again, so a refusal up to the offered epoch or above settles
// this offer, whichever offer it answered). This member's next offer is
// above it. Anything else is ignored.
func (m *Member) handoffAnswer(now int64, from int, v uint64, taken bool) {
	if m.role != RoleHandover || from != m.hand.to || m.hand.outcome != HandOffered {
		return
	}
	switch {
	case taken && v == m.hand.epoch:
		m.endHandover(now, HandTaken, from, v)
	case !taken && v >= m.hand.epoch:
		m.maxEpoch = max(m.maxEpoch, v)
		m.role = RoleActive
		m.hand.outcome, m.hand.result = HandRefused, from
		m.logf(slog.LevelWarn, "handover refused by the successor: serving again",
			"successor", m.name(from), "epoch", m.hand.epoch, "waited", time.Duration(now-m.hand.since))
		m.publish(false)
	}
}

// decideHandover is decide for a member handing over: what the others say
// can end the handover without an answer from the successor.
func (m *Member) decideHandover(now int64) {
	s := m.hand.to
	switch a := m.bestActive(now); {
	case a == s && m.peers[s].epoch >= m.hand.epoch && m.peers[s].serving:
		// The successor says it is the serving active at the epoch offered
		// (or a later one): it took the handover, whether or not its Ack
		// comes.
		m.endHandover(now, HandTaken, s, m.peers[s].epoch)
	case a >= 0 && m.peers[a].verdict == m.epoch && m.beats(m.peers[a].epoch, a, m.epoch, m.self, m.mixed(now)):
		// An active that became active later found this member would lose
		// less (contest.go).
		m.endHandover(now, HandSuperseded, a, m.peers[a].epoch)
	case m.takenSecondHand(now):
	case !m.live(s, now):
		// Silent (or leaving) before a verdict: it may have taken the
		// handover or not, and this member cannot ask. It serves nothing
		// from here: a standby without an active, which watches a full
		// timeout before the rules may promote anyone (itself included,
		// with a new epoch above the offered one).
		m.role, m.active, m.inSync = RoleStandby, None, false
		m.hand.outcome, m.hand.result = HandLost, s
		m.ready = false
		m.started = max(m.started, now)
		m.emit(Action{Kind: ActStream, On: false})
		m.publish(false) // M with no address: queued acquires included
		m.logf(slog.LevelWarn, "the successor went silent before deciding the handover: serving nothing; the failover rules decide",
			"successor", m.name(s), "epoch", m.hand.epoch, "waited", time.Duration(now-m.hand.since))
	}
}

// takenSecondHand ends a handover on what a live standby says: it follows
// the successor at the offered epoch or later, so the successor took it.
// (The successor holds requests from the moment it takes it, so the
// clients this sends there wait until it serves.) Another active heard
// only second-hand ends nothing: whoever would lose more stays, and only
// that active can tell.
func (m *Member) takenSecondHand(now int64) bool {
	for i := range m.peers {
		p := &m.peers[i]
		if i != m.self && i != m.hand.to && m.live(i, now) && p.role == RoleStandby && p.follows == m.hand.to && p.epoch >= m.hand.epoch {
			m.endHandover(now, HandTaken, m.hand.to, p.epoch)
			return true
		}
	}
	return false
}

// endHandover makes this member a standby of member i, the active at
// epoch e, as the handover's outcome o: M naming i from now on; outside a
// shutdown it follows i.
func (m *Member) endHandover(now int64, o HandState, i int, e uint64) {
	m.maxEpoch = max(m.maxEpoch, e)
	m.role, m.active, m.epoch, m.inSync = RoleStandby, i, e, false
	m.hand.outcome, m.hand.result = o, i
	m.ready = false
	if o == HandTaken {
		m.handovers++
	}
	m.emit(Action{Kind: ActStream, On: false})
	m.publish(false) // M naming i, queued acquires included
	m.logf(slog.LevelInfo, "handed over", "to", m.name(i), "outcome", o.String(), "epoch", m.hand.epoch,
		"took", time.Duration(now-m.hand.since), "shutdown", m.hand.shutdown)
	if !m.hand.shutdown {
		m.emit(Action{Kind: ActFollow, To: i, Epoch: e})
	}
}

// takeOver is a standby's side of a planned handover: everything the old
// active sent before the Handoff has been applied (one ordered link), so
// this member decides — takes the epoch it was given, or refuses it for
// good. Taken, it promotes (its epoch stored, a reservation of its own
// above the old active's tokens) and answers once it serves; refused, it
// answers at once.
func (m *Member) takeOver(now int64, from int, e, token, reserved uint64, handed Lineage, root uint64) {
	if m.tookFrom == from && m.tookEpoch == e && m.role == RoleActive && m.epoch == e {
		m.answerWhenServing(from, e) // a repeated Handoff: taken again
		return
	}
	if m.stopping || m.role != RoleStandby || m.active != from || !m.inSync || e <= m.epoch || e <= m.refused {
		m.refuse(e)
		m.logf(slog.LevelWarn, "handover refused: not a willing standby in sync with that active, or an epoch refused before",
			"from", m.name(from), "epoch", e, "refused_up_to", m.refused)
		m.emit(Action{Kind: ActAnswer, To: from, Taken: false, Epoch: m.refused})
		return
	}
	m.reservedSeen = max(m.reservedSeen, reserved)
	m.promoteAt(e)
	m.tookFrom, m.tookEpoch = from, e
	m.handovers++
	// The old active's base and lineage, not the table this member
	// followed: the old active's changes since it became active are in
	// this table, and stepping down would lose them too (PROTOCOL.md
	// §6.3).
	m.becomeActive(now, "planned handover", handed[0], max(token, reserved), false)
	m.baseHanded = true
	m.ancestors, m.root = inherit(handed[1:]), root
	m.answerWhenServing(from, e)
}

// abortAsked answers an old active's HandoffAbort at epoch e: taken when
// this member took that handoff (once it serves), or may have (its data
// dir holds an epoch at or above e, from before a restart); else it
// refuses e for good and says so.
func (m *Member) abortAsked(from int, e uint64) {
	took := m.tookFrom == from && m.tookEpoch == e
	taken := took || m.peers[m.self].storedEpoch >= e
	if !taken {
		m.refuse(e)
	}
	m.logf(slog.LevelInfo, "the old active asked to decide its handover", "from", m.name(from), "epoch", e, "taken", taken)
	switch {
	case !taken:
		m.emit(Action{Kind: ActAnswer, To: from, Taken: false, Epoch: m.refused})
	case took && m.role == RoleActive && m.epoch == e:
		m.answerWhenServing(from, e)
	default:
		m.emit(Action{Kind: ActAnswer, To: from, Taken: true, Epoch: e})
	}
}

// answerWhenServing sends Ack(handoff, e) to member to now if this
// member's gate serves, else once it does (owed).
func (m *Member) answerWhenServing(to int, e uint64) {
	if m.servingNow() {
		m.emit(Action{Kind: ActAnswer, To: to, Taken: true, Epoch: e})
		return
	}
	for _, o := range m.owed {
		if o.to == to && o.epoch == e {
			return
		}
	}
	m.owed = append(m.owed, owed{to: to, epoch: e})
}

// payOwed sends every answer owed, now that the gate serves.
func (m *Member) payOwed() {
	for _, o := range m.owed {
		if m.role == RoleActive && m.epoch == o.epoch {
			m.emit(Action{Kind: ActAnswer, To: o.to, Taken: true, Epoch: o.epoch})
		}
	}
	m.owed = m.owed[:0]
}

// refuse swears off epoch e: it is never taken, and every later promotion
// of this member is above it.
func (m *Member) refuse(e uint64) {
	m.refused = max(m.refused, e)
	m.maxEpoch = max(m.maxEpoch, e)
}

// stopBegin starts a shutdown: a standby says it is leaving and names its
// active; an active hands over (stopStep).
func (m *Member) stopBegin(now int64, deadline int64, syncing uint64) {
	if m.stopping {
		return
	}
	m.stopping, m.leaving = true, true
	m.local.Snapshotting = syncing
	if m.role != RoleActive && m.role != RoleHandover {
		// A standby: say so at once, so the active need not wait for
		// silence.
		m.heartbeats()
		to := None
		if m.active >= 0 && m.active != m.self {
			to = m.active
		}
		m.emit(Action{Kind: ActStopped, To: to})
		return
	}
	m.stop = stopping{running: true, deadline: deadline, succ: None}
}

// stopStep carries a shutdown of the active on after every input: a
// planned handover to each live, in-sync standby in priority order until
// one takes it (a refusal leaves this member the active, so the next is
// tried: a member that refused is offered once more, above every epoch it
// said it refuses — the epoch first offered may be one it refused before,
// offered by another member this one never heard of — and not again after
// a second refusal). A handover begun before the signal (to a member of
// higher priority) ends first, within the caller's deadline.
func (m *Member) stopStep(now int64) {
	st := &m.stop
	if !st.running {
		return
	}
	if m.role == RoleHandover {
		if !st.offered && st.deadline != 0 && now >= st.deadline {
			m.lastMember(now)
		}
		return
	}
	if st.offered {
		st.offered = false
		s := st.succ
		switch m.hand.outcome {
		case HandTaken, HandSuperseded, HandUndecided:
			m.stopped(m.hand.result)
			return
		case HandLost:
			// Another live, in-sync standby promotes by failover once this
			// member is gone (its heartbeats say it is leaving).
			if next := m.successor(now, st.refused|m.local.Snapshotting|1<<s); next >= 0 {
				m.logf(slog.LevelInfo, "the successor went silent before deciding the handover: another in-sync standby takes over once this member has left",
					"standby", m.name(next))
				m.stopped(next)
				return
			}
			m.lastMember(now)
			return
		case HandRefused:
			if st.once&(1<<s) == 0 {
				st.once |= 1 << s
				m.logf(slog.LevelInfo, "the successor refused the handover: offering it once more, above the epochs it refuses", "standby", m.name(s))
			} else {
				st.refused |= 1 << s
			}
		}
	}
	switch {
	case m.role == RoleStandby && m.active >= 0:
		m.stopped(m.active) // superseded, or handed over, meanwhile
		return
	case m.role == RoleActive && m.contest != None:
		m.stopped(m.contest) // a later active decides; its clients go there
		return
	case m.role != RoleActive || st.tries >= 2*m.n:
		m.lastMember(now)
		return
	}
	succ := m.successor(now, st.refused|m.local.Snapshotting)
	if succ < 0 || !m.offer(succ, now, true) {
		m.lastMember(now)
		return
	}
	st.tries++
	st.offered, st.succ = true, succ
}

// stopped ends a shutdown: requests go to member to (None: this member
// shuts down as a single node does).
func (m *Member) stopped(to int) {
	m.stop.running = false
	m.emit(Action{Kind: ActStopped, To: to})
}

// lastMember makes this member shut down as a single node: no successor
// takes over, so its table is written at Close as the active's would be.
func (m *Member) lastMember(now int64) {
	m.keepTable = true
	m.logf(slog.LevelInfo, "no live in-sync standby: shutting down as a single node",
		"members", m.successorViews(now), "being_sent_a_snapshot", m.list(m.local.Snapshotting))
	m.stopped(None)
}
