package shard

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// waiter is a queued acquire. Waiters are pooled per shard and never move to
// another shard. gen counts the waiter's reuses: DropConn snapshots it under
// the Conn lock and removes the waiter only if it is unchanged.
type waiter struct {
	q            uint32  // 1 + index of the key's queue in shard.queues; 0 while pooled
	next, prev   *waiter // key FIFO (circular); free list link while pooled
	cnext, cprev *waiter // Conn list (circular), guarded by conn.mu
	tnext, tprev *waiter // wheel slot list
	conn         *Conn
	owner        uint64
	deadline     int64  // wait deadline
	queued       int64  // when it was queued (table clock)
	gen          uint64 // written under the shard lock and, while linked, conn.mu
	shard        uint32 // index of the owning shard, fixed at allocation
	ident        Ident  // the identity the acquire came from; its grant is made to it
	slot         uint16 // wheel slot
	lease        uint8  // requested lease seconds
}

// maxFreeWaiters bounds a shard's free list of waiters: enough to absorb
// bursts, small enough that a table whose waiters all left holds next to
// nothing.
const maxFreeWaiters = 256

// shard is one lock-striped part of a Table. mu guards everything in it.
type shard struct {
	mu     sync.Mutex
	t      *Table
	id     uint32
	idx    index
	wheel  wheel
	slab   slab      // the entries (slab.go)
	longs  []longKey // keys longer than inlineKey; len is their number, buffers past it are kept
	queues []queue   // wait queues of contended keys, named by entry.q and waiter.q
	freeQ  uint32    // 1 + index of the first free queue (0: none)
	nq     int       // queues in use
	untidy bool      // a free made tidy due (slab.go)
	freeW  *waiter
	nfreeW int
	ctr    Counters // guarded by mu
	seq    uint64   // sequence of the last record made or applied here
	_      [64]byte // keep neighbouring shards' mutexes off one cache line
}

// unlock ends a Table call on s: it gives back memory that the call made
// free (settle), then releases s.mu. The hot paths write the two calls out,
// so that both inline.
func (s *shard) unlock() {
	s.settle()
	s.mu.Unlock()
}

// settle runs tidy if a free made it due.
func (s *shard) settle() {
	if s.untidy {
		s.tidy()
	}
}

const second = int64(1e9)

// --- entries -------------------------------------------------------------

// grant gives e (the entry r) the token tok and a lease of lease seconds
// from now, for the identity id.
func (s *shard) grant(r ref, e *entry, now int64, lease uint8, tok uint64, id Ident) {
	e.token = tok
	e.ident = uint16(id)
	e.lease = lease
	e.deadline = now + int64(lease)*second
	s.addLease(r, e)
	s.ctr.Grants++
	s.emit(RecordGrant, e, lease)
}

// emit numbers a record and sends it to the sink, if any.
func (s *shard) emit(kind RecordKind, e *entry, lease uint8) {
	s.seq++
	if sink := s.t.sink; sink != nil {
		r := Record{Kind: kind, Shard: s.id, Seq: s.seq, Key: s.keyOf(e), Token: e.token}
		if kind == RecordGrant || kind == RecordRenew {
			r.Lease, r.Deadline = lease, e.deadline
		}
		if kind == RecordGrant {
			r.Ident = s.t.idents.name(Ident(e.ident))
		}
		sink(r)
	}
}

// expire ends the lease of e (the entry r, in the wheel) and hands the key
// on. It reports whether e is still held (by the waiter it went to).
func (s *shard) expire(r ref, e *entry, h uint64, now int64, out *Out) bool {
	s.delLease(e)
	s.ctr.Expiries++
	s.emit(RecordExpire, e, 0)
	// The key was freed at the lease's deadline, which the timer (a tick
	// late at most) or a lookup may process later: a waiter still waiting
	// at the deadline gets the key, even if its own wait has passed since.
	return s.handoff(r, e, h, now, e.deadline, out)
}

// handoff gives e (the entry r, out of the wheel, lease ended at instant
// freed) to the first waiter whose wait had not passed at freed, timing out
// the ones before it whose wait had, or frees the key. The grant's lease
// counts from now. A waiter that would get the key while no token can be
// had is answered Busy (EffectBusy) and leaves the queue. It reports whether
// e is still held.
func (s *shard) handoff(r ref, e *entry, h uint64, now, freed int64, out *Out) bool {
	for w := s.head(e); w != nil; w = s.head(e) {
		s.unqueue(w)
		if w.deadline <= freed {
			s.ctr.Timeouts++
			out.add(EffectTimeout, w, 0, s.keyOf(e))
			s.freeWaiter(w)
			continue
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.ctr.NoToken++
			out.add(EffectBusy, w, 0, s.keyOf(e))
			s.freeWaiter(w)
			continue
		}
		s.grant(r, e, now, w.lease, tok, w.ident)
		s.ctr.Handoffs++
		out.add(EffectGrant, w, e.token, s.keyOf(e))
		s.freeWaiter(w)
		return true
	}
	s.freeEntry(r, e, h)
	return false
}

// lookup returns key's entry, processing an expiry that is due at now first
// (its effects go to out); 0 and nil if the key is free.
func (s *shard) lookup(now int64, h uint64, key []byte, out *Out) (ref, *entry) {
	r, e := s.find(h, key)
	if e != nil && e.deadline <= now && !s.expire(r, e, h, now, out) {
		return 0, nil
	}
	return r, e
}

// --- waiters -------------------------------------------------------------

func (s *shard) newWaiter() *waiter {
	w := s.freeW
	if w != nil {
		s.freeW = w.next
		w.next = nil
		s.nfreeW--
		return w
	}
	return &waiter{shard: s.id}
}

func (s *shard) freeWaiter(w *waiter) {
	w.q, w.conn, w.ident = 0, nil, NoIdent
	if s.nfreeW >= maxFreeWaiters {
		return
	}
	w.next = s.freeW
	s.freeW = w
	s.nfreeW++
}

// enqueue queues an acquire at the tail of the FIFO of e (the entry r). It
// reports false (and queues nothing) if c was dropped or has its
// Config.MaxWaitersPerConn.
func (s *shard) enqueue(r ref, e *entry, now int64, wait, lease uint8, owner uint64, id Ident, c *Conn) bool {
	w := s.newWaiter()
	w.conn, w.owner, w.lease, w.ident = c, owner, lease, id
	w.deadline = now + int64(wait)*second
	w.queued = now
	if c != nil && !c.link(w, s.t.maxPerConn) {
		s.freeWaiter(w)
		return false
	}
	q := s.queueOf(r, e)
	w.q = e.q
	if h := q.head; h == nil {
		w.next, w.prev = w, w
		q.head = w
	} else {
		tail := h.prev
		w.prev, w.next = tail, h
		tail.next = w
		h.prev = w
	}
	q.n++
	s.wheel.addWait(w)
	return true
}

// unqueue takes w out of its key's FIFO (freeing the queue if w was its
// last waiter), the wheel and its Conn's list, and retires its generation.
// The caller frees it.
func (s *shard) unqueue(w *waiter) {
	q := &s.queues[w.q-1]
	if w.next == w {
		q.head = nil
	} else {
		w.prev.next = w.next
		w.next.prev = w.prev
		if q.head == w {
			q.head = w.next
		}
	}
	w.next, w.prev = nil, nil
	if q.n--; q.n == 0 {
		s.freeQueue(s.ent(q.e))
	}
	s.wheel.delWait(w)
	if w.conn != nil {
		w.conn.unlink(w) // bumps gen under conn.mu
	} else {
		w.gen++
	}
	s.t.waiters.Add(-1)
}

// --- operations (s.mu held) ----------------------------------------------

func (s *shard) acquire(now int64, h uint64, key []byte, wait, lease uint8, owner uint64, id Ident, c *Conn, out *Out) (Status, uint64) {
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		if !s.room() || !s.t.reserve(&s.t.keys, s.t.maxKeys) {
			return Busy, 0
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.t.keys.Add(-1)
			s.ctr.NoToken++
			return Busy, 0
		}
		r, e = s.newEntry(h, key)
		s.grant(r, e, now, lease, tok, id)
		return Granted, e.token
	}
	if wait == 0 {
		return TimedOut, 0
	}
	if int64(s.waiters(e)) >= s.t.maxPerKey || !s.t.reserve(&s.t.waiters, s.t.maxWaiters) {
		return Busy, 0
	}
	if !s.enqueue(r, e, now, wait, lease, owner, id, c) {
		s.t.waiters.Add(-1)
		return Busy, 0
	}
	return Queued, 0
}

// release ends key's grant if token is current and who may (judge). The
// grant's identity is returned with the result.
func (s *shard) release(now int64, h uint64, key []byte, token uint64, who Who, out *Out) (Result, Ident) {
	r, e := s.lookup(now, h, key, out)
	if e == nil || e.token != token {
		return ResultNotHeld, NoIdent
	}
	holder := Ident(e.ident)
	res := judge(holder, who)
	switch res {
	case ResultRefused:
		s.ctr.RefusedReleases++
		return res, holder
	case ResultForced:
		s.ctr.ForcedReleases++
	}
	s.delLease(e)
	s.ctr.Releases++
	s.emit(RecordRelease, e, 0)
	s.handoff(r, e, h, now, now, out)
	return res, holder
}

// renew restarts key's lease if token is current and who may (judge); the
// grant keeps its identity. The grant's identity is returned with the
// result.
func (s *shard) renew(now int64, h uint64, key []byte, lease uint8, token uint64, who Who, out *Out) (Result, Ident) {
	r, e := s.lookup(now, h, key, out)
	if e == nil || e.token != token {
		return ResultNotHeld, NoIdent
	}
	holder := Ident(e.ident)
	res := judge(holder, who)
	switch res {
	case ResultRefused:
		s.ctr.RefusedRenews++
		return res, holder
	case ResultForced:
		s.ctr.ForcedRenews++
	}
	s.delLease(e)
	e.lease = lease
	e.deadline = now + int64(lease)*second
	s.addLease(r, e)
	s.ctr.Renews++
	s.emit(RecordRenew, e, lease)
	return res, holder
}

// tick fires every lease and wait deadline ≤ now.
func (s *shard) tick(now int64, out *Out) {
	w := &s.wheel
	from, to := w.span(now)
	// Every due lease first, then every due wait: a waiter still waiting
	// when its key's lease ended gets the key (handoff compares with the
	// lease's deadline), even if its own wait has passed since — whatever
	// the order of their slots in this span (a span of a whole rotation,
	// after a stall, does not visit slots in deadline order).
	for t := from; t <= to; t++ {
		i := uint64(t) & w.mask
		// Expiring e touches only e and its own waiters (a re-grant may file
		// e again, possibly in this slot, at the head; a freed entry goes to
		// the free list, and nothing moves before tidy): the saved next
		// stays valid.
		for r := w.leases[i]; r != 0; {
			e := s.ent(r)
			next := e.tnext
			if e.deadline <= now {
				s.expire(r, e, xxhash.Sum64(s.keyOf(e)), now, out)
			}
			r = next
		}
	}
	for t := from; t <= to; t++ {
		i := uint64(t) & w.mask
		for x := w.waits[i]; x != nil; {
			next := x.tnext
			if x.deadline <= now {
				key := s.keyOf(s.ent(s.queues[x.q-1].e))
				s.unqueue(x)
				s.ctr.Timeouts++
				out.add(EffectTimeout, x, 0, key)
				s.freeWaiter(x)
			}
			x = next
		}
	}
	w.done(to)
}

// cancel removes every waiter of the shard with an effect of kind each,
// key by key in FIFO order.
func (s *shard) cancel(kind EffectKind, out *Out) {
	for i := range s.queues {
		if q := &s.queues[i]; q.head != nil {
			s.dequeueAll(s.ent(q.e), kind, out)
		}
	}
}

// dequeueAll removes every waiter of e with an effect of kind each.
func (s *shard) dequeueAll(e *entry, kind EffectKind, out *Out) {
	for w := s.head(e); w != nil; w = s.head(e) {
		s.unqueue(w)
		out.add(kind, w, 0, s.keyOf(e))
		s.freeWaiter(w)
	}
}

// restore installs key held by token until deadline, granted to id.
func (s *shard) restore(h uint64, key []byte, token uint64, deadline int64, id Ident) error {
	r, e := s.find(h, key)
	if e == nil {
		if !s.room() || !s.t.reserve(&s.t.keys, s.t.maxKeys) {
			return ErrFull
		}
		r, e = s.newEntry(h, key)
	} else {
		if token <= e.token {
			return nil
		}
		s.delLease(e)
	}
	e.token, e.deadline, e.lease, e.ident = token, deadline, 0, uint16(id)
	s.addLease(r, e)
	return nil
}
