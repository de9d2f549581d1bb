package records

import (
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/lockd-dev/lockd/shard"
)

// index is what a Canceller needs of one record of a batch: its kind,
// token, Seq and end, read from the record's header when the batch is cut.
type index struct {
	seq   uint64
	token uint64
	end   uint32 // the record's end in the batch
	kind  shard.RecordKind
}

// Indexed is a BatchWriter whose batches a Canceller cuts. It keeps
// nothing beside the records: the Canceller reads what it needs of each
// from the records themselves when it cuts them, on its own memory. So
// the writer — an event loop, under a shard lock — writes each record's
// bytes once and nothing more, and what the cutter reads and writes stays
// off the lines the writer fills next (a per-record index beside the
// records doubled the bytes the writer's core had to take back from the
// cutter's). It reuses its buffer after Reset. Not safe for concurrent use.
type Indexed struct {
	w BatchWriter
}

// Add appends r as BatchWriter.Add does.
func (x *Indexed) Add(r *shard.Record) error { return x.w.Add(r) }

// Len returns the raw size of the records added since Reset, in bytes.
func (x *Indexed) Len() int { return x.w.Len() }

// Count returns the number of records added since Reset.
func (x *Indexed) Count() int { return x.w.Count() }

// Reset empties x, keeping its buffer.
func (x *Indexed) Reset() { x.w.Reset() }

// AppendTo appends x's records to dst as they are.
func (x *Indexed) AppendTo(dst *BatchWriter) { dst.addEncoded(x.w.Bytes(), x.w.Count()) }

// AppendIndexed appends src's records to x, after x's own.
func (x *Indexed) AppendIndexed(src *Indexed) { x.w.addEncoded(src.w.Bytes(), src.w.Count()) }

// SplitFrom moves x's records numbered seq or later to the end of tail and
// returns how many it moved. An Indexed's records are in Seq order (a
// shard's Sink numbers them as it adds them), so they are a suffix; if x's
// bytes do not read back as records, none move.
func (x *Indexed) SplitFrom(seq uint64, tail *Indexed) int {
	raw := x.w.Bytes()
	for at, k := 0, 0; at < len(raw); k++ {
		h, ok := header(raw, at)
		if !ok {
			return 0
		}
		if h.seq >= seq {
			moved := x.w.Count() - k
			tail.w.addEncoded(raw[at:], moved)
			x.w.buf, x.w.n = raw[:at], k
			return moved
		}
		at = int(h.end)
	}
	return 0
}

// Canceller takes out of one shard's records (an Indexed batch) every
// grant whose lease ended in the same batch (released or expired),
// together with that end and any renewal between: the standby's table is
// the same after the batch with or without them, and a batch of
// acquire/release pairs — the common load — would otherwise cost the
// standby a table insert and delete per pair. What it takes out it
// replaces by skip records (one per run of consecutive Seqs), so the
// standby's shard Seq still advances without a gap. Not safe for
// concurrent use.
//
// Tokens are unique, so a grant and its end are matched by token alone; a
// release of a token granted in an earlier batch stays.
type Canceller struct {
	// slots is the grants of the shard being cut, by token: an open-
	// addressing table of indices into its ix (plus one; 0 is empty), sized
	// to the shard's records and cleared per Cut, so a batch costs what its
	// records do, not what the largest batch left (a map's clear costs its
	// capacity).
	slots []int32
	shift uint // 64 - log2(len(slots))
	dead  []bool
	ix    []index  // the records of the shard being cut
	dix   []index  // … and those it held back (CutMerged)
	bits  []uint64 // sortSeqs' bitmap
}

// sortSeqs sorts seqs, the Seqs of one shard's batch (so within a span
// about as wide as their number), through a bitmap of that span: linear,
// where a comparison sort of a batch's pairs of grants and ends cost the
// cutter as much as the rest of the cut. A Seq given twice is kept once.
func (c *Canceller) sortSeqs(seqs []uint64) []uint64 {
	if len(seqs) < 2 {
		return seqs
	}
	lo, hi := seqs[0], seqs[0]
	for _, s := range seqs[1:] {
		lo, hi = min(lo, s), max(hi, s)
	}
	if hi-lo >= 64*uint64(len(seqs))+4096 {
		slices.Sort(seqs)
		return slices.Compact(seqs)
	}
	words := int((hi-lo)/64 + 1)
	c.bits = slices.Grow(c.bits[:0], words)[:words]
	clear(c.bits)
	for _, s := range seqs {
		d := s - lo
		c.bits[d>>6] |= 1 << (d & 63)
	}
	n := 0
	for w, word := range c.bits {
		for word != 0 {
			seqs[n] = lo + uint64(w)*64 + uint64(bits.TrailingZeros64(word))
			n++
			word &= word - 1
		}
	}
	return seqs[:n]
}

// scan fills c.ix with the kind, Seq, token and end of each of raw's n
// records; false if they do not read back as n records (never for an
// Indexed's own records).
func (c *Canceller) scan(raw []byte, n int) bool {
	ix, ok := scanInto(c.ix[:0], raw, n)
	c.ix = ix
	return ok
}

// scanInto appends to ix the kind, Seq, token and end of each of raw's n
// records; false if they do not read back as n records.
func scanInto(ix []index, raw []byte, n int) ([]index, bool) {
	ix = slices.Grow(ix, n)
	for at := 0; at < len(raw); {
		x, ok := header(raw, at)
		if !ok {
			return ix, false
		}
		ix = append(ix, x)
		at = int(x.end)
	}
	return ix, len(ix) == n
}

// header reads what a Canceller needs of the record at raw[at:]: its kind,
// Seq and token, and where it ends. The record is one an Indexed wrote
// (Add checked it whole), so only its bounds are checked here: the cut
// reads each header once and skips the key and the identity.
func header(raw []byte, at int) (index, bool) {
	if len(raw) < at+3 {
		return index{}, false
	}
	k := raw[at]
	seq, i, err := Uvarint(raw, at+3)
	if err != nil || len(raw) < i+9 {
		return index{}, false
	}
	token := binary.BigEndian.Uint64(raw[i:])
	i += 9 // token, lease
	if k&kindLimit != 0 {
		i += 2
	}
	keyLen, i, err := Uvarint(raw, i)
	if err != nil || uint64(len(raw)-i) < keyLen {
		return index{}, false
	}
	i += int(keyLen)
	if k&kindIdent != 0 {
		if i >= len(raw) {
			return index{}, false
		}
		i += 1 + int(raw[i])
		if i > len(raw) {
			return index{}, false
		}
	}
	return index{seq: seq, token: token, end: uint32(i), kind: shard.RecordKind(k &^ (kindIdent | kindLimit))}, true
}

// grantOf returns the index in ix of the grant of token, or -1.
func (c *Canceller) grantOf(ix []index, token uint64) int {
	mask := len(c.slots) - 1
	for h := c.home(token); ; h = (h + 1) & mask {
		j := int(c.slots[h]) - 1
		if j < 0 {
			return -1
		}
		if ix[j].token == token {
			return j
		}
	}
}

// home is token's first slot (Fibonacci hashing over len(slots)).
func (c *Canceller) home(token uint64) int { return int((token * 0x9E3779B97F4A7C15) >> c.shift) }

// addGrant notes grant k of ix.
func (c *Canceller) addGrant(ix []index, k int) {
	mask := len(c.slots) - 1
	h := c.home(ix[k].token)
	for c.slots[h] != 0 {
		h = (h + 1) & mask
	}
	c.slots[h] = int32(k + 1)
}

// Cut appends shard id's records src (in Seq order) to dst, with every
// grant that ended among them, its end and its renewals replaced by skip
// records; it returns how many records it took out.
func (c *Canceller) Cut(dst *BatchWriter, id uint32, src *Indexed) int {
	raw := src.w.Bytes()
	if !c.scan(raw, src.w.Count()) {
		// Not records this package wrote: they go as they are, none
		// taken out.
		dst.addEncoded(raw, src.w.Count())
		return 0
	}
	ix := c.ix
	dead := slices.Grow(c.dead[:0], len(ix))[:len(ix)]
	clear(dead)
	c.dead = dead
	if c.mark(ix, dead) == 0 {
		dst.addEncoded(raw, len(ix))
		return 0
	}
	taken := 0
	start := 0 // the byte offset of record k
	for k := 0; k < len(ix); {
		if !dead[k] {
			// A run of records that stay goes as it is.
			first := start
			n := 0
			for k < len(ix) && !dead[k] {
				start = int(ix[k].end)
				k++
				n++
			}
			dst.addEncoded(raw[first:start], n)
			continue
		}
		// A run of cancelled records with consecutive Seqs is one skip.
		from := ix[k].seq
		for {
			start = int(ix[k].end)
			k++
			taken++
			if k == len(ix) || !dead[k] || ix[k].seq != ix[k-1].seq+1 {
				break
			}
		}
		// AddSkip cannot refuse: Add indexed only records it took (shard
		// ≤ 65535, Seq ≥ 1). Were it to, the standby would find a gap and
		// ask for a snapshot.
		_ = dst.AddSkip(id, from, ix[k-1].seq)
	}
	return taken
}

// mark sets dead[k] for every record k of ix that cancels out: a grant
// that ended among them, its end and its renewals. It returns how many.
func (c *Canceller) mark(ix []index, dead []bool) int {
	bits := uint(4)
	for 1<<bits < 2*len(ix) {
		bits++
	}
	c.slots = slices.Grow(c.slots[:0], 1<<bits)[:1<<bits]
	clear(c.slots)
	c.shift = 64 - bits
	n := 0
	for k, r := range ix {
		switch r.kind {
		case shard.RecordGrant:
			c.addGrant(ix, k)
		case shard.RecordRelease, shard.RecordExpire:
			if j := c.grantOf(ix, r.token); j >= 0 && j < k && ix[j].kind == shard.RecordGrant {
				dead[j], dead[k] = true, true
				n += 2
			}
		}
	}
	if n == 0 {
		return 0
	}
	for k, r := range ix {
		if r.kind == shard.RecordRenew {
			if j := c.grantOf(ix, r.token); j >= 0 && j < k && dead[j] {
				dead[k] = true
				n++
			}
		}
	}
	return n
}

// CutMerged is Cut of src merged with what the shard held back
// (shard.Config.Defer): def, the records of grants held back and still
// held and of their renews (in Seq order), and skips, the Seqs of grants
// held back that ended within the batch and of their ends (any order;
// sorted in place). All three go to dst in Seq order, consecutive Seqs
// that stand for nothing (skips, and src's records cancelled) as one skip
// record. With cancel false, none of src's records is cancelled (a
// snapshot of the shard was cut while they were buffered), as if src were
// appended as it is. It returns the number of records taken out: src's
// cancelled records and skips.
func (c *Canceller) CutMerged(dst *BatchWriter, id uint32, src, def *Indexed, skips []uint64, cancel bool) int {
	if def.Count() == 0 && len(skips) == 0 {
		if cancel {
			return c.Cut(dst, id, src)
		}
		src.AppendTo(dst)
		return 0
	}
	raw, draw := src.w.Bytes(), def.w.Bytes()
	ok := c.scan(raw, src.w.Count())
	ix := c.ix
	var dix []index
	if ok {
		dix, ok = scanInto(c.dix[:0], draw, def.w.Count())
		c.dix = dix
	}
	if !ok {
		// Not records this package wrote: they go as they are, none taken
		// out; the Seqs out of order make the standby resynchronise.
		dst.addEncoded(raw, src.w.Count())
		dst.addEncoded(draw, def.w.Count())
		return 0
	}
	dead := slices.Grow(c.dead[:0], len(ix))[:len(ix)]
	clear(dead)
	c.dead = dead
	taken := 0
	if cancel {
		taken = c.mark(ix, dead)
	}
	skips = c.sortSeqs(skips)
	taken += len(skips)
	var from, to uint64 // the skip run being built (from 0: none)
	flush := func() {
		if from != 0 {
			// AddSkip cannot refuse here (Seqs ≥ 1, shard ≤ 65535).
			_ = dst.AddSkip(id, from, to)
			from = 0
		}
	}
	gap := func(seq uint64) {
		if from != 0 && seq == to+1 {
			to = seq
			return
		}
		flush()
		from, to = seq, seq
	}
	const none = ^uint64(0)
	a, b, k := 0, 0, 0
	aStart, bStart := 0, 0
	for {
		sa, sb, sk := none, none, none
		if a < len(ix) {
			sa = ix[a].seq
		}
		if b < len(dix) {
			sb = dix[b].seq
		}
		if k < len(skips) {
			sk = skips[k]
		}
		switch {
		case sa == none && sb == none && sk == none:
			flush()
			return taken
		case sa <= sb && sa <= sk:
			if dead[a] {
				gap(sa)
			} else {
				flush()
				dst.addEncoded(raw[aStart:ix[a].end], 1)
			}
			aStart = int(ix[a].end)
			a++
		case sb <= sk:
			flush()
			dst.addEncoded(draw[bStart:dix[b].end], 1)
			bStart = int(dix[b].end)
			b++
		default:
			gap(sk)
			k++
		}
	}
}
