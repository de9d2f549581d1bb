package shard

import (
	"errors"

	"github.com/cespare/xxhash/v2"
)

// Errors of Apply.
var (
	// ErrGap means a record's Seq skips records of its shard that were not
	// applied: the stream lost some, and the table needs a new dump.
	ErrGap = errors.New("shard: record sequence gap")
	// ErrShardMismatch means a record names a shard other than the one its
	// key hashes to here: the tables have different shard counts.
	ErrShardMismatch = errors.New("shard: record from a table with another shard count")
	// ErrBadRecord rejects a record of an unknown kind, with an empty key,
	// or a Skip whose From is 0, above its Seq or names no shard of t.
	ErrBadRecord = errors.New("shard: malformed record")
)

// Apply replays on t a record made by another table (an active's
// replication stream, a replicated log). Records of one shard must be
// applied in Seq order; a record whose Seq the shard has already reached is
// skipped (applied reports false), one that skips a Seq returns ErrGap and
// changes nothing.
//
// now is the instant, on t's clock, from which the record's lease counts
// (Grant, Renew: the lease ends Lease seconds after now). The caller picks
// it: the time it received the record gives a lease that never ends earlier
// than on the table that made it. Apply never calls Tokens.Next; the
// allocator observes every token applied, so a table that takes over from
// the one it followed starts above every token it has seen.
//
// A Grant with Limit 0 makes Key held exclusively by Token (replacing any
// holder), granted to the identity named by Ident (none if empty). A Grant
// with a Limit adds the holder Token to Key shared with that limit: a free
// key becomes shared; a key shared with that limit and fewer holders gains
// one; any other (held exclusively, shared with another limit, full) has
// its holders replaced. Release and Expire end the holder Token of Key, if
// it is one (a key whose last holder ends is freed); Renew restarts the
// lease of the holder Token. A Skip carries no key: it names its shard and
// stands for the records From..Seq, which cancelled out; a shard whose Seq
// is at least From-1 moves to Seq, one further behind returns ErrGap.
//
// A table fed by Apply normally has no waiters and no watches (its node
// executes no acquires and answers no watch): any waiter of a key that a
// record frees leaves its queue with an EffectMoved in out, a watch of a
// grant that a record ends gets its EffectLost (ReasonReleased,
// ReasonExpired; ReasonCannotTell when a Grant replaces it), and no queue
// is served.
func (t *Table) Apply(now int64, r *Record, out *Out) (applied bool, err error) {
	if r.Kind == RecordSkip {
		return t.applySkip(r)
	}
	if len(r.Key) == 0 || r.Kind < RecordGrant || r.Kind > RecordRenew {
		return false, ErrBadRecord
	}
	h := xxhash.Sum64(r.Key)
	s := t.shardOf(h)
	if s.id != r.Shard {
		return false, ErrShardMismatch
	}
	s.mu.Lock()
	defer s.unlock()
	switch {
	case r.Seq <= s.seq:
		return false, nil
	case r.Seq != s.seq+1:
		return false, ErrGap
	}
	if err := s.apply(now, h, r, out); err != nil {
		return false, err
	}
	s.seq = r.Seq
	return true, nil
}

// apply changes the shard as the record r says (Apply).
func (s *shard) apply(now int64, h uint64, r *Record, out *Out) error {
	t := s.t
	ref, e := s.find(h, r.Key)
	switch r.Kind {
	case RecordGrant:
		id := t.idents.intern(r.Ident)
		deadline := now + int64(r.Lease)*second
		if e == nil {
			if !s.room() || !s.take(budgetKeys) {
				return ErrFull
			}
			ref, e = s.newEntry(h, r.Key)
			s.install(ref, e, r.Token, deadline, id, r.Lease, r.Limit)
		} else if q := s.sharedQueue(e); r.Limit != 0 && q != nil && q.limit == r.Limit && int(q.nx)+1 < int(q.limit) {
			if !s.room() || !s.take(budgetHolders) {
				return ErrFull
			}
			x, xe := s.newHolder(e, r.Token)
			xe.deadline, xe.lease, xe.ident = deadline, r.Lease, uint16(id)
			s.addLease(x, xe)
			s.bound(e, deadline)
		} else {
			s.clearHolders(ref, e, out)
			s.install(ref, e, r.Token, deadline, id, r.Lease, r.Limit)
		}
		t.tokens.Observe(r.Token)
		s.ctr.Grants++
	case RecordRelease, RecordExpire:
		if e == nil {
			break
		}
		x, xe := s.holder(ref, e, r.Token)
		if xe == nil {
			break
		}
		s.delLease(xe)
		reason := ReasonReleased
		if r.Kind == RecordRelease {
			s.ctr.Releases++
		} else {
			s.ctr.Expiries++
			reason = ReasonExpired
		}
		if s.hooked() {
			s.ended(r.Token, r.Key, reason, out)
		}
		switch q := s.sharedQueue(e); {
		case x != ref:
			s.dropHolder(q, x, xe)
		case q != nil && q.nx != 0:
			s.promote(ref, e, q)
		default:
			if q != nil {
				s.unshare(q)
				if q.n == 0 {
					s.freeQueue(e)
				}
			}
			s.dequeueAll(e, EffectMoved, out)
			s.freeEntry(ref, e, h)
		}
	case RecordRenew:
		if e == nil {
			break
		}
		x, xe := s.holder(ref, e, r.Token)
		if xe == nil {
			break
		}
		s.delLease(xe)
		xe.lease = r.Lease
		xe.deadline = now + int64(r.Lease)*second
		s.addLease(x, xe)
		s.bound(e, xe.deadline)
		s.ctr.Renews++
	}
	return nil
}

// applySkip moves a shard's Seq over records that cancelled out.
func (t *Table) applySkip(r *Record) (bool, error) {
	if r.From == 0 || r.From > r.Seq || r.Shard >= uint32(len(t.shards)) {
		return false, ErrBadRecord
	}
	s := &t.shards[r.Shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Seq <= s.seq:
		return false, nil
	case r.From > s.seq+1:
		return false, ErrGap
	}
	s.seq = r.Seq
	return true, nil
}

// Locked runs fn(i) while holding shard i's lock. The owner of a Sink that
// buffers records per shard takes them here, so that the Sink — which runs
// under the same lock — needs no lock of its own. fn must be quick and must
// not call back into the Table.
func (t *Table) Locked(i int, fn func(int)) {
	s := &t.shards[i]
	s.mu.Lock()
	fn(i)
	s.mu.Unlock()
}

// Shards returns the number of shards.
func (t *Table) Shards() int { return len(t.shards) }

// Seq returns the Seq of shard i's last record, made or applied.
func (t *Table) Seq(i int) uint64 {
	s := &t.shards[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq
}

// SetSeq sets shard i's record sequence: after loading a dump of another
// table's shard i (Reset, Restore of its keys), the Seq that dump was cut
// at, so that Apply continues exactly after it.
func (t *Table) SetSeq(i int, seq uint64) {
	s := &t.shards[i]
	s.mu.Lock()
	s.seq, s.cutSeq = seq, min(s.cutSeq, seq)
	s.mu.Unlock()
}

// DumpShard calls fn for every holder of every held key of shard i (a
// shared key's holders one after the other, with its key) with its token,
// lease deadline (t's clock) and lease seconds (0 for a restored lock),
// under the shard's lock, and returns the Seq of the shard's last record at
// that point: the dump and the records with a larger Seq make up the
// shard's whole history. It does not say which keys are shared (Dump
// does). key is valid only during the call; fn must not call back into the
// Table.
func (t *Table) DumpShard(i int, fn func(key []byte, token uint64, deadline int64, lease uint8)) (seq uint64) {
	return t.Dump(i, func(h *HeldLock) { fn(h.Key, h.Token, h.Deadline, h.Lease) })
}

// HeldLock is one holder of a held key as Dump reports it (an exclusive
// key has one, a shared key one per holder, each with the key and its
// limit).
type HeldLock struct {
	Key      []byte // valid only during the call
	Token    uint64
	Deadline int64 // lease deadline on the table's clock
	Lease    uint8 // lease seconds (0 for a restored lock)
	// Ident names the identity the grant was made to (nil: none); the
	// bytes are the table's and stay valid, but must not be modified.
	Ident []byte
	// Limit is the key's limit if it is shared (1..65535), 0 if exclusive.
	Limit uint16
}

// Dump is DumpShard with each holder's identity and its key's limit: it
// calls fn for every holder of every held key of shard i under the shard's
// lock and returns the shard's Seq at that point. A shared key's holders
// come one after the other. h is reused between calls; fn must not call
// back into the Table. RestoreHolder rebuilds what it reports.
func (t *Table) Dump(i int, fn func(h *HeldLock)) (seq uint64) {
	s := &t.shards[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	var h HeldLock
	s.eachKey(func(_ ref, e *entry) {
		key, limit := s.keyOf(e), uint16(0)
		if q := s.sharedQueue(e); q != nil {
			limit = q.limit
		}
		s.eachHolder(e, func(x *entry) {
			h = HeldLock{Key: key, Token: x.token, Deadline: x.deadline, Lease: x.lease, Ident: t.idents.name(Ident(x.ident)), Limit: limit}
			fn(&h)
		})
	})
	return s.seq
}

// Reset empties the table: every key is freed (its waiters leave with an
// EffectMoved in out, the watches of its grants with an EffectLost,
// ReasonCannotTell) and every shard's Seq goes back to 0. The token
// allocator is left as it is: tokens never go back.
func (t *Table) Reset(out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		// From the top down, so that no freed entry is passed again (a key
		// frees its holder entries, above or below it).
		for r := s.slab.hwm - 1; r > 0; r-- {
			if e := s.ent(r); e.kl != klFree && e.kl != klHolder {
				s.dropKey(r, e, xxhash.Sum64(s.keyOf(e)), out)
			}
		}
		s.seq, s.cutSeq = 0, 0
		s.pend, s.renews = s.pend[:0], s.renews[:0]
		s.unlock()
	}
}

// MoveWaiters removes every queued acquire of every key and appends an
// EffectMoved for each: the node stopped executing (a standby, a deposed
// leader) and those acquires are answered M. Held locks stay.
func (t *Table) MoveWaiters(out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.cancel(EffectMoved, out)
		s.unlock()
	}
}

// ExtendLeases moves every holder's lease deadline that is earlier than
// min to min and returns how many it moved: a new Raft leader's lease rule
// (PROTOCOL.md §6.4: the later of the stored deadline and its election
// time plus the failover timeout, so a lease never ends earlier than on
// the old leader, and repeated elections extend it by at most one failover
// timeout each). A deadline at or after min is left as it is. It emits no
// Record: the deadlines a leader keeps are its own, and the next leader
// applies the rule again to what the log says.
func (t *Table) ExtendLeases(min int64) int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.each(func(r ref, e *entry) {
			if e.deadline < min {
				s.delLease(e)
				e.deadline = min
				s.addLease(r, e)
				n++
			}
		})
		s.mu.Unlock()
	}
	return n
}
