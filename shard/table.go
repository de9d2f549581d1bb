package shard

import (
	"errors"
	"math"

	"github.com/cespare/xxhash/v2"
)

// Table is the lock table: keys spread over shards by xxhash, each shard
// guarded by its own mutex. All methods are safe for concurrent use. Time is
// an input: now is nanoseconds on a monotonic clock chosen by the caller
// (the same clock for every call). No method blocks, sleeps, starts a
// goroutine or does I/O (except Tokens.Next, see there).
type Table struct {
	// The bounds MaxKeys, MaxWaiters and MaxHolders (budget.go): each
	// shard counts what it uses, and takes units from these in batches.
	// First, so that each budget's counter starts a cache line.
	budgets [nBudgets]budget

	shards []shard
	shift  uint // shard of hash h: h >> shift (the top bits; the index uses the low ones)
	tokens *Tokens
	// sinkRef is Config.SinkRef (or a call of Config.Sink with a copy),
	// recs the Record each shard hands it (one per shard, each on lines of
	// its own, written under the shard's lock).
	sinkRef func(*Record)
	deferFn func(uint32, int) bool // Config.Defer, nil without a Sink
	recs    []paddedRecord
	idents  idents // the names of the grants' identities (ident.go)

	maxPerKey                     int64
	maxPerConn, maxWatchesPerConn int
}

// ErrFull is returned by Restore when MaxKeys (or, for a further holder of
// a shared key, MaxHolders) is reached.
var ErrFull = errors.New("shard: table full")

// ErrNilTokens is returned by New without a token allocator.
var ErrNilTokens = errors.New("shard: nil Tokens")

// wheelBudget is the number of timer wheel slots of a whole table, spread
// over its shards (each gets 256..4096). With the 10 ms tick a rotation of
// 4096 slots lasts 41 s, so a 255 s lease waits at most 7 rotations, and an
// empty 64-shard table spends 3 MiB on its wheels (a 4-byte lease head
// and an 8-byte wait head a slot).
const (
	wheelBudget   = 1 << 18
	minWheelSlots = 256
	maxWheelSlots = 4096
)

// New returns an empty table that takes tokens from tokens.
func New(cfg Config, tokens *Tokens) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tokens == nil {
		return nil, ErrNilTokens
	}
	t := &Table{
		shards:     make([]shard, cfg.Shards),
		tokens:     tokens,
		sinkRef:    cfg.SinkRef,
		maxPerKey:  int64(cfg.MaxWaitersPerKey),
		maxPerConn: cfg.MaxWaitersPerConn,

		maxWatchesPerConn: cfg.MaxWatchesPerConn,
	}
	bits := uint(0)
	for 1<<bits < cfg.Shards {
		bits++
	}
	t.shift = 64 - bits
	if sink := cfg.Sink; sink != nil && t.sinkRef == nil {
		t.sinkRef = func(r *Record) { sink(*r) }
	}
	if t.sinkRef != nil {
		t.recs = make([]paddedRecord, cfg.Shards)
		t.deferFn = cfg.Defer
	}
	t.budgets[budgetKeys].init(int64(cfg.MaxKeys), cfg.Shards)
	t.budgets[budgetWaiters].init(int64(cfg.MaxWaiters), cfg.Shards)
	t.budgets[budgetHolders].init(int64(cfg.MaxHolders), cfg.Shards)
	slots := min(max(wheelBudget/cfg.Shards, minWheelSlots), maxWheelSlots)
	for i := range t.shards {
		s := &t.shards[i]
		s.t = t
		s.id = uint32(i)
		s.idx.init()
		s.hidx.init()
		s.slab.hwm = 1
		s.wheel.init(int64(cfg.Tick), slots)
	}
	return t, nil
}

// Tokens returns the table's token allocator.
func (t *Table) Tokens() *Tokens { return t.tokens }

// shardOf returns the shard of a key hash.
func (t *Table) shardOf(h uint64) *shard { return &t.shards[h>>t.shift] }

// Acquire applies an acquire request (PROTOCOL.md §4 "A" rows). wait and
// lease are seconds (lease ≥ 1, checked by the parser). On Granted the token
// is returned. Queued means an Effect on c will follow (EffectGrant or
// EffectTimeout, or EffectCancel). A grant or handoff made necessary by a
// lease that has already passed at now is processed first (its effects go to
// out). The key bytes are copied only when a new key entry is created.
//
// c may be nil (the waiter is then linked to no connection and its effects
// carry a nil Conn). An acquire that would queue answers Busy when c already
// has Config.MaxWaitersPerConn queued acquires. Acquiring with a Conn after
// DropConn or DropWaiters(c) is a caller bug; the table answers Busy instead
// of queueing such a request.
func (t *Table) Acquire(now int64, key []byte, wait, lease uint8, owner uint64, c *Conn, out *Out) (Status, uint64) {
	return t.AcquireAs(now, key, wait, lease, owner, NoIdent, c, out)
}

// AcquireAs is Acquire by the identity id (PROTOCOL.md §8.3): the grant,
// immediate or handed off later to this acquire, is made to id, and only
// id (or an admin) may release or renew it (ReleaseAs, RenewAs). NoIdent
// is Acquire.
func (t *Table) AcquireAs(now int64, key []byte, wait, lease uint8, owner uint64, id Ident, c *Conn, out *Out) (Status, uint64) {
	id = min(id, identOverflow) // the entry keeps 16 bits: no handle is larger
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	st, tok := s.acquire(now, h, key, wait, lease, owner, id, c, out)
	s.settle()
	s.mu.Unlock()
	return st, tok
}

// AcquireShared applies an acquire shared (PROTOCOL.md §9.2) with limit
// (1..65535) by the identity id (NoIdent: none):
//
//   - a free key is granted (Granted), and becomes shared with limit until
//     it is free again;
//   - a shared key with another limit answers Mismatch (E 7) — before any
//     other answer; so does limit 0;
//   - a shared key with the same limit, fewer holders than it and no one
//     queued is granted another holder, with its own token and lease
//     (Busy beyond Config.MaxHolders);
//   - otherwise (full, someone queued, or held exclusively) it queues, or
//     answers TimedOut (wait 0) or Busy, as Acquire does.
//
// A queued acquire shared is granted when it reaches the head of the queue
// and fits (serve): the key is free, or shared with its limit and fewer
// holders than it. c, out and the bounds are as for Acquire.
func (t *Table) AcquireShared(now int64, key []byte, wait, lease uint8, owner uint64, limit uint16, id Ident, c *Conn, out *Out) (Status, uint64) {
	if limit == 0 {
		return Mismatch, 0
	}
	id = min(id, identOverflow)
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	st, tok := s.acquireShared(now, h, key, wait, lease, owner, limit, id, c, out)
	s.settle()
	s.mu.Unlock()
	return st, tok
}

// Release applies a release: true (answer R) if token is key's current
// token; then the key goes to the head waiter with a new token (an
// EffectGrant in out) or becomes free. false answers N. The token alone
// decides, whatever identity the grant was made to (the server's own
// releases: undelivered grants; and a node without an ACL).
func (t *Table) Release(now int64, key []byte, token uint64, out *Out) bool {
	res, _ := t.ReleaseAs(now, key, token, Who{}, out)
	return res.Done()
}

// ReleaseAs is Release by who (PROTOCOL.md §8.3): a current token of a
// grant made to another identity releases nothing (ResultRefused, answer N
// as for a stale token) unless who is an admin (ResultForced). A grant of
// no identity, or a who of no identity, is judged by the token alone. The
// grant's identity is returned (NoIdent when not held), so that the
// caller can log a forced or refused release with both identities.
//
// On a shared key token names one holder: that holder alone is released
// (its identity judged), and the queue is served from its head for as long
// as the head fits, in the same call. The watches of the released grant
// get an EffectLost: ReasonForced for a forced release or one by
// who.Operator, ReasonReleased otherwise.
func (t *Table) ReleaseAs(now int64, key []byte, token uint64, who Who, out *Out) (Result, Ident) {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	res, holder := s.release(now, h, key, token, who, out)
	s.settle()
	s.mu.Unlock()
	return res, holder
}

// Renew restarts the lease of key at lease seconds from now if token is its
// current token (true: answer K); false answers N. A lease that has passed at
// now is expired first (so the renew answers N). The token alone decides,
// as for Release.
func (t *Table) Renew(now int64, key []byte, lease uint8, token uint64, out *Out) bool {
	res, _ := t.RenewAs(now, key, lease, token, Who{}, out)
	return res.Done()
}

// RenewAs is Renew by who, judged as ReleaseAs judges a release. A forced
// renew keeps the grant's identity; should the lease it set end, the
// grant's watches are told ReasonForced. On a shared key token names one
// holder, whose lease alone restarts.
func (t *Table) RenewAs(now int64, key []byte, lease uint8, token uint64, who Who, out *Out) (Result, Ident) {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	res, holder := s.renew(now, h, key, lease, token, who, out)
	s.settle()
	s.mu.Unlock()
	return res, holder
}

// Tick processes every lease and wait deadline that is ≤ now across all
// shards: expiries (with handoff → EffectGrant) and wait timeouts
// (EffectTimeout). Call it at least every Config.Tick.
func (t *Table) Tick(now int64, out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.tick(now, out)
		s.unlock()
	}
}

// DropConn removes every queued acquire and every watch of c silently (its
// connection closed). Grants already made stay. Cost is proportional to
// c's waiters and watches.
func (t *Table) DropConn(c *Conn) { t.DropWaiters(c, math.MaxInt) }

// DropWaiters is DropConn in slices: it removes at most limit of c's queued
// acquires and watches and reports whether none is left. The first call
// marks c dropped, so from then on c queues and watches nothing (Acquire
// answers Busy, Watch WatchLimit), and the waiters not removed yet can
// still be granted or time out meanwhile, and the watches fire (their
// effects carry c, as before). Call it again, from any goroutine, until it
// reports true. Each is removed under its own shard lock, held for that one
// only. A waiter that leaves the head of a shared key's queue may let the
// ones behind it in: they are served at the next Tick or request on the
// key (DropWaiters has no Out to answer them in).
func (t *Table) DropWaiters(c *Conn, limit int) bool {
	// Snapshot a batch of c's waiters under c.mu (the lock order is shard →
	// Conn, so no shard lock may be taken while holding it), then remove each
	// under its shard lock if it is still the same queued waiter (same
	// generation, same conn). Every snapshot waiter leaves c's list, removed
	// here or meanwhile by a grant or timeout, and c refuses new waiters once
	// dropped, so repeated calls end.
	if c == nil {
		return true
	}
	var buf [32]dropRef
	for {
		n := c.snapshot(buf[:min(len(buf), max(limit, 0))])
		if n == 0 {
			return c.empty()
		}
		for _, r := range buf[:n] {
			s := &t.shards[r.shard]
			s.mu.Lock()
			if w := r.w; w.gen == r.gen && w.conn == c {
				if w.watch {
					s.unwatch(w)
				} else {
					s.dropWaiter(w)
				}
			}
			s.unlock()
		}
		limit -= n
	}
}

// CancelWaiters removes every queued acquire of every key and appends an
// EffectCancel for each (shutdown). Held locks stay.
func (t *Table) CancelWaiters(out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.cancel(EffectCancel, out)
		s.unlock()
	}
}

// Held calls fn for every holder of every held key (a shared key's holders
// one after the other) with its token and lease deadline, shard by shard
// (each shard locked during its walk). key is valid only during the call.
// fn must not call back into the Table.
func (t *Table) Held(fn func(key []byte, token uint64, deadline int64)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.eachKey(func(_ ref, e *entry) {
			key := s.keyOf(e)
			s.eachHolder(e, func(x *entry) { fn(key, x.token, x.deadline) })
		})
		s.mu.Unlock()
	}
}

// Restore installs a held lock (after a restart): key held by token until
// deadline, exclusively. It emits no Record. A key already present is
// overwritten (every holder it has replaced) only if token is larger than
// its newest holder's.
func (t *Table) Restore(key []byte, token uint64, deadline int64) error {
	return t.RestoreAs(key, token, deadline, nil)
}

// RestoreAs is Restore of a grant made to the identity called ident (nil
// or empty: none), as a snapshot or a dump names it.
func (t *Table) RestoreAs(key []byte, token uint64, deadline int64, ident []byte) error {
	return t.RestoreHolder(&HeldLock{Key: key, Token: token, Deadline: deadline, Ident: ident})
}

// RestoreHolder installs one holder as Dump reports it (Key, Token,
// Deadline, Ident, Limit; Lease is not kept: a restored grant has none). It
// emits no Record and does not serve waiters. Restoring a dump's holders,
// in any order, into an empty table rebuilds the dumped keys holder by
// holder. Into a table that holds the key already:
//
//   - a holder with that token already there: nothing;
//   - a shared key with the same Limit and fewer holders than it: one more
//     holder (ErrFull beyond Config.MaxHolders);
//   - otherwise, if Token is larger than the key's newest holder's, the
//     key's holders are replaced by this one (their watches end silently:
//     a table fed by restores serves none), its waiters stay; else
//     nothing.
//
// A new key beyond Config.MaxKeys is ErrFull. The caller makes the token
// allocator observe the tokens (Tokens.Observe).
func (t *Table) RestoreHolder(h *HeldLock) error {
	id := t.idents.intern(h.Ident)
	hash := xxhash.Sum64(h.Key)
	s := t.shardOf(hash)
	s.mu.Lock()
	err := s.restore(hash, h.Key, h.Token, h.Deadline, id, h.Limit)
	s.unlock()
	return err
}

// Stats is a point-in-time count.
type Stats struct {
	Keys    int // keys held
	Waiters int // queued acquires
	// Holders counts the holders of shared keys beyond each key's first
	// (the ones Config.MaxHolders bounds): a key's first holder is in Keys.
	Holders int
	Watches int // watches registered
}

// Stats returns the table's counts, summed over its shards (each locked
// in turn: for a metrics scrape, not for the hot path).
func (t *Table) Stats() Stats {
	var st Stats
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		st.Keys += int(s.quota[budgetKeys].used)
		st.Waiters += int(s.quota[budgetWaiters].used)
		st.Holders += int(s.quota[budgetHolders].used)
		st.Watches += s.nwatch
		s.mu.Unlock()
	}
	return st
}

// Counters are totals since the table was made, summed over its shards.
type Counters struct {
	Grants   uint64 // every grant, immediate or handoff
	Handoffs uint64 // grants to a queued acquire (release or expiry handoff)
	Expiries uint64 // leases that ended without a release
	Timeouts uint64 // queued acquires whose wait passed
	Releases uint64 // successful releases
	Renews   uint64 // successful renews
	NoToken  uint64 // acquires and handoffs answered Busy because no token was reserved

	// Operations on another identity's grant (ReleaseAs, RenewAs,
	// PROTOCOL.md §8.3): Forced ones were an admin's and happened (they
	// are also in Releases and Renews); Refused ones carried the current
	// token from another identity and were answered N.
	ForcedReleases  uint64
	ForcedRenews    uint64
	RefusedReleases uint64
	RefusedRenews   uint64

	// Lost counts the EffectLost given to watches, by Reason (index 0
	// unused).
	Lost [5]uint64
}

// Counters sums the shards' counters, locking each shard in turn (for a
// metrics scrape, not for the hot path).
func (t *Table) Counters() Counters {
	var c Counters
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		x := s.ctr
		s.mu.Unlock()
		c.Grants += x.Grants
		c.Handoffs += x.Handoffs
		c.Expiries += x.Expiries
		c.Timeouts += x.Timeouts
		c.Releases += x.Releases
		c.Renews += x.Renews
		c.NoToken += x.NoToken
		c.ForcedReleases += x.ForcedReleases
		c.ForcedRenews += x.ForcedRenews
		c.RefusedReleases += x.RefusedReleases
		c.RefusedRenews += x.RefusedRenews
		for r := range c.Lost {
			c.Lost[r] += x.Lost[r]
		}
	}
	return c
}

// KeyInfo describes one key for the admin endpoint. Of a shared key, Token,
// Deadline and Ident are the newest holder's.
type KeyInfo struct {
	Held     bool
	Token    uint64
	Deadline int64
	Waiters  int
	// Ident is the name of the identity the grant was made to ("": none).
	Ident string
	// Holders is the number of holders (1 for an exclusive key; 0 free).
	Holders int
	// Limit is the key's shared limit, 0 for an exclusive or free key.
	Limit int
}

// Lookup returns key's state. It processes nothing: a lease whose deadline
// has passed but that no Tick or request has expired yet is still reported
// held.
func (t *Table) Lookup(key []byte) KeyInfo {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, e := s.find(h, key)
	if e == nil {
		return KeyInfo{}
	}
	y := s.newestEntry(e)
	ki := KeyInfo{Held: true, Token: y.token, Deadline: y.deadline, Waiters: int(s.waiters(e)), Ident: t.idents.lookup(Ident(y.ident)).s,
		Holders: s.holders(e)}
	if q := s.sharedQueue(e); q != nil {
		ki.Limit = int(q.limit)
	}
	return ki
}
