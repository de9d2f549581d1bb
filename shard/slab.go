package shard

import (
	"slices"

	"github.com/cespare/xxhash/v2"
)

// A shard keeps its entries in a slab: fixed chunks of chunkLen entries,
// allocated as the shard grows, and named by a 32-bit ref (chunk ref >>
// chunkBits, slot ref & chunkMask). Nothing in an entry is a pointer — the
// index, the timer wheel and the free list link entries by ref, a key of up
// to inlineKey bytes is stored in the entry itself, a longer one in the
// shard's longs table, and a key's wait queue, which only a contended or
// shared key has, in the shard's queues table — so the garbage collector
// never scans the chunks, and a held lock of a short key costs one 48-byte
// entry plus its share of the index (docs/DESIGN.md "Memory per lock").
//
// A shared key (PROTOCOL.md §9.2) is its key entry, which is also one of
// its holders, plus one holder entry (klHolder) for each further holder:
// an entry of the same slab, in the timer wheel under its own deadline,
// named by the shard's holder index (token → ref) instead of the key
// index, linked to the key's other holder entries through its key bytes,
// and to the key through its queue (q), which for a shared key always
// exists and carries the limit (holders.go).
//
// Refs are stable while an operation runs. Released entries go to a free
// list (LIFO: an acquire after a release reuses the entry just freed); when
// fewer than a quarter of a multi-chunk slab's entries are live, tidy moves
// the live entries above the live count into the holes below it and frees
// the chunks above, so a shard that held a million keys gives their memory
// back once they are released. tidy runs only at the end of a Table call,
// never while a loop (the tick's walk of a wheel slot) holds refs.
type ref uint32

// The slab's geometry: 512 entries of 48 bytes make a 24,576-byte chunk, a
// Go size class (no rounding waste). Refs stay below headMark (2³¹): a
// wheel link with that bit set is not a ref but the wheel slot of a list's
// head.
const (
	chunkBits = 9
	chunkLen  = 1 << chunkBits
	chunkMask = chunkLen - 1
	inlineKey = 16 // longest key stored in the entry itself

	headMark = ref(1) << 31
	maxRef   = headMark - 1

	klFree   = 0   // entry.kl of a free entry
	klHolder = 254 // entry.kl of a holder entry of a shared key (holders.go)
	klLong   = 255 // entry.kl of an entry whose key is in s.longs
)

// entry is a held key (free keys have no entry), or a further holder of a
// shared key (klHolder). Its 48 bytes (TestEntrySize): token 8, deadline 8,
// wheel links 2 × 4, queue 4, identity 2, key length 1, lease 1, inline
// key 16.
type entry struct {
	token    uint64 // current fencing token (of this holder)
	deadline int64  // lease deadline (ns on the caller's clock)
	tnext    ref    // wheel slot list; free list link while free
	tprev    ref    // wheel slot list; headMark | the slot for the slot's head
	// q is 1 + the index of the key's queue in shard.queues (0: none: no
	// waiter, not shared); a holder entry's is its key's.
	q     uint32
	ident uint16 // the Ident the current grant was made to (NoIdent: none; handles are < 2¹⁶)
	kl    uint8  // klFree; 1 + the key's length if it is inline; klLong; klHolder
	lease uint8  // lease seconds of the current grant or renew
	// key is the key itself (kl-1 bytes), or for klLong the index of its
	// buffer in shard.longs (4 bytes, little-endian), or for klHolder the
	// next and previous holder entries of the key (2 × 4 bytes,
	// little-endian).
	key [inlineKey]byte
}

// longKey is the buffer of a key longer than inlineKey bytes, and the entry
// it belongs to (so that moving the buffer or the entry can fix the other).
type longKey struct {
	b []byte
	e ref
}

// queue is what a contended or shared key has beyond its entry: the FIFO
// of its queued acquires and, for a shared key, its limit and its further
// holders. It exists while the key has a waiter or is shared.
type queue struct {
	head *waiter // circular list of the waiters; nil while none (or free)
	// next is, for a shared key, a lower bound of its holders' lease
	// deadlines: a lookup at now < next has nothing due to process.
	next  int64
	n     uint32 // waiters
	e     ref    // the key's entry; the free list link while free
	hx    ref    // shared: the first further holder entry (circular list, the last is the newest); 0: none
	nx    uint16 // shared: further holders (holders − 1)
	limit uint16 // 0: exclusive; 1..65535: shared with this limit
	// stale: a waiter left the head of this shared key's queue without the
	// queue being served (DropWaiters has no Out); the next Tick or lookup
	// serves it.
	stale bool
}

// Bounds of what a shard keeps for reuse.
const (
	maxKeptKey = 128 // long-key buffers above this are not kept for the next long key
	minKeptQ   = 64  // a queues table at most this large is kept when its last waiter leaves
)

// slab is a shard's entry storage.
type slab struct {
	chunks []*[chunkLen]entry
	hwm    ref // every ref below it has been handed out; ≥ 1 (ref 0 never is)
	free   ref // head of the free list (0: empty)
	n      int // live entries
}

// ent returns the entry of r (not 0).
func (s *shard) ent(r ref) *entry { return &s.slab.chunks[r>>chunkBits][r&chunkMask] }

// keyOf returns e's key; the bytes belong to the shard (valid until the
// entry is freed or moved).
func (s *shard) keyOf(e *entry) []byte {
	if e.kl != klLong {
		return e.key[:e.kl-1]
	}
	return s.longs[longIndex(e)].b
}

func longIndex(e *entry) uint32 {
	return uint32(e.key[0]) | uint32(e.key[1])<<8 | uint32(e.key[2])<<16 | uint32(e.key[3])<<24
}

func setLongIndex(e *entry, i uint32) {
	e.key[0], e.key[1], e.key[2], e.key[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
}

// room reports whether the shard can make one more entry: below 2³¹ refs
// (a shard of 100 GB), always.
func (s *shard) room() bool { return s.slab.free != 0 || s.slab.hwm <= maxRef }

// newEntry creates the entry of a key (hash h) that is not in the index
// (room reported true). Its fields other than the key are zero.
func (s *shard) newEntry(h uint64, key []byte) (ref, *entry) {
	// alloc's code, written out: this is the hot path of every new key.
	sl := &s.slab
	r := sl.free
	var e *entry
	if r != 0 {
		e = s.ent(r)
		sl.free = e.tnext
	} else {
		r = sl.hwm
		if int(r>>chunkBits) == len(sl.chunks) {
			sl.chunks = append(sl.chunks, new([chunkLen]entry))
		}
		sl.hwm = r + 1
		e = s.ent(r)
	}
	*e = entry{}
	sl.n++
	if len(key) <= inlineKey {
		e.kl = uint8(len(key) + 1)
		copy(e.key[:], key)
	} else {
		e.kl = klLong
		setLongIndex(e, s.newLong(r, key))
	}
	s.idx.insert(h, r)
	return r, e
}

// alloc takes a zeroed entry off the free list or the high-water mark
// (room reported true) and counts it live.
func (s *shard) alloc() (ref, *entry) {
	sl := &s.slab
	r := sl.free
	var e *entry
	if r != 0 {
		e = s.ent(r)
		sl.free = e.tnext
	} else {
		r = sl.hwm
		if int(r>>chunkBits) == len(sl.chunks) {
			sl.chunks = append(sl.chunks, new([chunkLen]entry))
		}
		sl.hwm = r + 1
		e = s.ent(r)
	}
	*e = entry{}
	sl.n++
	return r, e
}

// newLong stores a copy of key for the entry r and returns its index in
// s.longs, reusing a kept buffer that fits.
func (s *shard) newLong(r ref, key []byte) uint32 {
	i := len(s.longs)
	if i < cap(s.longs) {
		s.longs = s.longs[:i+1]
	} else {
		s.longs = append(s.longs, longKey{})
	}
	l := &s.longs[i]
	if c := cap(l.b); c >= len(key) && c <= 2*len(key)+32 {
		l.b = append(l.b[:0], key...)
	} else {
		l.b = append(make([]byte, 0, len(key)), key...)
	}
	l.e = r
	return uint32(i)
}

// freeLong drops e's long key: the last one moves into its place and the
// freed buffer goes past the end of s.longs, kept for the next long key
// unless it is large.
func (s *shard) freeLong(e *entry) {
	i, last := longIndex(e), len(s.longs)-1
	if int(i) != last {
		s.longs[i], s.longs[last] = s.longs[last], s.longs[i]
		setLongIndex(s.ent(s.longs[i].e), i)
	}
	l := &s.longs[last]
	l.e = 0
	if cap(l.b) > maxKeptKey {
		l.b = nil
	}
	s.longs = s.longs[:last]
	if c := cap(s.longs); c > 16 && len(s.longs)*4 < c {
		s.untidy = true
	}
}

// freeEntry removes the entry r (no waiters, out of the wheel, key hash h)
// from the index and puts it on the free list.
func (s *shard) freeEntry(r ref, e *entry, h uint64) {
	s.idx.remove(h, r)
	s.give(budgetKeys)
	if e.kl == klLong {
		s.freeLong(e)
	}
	// The key's bytes stay: a Record or HeldLock made during this call may
	// still be read until it returns.
	s.recycle(r, e)
}

// recycle puts the entry r (out of the index and the wheel) on the free
// list.
func (s *shard) recycle(r ref, e *entry) {
	e.token, e.deadline, e.ident, e.lease, e.kl, e.q = 0, 0, 0, 0, klFree, 0
	e.tnext = s.slab.free
	s.slab.free = r
	if s.slab.n--; len(s.slab.chunks) > 1 && s.slab.n*4 < len(s.slab.chunks)*chunkLen {
		s.untidy = true
	}
}

// --- wait queues ---------------------------------------------------------

// queueOf returns e's wait queue, creating it (for the entry r) if e has
// none.
func (s *shard) queueOf(r ref, e *entry) *queue {
	if e.q == 0 {
		i := s.freeQ
		if i != 0 {
			s.freeQ = uint32(s.queues[i-1].e)
		} else {
			s.queues = append(s.queues, queue{})
			i = uint32(len(s.queues))
		}
		s.queues[i-1] = queue{e: r}
		e.q = i
		s.nq++
	}
	return &s.queues[e.q-1]
}

// freeQueue frees e's queue, whose last waiter left and which is not (or
// no longer) shared (so not stale: unshare cleared the mark).
func (s *shard) freeQueue(e *entry) {
	i := e.q
	s.queues[i-1] = queue{e: ref(s.freeQ)}
	s.freeQ = i
	e.q = 0
	if s.nq--; s.nq == 0 && cap(s.queues) > minKeptQ {
		s.untidy = true
	}
}

// waiters returns the number of e's queued acquires.
func (s *shard) waiters(e *entry) uint32 {
	if e.q == 0 {
		return 0
	}
	return s.queues[e.q-1].n
}

// head returns e's first waiter (nil if none).
func (s *shard) head(e *entry) *waiter {
	if e.q == 0 {
		return nil
	}
	return s.queues[e.q-1].head
}

// --- keeping it compact --------------------------------------------------

// tidy gives memory back after an operation that freed entries, long keys
// or queues (they set s.untidy when it is due): it compacts a slab whose
// live entries fill less than a quarter of its chunks, drops a queues table
// whose last waiter left, and shrinks a long-key table that is three
// quarters empty, each amortized over the frees that made it due.
func (s *shard) tidy() {
	s.untidy = false
	sl := &s.slab
	if len(sl.chunks) > 1 && sl.n*4 < len(sl.chunks)*chunkLen {
		s.compact()
	}
	if s.nq == 0 && cap(s.queues) > minKeptQ {
		s.queues, s.freeQ = nil, 0
	}
	if c := cap(s.longs); c > 16 && len(s.longs)*4 < c {
		s.longs = slices.Clone(s.longs) // the kept buffers past len go too
	}
}

// compact moves every live entry with a ref above the live count into a
// free entry below it, so that the live entries are refs 1..n, and frees
// the chunks above them.
func (s *shard) compact() {
	sl := &s.slab
	top := ref(sl.n) // the last ref that will be live
	lo := ref(1)
	for hi := sl.hwm - 1; hi > top; hi-- {
		if s.ent(hi).kl == klFree {
			continue
		}
		for s.ent(lo).kl != klFree {
			lo++
		}
		s.move(hi, lo)
	}
	sl.hwm, sl.free = top+1, 0
	keep := int(top)/chunkLen + 1
	clear(sl.chunks[keep:])
	sl.chunks = sl.chunks[:keep]
	if cap(sl.chunks) > 2*keep+8 {
		sl.chunks = slices.Clone(sl.chunks)
	}
}

// move moves the live entry from into the free entry to and repoints
// everything that names it: its index slot (a holder entry's: in the holder
// index), its wheel neighbours (or its wheel slot's head: every live entry
// is in the wheel between calls), its queue, its long key, a holder entry's
// list neighbours, and the watches of its grant.
func (s *shard) move(from, to ref) {
	src, dst := s.ent(from), s.ent(to)
	*dst = *src
	src.kl = klFree
	if dst.kl == klHolder {
		s.moveHolder(from, to, dst)
	} else {
		s.idx.repoint(xxhash.Sum64(s.keyOf(dst)), from, to)
		if dst.q != 0 {
			s.queues[dst.q-1].e = to
		}
		if dst.kl == klLong {
			s.longs[longIndex(dst)].e = to
		}
	}
	s.repointPend(from, to, dst)
	if s.nwatch != 0 {
		s.repointWatches(dst.token, to)
	}
	if p := dst.tprev; p&headMark != 0 {
		s.wheel.leases[p&^headMark] = to
	} else {
		s.ent(p).tnext = to
	}
	if dst.tnext != 0 {
		s.ent(dst.tnext).tprev = to
	}
}

// each calls fn for every live entry of the shard (key entries and holder
// entries), in ref order. fn must not free entries.
func (s *shard) each(fn func(r ref, e *entry)) {
	for r := ref(1); r < s.slab.hwm; r++ {
		if e := s.ent(r); e.kl != klFree {
			fn(r, e)
		}
	}
}

// eachKey calls fn for every held key's entry of the shard, in ref order.
// fn must not free entries.
func (s *shard) eachKey(fn func(r ref, e *entry)) {
	for r := ref(1); r < s.slab.hwm; r++ {
		if e := s.ent(r); e.kl != klFree && e.kl != klHolder {
			fn(r, e)
		}
	}
}
