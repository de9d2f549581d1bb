package machine

import (
	"log/slog"
	"math"
)

// Whoever would lose more stays (PROTOCOL.md §6.3). When two actives see
// each other, each holds changes the other lacks: the one that became
// active later (L), the changes it has made since it took over from E's
// table (all of its table's, from its root, when it never held E's); the
// other (E), the changes it made or received after the last position L
// had applied from it — all of them when L never held E's whole table (a
// snapshot counts only once complete). The one with fewer steps down; on a
// tie, E (docs/PROTOCOL.md decision 71). So a member that promoted with a partial or empty table yields
// to a live active that kept the replicated table, while a frozen
// ex-active still yields to a successor that has served since.
//
// Positions are counts of changes: the sum of a table's shard sequences,
// which a standby's copy shares with its active's table (Heartbeat.Pos).
// Only L decides, so the two can never both step down, nor both stay:
//
//   - E, on hearing L, stops executing: its gate sends requests to L (M),
//     its table stays, and from its next heartbeat on its position is
//     final (Heartbeat.Held);
//   - L, on E's first held heartbeat, compares what each holds that the
//     other lacks. Their tables are the same up to the position of E's
//     table (at E's epoch) that L holds whole — through its base or a table
//     of its lineage (a standby promoted with its active's whole table
//     holds what that active held; a handover's successor has its
//     predecessor's base and lineage: the chain of handovers is one
//     active) — else up to the lesser of their positions of a third
//     member's table both hold, else 0 (shared). E's changes are its
//     position less that; L's, its position less that or its root (where
//     its chain of whole tables began from a partial or empty one),
//     whichever is higher. L steps down if it has fewer, else
//     it tells E so in every heartbeat to it (Heartbeat.Verdict: E's
//     epoch), and E steps down on reading it;
//   - E serves again when no later active is left (L stepped down and
//     follows it, or went silent), once a reservation is made above
//     every token L issued (tokens.go).
//
// L answers nothing (its gate holds) from the moment it hears E until the
// two are compared — E holds from its next heartbeat — and it compares
// before its gate first opens (its promotion's or a resume's reservation
// done): serving meanwhile, it answered from a table it might discard a
// heartbeat later (N to a renew of a lock E holds, grants lost with the
// step-down). An E that does not hold within a failover timeout is served
// beside (judgeEarlier; unready says so after two). A later active E hears
// only second-hand (a standby follows it) also stops E executing, until it
// is heard or gone: E never steps down on hearsay, which cost a replicated
// table before.

// yieldsToLater handles this active's side as E: a live active that
// became active later, heard directly (or second-hand), makes it execute
// nothing until that one's verdict; the verdict makes it step down. It
// reports whether this member does not serve (it stepped down, or waits).
func (m *Member) yieldsToLater(now int64) bool {
	mixed := m.mixed(now)
	later := None
	for i := range m.peers {
		p := &m.peers[i]
		if i == m.self || !m.live(i, now) || (p.role != RoleActive && p.role != RoleHandover) ||
			!m.beats(p.epoch, i, m.epoch, m.self, mixed) {
			continue
		}
		if later < 0 || m.beats(p.epoch, i, m.peers[later].epoch, later, mixed) {
			later = i
		}
	}
	if later >= 0 && m.peers[later].verdict == m.epoch {
		p := &m.peers[later]
		m.stepDown(now, later, p.epoch, "another member became active later and would lose more than this one by stepping down: discarding this state and following it")
		return true
	}
	var laterEpoch uint64
	if later >= 0 {
		laterEpoch = m.peers[later].epoch
	} else if a, e := m.laterActive(now); a >= 0 && m.beats(e, a, m.epoch, m.self, mixed) {
		later, laterEpoch = a, e // second-hand: wait until it is heard, or gone
	}
	if later >= 0 {
		if m.contest != later {
			m.contest = later
			m.logf(slog.LevelWarn, "another member is active and became active later: executing nothing (M naming it) until it says which of the two steps down",
				"other", m.name(later), "its_epoch", laterEpoch, "epoch", m.epoch, "position", m.local.Pos)
			m.publish(false)
		}
		return true
	}
	if m.contest != None {
		m.logf(slog.LevelInfo, "the later active stepped down or went silent: serving again once tokens are reserved above its", "other", m.name(m.contest))
		m.contest = None
		m.resume(now, "the other active stepped down")
	}
	return false
}

// judgeEarlier handles this active's side as L: for each live active that
// became active earlier and holds (its position final), it compares what
// each would lose, and steps down (reporting true) or gives its verdict.
func (m *Member) judgeEarlier(now int64) bool {
	mixed := m.mixed(now)
	deciding := false
	defer func() {
		// Until an earlier active it hears holds, this one answers
		// nothing: serving meanwhile, it would answer from a table it may
		// discard a heartbeat later (N to a renew of a lock the other
		// holds, grants lost with the step-down). The other holds from its
		// next heartbeat; one that does not within a failover timeout is
		// served beside (unready says so after two).
		if m.deciding != deciding {
			m.deciding = deciding
			m.publish(false)
		}
	}()
	for i := range m.peers {
		p := &m.peers[i]
		if i == m.self || !m.live(i, now) || (p.role != RoleActive && p.role != RoleHandover) ||
			!m.beats(m.epoch, m.self, p.epoch, i, mixed) || (i == m.tookFrom && m.epoch == m.tookEpoch && p.epoch < m.tookEpoch) {
			// (The member that handed this one the role ends its handover
			// by this one's answer, and executes nothing meanwhile: a
			// heartbeat of its as the active, from before its offer, is
			// stale.)
			m.unresolved[i] = 0
			continue
		}
		if !p.held || !m.ready || !m.baseKnown {
			// It stops executing once it hears this member; until then
			// there is nothing final to compare.
			if m.unresolved[i] == 0 {
				m.unresolved[i] = now
			}
			deciding = deciding || now-m.unresolved[i] < m.timeout
			continue
		}
		m.unresolved[i] = 0
		if m.verdict[i] == p.epoch {
			continue
		}
		common := m.shared(i, p)
		mine := sub(m.local.Pos, max(common, m.ownRoot()))
		theirs := sub(p.pos, common)
		if mine < theirs {
			deciding = false
			m.stepDown(now, i, p.epoch, "another member became active earlier and would lose more than this one by stepping down: discarding this state and following it",
				"changes_here", mine, "changes_there", theirs)
			return true
		}
		m.verdict[i] = p.epoch
		m.logf(slog.LevelWarn, "another member became active earlier and would lose no more than this one: it steps down",
			"other", m.name(i), "its_epoch", p.epoch, "changes_here", mine, "changes_there", theirs)
	}
	return false
}

// shared is the position up to which this active's table and the table
// of member i (an earlier active, p) are the same: the position of i's
// table at its epoch that this one holds whole (through its base or a
// table of its lineage), else, where both hold a table of some third
// member at one epoch whole, the lesser of their two positions of it;
// 0 when they share nothing.
func (m *Member) shared(i int, p *peer) uint64 {
	own := m.ownLineage()
	for _, b := range own {
		if b.From == i && b.Epoch == p.epoch {
			return b.Pos
		}
	}
	var common uint64
	for _, b := range own {
		for _, c := range p.lineage {
			if b.From != None && b.From == c.From && b.Epoch == c.Epoch {
				common = max(common, min(b.Pos, c.Pos))
			}
		}
	}
	return common
}

// rootOfBase is Member.root when a whole base's root is not known: the
// base's own position stands in (only changes since count).
const rootOfBase = math.MaxUint64

// ownRoot is the position below which this active's table counts as
// nothing in a contest: where its chain of whole tables began from a
// partial or empty one (a snapshot counts only once complete). For a
// member that promoted without a whole table, its base's position; for
// one with a whole base, that base's root, as its active said it.
func (m *Member) ownRoot() uint64 {
	if m.base.From == None || m.root == rootOfBase {
		return m.handedBase().Pos
	}
	return m.root
}

// ownLineage is this active's lineage: its base as a Handoff gives it
// (handedBase), then the base's own lineage.
func (m *Member) ownLineage() Lineage {
	var l Lineage
	l[0] = m.handedBase()
	copy(l[1:], m.ancestors[:LineageLen-1])
	return l
}

// inherit is the ancestors of a table whose base is the whole table of an
// active with lineage l (or whose base l[0] a Handoff gave, with l its
// ancestors): the entries of l that name a table, nearest first, the
// oldest past LineageLen-1 forgotten.
func inherit(l []Base) Lineage {
	out := noLineage()
	n := 0
	for _, b := range l {
		if b.From != None && n < LineageLen-1 {
			out[n] = b
			n++
		}
	}
	return out
}

// noLineage names no table (a zero Base would name member 0).
func noLineage() Lineage {
	var l Lineage
	for i := range l {
		l[i].From = None
	}
	return l
}

// known is l with every entry that names no member of this cluster
// made None: a peer's message names only members this one knows.
func (m *Member) known(l Lineage) Lineage {
	for i := range l {
		if l[i].From < None || l[i].From >= m.n {
			l[i].From = None
		}
	}
	return l
}

// endContests forgets every contest of §6.3 this member was in, as it
// changes role: whom it waits for, its verdicts, the earlier actives it
// waited to hold, and the hold while it waited.
func (m *Member) endContests() {
	m.contest = None
	clear(m.verdict)
	clear(m.unresolved)
	m.deciding = false
}

// stepDown makes this active (or handing-over member) a standby of a at
// epoch e, discarding its state: the snapshot a sends replaces its table.
func (m *Member) stepDown(now int64, a int, e uint64, why string, args ...any) {
	m.demotions++
	m.promoteOp, m.resumeOp = 0, 0
	m.owed = m.owed[:0]
	m.logf(slog.LevelWarn, "stepping down: "+why, append([]any{"active", m.name(a), "epoch", m.epoch, "its_epoch", e}, args...)...)
	m.follow(now, a, e)
}

// sub is a-b, or 0 below 0.
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
