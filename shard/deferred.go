package shard

import (
	"cmp"
	"slices"
	"sort"
)

// Deferred records (Config.Defer). An active member streams every change
// to its standbys, but most of a pipelined client's grants end within the
// batch they were made in, and such a grant and its end are sent as a
// skip, not as records. Building and buffering both records on the event
// loop only for the batch cutter to take them out again was most of what
// the stream cost the loop. So a shard with Config.Defer holds an
// exclusive grant back as a slot (its Seq, token and entry), and the
// owner of the Sink takes what is held back when it cuts a batch
// (LockedTake): the records of grants still held, read from their entries
// then, and the Seqs of the grants that ended meanwhile and of their ends,
// which become skips. The Seqs stay the shard's: every change is numbered
// when it happens, and each number is taken exactly once — by the Sink, or
// by LockedTake as a record or as a skip — so a standby's shard still
// advances without a gap, and a Seq that neither hands over is a gap that
// makes the standby resynchronise (never a silent loss).
//
// Only an exclusive key's own grant is held back: its entry is the key's,
// and nothing but compact moves it (move repoints the slot). A shared
// key's holders go to the Sink as they happen.

// pendGrant is an exclusive grant held back.
type pendGrant struct {
	seq uint64 // its record's Seq
	tok uint64 // its token; slots are in token order (tokens rise, and a shard grants one at a time)
	// end is the Seq of the release or expiry that ended the grant before
	// it was taken (0: still held). Both Seqs are then skips.
	end uint64
	r   ref    // the key's entry
	at  uint32 // when it was granted, in units of 1<<atShift ns of the table's clock (wraps)
}

// atShift scales a grant's time for pendGrant.at: about a microsecond,
// so 32 bits compare correctly for grants less than half an hour apart.
const atShift = 10

// young reports whether p was granted at or after the table time since
// (both within half an hour of each other).
func (p *pendGrant) young(since int64) bool { return int32(p.at-uint32(since>>atShift)) >= 0 }

// maxHeldRenews bounds the renews a shard holds back with their grants
// (16 bytes each; the grants themselves are bounded by Config.Defer's
// answer): past it a renew goes to the Sink as it happens. Its record
// then follows its grant's in Seq order if the grant is still held at
// the cut; if the grant ended, the standby never had it and the renew of
// a token it does not hold changes nothing there.
const maxHeldRenews = 4096

// pendRenew is a renew of a grant held back, held back with it.
type pendRenew struct {
	seq uint64
	j   int // its grant's slot
}

// pendAtMask sizes a shard's pendAt: the slot of each grant held back,
// by the low bits of its token, so that the end of one finds it at once;
// a slot that another grant took since is checked by its token, and the
// search falls back to a binary search of the slots (in token order).
const pendAtMask = 255

// findPend returns the slot of the grant tok held back, or -1.
func (s *shard) findPend(tok uint64) int {
	p := s.pend
	if len(p) == 0 || tok < p[0].tok {
		return -1
	}
	if j := int(s.pendAt[tok&pendAtMask]); j < len(p) && p[j].tok == tok {
		return j
	}
	lo, hi := 0, len(p)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p[m].tok < tok {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(p) && p[lo].tok == tok {
		return lo
	}
	return -1
}

// emitGrant is emit of the grant just made at now on the key entry e (ref
// r), k and x both e: held back if e's key is exclusive and the Sink's owner
// wants it (Config.Defer).
func (s *shard) emitGrant(r ref, e *entry, now int64) {
	if f := s.t.deferFn; f != nil && (e.q == 0 || s.queues[e.q-1].limit == 0) && f(s.id, len(s.pend)) {
		s.seq++
		if s.pendAt == nil {
			s.pendAt = new([pendAtMask + 1]uint16)
		}
		s.pendAt[e.token&pendAtMask] = uint16(len(s.pend))
		s.pend = append(s.pend, pendGrant{seq: s.seq, tok: e.token, r: r, at: uint32(now >> atShift)})
		return
	}
	s.emit(RecordGrant, e, e)
}

// withheld reports whether the change kind (Seq s.seq, already numbered)
// of the holder x of the key whose entry is k is held back with a grant
// held back: an end of that grant (its Seq noted as a skip) or a renew
// of it.
func (s *shard) withheld(kind RecordKind, k, x *entry) bool {
	if k != x {
		return false
	}
	j := s.findPend(x.token)
	if j < 0 || s.pend[j].end != 0 {
		return false
	}
	switch kind {
	case RecordRelease, RecordExpire:
		s.pend[j].end = s.seq
	case RecordRenew:
		if len(s.renews) >= maxHeldRenews {
			return false // its record goes to the Sink, after its grant's Seq
		}
		s.renews = append(s.renews, pendRenew{seq: s.seq, j: j})
	default:
		return false
	}
	return true
}

// repointPend follows a compact's move of the live entry dst from ref
// from to ref to, if its grant is held back.
func (s *shard) repointPend(from, to ref, dst *entry) {
	if len(s.pend) == 0 || dst.kl == klHolder {
		return
	}
	if j := s.findPend(dst.token); j >= 0 && s.pend[j].r == from {
		s.pend[j].r = to
	}
}

// holding returns the entry of the grant p, or nil if it no longer holds
// it (a bug: its Seq is then handed over as neither record nor skip, a
// gap, and a standby that meets it resynchronises).
func (s *shard) holding(p *pendGrant) *entry {
	e := s.ent(p.r)
	if e.kl == klFree || e.kl == klHolder || e.token != p.tok {
		return nil
	}
	return e
}

// takePend hands the first n grants held back to take, with their renews
// (all Seqs below those of the rest, cutPoint), and keeps the rest held
// back; n = len(s.pend) hands over everything. Records (grants still
// held, read from their entries now, and renews of them) go to take in
// Seq order; the Seqs of grants that ended, of their ends and of their
// renews are appended to skips. The Record is the shard's, rewritten for
// each call.
func (s *shard) takePend(n int, take func(*Record), skips *[]uint64) {
	if len(s.pend) == 0 {
		return
	}
	ri := 0
	for gi := range s.pend[:n] {
		p := &s.pend[gi]
		for ; ri < len(s.renews) && s.renews[ri].seq < p.seq; ri++ {
			s.takeRenew(s.renews[ri], take, skips)
		}
		if p.end != 0 {
			*skips = append(*skips, p.seq, p.end)
			continue
		}
		if e := s.holding(p); e != nil {
			take(s.record(RecordGrant, p.seq, e, e))
		}
	}
	// The renews of the first n grants come first: each is numbered after
	// its grant, and every one of theirs before the rest's first grant.
	for ; ri < len(s.renews) && s.renews[ri].j < n; ri++ {
		s.takeRenew(s.renews[ri], take, skips)
	}
	if n == len(s.pend) {
		s.pend, s.renews = s.pend[:0], s.renews[:0]
		return
	}
	s.pend = s.pend[:copy(s.pend, s.pend[n:])]
	s.renews = s.renews[:copy(s.renews, s.renews[ri:])]
	for k := range s.renews {
		s.renews[k].j -= n
	}
	for j := range s.pend {
		s.pendAt[s.pend[j].tok&pendAtMask] = uint16(j)
	}
}

// cutPoint returns how many of the grants held back a cut at since hands
// over: all of them, or those before the first one granted at or after
// since, still held and numbered after the last cut (so that a change
// waits at most one cut more, whatever the clock does), and before any
// grant renewed after that one was made (a renew goes in its grant's
// cut). A grant before the point that ended after it is a skip now and
// its end a skip later; nothing else numbered before the point depends on
// what is numbered after it.
//
// Slots are in Seq order and, near enough, in time order (each event loop
// reads the clock for itself), so both bounds are binary searches: the cut
// reads the slots the loops wrote from the point on only, not all of them.
// Slots a little out of time order move the point a little; any point
// keeps the stream whole.
func (s *shard) cutPoint(since int64) int {
	p := s.pend
	lo, _ := slices.BinarySearchFunc(p, s.cutSeq+1, func(g pendGrant, seq uint64) int { return cmp.Compare(g.seq, seq) })
	y := lo + sort.Search(len(p)-lo, func(k int) bool { return p[lo+k].young(since) })
	n := -1
	for j := y; j < len(p); j++ {
		if p[j].end == 0 {
			n = j
			break
		}
	}
	if n < 0 {
		return len(p)
	}
	for {
		keep, tied := s.pend[n].seq, n
		for k := len(s.renews) - 1; k >= 0 && s.renews[k].seq >= keep; k-- {
			tied = min(tied, s.renews[k].j)
		}
		if tied == n {
			return n
		}
		if n = tied; s.pend[n].seq <= s.cutSeq {
			return len(s.pend) // a renew ties the young grant to one the last cut kept
		}
	}
}

// takeRenew hands a renew held back to take: a record if its grant is
// still held, else a skip.
func (s *shard) takeRenew(rn pendRenew, take func(*Record), skips *[]uint64) {
	p := &s.pend[rn.j]
	if p.end != 0 {
		*skips = append(*skips, rn.seq)
		return
	}
	if e := s.holding(p); e != nil {
		take(s.record(RecordRenew, rn.seq, e, e))
	}
}

// LockedTake is Locked that first hands over everything shard i holds
// back (Config.Defer): take gets the records of grants still held and of
// their renews, in Seq order, and skips gets appended the Seqs of the
// grants that ended before now, of their ends and of their renews, in no
// particular order. The Record is the shard's, valid only during the call.
// take and fn run under the shard's lock: they must be quick and must not
// call back into the Table.
func (t *Table) LockedTake(i int, take func(*Record), skips *[]uint64, fn func(int)) {
	t.lockedCut(i, 0, true, take, skips, fn)
}

// LockedCut is LockedTake that keeps held back the grants made at or
// after since (on the table's clock) that are still held, and with them
// every change numbered from the first of them on: it returns that Seq,
// keep (0 when it kept nothing). The cut it feeds takes only the changes
// numbered below keep; the Sink's owner keeps what its Sink got from keep
// on for a later cut, as the shard keeps the rest of what it held back.
// Most such grants end before the next cut, and a grant and its end then
// cost the stream no record; what is kept waits one cut longer. Of the
// skips appended, those of grants that ended at keep or later are keep or
// more too: they belong to a later cut.
func (t *Table) LockedCut(i int, since int64, take func(*Record), skips *[]uint64, fn func(int)) (keep uint64) {
	return t.lockedCut(i, since, false, take, skips, fn)
}

// lockedCut is LockedCut, or LockedTake when all (since unused: no time
// names every grant, the clock's bits wrap).
func (t *Table) lockedCut(i int, since int64, all bool, take func(*Record), skips *[]uint64, fn func(int)) (keep uint64) {
	s := &t.shards[i]
	s.mu.Lock()
	n := len(s.pend)
	if !all {
		n = s.cutPoint(since)
	}
	if n < len(s.pend) {
		keep = s.pend[n].seq
	}
	s.takePend(n, take, skips)
	s.cutSeq = s.seq
	fn(i)
	s.mu.Unlock()
	return keep
}
