package machine

import (
	"log/slog"
	"math"
	"time"
)

// Tokens across a failover (docs/DESIGN.md): every reservation is this
// machine's (ActReserve, carried out off the driver's goroutine, then
// MsgReserved); it extends the allocator only once the reservation is
// durable and, on an active, acknowledged by the standbys in its stream. A
// member that becomes active starts above every token and reservation it
// has seen and, after a failover, above the wall clock plus the failover
// timeout; an active that hears another active, or a member back from a
// later epoch, raises its counter above that member's tokens and holds
// requests until a reservation covers the jump.

// becomeActive starts serving as the active this member just became (its
// role and epoch set by promoteAt): requests held until its first
// reservation — above every token it has seen, the old active's given
// (above) included, and for a failover (wallFloor) above the wall clock
// plus the failover timeout — is durable and replicated; base is the
// table it became active with.
func (m *Member) becomeActive(now int64, why string, base Base, above uint64, wallFloor bool) {
	m.base, m.baseKnown, m.baseHanded, m.ancestors, m.root = base, false, false, noLineage(), rootOfBase
	m.ready, m.resumeOp, m.jumped = false, 0, false
	start := max(above, m.local.TokenLast, m.limit, m.floor, m.reservedSeen, m.local.Mark, m.jump)
	for i := range m.peers {
		p := &m.peers[i]
		start = max(start, p.token, p.reserved, p.mark)
	}
	var floor int64
	if wallFloor && !m.cfg.NoWallFloor {
		floor = m.timeout
	}
	m.publish(false) // Hold: no M naming the member it followed, nothing executed yet
	m.promoteOp = m.reserve(Reserve{Epoch: m.epoch, Barrier: true, Floor: floor, Start: start, Block: m.cfg.TokenBlock, Replicate: true})
	m.promoteWhy = why
}

// resume makes an active serve again after its freeze check, a contest it
// stayed through, or a member back from a later epoch: requests held
// while its counter jumps above the wall clock plus the failover timeout
// (a member it did not hear from may have been promoted meanwhile: its
// tokens are below that, clocks agreeing within the timeout) and above
// jump, and a reservation covers it.
func (m *Member) resume(now int64, why string) {
	if m.role != RoleActive {
		return
	}
	m.ready = false
	m.publish(false)
	var floor int64
	if !m.cfg.NoWallFloor {
		floor = m.timeout
	}
	m.resumeOp = m.reserve(Reserve{Floor: floor, Start: m.jump, Block: m.cfg.TokenBlock, Replicate: true})
	m.resumeWhy = why
}

// reserve emits reservation r under a new number, which it returns.
func (m *Member) reserve(r Reserve) uint64 {
	m.op++
	r.Op = m.op
	m.emit(Action{Kind: ActReserve, Reserve: r})
	return r.Op
}

// reserveSoon reserves ahead of the allocator (it asked, or its counter
// jumped above the reserved range): one reservation at a time; one asked
// for meanwhile follows it.
func (m *Member) reserveSoon() {
	if m.role == RoleHandover {
		// It executes nothing, and its Handoff told the successor its
		// reservation and a bound on the one in flight: one begun now
		// would go past that bound, the standbys would record it as their
		// mark, and the successor would jump above it. If the handover is
		// refused, the allocator asks again when it runs low.
		m.wantMore = false
		return
	}
	if m.steadyOp != 0 {
		m.wantMore = true
		return
	}
	m.resRetry = 0
	m.steadyOp = m.reserve(Reserve{Block: 2 * m.cfg.TokenBlock, Replicate: m.role == RoleActive || m.role == RoleHandover})
}

// tickReserve retries a failed reservation once its back-off has passed.
func (m *Member) tickReserve(now int64) {
	if m.resRetry != 0 && now >= m.resRetry && m.steadyOp == 0 {
		m.reserveSoon()
	}
}

// reserved takes the result of a reservation: the allocator is extended;
// a promotion or resume waiting for it serves.
func (m *Member) reserved(now int64, msg *Msg) {
	op := msg.Op
	if msg.Err == "" {
		if msg.Limit > m.limit {
			m.limit = msg.Limit
			m.emit(Action{Kind: ActExtend, Limit: msg.Limit})
		}
		// Durable in the data dir now: the mark the last tick measured is
		// below it (a standby that recorded it reports it as its own).
		m.local.Mark = max(m.local.Mark, msg.Limit)
		m.floor = max(m.floor, msg.Token)
		if m.resErr != "" {
			m.logf(slog.LevelInfo, "reserving tokens works again", "reserved", msg.Limit)
		}
		m.resErr, m.resBackoff, m.resRetry = "", 0, 0
	} else {
		m.resErrs++
		m.resErr = msg.Err
		m.resBackoff = min(max(2*m.resBackoff, int64(10*time.Millisecond)), int64(time.Second))
		m.resRetry = now + m.resBackoff
		if _, ok := m.resLog.Allow(now); ok {
			m.logf(slog.LevelError, "reserving tokens failed: acquires that need a new token get B until a reservation succeeds; retrying",
				"err", msg.Err, "failures", m.resErrs, "reserved", m.limit)
		}
	}
	if m.jumped && (msg.Err != "" || m.limit > m.floor) {
		// Covered, or the reservation failed: then acquires that need a
		// token get B like any acquire while reserving fails, and the
		// rest is served.
		m.jumped = false
		m.publish(false)
	}
	switch op {
	case m.steadyOp:
		m.steadyOp = 0
		if m.wantMore {
			m.wantMore = false
			m.reserveSoon()
		}
	case m.promoteOp:
		m.promoteOp = 0
		if m.role != RoleActive {
			return
		}
		if !m.baseHanded {
			m.base.Pos = msg.Pos
		}
		m.baseKnown = true
		m.emit(Action{Kind: ActStream, On: true})
		m.ready = true
		m.logf(slog.LevelInfo, "active", "epoch", m.epoch, "why", m.promoteWhy, "token_start", msg.Token, "position", msg.Pos)
		if m.judgeEarlier(now) {
			return
		}
		m.publish(false)
		m.payOwed()
	case m.resumeOp:
		m.resumeOp = 0
		if m.role != RoleActive {
			return
		}
		m.ready = true
		if m.judgeEarlier(now) {
			return
		}
		m.logf(slog.LevelInfo, "serving again", "why", m.resumeWhy, "next_token", msg.Token+1)
		m.publish(false)
		m.payOwed()
	}
}

// tokensHeard applies the token rules to a heartbeat of another member.
func (m *Member) tokensHeard(now int64, from int, hb *Heartbeat) {
	if m.role != RoleActive && m.role != RoleHandover {
		return
	}
	if m.role == RoleActive && from == m.tookFrom && m.epoch == m.tookEpoch && hb.Epoch < m.tookEpoch {
		// The member this one took the handover from, at its epoch before
		// the offer: it executed nothing after sending its Handoff, whose
		// last token and reservation this member started above. A
		// heartbeat of its from before the offer, read late, is not
		// another active's.
		return
	}
	// An active that hears another that became active later executes
	// nothing from now until the other's verdict (contest.go), and serves
	// again only through resume, which reserves above jump. Its counter
	// and heartbeat stay its own: raising them would send the other its
	// own reservation back (directly, or through a standby's mark), above
	// which it would jump again at every heartbeat of the contest.
	// A standby that follows such an active makes it yield too, in the
	// decide that follows this (second-hand: laterActive); its mark is that
	// active's reservation, which this member must not take as its own and
	// reserve above before it yields.
	mixed := m.mixed(now)
	yielding := m.role == RoleActive &&
		(m.contest != None || hb.Role == RoleActive && m.beats(hb.Epoch, from, m.epoch, m.self, mixed) ||
			hb.Role == RoleStandby && hb.Active >= 0 && hb.Active < m.n && hb.Active != m.self && m.beats(hb.Epoch, hb.Active, m.epoch, m.self, mixed))
	if hb.Mark > max(m.local.Mark, m.limit, m.reserving) {
		// Whatever the member is now, its data dir's mark is above every
		// token it ever issued. A mark above this active's own (written
		// before any standby is sent the reservation) is one the member
		// made on its own — it served on the other side of a split, say,
		// and restarted before the two met as actives — and its tokens
		// must not be undercut. A standby's mark is a reservation of this
		// active's (or of an earlier active's, below this one's): nothing
		// moves — including one this active began to write but has not
		// heard the end of (MsgReserved comes after the standbys'
		// acknowledgements, and a standby's heartbeat or a snapshot's end
		// can report the mark first).
		if yielding {
			m.jump = max(m.jump, hb.Mark)
		} else {
			m.holdAbove(hb.Mark)
			m.observe(hb.Mark)
		}
	}
	if yielding && hb.Role == RoleActive {
		m.jump = max(m.jump, max(hb.TokenLast, hb.Reserved)+2*m.cfg.TokenBlock)
	} else if m.role == RoleActive && hb.Role == RoleActive {
		// Another active (a healed partition, a frozen member): whichever
		// stays, tokens must go on above everything the other issued. Its
		// heartbeat is already a little old: since it, the other may have
		// granted up to its reservation and extended that once more (an
		// extension reserves two blocks past its last token, and a second
		// one needs a block of grants, far more than a heartbeat interval
		// allows). So this member's next token is above all of that; until
		// a reservation has made that safe, requests are held rather than
		// answered B: B says the server is full, and clients take it as
		// final.
		m.reservedSeen = max(m.reservedSeen, hb.Reserved)
		x := max(hb.TokenLast, hb.Reserved) + 2*m.cfg.TokenBlock
		m.holdAbove(x)
		m.observe(x)
	}
	if m.role == RoleActive && hb.Role != RoleActive && hb.StoredEpoch > m.epoch && hb.TokenLast < math.MaxUint64/2 {
		// A member whose data dir holds an epoch above this active's: it
		// promoted on the other side of a partition and stopped before the
		// heal, so the two never saw each other as actives. It restarted
		// with its counter above its reservation mark, which every token
		// it issued stayed below: tokens go on above it. Within the range
		// this member reserved, the counter just moves; above it, requests
		// are held until the jump is reserved (rather than answered B).
		// (Not its Reserved: as a standby of this active it echoes this
		// active's own reservations. A counter past 2^63 is no real
		// member's — tokens start near the wall clock in ns, 2^60 — and
		// the reservation above it would wrap: it is ignored.)
		switch {
		case yielding:
			// It follows a later active (or this member waits for one's
			// verdict): this member serves again only through resume,
			// which reserves above jump; reserving now would show the
			// later active a reservation above its own, and it would jump
			// again.
			m.jump = max(m.jump, hb.TokenLast)
		case hb.TokenLast > m.limit && hb.TokenLast > m.jump:
			m.jump = hb.TokenLast
			m.resume(now, "a member back from a later epoch")
		case hb.TokenLast > m.floor:
			m.observe(hb.TokenLast)
		}
	}
}

// holdAbove holds a serving active's requests when its counter is about
// to be raised to x, at or above its reserved range, until a reservation
// covers it (reserved): acquires would get B meanwhile, which says the
// server is full, and clients take B as final.
func (m *Member) holdAbove(x uint64) {
	if m.role == RoleActive && x >= m.limit && x > m.floor && m.ready && !m.jumped && m.contest == None {
		m.jumped = true
		m.publish(false)
	}
}

// observe raises the allocator's counter to at least x; above the
// reserved range an active reserves at once. Until then a grant that
// needs a token gets B, unless holdAbove has closed the gate first (the
// callers that can hold do so before they observe).
func (m *Member) observe(x uint64) {
	if x <= m.floor {
		return
	}
	m.floor = x
	m.emit(Action{Kind: ActObserve, Token: x})
	if x >= m.limit && (m.role == RoleActive || m.role == RoleHandover) {
		m.reserveSoon()
	}
}
