package repl

import (
	"slices"

	"github.com/lockd-dev/lockd/shard"
)

// recIx is what the canceller needs of one buffered record: the Sink
// writes it beside the record, so the flusher never decodes a record to
// cut a batch.
type recIx struct {
	seq   uint64
	token uint64
	end   uint32 // the record's end in its shard's buffer
	kind  shard.RecordKind
}

// canceller takes out of a shard's buffered records every grant whose
// lease ended in the same batch (released or expired), together with that
// end and any renewal between: the standby's table is the same after the
// batch with or without them, and a batch of acquire/release pairs — the
// common load — would otherwise cost the standby a table insert and delete
// per pair. What it takes out it replaces by skip records (one per run of
// consecutive Seqs), so the standby's shard Seq still advances without a
// gap. It is the flusher's alone (under outStream.flushMu).
//
// Tokens are unique, so a grant and its end are matched by token alone; a
// release of a token granted in an earlier batch stays.
type canceller struct {
	grants map[uint64]int32 // token → its grant's index in the shard's ix
	dead   []bool
}

// reset forgets the grants of the previous batch.
func (c *canceller) reset() {
	if c.grants == nil {
		c.grants = make(map[uint64]int32)
	}
	clear(c.grants)
}

// cut appends shard id's records raw (indexed by ix, in Seq order) to w,
// with every grant that ended among them, its end and its renewals
// replaced by skip records; it returns how many records it took out.
func (c *canceller) cut(w *BatchWriter, id uint32, raw []byte, ix []recIx) int {
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
		w.addEncoded(raw, len(ix))
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
			w.addEncoded(raw[first:start], n)
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
		// AddSkip cannot refuse: the Sink indexed only records Add took
		// (shard ≤ 65535, Seq ≥ 1). Were it to, the standby would find a
		// gap and ask for a snapshot.
		_ = w.AddSkip(id, from, ix[k-1].seq)
	}
	return taken
}
