package shard

import (
	"cmp"
	"slices"
	"sync"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// waiter is a queued acquire or, with watch set, a registered watch
// (PROTOCOL.md §9.4): both are linked to their Conn, so that DropConn finds
// them and the Conn's bounds count them, and both come from the same pool.
// Waiters and watches are pooled per shard and never move to another shard.
// gen counts their reuses: DropConn snapshots it under the Conn lock and
// removes the waiter or watch only if it is unchanged.
type waiter struct {
	q uint32 // waiter: 1 + index of the key's queue in shard.queues; 0 while pooled and for a watch
	e ref    // watch: the entry holding the watched grant (the key's or a holder entry)
	// next and prev: a waiter's key FIFO (circular); a watch's chain of the
	// watches of its token (nil-ended, the head in shard.watches); the free
	// list link while pooled.
	next, prev   *waiter
	cnext, cprev *waiter // Conn list (circular), guarded by conn.mu
	tnext, tprev *waiter // wheel slot list (waiters only)
	conn         *Conn
	owner        uint64 // waiter: the owner id; watch: the watched grant's token
	deadline     int64  // wait deadline
	queued       int64  // when it was queued (table clock)
	gen          uint64 // written under the shard lock and, while linked, conn.mu
	shard        uint32 // index of the owning shard, fixed at allocation
	ident        Ident  // the identity the acquire came from; its grant is made to it
	slot         uint16 // wheel slot
	limit        uint16 // 0: an exclusive acquire (A); 1..65535: an acquire shared (S) with this limit
	lease        uint8  // requested lease seconds
	watch        bool   // a watch, not a queued acquire
}

// maxFreeWaiters bounds a shard's free list of waiters: enough to absorb
// bursts, small enough that a table whose waiters all left holds next to
// nothing.
const maxFreeWaiters = 256

// shard is one lock-striped part of a Table. mu guards everything in it
// but quota's credits (budget.go).
//
// Its fields are ordered for the caches: a shard's lines move to the core
// of whichever event loop has a request on one of its keys next, so what
// every request reads or writes comes first, in as few lines as possible
// (an acquire and release of a new key: the first four lines, and the
// wheel's head), and shards are padded so that two of them never share a
// line (TestShardLayout).
type shard struct {
	mu    sync.Mutex
	t     *Table
	seq   uint64 // sequence of the last record made or applied here
	slab  slab   // the entries (slab.go)
	idx   index
	quota [nBudgets]quota // this shard's part of the table's bounds (budget.go)
	// hooks = nwatch + len(forced): the end of a grant owes more than its
	// record.
	hooks   int
	nshared int  // queues of shared keys (limit ≠ 0): a shard with none skips their checks
	untidy  bool // a free made tidy due (slab.go)
	id      uint32
	_       [16]byte
	ctr     Counters // guarded by mu
	wheel   wheel
	longs   []longKey // keys longer than inlineKey; len is their number, buffers past it are kept
	queues  []queue   // wait queues of contended keys, and what shared keys have beyond their entry
	freeQ   uint32    // 1 + index of the first free queue (0: none)
	nq      int       // queues in use
	nstale  int       // queues marked stale (queue.stale)
	freeW   *waiter
	nfreeW  int

	// Shared keys and watches (holders.go, watch.go); empty and untouched
	// on a table that has neither.
	hidx    index               // holder entries by token (mixToken)
	due     []dueHolder         // scratch of expireShared
	dueW    []*waiter           // scratch of timeoutShared
	watches watchIndex          // the watches of each watched token
	nwatch  int                 // watches registered here
	forced  map[uint64]struct{} // tokens whose lease an admin renewed (their expiry is ReasonForced)

	// Deferred records (deferred.go): exclusive grants whose records the
	// Sink's owner takes later (Config.Defer), and renews of them.
	pend   []pendGrant
	renews []pendRenew
	pendAt *[pendAtMask + 1]uint16 // findPend's first guess (deferred.go), allocated with the first grant held back
	cutSeq uint64                  // the Seq when LockedCut or LockedTake last ran: no grant before it is kept again
	// Keep the next shard's first line off this one's last, and the size
	// a multiple of a line: shards are 64-byte aligned (a size class that
	// is a multiple of 64; a large array is page-aligned).
	_ [72]byte
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

// grant gives e (the entry r: a key's entry or a holder entry) the token
// tok and a lease of lease seconds from now, for the identity id. The
// caller emits its record.
func (s *shard) grant(r ref, e *entry, now int64, lease uint8, tok uint64, id Ident) {
	e.token = tok
	e.ident = uint16(id)
	e.lease = lease
	e.deadline = now + int64(lease)*second
	s.addLease(r, e)
	s.ctr.Grants++
}

// emit numbers a record of the holder x of the key whose entry is k (x ==
// k for an exclusive key or a shared key's own holder) and sends it to the
// sink, if any.
func (s *shard) emit(kind RecordKind, k, x *entry) {
	s.seq++
	ref := s.t.sinkRef
	if ref == nil {
		return
	}
	if len(s.pend) != 0 && kind != RecordGrant && s.withheld(kind, k, x) {
		return
	}
	ref(s.record(kind, s.seq, k, x))
}

// record fills the shard's Record with the change kind, numbered seq, of
// the holder x of the key whose entry is k, as it stands now, and returns
// it (valid until the shard's next record).
func (s *shard) record(kind RecordKind, seq uint64, k, x *entry) *Record {
	r := &s.t.recs[s.id].r
	*r = Record{Kind: kind, Shard: s.id, Seq: seq, Key: s.keyOf(k), Token: x.token}
	if kind == RecordGrant || kind == RecordRenew {
		r.Lease, r.Deadline = x.lease, x.deadline
	}
	if kind == RecordGrant {
		r.Ident = s.t.idents.name(Ident(x.ident))
		if k.q != 0 {
			r.Limit = s.queues[k.q-1].limit
		}
	}
	return r
}

// paddedRecord is a shard's Record for Config.SinkRef, alone on its
// cache lines (written by whichever event loop holds the shard's lock).
type paddedRecord struct {
	r Record
	_ [128 - unsafe.Sizeof(Record{})%128]byte
}

// hooked reports whether the end of a grant owes more than its record: an
// L to its watches, or the reason of an admin's renew (watch.go).
func (s *shard) hooked() bool { return s.hooks != 0 }

// expire ends the lease of the exclusive holder e (the key's entry r, in
// the wheel) and hands the key on. It reports whether e is still held (by
// the waiter it went to).
func (s *shard) expire(r ref, e *entry, h uint64, now int64, out *Out) bool {
	s.delLease(e)
	s.ctr.Expiries++
	s.emit(RecordExpire, e, e)
	if s.hooked() {
		s.ended(e.token, s.keyOf(e), ReasonExpired, out)
	}
	// The key was freed at the lease's deadline, which the timer (a tick
	// late at most) or a lookup may process later: a waiter still waiting
	// at the deadline gets the key, even if its own wait has passed since.
	return s.vacate(r, e, h, now, e.deadline, out)
}

// vacate hands on the key of e (the entry r), whose exclusive holder has
// just left (its lease out of the wheel, its end recorded), at instant
// freed: to its queue, or it frees the key. It reports whether e is still
// held.
func (s *shard) vacate(r ref, e *entry, h uint64, now, freed int64, out *Out) bool {
	if e.q == 0 {
		s.freeEntry(r, e, h)
		return false
	}
	return s.handoff(r, e, h, now, freed, out)
}

// handoff hands on the key of e (the entry r, which has a queue), whose
// own holder has just left (its lease out of the wheel, its end recorded),
// at instant freed: a shared key's other holders stay (leave), an
// exclusive key goes to its queue (serve). The common case is written out:
// an exclusive key to the exclusive acquire at its head, whose wait has not
// passed. It reports whether e is still held.
func (s *shard) handoff(r ref, e *entry, h uint64, now, freed int64, out *Out) bool {
	q := &s.queues[e.q-1]
	if q.limit != 0 {
		return s.leave(r, e, h, r, e, now, freed, out)
	}
	if w := q.head; w.limit == 0 && w.deadline > freed {
		if tok := s.t.tokens.Next(); tok != 0 {
			s.unqueue(w)
			s.grant(r, e, now, w.lease, tok, w.ident)
			s.emitGrant(r, e, now)
			s.ctr.Handoffs++
			out.add(EffectGrant, w, tok, s.keyOf(e))
			s.freeWaiter(w)
			return true
		}
	}
	return s.serve(r, e, h, now, freed, true, out)
}

// serve grants the queue of e (the entry r, which has a queue) from its
// head for as long as the head fits, each with a new token, in this one
// step (PROTOCOL.md §4, §9.2): an exclusive acquire fits only a vacant key
// (no holder: e's own grant has ended), an acquire shared fits a vacant
// key, or a shared key with the same limit and fewer holders than it. The
// first grant on a vacant key goes to e itself and sets the key's kind (a
// shared limit, or exclusive); further ones become holder entries. A waiter
// at the head whose wait had passed at instant freed (the key's release or
// lease end) is timed out instead; one that would be granted while no token
// can be had, or beyond Config.MaxHolders, is answered Busy (EffectBusy);
// both leave the queue and serving goes on. Grants' leases count from now.
// A key left vacant is freed. It reports whether e is still held.
func (s *shard) serve(r ref, e *entry, h uint64, now, freed int64, vacant bool, out *Out) bool {
	for w := s.head(e); w != nil; w = s.head(e) {
		if w.deadline <= freed {
			s.unqueue(w)
			s.ctr.Timeouts++
			out.add(EffectTimeout, w, 0, s.keyOf(e))
			s.freeWaiter(w)
			continue
		}
		q := &s.queues[e.q-1]
		limit := w.limit
		if !vacant && (limit == 0 || q.limit != limit || int(q.nx)+1 >= int(limit)) {
			break // the head does not fit: it waits, and everyone behind it
		}
		if !vacant && (!s.room() || !s.take(budgetHolders)) {
			s.unqueue(w)
			out.add(EffectBusy, w, 0, s.keyOf(e))
			s.freeWaiter(w)
			continue
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			if !vacant {
				s.give(budgetHolders)
			}
			s.ctr.NoToken++
			s.unqueue(w)
			out.add(EffectBusy, w, 0, s.keyOf(e))
			s.freeWaiter(w)
			continue
		}
		if vacant {
			// The key's kind is set before the waiter leaves: an exclusive
			// key's queue goes with its last waiter, a shared key's stays.
			if limit == 0 {
				s.unshare(q)
			} else {
				s.share(q, limit)
			}
			s.unqueue(w)
			s.grant(r, e, now, w.lease, tok, w.ident)
			if limit != 0 {
				s.queues[e.q-1].next = e.deadline
			}
			s.emitGrant(r, e, now)
			vacant = false
		} else {
			s.unqueue(w)
			x, xe := s.newHolder(e, tok)
			s.grant(x, xe, now, w.lease, tok, w.ident)
			s.bound(e, xe.deadline)
			s.emit(RecordGrant, e, xe)
		}
		s.ctr.Handoffs++
		out.add(EffectGrant, w, tok, s.keyOf(e))
		s.freeWaiter(w)
		if limit == 0 {
			break // an exclusive holder: nothing else fits
		}
	}
	if vacant {
		if e.q != 0 {
			s.unshare(&s.queues[e.q-1])
			s.freeQueue(e)
		}
		s.freeEntry(r, e, h)
		return false
	}
	return true
}

// share makes q's key shared with limit (≥ 1).
func (s *shard) share(q *queue, limit uint16) {
	if q.limit == 0 {
		s.nshared++
	}
	q.limit = limit
}

// unshare makes q's key exclusive (its further holders gone): a queue
// left stale is served no more, as an exclusive key's head never lets
// anyone in.
func (s *shard) unshare(q *queue) {
	if q.limit != 0 {
		s.nshared--
	}
	q.limit = 0
	if q.stale {
		q.stale = false
		s.nstale--
	}
}

// lookup returns key's entry, processing what is due at now first (its
// effects go to out): an exclusive lease that has ended, every shared
// holder whose lease has ended, a shared queue left stale; 0 and nil if
// the key is free.
func (s *shard) lookup(now int64, h uint64, key []byte, out *Out) (ref, *entry) {
	r, e := s.find(h, key)
	if e != nil && (e.deadline <= now || e.q != 0 && s.nshared != 0 && s.queues[e.q-1].limit != 0) && !s.settleKey(r, e, h, now, out) {
		return 0, nil
	}
	return r, e
}

// settleKey processes what is due at now on the held key of e (the entry
// r), whose lease has passed or which is shared. It reports whether the
// key is still held.
func (s *shard) settleKey(r ref, e *entry, h uint64, now int64, out *Out) bool {
	if e.q != 0 {
		if q := &s.queues[e.q-1]; q.limit != 0 {
			return (q.next > now && !q.stale) || s.expireShared(r, e, h, now, out)
		}
	}
	return e.deadline > now || s.expire(r, e, h, now, out)
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
	w.q, w.e, w.conn, w.ident, w.limit, w.watch = 0, 0, nil, NoIdent, 0, false
	if s.nfreeW >= maxFreeWaiters {
		return
	}
	w.next = s.freeW
	s.freeW = w
	s.nfreeW++
}

// enqueue queues an acquire (limit 0: exclusive; else shared) at the tail
// of the FIFO of e (the entry r). It reports false (and queues nothing) if
// c was dropped or has its Config.MaxWaitersPerConn.
func (s *shard) enqueue(r ref, e *entry, now int64, wait, lease uint8, owner uint64, limit uint16, id Ident, c *Conn) bool {
	w := s.newWaiter()
	w.conn, w.owner, w.lease, w.ident, w.limit = c, owner, lease, id, limit
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
// last waiter and the key is not shared), the wheel and its Conn's list,
// and retires its generation. The caller frees it.
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
	if q.n--; q.n == 0 && q.limit == 0 {
		s.freeQueue(s.ent(q.e))
	}
	s.wheel.delWait(w)
	if w.conn != nil {
		w.conn.unlink(w) // bumps gen under conn.mu
	} else {
		w.gen++
	}
	s.give(budgetWaiters)
}

// --- operations (s.mu held) ----------------------------------------------

func (s *shard) acquire(now int64, h uint64, key []byte, wait, lease uint8, owner uint64, id Ident, c *Conn, out *Out) (Status, uint64) {
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		if !s.room() || !s.take(budgetKeys) {
			return Busy, 0
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.give(budgetKeys)
			s.ctr.NoToken++
			return Busy, 0
		}
		r, e = s.newEntry(h, key)
		s.grant(r, e, now, lease, tok, id)
		s.emitGrant(r, e, now)
		return Granted, e.token
	}
	// wait's code, written out for the exclusive acquire.
	if wait == 0 {
		return TimedOut, 0
	}
	if int64(s.waiters(e)) >= s.t.maxPerKey || !s.take(budgetWaiters) {
		return Busy, 0
	}
	if !s.enqueue(r, e, now, wait, lease, owner, 0, id, c) {
		s.give(budgetWaiters)
		return Busy, 0
	}
	return Queued, 0
}

// wait queues an acquire on the held key of e (the entry r), or answers it
// TimedOut (wait 0) or Busy (a bound).
func (s *shard) wait(r ref, e *entry, now int64, wait, lease uint8, owner uint64, limit uint16, id Ident, c *Conn) (Status, uint64) {
	if wait == 0 {
		return TimedOut, 0
	}
	if int64(s.waiters(e)) >= s.t.maxPerKey || !s.take(budgetWaiters) {
		return Busy, 0
	}
	if !s.enqueue(r, e, now, wait, lease, owner, limit, id, c) {
		s.give(budgetWaiters)
		return Busy, 0
	}
	return Queued, 0
}

// acquireShared is acquire of a shared grant with limit (≥ 1, PROTOCOL.md
// §9.2).
func (s *shard) acquireShared(now int64, h uint64, key []byte, wait, lease uint8, owner uint64, limit uint16, id Ident, c *Conn, out *Out) (Status, uint64) {
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		if !s.room() || !s.take(budgetKeys) {
			return Busy, 0
		}
		tok := s.t.tokens.Next()
		if tok == 0 {
			s.give(budgetKeys)
			s.ctr.NoToken++
			return Busy, 0
		}
		r, e = s.newEntry(h, key)
		s.share(s.queueOf(r, e), limit)
		s.grant(r, e, now, lease, tok, id)
		s.queues[e.q-1].next = e.deadline
		s.emit(RecordGrant, e, e)
		return Granted, tok
	}
	if e.q != 0 {
		if q := &s.queues[e.q-1]; q.limit != 0 {
			if q.limit != limit {
				return Mismatch, 0
			}
			if q.n == 0 && int(q.nx)+1 < int(limit) {
				if !s.room() || !s.take(budgetHolders) {
					return Busy, 0
				}
				tok := s.t.tokens.Next()
				if tok == 0 {
					s.give(budgetHolders)
					s.ctr.NoToken++
					return Busy, 0
				}
				x, xe := s.newHolder(e, tok)
				s.grant(x, xe, now, lease, tok, id)
				s.bound(e, xe.deadline)
				s.emit(RecordGrant, e, xe)
				return Granted, tok
			}
		}
	}
	return s.wait(r, e, now, wait, lease, owner, limit, id, c)
}

// holder returns the holder of key e (the entry r) whose grant is token:
// e itself, or one of a shared key's holder entries; 0 and nil if token
// holds no grant of this key.
func (s *shard) holder(r ref, e *entry, token uint64) (ref, *entry) {
	if e.token == token {
		return r, e
	}
	if e.q == 0 {
		return 0, nil
	}
	return s.holderOf(e, token)
}

// release ends the grant token of key if it is current and who may
// (judge), and hands the key on. The grant's identity is returned with the
// result.
func (s *shard) release(now int64, h uint64, key []byte, token uint64, who Who, out *Out) (Result, Ident) {
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		return ResultNotHeld, NoIdent
	}
	if e.token != token {
		if e.q == 0 {
			return ResultNotHeld, NoIdent
		}
		return s.releaseHolder(now, h, key, r, e, token, who, out)
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
	s.emit(RecordRelease, e, e)
	if s.hooked() {
		s.ended(token, key, releaseReason(res, who), out)
	}
	if e.q == 0 {
		s.freeEntry(r, e, h)
	} else {
		s.handoff(r, e, h, now, now, out)
	}
	return res, holder
}

// releaseHolder is release of a token that is not the one in key's entry
// (the entry r, which has a queue): one of a shared key's holder entries,
// or N.
func (s *shard) releaseHolder(now int64, h uint64, key []byte, r ref, e *entry, token uint64, who Who, out *Out) (Result, Ident) {
	x, xe := s.holderOf(e, token)
	if xe == nil {
		return ResultNotHeld, NoIdent
	}
	holder := Ident(xe.ident)
	res := judge(holder, who)
	switch res {
	case ResultRefused:
		s.ctr.RefusedReleases++
		return res, holder
	case ResultForced:
		s.ctr.ForcedReleases++
	}
	s.delLease(xe)
	s.ctr.Releases++
	s.emit(RecordRelease, e, xe)
	if s.hooked() {
		s.ended(token, key, releaseReason(res, who), out)
	}
	s.leave(r, e, h, x, xe, now, now, out)
	return res, holder
}

// releaseReason is the reason a release gives the grant's watches.
func releaseReason(res Result, who Who) Reason {
	if res == ResultForced || who.Operator {
		return ReasonForced
	}
	return ReasonReleased
}

// renew restarts the lease of the grant token of key if it is current and
// who may (judge); the grant keeps its identity. The grant's identity is
// returned with the result.
func (s *shard) renew(now int64, h uint64, key []byte, lease uint8, token uint64, who Who, out *Out) (Result, Ident) {
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		return ResultNotHeld, NoIdent
	}
	x, xe := r, e
	if e.token != token {
		if e.q == 0 {
			return ResultNotHeld, NoIdent
		}
		if x, xe = s.holderOf(e, token); xe == nil {
			return ResultNotHeld, NoIdent
		}
	}
	holder := Ident(xe.ident)
	res := judge(holder, who)
	if res != ResultOK || s.hooks != 0 {
		if res == ResultRefused {
			s.ctr.RefusedRenews++
			return res, holder
		}
		s.renewed(token, res)
	}
	s.delLease(xe)
	xe.lease = lease
	xe.deadline = now + int64(lease)*second
	s.addLease(x, xe)
	if e.q != 0 {
		s.bound(e, xe.deadline)
	}
	s.ctr.Renews++
	s.emit(RecordRenew, e, xe)
	return res, holder
}

// renewed notes who renewed the grant token (res ResultOK or
// ResultForced): an admin's renew of another identity's grant makes its
// expiry ReasonForced, its own identity's renew undoes that.
func (s *shard) renewed(token uint64, res Result) {
	if res == ResultForced {
		s.ctr.ForcedRenews++
		s.markForced(token)
	} else {
		s.unmarkForced(token)
	}
}

// tick fires every lease and wait deadline ≤ now.
func (s *shard) tick(now int64, out *Out) {
	w := &s.wheel
	from, to := w.span(now)
	// Every due lease first, then every due wait: a waiter still waiting
	// when its key's lease ended gets the key (serve compares with the
	// lease's deadline), even if its own wait has passed since — whatever
	// the order of their slots in this span (a span of a whole rotation,
	// after a stall, does not visit slots in deadline order).
	for t := from; t <= to; t++ {
		i := uint64(t) & w.mask
		// Expiring an exclusive e touches only e and its own waiters (a
		// re-grant may file e again, possibly in this slot, at the head; a
		// freed entry goes to the free list, and nothing moves before
		// tidy): the saved next stays valid. A shared key's expiry may free
		// holder entries, the saved next among them, and reuse them for
		// new holders: the walk starts the slot again (what it passes again
		// is not due).
		for r := w.leases[i]; r != 0; {
			e := s.ent(r)
			next := e.tnext
			if e.deadline <= now && s.expireDue(r, e, now, out) {
				next = w.leases[i]
			}
			r = next
		}
	}
	if s.nstale != 0 {
		s.serveStale(now, out)
	}
	for t := from; t <= to; t++ {
		i := uint64(t) & w.mask
		for x := w.waits[i]; x != nil; {
			next := x.tnext
			if x.deadline <= now && s.timeoutDue(x, now, out) {
				next = w.waits[i]
			}
			x = next
		}
	}
	w.done(to)
}

// expireDue ends the lease of the holder r (e) that tick found due: an
// exclusive key's, or every due one of a shared key (expireShared). It
// reports whether the tick must walk the wheel slot again (a shared key's
// holder entries may have been freed and reused).
func (s *shard) expireDue(r ref, e *entry, now int64, out *Out) bool {
	if kr, ke := s.sharedKey(r, e); ke != nil {
		s.expireShared(kr, ke, xxhash.Sum64(s.keyOf(ke)), now, out)
		return true
	}
	s.expire(r, e, xxhash.Sum64(s.keyOf(e)), now, out)
	return false
}

// timeoutDue times out the waiter x that tick found due, or every due one
// of its key if the key is shared (timeoutShared). It reports whether the
// tick must walk the wheel slot again (serving a shared key's queue may
// unqueue waiters of the slot).
func (s *shard) timeoutDue(x *waiter, now int64, out *Out) bool {
	kr := s.queues[x.q-1].e
	e := s.ent(kr)
	if s.sharedQueue(e) != nil {
		s.timeoutShared(kr, e, now, out)
		return true
	}
	s.unqueue(x)
	s.ctr.Timeouts++
	out.add(EffectTimeout, x, 0, s.keyOf(e))
	s.freeWaiter(x)
	return false
}

// timeoutShared times out every waiter of the shared key e (the entry r)
// whose wait deadline is ≤ now, in deadline order (then queue order), each
// followed by serving the queue as of its deadline: a waiter that held up
// the ones behind it (an A, or an S of another limit, at the head) lets in
// those that fit and were still waiting then.
func (s *shard) timeoutShared(r ref, e *entry, now int64, out *Out) {
	due := s.dueW[:0]
	for w, first := s.head(e), s.head(e); w != nil; {
		if w.deadline <= now {
			due = append(due, w)
		}
		if w = w.next; w == first {
			break
		}
	}
	slices.SortStableFunc(due, func(a, b *waiter) int { return cmp.Compare(a.deadline, b.deadline) })
	h := xxhash.Sum64(s.keyOf(e))
	for _, w := range due {
		if w.q == 0 {
			continue // served or timed out since
		}
		freed := w.deadline
		s.unqueue(w)
		s.ctr.Timeouts++
		out.add(EffectTimeout, w, 0, s.keyOf(e))
		s.freeWaiter(w)
		s.serve(r, e, h, now, freed, false, out)
	}
	clear(due)
	if s.dueW = due[:0]; cap(due) > maxKeptDue {
		s.dueW = nil
	}
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

// dropWaiter removes the queued acquire w (DropWaiters). A waiter that
// leaves the head of a shared key's queue may have held up the ones behind
// it: the queue is marked stale, to be served by the next Tick or lookup
// (there is no Out to answer them in here).
func (s *shard) dropWaiter(w *waiter) {
	q := &s.queues[w.q-1]
	stale := q.limit != 0 && q.head == w && !q.stale
	s.unqueue(w)
	s.freeWaiter(w)
	if stale {
		q.stale = true // a shared key's queue stays when its last waiter leaves
		s.nstale++
	}
}

// serveStale serves every queue marked stale (shared keys only: unshare
// clears the mark).
func (s *shard) serveStale(now int64, out *Out) {
	for i := 0; s.nstale != 0 && i < len(s.queues); i++ {
		if q := &s.queues[i]; q.stale {
			q.stale = false
			s.nstale--
			r := q.e
			e := s.ent(r)
			s.serve(r, e, xxhash.Sum64(s.keyOf(e)), now, now, false, out)
		}
	}
}

// restore installs key's holder token until deadline, granted to id; limit
// 0 makes the key exclusive, else shared with that limit (restore.go has
// the rules).
func (s *shard) restore(h uint64, key []byte, token uint64, deadline int64, id Ident, limit uint16) error {
	r, e := s.find(h, key)
	if e == nil {
		if !s.room() || !s.take(budgetKeys) {
			return ErrFull
		}
		r, e = s.newEntry(h, key)
		s.install(r, e, token, deadline, id, 0, limit)
		return nil
	}
	if _, xe := s.holder(r, e, token); xe != nil {
		return nil // already there
	}
	if q := s.sharedQueue(e); q != nil && limit == q.limit && int(q.nx)+1 < int(limit) {
		if !s.room() || !s.take(budgetHolders) {
			return ErrFull
		}
		x, xe := s.newHolder(e, token)
		xe.deadline, xe.ident = deadline, uint16(id)
		s.addLease(x, xe)
		s.bound(e, deadline)
		return nil
	}
	if token <= s.newest(r, e) {
		return nil
	}
	s.clearHolders(r, e, nil)
	s.install(r, e, token, deadline, id, 0, limit)
	return nil
}

// install makes e (the entry r, a new key's or one whose holders were
// cleared, out of the wheel) held by token until deadline, granted to id
// with lease seconds, exclusive (limit 0) or shared with limit.
func (s *shard) install(r ref, e *entry, token uint64, deadline int64, id Ident, lease uint8, limit uint16) {
	e.token, e.deadline, e.lease, e.ident = token, deadline, lease, uint16(id)
	s.addLease(r, e)
	if limit != 0 {
		q := s.queueOf(r, e)
		s.share(q, limit)
		q.next = deadline
	}
}
