package shard

import (
	"cmp"
	"math"
	"slices"
)

// Shared keys (PROTOCOL.md §9.2). A shared key has a queue (slab.go) with
// its limit, and its holders are its own entry plus one holder entry for
// each further holder: the key's entry is one of them, not necessarily the
// oldest. Holder entries are entries of the slab (48 bytes each), each in
// the timer wheel under its own lease deadline, found by token through the
// shard's holder index (hidx, keyed by mixToken), and linked to the key's
// other holder entries in a circular list through their key bytes, in the
// order they were granted (the last is the newest). The key's entry is in
// the key index as for an exclusive key, so the exclusive paths see a
// shared key only as an entry with a queue.
//
// Every holder of a shared key whose lease has ended is processed together,
// in deadline order, before anything else happens to the key (a request's
// lookup, a tick): the queue's next is a lower bound of the holders'
// deadlines, so a lookup before it costs one comparison.

// mixToken spreads a token's bits over the 64 (the holder and watch
// indexes place keys by their low bits; tokens are sequential).
func mixToken(t uint64) uint64 {
	t ^= t >> 33
	t *= 0xff51afd7ed558ccd
	t ^= t >> 33
	t *= 0xc4ceb9fe1a85ec53
	t ^= t >> 33
	return t
}

// The list links of a holder entry, in its key bytes.
func hnext(e *entry) ref { return ref(le32(e.key[0:4])) }
func hprev(e *entry) ref { return ref(le32(e.key[4:8])) }

func setHnext(e *entry, r ref) { putLe32(e.key[0:4], uint32(r)) }
func setHprev(e *entry, r ref) { putLe32(e.key[4:8], uint32(r)) }

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func putLe32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// sharedQueue returns e's queue if e's key is shared, else nil.
func (s *shard) sharedQueue(e *entry) *queue {
	if e.q != 0 {
		if q := &s.queues[e.q-1]; q.limit != 0 {
			return q
		}
	}
	return nil
}

// sharedKey returns the key entry of r (e) if r is a holder of a shared
// key (its key's entry or a holder entry), else 0 and nil.
func (s *shard) sharedKey(r ref, e *entry) (ref, *entry) {
	if e.kl == klHolder {
		kr := s.queues[e.q-1].e
		return kr, s.ent(kr)
	}
	if s.sharedQueue(e) != nil {
		return r, e
	}
	return 0, nil
}

// holderOf returns the holder entry of token among the further holders of
// e's key, or 0 and nil (e has a queue).
func (s *shard) holderOf(e *entry, token uint64) (ref, *entry) {
	if s.queues[e.q-1].nx == 0 {
		return 0, nil
	}
	x := &s.hidx
	h := mixToken(token)
	h32 := uint32(h)
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		sl := x.slots[i]
		if sl.r == 0 {
			return 0, nil
		}
		if sl.h == h32 {
			if xe := s.ent(sl.r); xe.token == token {
				if xe.q != e.q {
					return 0, nil // a holder of another key
				}
				return sl.r, xe
			}
		}
	}
}

// bound lowers the shared key e's lower bound of its holders' deadlines to
// deadline (nothing for an exclusive key).
func (s *shard) bound(e *entry, deadline int64) {
	if q := s.sharedQueue(e); q != nil && deadline < q.next {
		q.next = deadline
	}
}

// newHolder adds a holder entry with token to the shared key e (room and
// Config.MaxHolders reserved by the caller) and indexes it by token. The
// key's list stays in token order, the newest last: a grant's token is
// the largest yet, so it goes at the end at once; a restore may come in
// any order. Its lease is the caller's to set and file.
func (s *shard) newHolder(e *entry, token uint64) (ref, *entry) {
	x, xe := s.alloc()
	xe.kl = klHolder
	xe.q = e.q
	xe.token = token
	q := &s.queues[e.q-1]
	if q.hx == 0 {
		setHnext(xe, x)
		setHprev(xe, x)
		q.hx = x
	} else {
		first := q.hx
		after := hprev(s.ent(first)) // the newest
		for s.ent(after).token > token {
			if after == first {
				after = 0
				break
			}
			after = hprev(s.ent(after))
		}
		if after == 0 { // the oldest: the new first
			after = hprev(s.ent(first))
			q.hx = x
		}
		next := hnext(s.ent(after))
		setHnext(s.ent(after), x)
		setHprev(xe, after)
		setHnext(xe, next)
		setHprev(s.ent(next), x)
	}
	q.nx++
	s.hidx.insert(mixToken(token), x)
	return x, xe
}

// dropHolder removes the holder entry x (xe, out of the wheel) from its
// key's list and the holder index, and frees it.
func (s *shard) dropHolder(q *queue, x ref, xe *entry) {
	if n := hnext(xe); n == x {
		q.hx = 0
	} else {
		p := hprev(xe)
		setHnext(s.ent(p), n)
		setHprev(s.ent(n), p)
		if q.hx == x {
			q.hx = n
		}
	}
	q.nx--
	s.hidx.remove(mixToken(xe.token), x)
	s.give(budgetHolders)
	s.recycle(x, xe)
}

// moveHolder repoints what names the holder entry from, now at to (move).
func (s *shard) moveHolder(from, to ref, dst *entry) {
	s.hidx.repoint(mixToken(dst.token), from, to)
	q := &s.queues[dst.q-1]
	if n := hnext(dst); n == from {
		setHnext(dst, to)
		setHprev(dst, to)
	} else {
		setHprev(s.ent(n), to)
		setHnext(s.ent(hprev(dst)), to)
	}
	if q.hx == from {
		q.hx = to
	}
}

// promote moves the newest holder entry of the shared key e (the entry r,
// whose own grant has ended and is out of the wheel) into e, and frees it.
func (s *shard) promote(r ref, e *entry, q *queue) {
	y := hprev(s.ent(q.hx)) // the newest
	ye := s.ent(y)
	s.delLease(ye)
	e.token, e.deadline, e.ident, e.lease = ye.token, ye.deadline, ye.ident, ye.lease
	s.addLease(r, e)
	if s.nwatch != 0 {
		s.repointWatches(e.token, r)
	}
	s.dropHolder(q, y, ye)
}

// leave removes the holder x (xe: e itself, or a holder entry; its lease
// out of the wheel, its end recorded) of the shared key e (the entry r)
// and serves the queue, at instant freed. It reports whether the key is
// still held.
func (s *shard) leave(r ref, e *entry, h uint64, x ref, xe *entry, now, freed int64, out *Out) bool {
	q := &s.queues[e.q-1]
	switch {
	case x != r:
		s.dropHolder(q, x, xe)
	case q.nx != 0:
		s.promote(r, e, q)
	default:
		return s.serve(r, e, h, now, freed, true, out)
	}
	return s.serve(r, e, h, now, freed, false, out)
}

// newest returns the token of the newest holder of e's key (the entry r).
func (s *shard) newest(r ref, e *entry) uint64 {
	if q := s.sharedQueue(e); q != nil && q.nx != 0 {
		return max(e.token, s.ent(hprev(s.ent(q.hx))).token)
	}
	return e.token
}

// newestEntry returns the newest holder of e's key.
func (s *shard) newestEntry(e *entry) *entry {
	if q := s.sharedQueue(e); q != nil && q.nx != 0 {
		if y := s.ent(hprev(s.ent(q.hx))); y.token > e.token {
			return y
		}
	}
	return e
}

// holders returns the number of holders of e's key.
func (s *shard) holders(e *entry) int {
	if q := s.sharedQueue(e); q != nil {
		return int(q.nx) + 1
	}
	return 1
}

// eachHolder calls fn for every holder of e's key: e first, then its
// holder entries in the order they were granted. fn must not change them.
func (s *shard) eachHolder(e *entry, fn func(x *entry)) {
	fn(e)
	if q := s.sharedQueue(e); q != nil && q.hx != 0 {
		for x := q.hx; ; {
			xe := s.ent(x)
			fn(xe)
			if x = hnext(xe); x == q.hx {
				break
			}
		}
	}
}

// maxKeptDue bounds the scratch slices a shard keeps for expireShared
// and timeoutShared between calls.
const maxKeptDue = 1024

// dueHolder is a holder whose lease has ended, for expireShared.
type dueHolder struct {
	deadline int64
	token    uint64
}

// expireShared ends every holder of the shared key e (the entry r) whose
// lease deadline is ≤ now, in deadline order (then token order), each
// followed by serving the queue at its deadline — what would have happened
// had each been processed at its own deadline — then serves a queue left
// stale. It reports whether the key is still held.
func (s *shard) expireShared(r ref, e *entry, h uint64, now int64, out *Out) bool {
	q := &s.queues[e.q-1]
	due := s.due[:0]
	next := int64(math.MaxInt64)
	for x, xe := r, e; ; {
		if xe.deadline <= now {
			due = append(due, dueHolder{xe.deadline, xe.token})
		} else {
			next = min(next, xe.deadline)
		}
		if x == r {
			x = q.hx
		} else if x = hnext(xe); x == q.hx {
			x = 0
		}
		if x == 0 {
			break
		}
		xe = s.ent(x)
	}
	q.next = next
	if len(due) > 1 {
		slices.SortFunc(due, func(a, b dueHolder) int {
			if c := cmp.Compare(a.deadline, b.deadline); c != 0 {
				return c
			}
			return cmp.Compare(a.token, b.token)
		})
	}
	if s.due = due; cap(due) > maxKeptDue {
		s.due = nil // a mass expiry's scratch is not kept
	}
	key := s.keyOf(e)
	for _, d := range due {
		if s.sharedQueue(e) == nil {
			break // an exclusive grant followed: every earlier holder is gone
		}
		x, xe := s.holder(r, e, d.token)
		if xe == nil {
			continue
		}
		s.delLease(xe)
		s.ctr.Expiries++
		s.emit(RecordExpire, e, xe)
		if s.hooked() {
			s.ended(d.token, key, ReasonExpired, out)
		}
		if !s.leave(r, e, h, x, xe, now, d.deadline, out) {
			return false
		}
	}
	if q := s.sharedQueue(e); q != nil && q.stale {
		q.stale = false
		s.nstale--
		return s.serve(r, e, h, now, now, false, out)
	}
	return true
}

// clearHolders ends every holder of e's key (the entry r) without a
// record: a replicated or restored grant replaces them, or the key is
// dropped. Their watches end with ReasonCannotTell in out (dropped without
// an effect when out is nil: a table fed by Restore serves no watches).
// e's own lease leaves the wheel and the key is left exclusive and vacant;
// its waiters stay.
func (s *shard) clearHolders(r ref, e *entry, out *Out) {
	key := s.keyOf(e)
	s.delLease(e)
	s.endedQuietly(e.token, key, out)
	q := s.sharedQueue(e)
	if q == nil {
		return
	}
	for q.hx != 0 {
		x := q.hx
		xe := s.ent(x)
		s.delLease(xe)
		s.endedQuietly(xe.token, key, out)
		s.dropHolder(q, x, xe)
	}
	s.unshare(q)
	if q.n == 0 {
		s.freeQueue(e)
	}
}

// dropKey frees the key of e (the entry r, hash h): its holders end
// (clearHolders) and its waiters leave with an EffectMoved.
func (s *shard) dropKey(r ref, e *entry, h uint64, out *Out) {
	s.clearHolders(r, e, out)
	s.dequeueAll(e, EffectMoved, out)
	s.freeEntry(r, e, h)
}
