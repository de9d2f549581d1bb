package shard

// Status is the immediate outcome of Acquire.
type Status uint8

// Acquire outcomes.
const (
	Granted  Status = iota + 1 // the key was free: token returned, answer A now
	TimedOut                   // wait=0 on a held key: answer T now
	Busy                       // a capacity limit: answer B now, nothing queued
	Queued                     // queued: a later Effect answers it (grant or timeout)
	// Mismatch: an AcquireShared whose limit differs from the limit of the
	// key's shared holders, or limit 0 (answer E 7, PROTOCOL.md §9.2).
	Mismatch
)

// String returns the status name.
func (s Status) String() string {
	switch s {
	case Granted:
		return "granted"
	case TimedOut:
		return "timedout"
	case Busy:
		return "busy"
	case Queued:
		return "queued"
	case Mismatch:
		return "mismatch"
	}
	return "Status(?)"
}

// EffectKind says what a deferred answer is.
type EffectKind uint8

// Effect kinds.
const (
	EffectGrant   EffectKind = iota + 1 // a queued acquire was granted (handoff): answer A with Token
	EffectTimeout                       // a queued acquire's wait passed: answer T
	EffectCancel                        // CancelWaiters removed it (shutdown): answer E 4
	EffectBusy                          // it would have got the key, but no token could be had: answer B
	EffectMoved                         // MoveWaiters removed it (this node stopped executing): answer M
	// EffectLost: a watched grant ended (PROTOCOL.md §9.4): answer L with
	// Token and Reason on Conn, the watch's connection. Exactly one per
	// registered watch, unless its connection is dropped first.
	EffectLost
)

// Reason says why a watched grant ended: the reason byte of an L frame
// (PROTOCOL.md §9.4), with the same values.
type Reason uint8

// Reasons.
const (
	ReasonReleased   Reason = 1 // released, by any connection (its own identity, or no ACL)
	ReasonExpired    Reason = 2 // its lease ended
	ReasonForced     Reason = 3 // released by an admin identity or the admin endpoint, or its lease ended after an admin renewed it
	ReasonCannotTell Reason = 4 // this table stopped telling: EndWatches (shutdown, step-down), Reset, or a replicated or restored grant replaced it
)

// String returns the reason's name.
func (r Reason) String() string {
	switch r {
	case ReasonReleased:
		return "released"
	case ReasonExpired:
		return "expired"
	case ReasonForced:
		return "forced"
	case ReasonCannotTell:
		return "cannot-tell"
	}
	return "Reason(?)"
}

// String returns the effect kind's name.
func (k EffectKind) String() string {
	switch k {
	case EffectGrant:
		return "grant"
	case EffectTimeout:
		return "timeout"
	case EffectCancel:
		return "cancel"
	case EffectBusy:
		return "busy"
	case EffectMoved:
		return "moved"
	case EffectLost:
		return "lost"
	}
	return "EffectKind(?)"
}

// Effect is an answer owed to a queued acquire or a watch on some
// connection, produced by a release, an expiry, a tick, CancelWaiters,
// MoveWaiters or EndWatches. The caller delivers it after the call returns
// (no table lock is held then). A grant that cannot be delivered (its
// connection is gone) must be given back with Release.
type Effect struct {
	Kind   EffectKind
	Reason Reason // EffectLost: why the grant ended
	// Limit is the waiter's: 0 for an acquire (A), the limit of an
	// acquire shared (S), so that an answer correlated by (op, owner) — M,
	// E — names the request's op. 0 for EffectLost.
	Limit  uint16
	Conn   *Conn  // the waiter's or the watch's connection
	Owner  uint64 // the waiter's owner id (0 for EffectLost)
	Token  uint64 // EffectGrant: the new token; EffectLost: the ended grant's token
	Key    []byte // copy of the key in Out's arena; valid until Out.Reset
	Queued int64  // when the acquire was queued (table clock), for wait-time metrics
}

// Out collects effects. The caller owns it, reuses it across calls (Reset),
// and must not share one Out between goroutines.
type Out struct {
	Effects []Effect
	// arena holds the effects' key copies. It only grows by append: when it
	// is reallocated, earlier Keys keep pointing into the old backing array,
	// which nothing writes to any more, so they stay valid until Reset.
	arena []byte
}

// Reset empties o, keeping its memory.
func (o *Out) Reset() {
	clear(o.Effects) // drop Conn pointers so closed connections can be collected
	o.Effects = o.Effects[:0]
	o.arena = o.arena[:0]
}

// add appends an effect with a copy of key.
func (o *Out) add(kind EffectKind, w *waiter, token uint64, key []byte) {
	n := len(o.arena)
	o.arena = append(o.arena, key...)
	m := len(o.arena)
	o.Effects = append(o.Effects, Effect{
		Kind:   kind,
		Limit:  w.limit,
		Conn:   w.conn,
		Owner:  w.owner,
		Token:  token,
		Key:    o.arena[n:m:m],
		Queued: w.queued,
	})
}

// addLost appends the EffectLost of the watch w (of the grant token of key).
func (o *Out) addLost(w *waiter, token uint64, key []byte, reason Reason) {
	n := len(o.arena)
	o.arena = append(o.arena, key...)
	m := len(o.arena)
	o.Effects = append(o.Effects, Effect{Kind: EffectLost, Reason: reason, Conn: w.conn, Token: token, Key: o.arena[n:m:m]})
}

// RecordKind names a state change.
type RecordKind uint8

// Record kinds (PROTOCOL.md §5; source 002).
const (
	RecordGrant   RecordKind = iota + 1 // key granted with Token until Deadline
	RecordRelease                       // key released by its holder (Token)
	RecordExpire                        // Token's lease ended
	RecordRenew                         // Token's lease restarted, now ending at Deadline
	// RecordSkip stands for the shard's records From..Seq, which made no
	// lasting change together (a grant and its end, sent as one batch):
	// applying it only advances the shard's Seq. A table never emits one;
	// a sender that cancels records out of a batch writes it.
	RecordSkip
)

// String returns the record kind's name.
func (k RecordKind) String() string {
	switch k {
	case RecordGrant:
		return "grant"
	case RecordRelease:
		return "release"
	case RecordExpire:
		return "expire"
	case RecordRenew:
		return "renew"
	case RecordSkip:
		return "skip"
	}
	return "RecordKind(?)"
}

// Record is one state change, small enough to stream to a replica. What it
// means off this process is Kind, Key, Token, Lease (a duration: the
// lease runs Lease seconds from the change), Ident and Limit, numbered by
// Seq within Shard; Deadline is the same lease end on this table's own
// clock, meaningful only here. Apply replays records on another table.
//
// A shared key (PROTOCOL.md §9.2) has one Grant per holder, each with the
// key's limit, and each holder ends with its own Release or Expire (Token
// names the holder); a Renew restarts the lease of the holder Token names.
type Record struct {
	Kind RecordKind
	// Shard is the index of the shard that made the record (the top bits of
	// the key's xxhash: equal on tables with the same shard count).
	Shard uint32
	// Seq numbers the shard's records: 1, 2, 3, … without gaps, in the
	// order the changes happened. A shard's dump carries the Seq of its last
	// record, so a dump and a stream join without doubles or gaps.
	Seq      uint64
	Key      []byte // valid only during the Sink call
	Token    uint64
	Lease    uint8  // Grant, Renew: lease seconds
	Deadline int64  // Grant, Renew: lease deadline on the table's clock (ns)
	From     uint64 // Skip: the first Seq it stands for (Seq is the last)
	// Ident is, on a Grant, the name of the identity the grant was made to
	// (PROTOCOL.md §8.3; empty: none, the token alone decides); a name,
	// not the table's handle, so that it means the same on another
	// process. Made by a table, it is valid beyond the Sink call (the
	// registry's bytes never change) but must not be modified.
	Ident []byte
	// Limit is, on a Grant, the key's holder limit when it is shared (an
	// acquire shared, 1..65535), 0 for an exclusive grant.
	Limit uint16
}
