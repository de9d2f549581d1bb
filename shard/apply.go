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
// A Grant makes Key held by Token (replacing any holder), granted to the
// identity named by Ident (none if empty); Release and Expire
// free Key if Token is its current token; Renew restarts the lease if Token
// is current. A Skip carries no key: it names its shard and stands for the
// records From..Seq, which cancelled out; a shard whose Seq is at least
// From-1 moves to Seq, one further behind returns ErrGap. A table fed by
// Apply normally has no waiters (its node
// executes no acquires); any waiter of a key that a record frees leaves its
// queue with an EffectMoved in out.
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
	ref, e := s.find(h, r.Key)
	switch r.Kind {
	case RecordGrant:
		if e == nil {
			if !s.room() || !t.reserve(&t.keys, t.maxKeys) {
				return false, ErrFull
			}
			ref, e = s.newEntry(h, r.Key)
		} else {
			s.delLease(e)
		}
		e.token, e.lease = r.Token, r.Lease
		e.ident = uint16(t.idents.intern(r.Ident))
		e.deadline = now + int64(r.Lease)*second
		s.addLease(ref, e)
		t.tokens.Observe(r.Token)
		s.ctr.Grants++
	case RecordRelease, RecordExpire:
		if e != nil && e.token == r.Token {
			s.delLease(e)
			if r.Kind == RecordRelease {
				s.ctr.Releases++
			} else {
				s.ctr.Expiries++
			}
			s.dequeueAll(e, EffectMoved, out)
			s.freeEntry(ref, e, h)
		}
	case RecordRenew:
		if e != nil && e.token == r.Token {
			s.delLease(e)
			e.lease = r.Lease
			e.deadline = now + int64(r.Lease)*second
			s.addLease(ref, e)
			s.ctr.Renews++
		}
	}
	s.seq = r.Seq
	return true, nil
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
	s.seq = seq
	s.mu.Unlock()
}

// DumpShard calls fn for every held key of shard i with its token, lease
// deadline (t's clock) and lease seconds (0 for a restored lock), under the
// shard's lock, and returns the Seq of the shard's last record at that
// point: the dump and the records with a larger Seq make up the shard's
// whole history. key is valid only during the call; fn must not call back
// into the Table.
func (t *Table) DumpShard(i int, fn func(key []byte, token uint64, deadline int64, lease uint8)) (seq uint64) {
	return t.Dump(i, func(h *HeldLock) { fn(h.Key, h.Token, h.Deadline, h.Lease) })
}

// HeldLock is one held key as Dump reports it.
type HeldLock struct {
	Key      []byte // valid only during the call
	Token    uint64
	Deadline int64 // lease deadline on the table's clock
	Lease    uint8 // lease seconds (0 for a restored lock)
	// Ident names the identity the grant was made to (nil: none); the
	// bytes are the table's and stay valid, but must not be modified.
	Ident []byte
}

// Dump is DumpShard with the grant's identity: it calls fn for every held
// key of shard i under the shard's lock and returns the shard's Seq at that
// point. h is reused between calls; fn must not call back into the Table.
func (t *Table) Dump(i int, fn func(h *HeldLock)) (seq uint64) {
	s := &t.shards[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	var h HeldLock
	s.each(func(_ ref, e *entry) {
		h = HeldLock{Key: s.keyOf(e), Token: e.token, Deadline: e.deadline, Lease: e.lease, Ident: t.idents.name(Ident(e.ident))}
		fn(&h)
	})
	return s.seq
}

// Reset empties the table: every key is freed (its waiters leave with an
// EffectMoved in out) and every shard's Seq goes back to 0. The token
// allocator is left as it is: tokens never go back.
func (t *Table) Reset(out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		// From the top down, so that no freed entry is passed again.
		for r := s.slab.hwm - 1; r > 0; r-- {
			if e := s.ent(r); e.kl != klFree {
				s.dequeueAll(e, EffectMoved, out)
				s.delLease(e)
				s.freeEntry(r, e, xxhash.Sum64(s.keyOf(e)))
			}
		}
		s.seq = 0
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

// ExtendLeases moves every held key's lease deadline that is earlier than
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
