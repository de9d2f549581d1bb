package records

import (
	"slices"

	"github.com/lockd-dev/lockd/shard"
)

// index is what a Canceller needs of one record of an Indexed batch:
// noted beside the record when it is added, so cutting a batch never
// decodes a record.
type index struct {
	seq   uint64
	token uint64
	end   uint32 // the record's end in the batch
	kind  shard.RecordKind
}

// Indexed is a BatchWriter that also notes, beside each record, its kind,
// token, Seq and end, for a Canceller. It reuses its buffers after Reset.
// Not safe for concurrent use.
type Indexed struct {
	w  BatchWriter
	ix []index
}

// Add appends r as BatchWriter.Add does, with its index.
func (x *Indexed) Add(r *shard.Record) error {
	if err := x.w.Add(r); err != nil {
		return err
	}
	x.ix = append(x.ix, index{kind: r.Kind, seq: r.Seq, token: r.Token, end: uint32(x.w.Len())})
	return nil
}

// Len returns the raw size of the records added since Reset, in bytes.
func (x *Indexed) Len() int { return x.w.Len() }

// Count returns the number of records added since Reset.
func (x *Indexed) Count() int { return x.w.Count() }

// Reset empties x, keeping its buffers.
func (x *Indexed) Reset() {
	x.w.Reset()
	x.ix = x.ix[:0]
}

// AppendTo appends x's records to dst as they are.
func (x *Indexed) AppendTo(dst *BatchWriter) { dst.addEncoded(x.w.Bytes(), x.w.Count()) }

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
	grants map[uint64]int32 // token → its grant's index in the shard's ix
	dead   []bool
}

// Reset forgets the grants of the previous batch.
func (c *Canceller) Reset() {
	if c.grants == nil {
		c.grants = make(map[uint64]int32)
	}
	clear(c.grants)
}

// Cut appends shard id's records src (in Seq order) to dst, with every
// grant that ended among them, its end and its renewals replaced by skip
// records; it returns how many records it took out.
func (c *Canceller) Cut(dst *BatchWriter, id uint32, src *Indexed) int {
	raw, ix := src.w.Bytes(), src.ix
	dead := slices.Grow(c.dead[:0], len(ix))[:len(ix)]
	clear(dead)
	c.dead = dead
	cut := false
	for k, r := range ix {
		switch r.kind {
		case shard.RecordGrant:
			c.grants[r.token] = int32(k)
		case shard.RecordRelease, shard.RecordExpire:
			if j, ok := c.grants[r.token]; ok && int(j) < k && ix[j].token == r.token && ix[j].kind == shard.RecordGrant {
				dead[j], dead[k], cut = true, true, true
			}
		}
	}
	if !cut {
		dst.addEncoded(raw, len(ix))
		return 0
	}
	for k, r := range ix {
		if r.kind == shard.RecordRenew {
			if j, ok := c.grants[r.token]; ok && int(j) < k && ix[j].token == r.token && dead[j] {
				dead[k] = true
			}
		}
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
