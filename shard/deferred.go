package shard

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
	r   ref // the key's entry
}

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

// emitGrant is emit of the grant just made on the key entry e (ref r), k
// and x both e: held back if e's key is exclusive and the Sink's owner
// wants it (Config.Defer).
func (s *shard) emitGrant(r ref, e *entry) {
	if f := s.t.deferFn; f != nil && (e.q == 0 || s.queues[e.q-1].limit == 0) && f(s.id, len(s.pend)) {
		s.seq++
		if s.pendAt == nil {
			s.pendAt = new([pendAtMask + 1]uint16)
		}
		s.pendAt[e.token&pendAtMask] = uint16(len(s.pend))
		s.pend = append(s.pend, pendGrant{seq: s.seq, tok: e.token, r: r})
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

// takePend hands everything held back to take, in Seq order for records
// (grants still held, read from their entries now, and renews of them),
// and appends to skips the Seqs of grants that ended, of their ends and of
// their renews; then it forgets them. The Record is the shard's,
// rewritten for each call.
func (s *shard) takePend(take func(*Record), skips *[]uint64) {
	if len(s.pend) == 0 {
		return
	}
	ri := 0
	for gi := range s.pend {
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
	for ; ri < len(s.renews); ri++ {
		s.takeRenew(s.renews[ri], take, skips)
	}
	s.pend, s.renews = s.pend[:0], s.renews[:0]
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
	s := &t.shards[i]
	s.mu.Lock()
	s.takePend(take, skips)
	fn(i)
	s.mu.Unlock()
}
