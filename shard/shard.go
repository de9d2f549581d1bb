package shard

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// entry is a held key. Free keys have no entry: a released or expired entry
// leaves the index and goes to its shard's bounded free list with its key
// buffer, so a steady stream of acquires and releases allocates nothing.
// The struct is kept at 80 bytes (a Go size class) because a million held
// locks means a million entries: the grant's identity is a 4-byte handle
// into the table's registry (ident.go), not a string per entry.
type entry struct {
	key      []byte // the key; the buffer is reused by the next key
	token    uint64 // current fencing token
	deadline int64  // lease deadline (ns on the caller's clock)
	tnext    *entry // wheel slot list; free list link while free
	tprev    *entry
	wq       *waiter // head of the circular FIFO of waiters; nil if uncontended
	ident    Ident   // the identity the current grant was made to (NoIdent: none)
	nwait    uint32  // len(wq)
	slot     uint16  // wheel slot
	lease    uint8   // lease seconds of the current grant or renew
}

// waiter is a queued acquire. Waiters are pooled per shard and never move to
// another shard. gen counts the waiter's reuses: DropConn snapshots it under
// the Conn lock and removes the waiter only if it is unchanged.
type waiter struct {
	e            *entry  // key waited for; nil while pooled
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

// Free-list bounds per shard: enough to absorb bursts, small enough that a
// table whose keys were all released holds next to nothing.
const (
	maxFreeEntries = 256
	maxFreeWaiters = 256
	maxKeptKey     = 128 // key buffers above this are not kept on the free list
)

// shard is one lock-striped part of a Table. mu guards everything in it.
type shard struct {
	mu     sync.Mutex
	t      *Table
	id     uint32
	idx    index
	wheel  wheel
	freeE  *entry
	nfreeE int
	freeW  *waiter
	nfreeW int
	ctr    Counters // guarded by mu
	seq    uint64   // sequence of the last record made or applied here
	_      [64]byte // keep neighbouring shards' mutexes off one cache line
}

const second = int64(1e9)

// --- entries -------------------------------------------------------------

// newEntry creates the entry of a key that is not in the index.
func (s *shard) newEntry(h uint64, key []byte) *entry {
	e := s.freeE
	if e != nil {
		s.freeE = e.tnext
		e.tnext = nil
		s.nfreeE--
	} else {
		e = new(entry)
	}
	if c := cap(e.key); c >= len(key) && c <= 2*len(key)+32 {
		e.key = append(e.key[:0], key...)
	} else {
		e.key = append(make([]byte, 0, len(key)), key...)
	}
	s.idx.insert(h, e)
	return e
}

// freeEntry removes e (no waiters, out of the wheel, key hash h) from the
// index.
func (s *shard) freeEntry(e *entry, h uint64) {
	s.idx.remove(h, e)
	s.t.keys.Add(-1)
	e.token, e.deadline, e.lease, e.ident = 0, 0, 0, NoIdent
	if s.nfreeE >= maxFreeEntries {
		return
	}
	if cap(e.key) > maxKeptKey {
		e.key = nil
	} else {
		e.key = e.key[:0]
	}
	e.tnext = s.freeE
	s.freeE = e
	s.nfreeE++
}

// grant gives e the token tok and a lease of lease seconds from now, for
// the identity id.
func (s *shard) grant(e *entry, now int64, lease uint8, tok uint64, id Ident) {
	e.token = tok
	e.ident = id
	e.lease = lease
	e.deadline = now + int64(lease)*second
	s.wheel.addLease(e)
	s.ctr.Grants++
	s.emit(RecordGrant, e, lease)
}

// emit numbers a record and sends it to the sink, if any.
func (s *shard) emit(kind RecordKind, e *entry, lease uint8) {
	s.seq++
	if sink := s.t.sink; sink != nil {
		r := Record{Kind: kind, Shard: s.id, Seq: s.seq, Key: e.key, Token: e.token}
		if kind == RecordGrant || kind == RecordRenew {
			r.Lease, r.Deadline = lease, e.deadline
		}
		if kind == RecordGrant {
			r.Ident = s.t.idents.name(e.ident)
		}
		sink(r)
	}
}

// expire ends e's lease (e is in the wheel) and hands the key on. It reports
// whether e is still held (by the waiter it went to).
func (s *shard) expire(e *entry, h uint64, now int64, out *Out) bool {
	s.wheel.delLease(e)
	s.ctr.Expiries++
	s.emit(RecordExpire, e, 0)
	// The key was freed at the lease's deadline, which the timer (a tick
	// late at most) or a lookup may process later: a waiter still waiting
	// at the deadline gets the key, even if its own wait has passed since.
	return s.handoff(e, h, now, e.deadline, out)
}

// handoff gives e (out of the wheel, lease ended at instant freed) to the
// first waiter whose wait had not passed at freed, timing out the ones
// before it whose wait had, or frees the key. The grant's lease counts from
// now. A waiter that would get the key while no token can be had is
// answered Busy (EffectBusy) and leaves the queue. It reports whether e is
// still held.
func (s *shard) handoff(e *entry, h uint64, now, freed int64, out *Out) bool {
	for e.wq != nil {
		w := e.wq
		s.unqueue(w)
		if w.deadline <= freed {
			s.ctr.Timeouts++
			out.add(EffectTimeout, w, 0, e.key)
			s.freeWaiter(w)
			continue
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.ctr.NoToken++
			out.add(EffectBusy, w, 0, e.key)
			s.freeWaiter(w)
			continue
		}
		s.grant(e, now, w.lease, tok, w.ident)
		s.ctr.Handoffs++
		out.add(EffectGrant, w, e.token, e.key)
		s.freeWaiter(w)
		return true
	}
	s.freeEntry(e, h)
	return false
}

// lookup returns key's entry, processing an expiry that is due at now first
// (its effects go to out); nil if the key is free.
func (s *shard) lookup(now int64, h uint64, key []byte, out *Out) *entry {
	e := s.idx.find(h, key)
	if e != nil && e.deadline <= now && !s.expire(e, h, now, out) {
		return nil
	}
	return e
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
	w.e, w.conn, w.ident = nil, nil, NoIdent
	if s.nfreeW >= maxFreeWaiters {
		return
	}
	w.next = s.freeW
	s.freeW = w
	s.nfreeW++
}

// enqueue queues an acquire at the tail of e's FIFO. It reports false (and
// queues nothing) if c was dropped or has its Config.MaxWaitersPerConn.
func (s *shard) enqueue(e *entry, now int64, wait, lease uint8, owner uint64, id Ident, c *Conn) bool {
	w := s.newWaiter()
	w.e, w.conn, w.owner, w.lease, w.ident = e, c, owner, lease, id
	w.deadline = now + int64(wait)*second
	w.queued = now
	if c != nil && !c.link(w, s.t.maxPerConn) {
		s.freeWaiter(w)
		return false
	}
	if h := e.wq; h == nil {
		w.next, w.prev = w, w
		e.wq = w
	} else {
		tail := h.prev
		w.prev, w.next = tail, h
		tail.next = w
		h.prev = w
	}
	e.nwait++
	s.wheel.addWait(w)
	return true
}

// unqueue takes w out of its key's FIFO, the wheel and its Conn's list, and
// retires its generation. The caller frees it.
func (s *shard) unqueue(w *waiter) {
	e := w.e
	if w.next == w {
		e.wq = nil
	} else {
		w.prev.next = w.next
		w.next.prev = w.prev
		if e.wq == w {
			e.wq = w.next
		}
	}
	w.next, w.prev = nil, nil
	e.nwait--
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
	e := s.lookup(now, h, key, out)
	if e == nil {
		if !s.t.reserve(&s.t.keys, s.t.maxKeys) {
			return Busy, 0
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.t.keys.Add(-1)
			s.ctr.NoToken++
			return Busy, 0
		}
		e = s.newEntry(h, key)
		s.grant(e, now, lease, tok, id)
		return Granted, e.token
	}
	if wait == 0 {
		return TimedOut, 0
	}
	if int64(e.nwait) >= s.t.maxPerKey || !s.t.reserve(&s.t.waiters, s.t.maxWaiters) {
		return Busy, 0
	}
	if !s.enqueue(e, now, wait, lease, owner, id, c) {
		s.t.waiters.Add(-1)
		return Busy, 0
	}
	return Queued, 0
}

// release ends key's grant if token is current and who may (judge). The
// grant's identity is returned with the result.
func (s *shard) release(now int64, h uint64, key []byte, token uint64, who Who, out *Out) (Result, Ident) {
	e := s.lookup(now, h, key, out)
	if e == nil || e.token != token {
		return ResultNotHeld, NoIdent
	}
	holder := e.ident
	res := judge(holder, who)
	switch res {
	case ResultRefused:
		s.ctr.RefusedReleases++
		return res, holder
	case ResultForced:
		s.ctr.ForcedReleases++
	}
	s.wheel.delLease(e)
	s.ctr.Releases++
	s.emit(RecordRelease, e, 0)
	s.handoff(e, h, now, now, out)
	return res, holder
}

// renew restarts key's lease if token is current and who may (judge); the
// grant keeps its identity. The grant's identity is returned with the
// result.
func (s *shard) renew(now int64, h uint64, key []byte, lease uint8, token uint64, who Who, out *Out) (Result, Ident) {
	e := s.lookup(now, h, key, out)
	if e == nil || e.token != token {
		return ResultNotHeld, NoIdent
	}
	res := judge(e.ident, who)
	switch res {
	case ResultRefused:
		s.ctr.RefusedRenews++
		return res, e.ident
	case ResultForced:
		s.ctr.ForcedRenews++
	}
	s.wheel.delLease(e)
	e.lease = lease
	e.deadline = now + int64(lease)*second
	s.wheel.addLease(e)
	s.ctr.Renews++
	s.emit(RecordRenew, e, lease)
	return res, e.ident
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
		// e again, possibly in this slot, at the head): the saved next stays
		// valid.
		for e := w.leases[i]; e != nil; {
			next := e.tnext
			if e.deadline <= now {
				s.expire(e, xxhash.Sum64(e.key), now, out)
			}
			e = next
		}
	}
	for t := from; t <= to; t++ {
		i := uint64(t) & w.mask
		for x := w.waits[i]; x != nil; {
			next := x.tnext
			if x.deadline <= now {
				key := x.e.key
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
	for _, sl := range s.idx.slots {
		if e := sl.e; e != nil {
			s.dequeueAll(e, kind, out)
		}
	}
}

// dequeueAll removes every waiter of e with an effect of kind each.
func (s *shard) dequeueAll(e *entry, kind EffectKind, out *Out) {
	for e.wq != nil {
		w := e.wq
		s.unqueue(w)
		out.add(kind, w, 0, e.key)
		s.freeWaiter(w)
	}
}

// restore installs key held by token until deadline, granted to id.
func (s *shard) restore(h uint64, key []byte, token uint64, deadline int64, id Ident) error {
	e := s.idx.find(h, key)
	if e == nil {
		if !s.t.reserve(&s.t.keys, s.t.maxKeys) {
			return ErrFull
		}
		e = s.newEntry(h, key)
	} else {
		if token <= e.token {
			return nil
		}
		s.wheel.delLease(e)
	}
	e.token, e.deadline, e.lease, e.ident = token, deadline, 0, id
	s.wheel.addLease(e)
	return nil
}
