package priority

import "math"

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
	handTo   int    // RoleHandover: the successor, else -1

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
}

func newRoles(self, n int, timeout int64, storedEpoch uint64, now int64) *roles {
	r := &roles{self: self, n: n, timeout: timeout, role: roleStandby, active: -1, handTo: -1,
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
	p := &r.peers[from]
	echo, lastKnown := max(p.echo, hb.echo), p.lastKnown
	*p = hb
	p.known, p.heard, p.echo, p.lastKnown = true, now, echo, lastKnown
	r.maxEpoch = max(r.maxEpoch, hb.epoch, hb.storedEpoch)
	return r.decide(now, c)
}

// tick advances the clock: freeze detection, liveness, promotion.
func (r *roles) tick(now int64) change {
	if now-r.lastTick > r.timeout/2 && !r.checking() {
		// Frozen or stalled: what this member believed about the others
		// is stale. Start the freeze check with the next probe, and count
		// no silence it did not watch: a standby listens a full timeout
		// again, as at start, before it may promote.
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
	r.lastTick = now
	return r.decide(now, noChange())
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

// decide applies the rules after the view changed.
func (r *roles) decide(now int64, c change) change {
	ended := r.checkResumed(now)
	switch r.role {
	case roleActive:
		if a := r.bestActive(now); a >= 0 && r.beats(r.peers[a].epoch, a, r.epoch, r.self, r.mixed(now)) {
			// Two actives: this one became active earlier. Step down.
			r.role, r.active, r.epoch, r.inSync = roleStandby, a, r.peers[a].epoch, false
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
			p := &r.peers[i]
			if r.live(i, now) && p.role == roleStandby && p.follows == r.self && p.inSync && p.epoch == r.epoch {
				c.handover = i
				return c
			}
		}
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
		if r.candidate(now) == r.self && r.promote() {
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

// startHandover moves an active to RoleHandover towards successor i and
// returns the epoch the successor must take; false (and no change) when
// there is none (nextEpoch).
func (r *roles) startHandover(i int) (uint64, bool) {
	e, ok := r.nextEpoch()
	if ok {
		r.role, r.handTo = roleHandover, i
	}
	return e, ok
}

// abortHandover returns a handing-over member to active (the successor did
// not confirm in time).
func (r *roles) abortHandover() {
	if r.role == roleHandover {
		r.role, r.handTo = roleActive, -1
	}
}

// handedOver makes this member a standby of successor i at epoch e.
func (r *roles) handedOver(i int, e uint64) {
	r.maxEpoch = max(r.maxEpoch, e)
	r.role, r.active, r.epoch, r.inSync, r.handTo = roleStandby, i, e, false, -1
}

// successor is the live standby an active hands over to on shutdown: the
// highest-priority one that is in sync with it, or -1.
func (r *roles) successor(now int64) int {
	for i := range r.peers {
		p := &r.peers[i]
		if i != r.self && r.live(i, now) && p.role == roleStandby && p.follows == r.self && p.inSync && p.epoch == r.epoch {
			return i
		}
	}
	return -1
}
