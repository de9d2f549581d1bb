package priority

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// peerState is what a member said in its last heartbeat, and when.
type peerState struct {
	known       bool  // heard from since this member started (or resumed)
	heard       int64 // when (our clock)
	epoch       uint64
	role        role
	follows     int  // the active it follows, -1 none
	inSync      bool // a standby in sync with the active it follows
	echo        uint64
	storedEpoch uint64
	token       uint64 // the highest token it has issued or seen
	reserved    uint64 // the highest reservation it has made or seen
	mark        uint64 // the reservation mark in its data dir
	lastKnown   bool   // live when this member noticed it had been frozen
}

// change is what a step of the role machine asks the node to do.
type change struct {
	promote  bool // this member became the active
	demote   bool // this member stepped down (the active it now follows: follow)
	follow   int  // start following this active (-1: no change): reset and request a snapshot
	handover int  // start a planned handover to this member (-1: none)
	// resume: an active's freeze check ended: it may serve again, once its
	// tokens are raised (a member it did not hear from after resuming may
	// have been promoted meanwhile).
	resume bool
	// took: this member took a planned handover (takeHandoff): it promotes
	// above the tokens the old active handed over.
	took bool
}

func noChange() change { return change{follow: -1, handover: -1} }

// roles is the priority mode's role machine (PROTOCOL.md §6.2–6.3): pure
// state driven by the clock (tick) and by what the other members say
// (heard); no I/O, no goroutine, no clock read. The node holds its lock
// around every call and does what the returned change asks.
//
// Rules:
//   - a member is live while it has been heard from within the failover
//     timeout (and has not said it is leaving);
//   - at start a member listens for a failover timeout; an active heard
//     meanwhile is followed at once;
//   - with no live active, the highest-priority live standby that is in
//     sync promotes itself; when none is in sync, the live member whose
//     data dir holds the highest epoch (the last active), ties broken by
//     priority;
//   - two actives: the one that became active earlier (lower epoch; equal
//     epochs: lower priority) steps down and follows the other;
//   - an active hands over to a live, in-sync member of higher priority
//     (rejoin), and on shutdown to the best live in-sync standby;
//   - a planned handover (MEMBER-LINK.md, "Planned handover") is decided by
//     the successor alone, and only once: the old active offers an epoch
//     and executes nothing until the successor says it took it (or is
//     heard as the active at it) or refused it; a successor that is asked
//     to decide (HandoffAbort) before it saw the offer refuses that epoch
//     for good; when the successor goes silent before a verdict, the old
//     active becomes a standby without an active and the rules above
//     decide (it never serves again from the handover's side);
//   - a member whose ticks stopped for more than half the timeout (frozen,
//     stalled) does nothing from its stale view until every member it knew
//     as live has echoed a heartbeat it sent after resuming, or a full
//     timeout has passed since resuming (always the timeout when it knew
//     none): an active executes nothing meanwhile, and no standby counts
//     silence it did not watch (it listens a full timeout again, as at
//     start, before it may promote).
type roles struct {
	self, n int
	timeout int64

	role     role
	epoch    uint64 // the followed active's epoch; mine when active
	maxEpoch uint64 // the highest epoch seen, including the one stored on disk
	active   int    // the active this member follows or is, -1 none known
	inSync   bool   // standby: applied a snapshot of active and the stream since

	// The old active's side of a planned handover.
	handTo      int       // RoleHandover: the successor, else -1
	handEpoch   uint64    // RoleHandover: the epoch offered to handTo
	handSince   int64     // RoleHandover: when it was offered
	handAsked   int64     // when the successor was last asked to decide (HandoffAbort), 0 never
	handOutcome handState // how the last handover ended (handOffered while it runs)
	handResult  int       // the member it ended with: the successor, or the active that superseded it
	// The successor's side: the handoff this member took, and the highest
	// epoch it refused (it never takes an epoch at or below it).
	tookFrom  int
	tookEpoch uint64
	refused   uint64

	peers    []peerState
	names    []string // each member's own --peers entry (its --self as it writes it), from its Hello
	differs  []bool   // a member whose --peers differs from this one's (peers.go): priorities compare names
	probe    uint64   // number of the last heartbeat this member sent
	started  int64
	lastTick int64

	resumeProbe uint64 // freeze check in progress when > 0: the first probe sent after resuming
	resumeAt    int64

	// epochSpent: this member refused to promote or hand over because no
	// epoch is left above the highest it has seen (nextEpoch).
	epochSpent bool
	// leaving: this member is shutting down (Stop): it never promotes
	// itself, whatever the failover rules say — a shutdown whose handover
	// was left undecided or lost must not come back as the active.
	leaving bool
}

func newRoles(self, n int, timeout int64, storedEpoch uint64, now int64) *roles {
	r := &roles{self: self, n: n, timeout: timeout, role: roleStandby, active: -1, handTo: -1, tookFrom: -1, handResult: -1,
		maxEpoch: storedEpoch, peers: make([]peerState, n), names: make([]string, n), differs: make([]bool, n),
		started: now, lastTick: now}
	for i := range r.peers {
		r.peers[i].follows = -1
	}
	r.peers[self].storedEpoch = storedEpoch
	return r
}

// live reports whether member i (not self) counts as live at now.
func (r *roles) live(i int, now int64) bool {
	p := &r.peers[i]
	return p.known && p.role != roleLeaving && now-p.heard < r.timeout
}

// setPeer records member i's own entry (its --self, as it writes it) and
// whether its --peers differs from this member's (peers.go).
func (r *roles) setPeer(i int, name string, differs bool) {
	if i >= 0 && i < r.n && i != r.self {
		r.names[i], r.differs[i] = name, differs
	}
}

// setSelfName records this member's own entry (newRoles' caller).
func (r *roles) setSelfName(name string) { r.names[r.self] = name }

// mixed reports whether a live member's --peers differs from this
// member's (a rolling change of --peers in progress, peers.go): the live
// members may then disagree on priorities, so every decision that several
// members must make alike orders members by their own entries instead
// (before), and no active hands over for priority.
func (r *roles) mixed(now int64) bool {
	for i := range r.peers {
		if i != r.self && r.differs[i] && r.live(i, now) {
			return true
		}
	}
	return false
}

// before reports whether member i comes before member j in priority: the
// lower index; while the lists are mixed, the smaller own entry (text),
// which every member computes alike whatever its list.
func (r *roles) before(i, j int, mixed bool) bool {
	if mixed && r.names[i] != "" && r.names[j] != "" {
		return r.names[i] < r.names[j]
	}
	return i < j
}

// beats reports whether an active (epoch e1, member i1) became active later
// than (e2, i2): higher epoch, or equal epochs and higher priority.
func (r *roles) beats(e1 uint64, i1 int, e2 uint64, i2 int, mixed bool) bool {
	return e1 > e2 || (e1 == e2 && r.before(i1, i2, mixed))
}

// checking reports whether the freeze check is in progress.
func (r *roles) checking() bool { return r.resumeProbe > 0 }

// serving reports whether this member may execute requests now.
func (r *roles) serving() bool { return r.role == roleActive && !r.checking() }

// nextProbe numbers the heartbeat about to be sent.
func (r *roles) nextProbe() uint64 {
	r.probe++
	return r.probe
}

// heard records a heartbeat of member from.
func (r *roles) heard(now int64, from int, hb peerState) change {
	c := noChange()
	if from == r.self || from < 0 || from >= r.n {
		return c
	}
	// A heartbeat read first after a stall (before the ticker ran) must
	// not decide with the stall counted as the others' silence.
	r.noticeFreeze(now)
	p := &r.peers[from]
	echo, lastKnown := max(p.echo, hb.echo), p.lastKnown
	*p = hb
	p.known, p.heard, p.echo, p.lastKnown = true, now, echo, lastKnown
	r.maxEpoch = max(r.maxEpoch, hb.epoch, hb.storedEpoch)
	return r.decide(now, c)
}

// tick advances the clock: freeze detection, liveness, promotion.
func (r *roles) tick(now int64) change {
	r.noticeFreeze(now)
	r.lastTick = now
	return r.decide(now, noChange())
}

// noticeFreeze starts the freeze check when the ticks stopped for more
// than half the timeout (frozen or stalled), whichever call comes first
// after it — the ticker's, or a heartbeat read before the ticker ran.
// What this member believed about the others is stale: the check begins
// with the next probe, and no silence it did not watch counts (a standby
// listens a full timeout again, as at start, before it may promote). It
// leaves lastTick to the ticker: only the ticker extends the gate.
func (r *roles) noticeFreeze(now int64) {
	if now-r.lastTick <= r.timeout/2 || r.checking() {
		return
	}
	r.resumeProbe = r.probe + 1
	r.resumeAt = now
	r.started = max(r.started, now)
	for i := range r.peers {
		p := &r.peers[i]
		p.lastKnown = i != r.self && p.known && p.role != roleLeaving && r.lastTick-p.heard < r.timeout
		if p.lastKnown {
			p.heard = now
		}
	}
}

// checkResumed ends the freeze check once every member live before it has
// echoed a probe sent after resuming, or a full timeout has passed, and
// reports whether it ended now. A member that knew no other as live has
// nobody to ask: it watches a full timeout (a member promoted meanwhile is
// heard, and this one steps down without serving from its stale state).
func (r *roles) checkResumed(now int64) (ended bool) {
	if !r.checking() {
		return false
	}
	if now-r.resumeAt < r.timeout {
		asked := false
		for i := range r.peers {
			p := &r.peers[i]
			if !p.lastKnown || p.role == roleLeaving {
				continue
			}
			if p.echo < r.resumeProbe {
				return false
			}
			asked = true
		}
		if !asked {
			return false
		}
	}
	r.resumeProbe = 0
	for i := range r.peers {
		r.peers[i].lastKnown = false
	}
	return true
}

// bestActive returns the live member that says it is active and became
// active last, or -1.
func (r *roles) bestActive(now int64) int {
	best := -1
	mixed := r.mixed(now)
	for i := range r.peers {
		if i == r.self || !r.live(i, now) || r.peers[i].role != roleActive {
			continue
		}
		if best < 0 || r.beats(r.peers[i].epoch, i, r.peers[best].epoch, best, mixed) {
			best = i
		}
	}
	return best
}

// laterActive returns the active that became active last as the live
// members tell it — one that says it is active, or one a live standby says
// it follows (its heartbeat carries that active's epoch) — and its epoch,
// or -1. A member may learn that it was superseded second-hand: after a
// freeze, say, from a standby that follows the new active before the new
// active itself is heard (its links reconnecting).
func (r *roles) laterActive(now int64) (int, uint64) {
	best, epoch := -1, uint64(0)
	mixed := r.mixed(now)
	consider := func(a int, e uint64) {
		if a >= 0 && a < r.n && a != r.self && (best < 0 || r.beats(e, a, epoch, best, mixed)) {
			best, epoch = a, e
		}
	}
	for i := range r.peers {
		p := &r.peers[i]
		if i == r.self || !r.live(i, now) {
			continue
		}
		switch p.role {
		case roleActive:
			consider(i, p.epoch)
		case roleStandby:
			consider(p.follows, p.epoch)
		}
	}
	return best, epoch
}

// decide applies the rules after the view changed.
func (r *roles) decide(now int64, c change) change {
	ended := r.checkResumed(now)
	switch r.role {
	case roleActive:
		if a, e := r.laterActive(now); a >= 0 && r.beats(e, a, r.epoch, r.self, r.mixed(now)) {
			// Two actives: this one became active earlier. Step down.
			r.role, r.active, r.epoch, r.inSync = roleStandby, a, e, false
			c.demote, c.follow = true, a
			return c
		}
		if ended {
			c.resume = true
		}
		if r.checking() {
			return c
		}
		// Priority order: hand over to a live, in-sync member of higher
		// priority that follows this active — not while the live members'
		// lists differ (they may disagree on the order: handovers would
		// go back and forth; the order is restored once they agree).
		if r.mixed(now) {
			return c
		}
		for i := 0; i < r.self; i++ {
			if r.inSyncStandby(i, now) {
				c.handover = i
				return c
			}
		}
	case roleHandover:
		r.decideHandover(now)
	case roleStandby:
		if a := r.bestActive(now); a >= 0 {
			if a != r.active || r.peers[a].epoch != r.epoch {
				r.active, r.epoch, r.inSync = a, r.peers[a].epoch, false
				c.follow = a
			}
			return c
		}
		if r.checking() || now-r.started < r.timeout {
			return c
		}
		if r.active >= 0 && r.active != r.self && r.live(r.active, now) && r.peers[r.active].role == roleHandover {
			return c // the active is handing over: wait for it
		}
		if !r.leaving && r.candidate(now) == r.self && r.promote() {
			c.promote = true
		}
	}
	return c
}

// candidate is the member that should promote itself now that no live
// active is known: the highest-priority live standby in sync, else the
// live member with the highest stored epoch, ties by priority.
func (r *roles) candidate(now int64) int {
	type cand struct {
		i      int
		inSync bool
		stored uint64
	}
	var list []cand
	list = append(list, cand{r.self, r.inSync && r.active >= 0, r.maxEpochStored()})
	for i := range r.peers {
		if i != r.self && r.live(i, now) && (r.peers[i].role == roleStandby) {
			list = append(list, cand{i, r.peers[i].inSync, r.peers[i].storedEpoch})
		}
	}
	best := -1
	mixed := r.mixed(now)
	for k, x := range list {
		if best < 0 {
			best = k
			continue
		}
		b := list[best]
		switch {
		case x.inSync != b.inSync:
			if x.inSync {
				best = k
			}
		case x.inSync:
			if r.before(x.i, b.i, mixed) {
				best = k
			}
		case x.stored != b.stored:
			if x.stored > b.stored {
				best = k
			}
		case r.before(x.i, b.i, mixed):
			best = k
		}
	}
	return list[best].i
}

// maxEpochStored is the epoch this member's data dir holds (set by
// newRoles and by every promotion).
func (r *roles) maxEpochStored() uint64 { return r.peers[r.self].storedEpoch }

// promote makes this member the active with a new epoch above every epoch
// seen. It refuses when there is none (nextEpoch).
func (r *roles) promote() bool {
	e, ok := r.nextEpoch()
	if ok {
		r.promoteAt(e)
	}
	return ok
}

// nextEpoch is the epoch above every epoch seen. There is none when the
// highest seen is 2^64-1: each promotion adds one, so only a corrupt data
// dir or a forged message brings it there, and one more would wrap to 0,
// the earliest of all (issue 18). The member then refuses to promote and
// to hand over (epochSpent), and the node logs it.
func (r *roles) nextEpoch() (uint64, bool) {
	if r.maxEpoch == math.MaxUint64 {
		r.epochSpent = true
		return 0, false
	}
	return r.maxEpoch + 1, true
}

// promoteAt makes this member the active with epoch e (a planned
// handover names it).
func (r *roles) promoteAt(e uint64) {
	r.maxEpoch = max(r.maxEpoch, e)
	r.role, r.epoch, r.active, r.handTo = roleActive, e, r.self, -1
	r.peers[r.self].storedEpoch = e
}

// handState is where a planned handover stands, as its old active sees it.
type handState uint8

// Handover states.
const (
	handNone       handState = iota // none since this member started
	handOffered                     // the Handoff is out, no verdict yet: execute nothing
	handTaken                       // the successor took it: this member follows it
	handRefused                     // the successor refused it: this member is the active again
	handLost                        // the successor went silent first: a standby without an active
	handSuperseded                  // another member became active later: this member follows it
	handUndecided                   // no verdict in time, the successor live: this member follows it, serving nothing
)

var handNames = [...]string{handNone: "none", handOffered: "offered", handTaken: "taken", handRefused: "refused",
	handLost: "lost", handSuperseded: "superseded", handUndecided: "undecided"}

// String names the state.
func (h handState) String() string { return nameOf(handNames[:], uint8(h), "handState") }

// offer starts a planned handover of this active to member i and returns
// the epoch it offers: above every epoch seen, so that a refused or lost
// offer's epoch is never offered again; false (and no change) when there
// is none (nextEpoch).
func (r *roles) offer(i int, now int64) (uint64, bool) {
	e, ok := r.nextEpoch()
	if !ok {
		return 0, false
	}
	r.maxEpoch = e
	r.role, r.handTo, r.handEpoch, r.handSince, r.handAsked = roleHandover, i, e, now, 0
	r.handOutcome, r.handResult = handOffered, -1
	return e, true
}

// handoffAnswer applies the successor's verdict on the offer in progress:
// Ack(handoff) of its epoch when taken; Ack(refused) otherwise, whose value
// is the epoch up to which the successor refuses every handoff (at least
// the one it refused: it never takes one at or below it again, so a
// refusal up to the offered epoch or above settles this offer, whichever
// offer it answered). This member's next offer is above it. Anything else
// is ignored.
func (r *roles) handoffAnswer(from int, v uint64, taken bool) {
	if r.role != roleHandover || from != r.handTo {
		return
	}
	switch {
	case taken && v == r.handEpoch:
		r.endHandover(handTaken, from, v)
	case !taken && v >= r.handEpoch:
		r.maxEpoch = max(r.maxEpoch, v)
		r.role, r.handTo = roleActive, -1
		r.handOutcome, r.handResult = handRefused, from
	}
}

// decideHandover is decide for a member handing over: what the others say
// can end the handover without an answer from the successor.
func (r *roles) decideHandover(now int64) {
	s := r.handTo
	switch a := r.bestActive(now); {
	case a == s && r.peers[s].epoch >= r.handEpoch:
		// The successor says it is the active at the epoch offered (or a
		// later one): it took the handover, whether or not its Ack comes.
		r.endHandover(handTaken, s, r.peers[s].epoch)
	case a >= 0 && r.beats(r.peers[a].epoch, a, r.epoch, r.self, r.mixed(now)):
		r.endHandover(handSuperseded, a, r.peers[a].epoch)
	case r.supersededSecondHand(now):
	case !r.live(s, now):
		// Silent (or leaving) before a verdict: it may have taken the
		// handover or not, and this member cannot ask. It serves nothing
		// from here: a standby without an active, which watches a full
		// timeout before the rules may promote anyone (itself included,
		// with a new epoch above the offered one).
		r.role, r.active, r.inSync, r.handTo = roleStandby, -1, false, -1
		r.handOutcome, r.handResult = handLost, s
		r.started = max(r.started, now)
	}
}

// supersededSecondHand ends a handover on what a live standby says: it
// follows the successor at the offered epoch or later (the successor took
// it), or another active that became active later than this member.
func (r *roles) supersededSecondHand(now int64) bool {
	a, e := r.laterActive(now)
	switch {
	case a == r.handTo && e >= r.handEpoch:
		r.endHandover(handTaken, a, e)
	case a >= 0 && a != r.handTo && r.beats(e, a, r.epoch, r.self, r.mixed(now)):
		r.endHandover(handSuperseded, a, e)
	default:
		return false
	}
	return true
}

// endHandover makes this member a standby of member i, the active at
// epoch e, as the handover's outcome o.
func (r *roles) endHandover(o handState, i int, e uint64) {
	r.handedOver(i, e)
	r.handOutcome, r.handResult = o, i
}

// leaveUndecided ends a handover that got no verdict in the time its owner
// allows while the successor is live: this member serves nothing and
// follows the successor, which took it or will promote by failover once
// this member leaves.
func (r *roles) leaveUndecided() {
	if r.role != roleHandover {
		return
	}
	s := r.handTo
	r.role, r.active, r.inSync, r.handTo = roleStandby, s, false, -1
	r.handOutcome, r.handResult = handUndecided, s
}

// askDue reports whether the successor should be asked (again) to decide
// the handover in progress (HandoffAbort): the offer has waited a failover
// timeout, and the last ask half of one. Asking is safe at any time: the
// successor decides once.
func (r *roles) askDue(now int64) bool {
	if r.role != roleHandover || now-r.handSince < r.timeout || (r.handAsked != 0 && now-r.handAsked < r.timeout/2) {
		return false
	}
	r.handAsked = now
	return true
}

// handover reports how the last handover stands: its state and the member
// it ended with (-1 while it runs, or when there was none).
func (r *roles) handover() (handState, int) { return r.handOutcome, r.handResult }

// takeHandoff is this member's answer to member from's Handoff at epoch e:
// taken (fresh when it promoted now; a repeated Handoff is taken again) or
// refused — then for good. It takes it only as a standby of from in sync
// with it, willing (not shutting down), for an epoch above the one it
// follows and above every epoch it refused.
// A refusal is answered with refusedUpTo.
func (r *roles) takeHandoff(from int, e uint64, willing bool) (taken, fresh bool) {
	if r.tookFrom == from && r.tookEpoch == e && r.role == roleActive && r.epoch == e {
		return true, false
	}
	if !willing || r.role != roleStandby || r.active != from || !r.inSync || e <= r.epoch || e <= r.refused {
		r.refuse(e)
		return false, false
	}
	r.promoteAt(e)
	r.tookFrom, r.tookEpoch = from, e
	return true, true
}

// abortHandoff is this member's answer to member from's HandoffAbort at
// epoch e: true when it took that handoff (or may have: its data dir holds
// an epoch at or above e, from before a restart), else it refuses e for
// good and says so.
func (r *roles) abortHandoff(from int, e uint64) (taken bool) {
	if r.tookFrom == from && r.tookEpoch == e || r.peers[r.self].storedEpoch >= e {
		return true
	}
	r.refuse(e)
	return false
}

// refusedUpTo is the epoch up to which this member refuses every handoff:
// what its Ack(refused) says (handoffAnswer).
func (r *roles) refusedUpTo() uint64 { return r.refused }

// refuse swears off epoch e: it is never taken, and every later promotion
// of this member is above it.
func (r *roles) refuse(e uint64) {
	r.refused = max(r.refused, e)
	r.maxEpoch = max(r.maxEpoch, e)
}

// handedOver makes this member a standby of successor i at epoch e.
func (r *roles) handedOver(i int, e uint64) {
	r.maxEpoch = max(r.maxEpoch, e)
	r.role, r.active, r.epoch, r.inSync, r.handTo = roleStandby, i, e, false, -1
}

// snapshotApplied records that member from applied this active's snapshot
// sent at epoch e (its Ack(snapshot)): it is a standby of this member at e,
// in sync, as its next heartbeat will say. An active about to hand over
// must not wait for that heartbeat to know: a member that was just handed
// the role (or that just came back) has standbys whose last heartbeats
// still name the active before it. A heartbeat at an epoch above e, or one
// at e that says something else (leaving, say), is newer than the
// acknowledgement and stands; so does a member's leaving.
func (r *roles) snapshotApplied(from int, e uint64) {
	if from == r.self || from < 0 || from >= r.n || (r.role != roleActive && r.role != roleHandover) || e != r.epoch {
		return
	}
	p := &r.peers[from]
	switch {
	case !p.known || p.epoch > e || p.role == roleLeaving:
		return
	case p.epoch < e:
		p.role, p.follows, p.inSync, p.epoch = roleStandby, r.self, true, e
	case p.role == roleStandby && p.follows == r.self:
		p.inSync = true
	}
}

// heardFrom records that member from said something (any frame, not only
// a heartbeat): it is live, whatever else the link carries (a snapshot of
// any size). What it said last in a heartbeat stands.
func (r *roles) heardFrom(now int64, from int) {
	if from == r.self || from < 0 || from >= r.n {
		return
	}
	if p := &r.peers[from]; p.known {
		p.heard = max(p.heard, now)
	}
}

// successor is the live standby an active hands over to on shutdown: the
// highest-priority one that is in sync with it and not in skip (a bit per
// member: those that refused already), or -1.
func (r *roles) successor(now int64, skip uint64) int {
	for i := range r.peers {
		if i != r.self && skip&(1<<i) == 0 && r.inSyncStandby(i, now) {
			return i
		}
	}
	return -1
}

// inSyncStandby reports whether member i is, in this active's view at now,
// a live standby following it at its epoch, in sync: one it may hand over
// to (successorViews says why another is not).
func (r *roles) inSyncStandby(i int, now int64) bool {
	p := &r.peers[i]
	return r.live(i, now) && p.role == roleStandby && p.follows == r.self && p.inSync && p.epoch == r.epoch
}

// successorViews says, for each other member, what this member knows of it
// as a successor at now (why it is not one, or "successor"): the log line
// a shutdown without a successor writes.
func (r *roles) successorViews(now int64) []string {
	var out []string
	for i := range r.peers {
		if i == r.self {
			continue
		}
		p := &r.peers[i]
		var why []string
		switch {
		case !p.known:
			why = append(why, "never heard")
		case p.role == roleLeaving:
			why = append(why, "leaving")
		case now-p.heard >= r.timeout:
			why = append(why, fmt.Sprintf("silent %v", time.Duration(now-p.heard)))
		}
		if p.known {
			if p.role != roleStandby && p.role != roleLeaving {
				why = append(why, "role "+p.role.String())
			}
			if p.follows != r.self {
				why = append(why, fmt.Sprintf("follows %d", p.follows))
			}
			if !p.inSync {
				why = append(why, "not in sync")
			}
			if p.epoch != r.epoch {
				why = append(why, fmt.Sprintf("epoch %d, not %d", p.epoch, r.epoch))
			}
		}
		if len(why) == 0 {
			why = append(why, "successor")
		}
		out = append(out, fmt.Sprintf("%d: %s", i, strings.Join(why, ", ")))
	}
	return out
}
