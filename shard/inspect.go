package shard

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Validate answers a validate (PROTOCOL.md §9.3): ok and the holder's lease
// deadline when token is a current holder of key (of an exclusive key, or
// any one holder of a shared key), else false (answer N). It changes
// nothing, but what is due at now is processed first, as for every request
// (an ended lease is ended, its effects in out), so a holder past its
// deadline is never valid. The caller answers the time left, deadline−now.
func (t *Table) Validate(now int64, key []byte, token uint64, out *Out) (deadline int64, ok bool) {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	r, e := s.lookup(now, h, key, out)
	if e != nil {
		if _, xe := s.holder(r, e, token); xe != nil {
			deadline, ok = xe.deadline, true
		}
	}
	s.settle()
	s.mu.Unlock()
	return deadline, ok
}

// WatchStatus is the immediate outcome of Watch.
type WatchStatus uint8

// Watch outcomes.
const (
	Watching     WatchStatus = iota + 1 // registered: answer W; one EffectLost follows when the grant ends
	WatchNotHeld                        // token is not a current holder of key: answer N
	WatchLimit                          // c has Config.MaxWatchesPerConn watches (or was dropped): answer E 8
)

// String returns the status name.
func (w WatchStatus) String() string {
	switch w {
	case Watching:
		return "watching"
	case WatchNotHeld:
		return "not-held"
	case WatchLimit:
		return "limit"
	}
	return "WatchStatus(?)"
}

// Watch registers, for c, a watch of the grant token of key (PROTOCOL.md
// §9.4): Watching when token is a current holder of key, and then exactly
// one EffectLost (carrying c, token and the Reason) when that grant ends —
// released, expired, released by force, or EndWatches — unless c is
// dropped first (DropConn drops its watches silently). Two watches of one
// grant are two registrations, two effects. c at its bound answers
// WatchLimit before anything is looked up (PROTOCOL.md §9.6: E 8 before N).
// What is due at now is processed first (effects in out). c may be nil
// (no bound, effects carry a nil Conn).
func (t *Table) Watch(now int64, key []byte, token uint64, c *Conn, out *Out) WatchStatus {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	st := s.watchKey(now, h, key, token, c, out)
	s.settle()
	s.mu.Unlock()
	return st
}

func (s *shard) watchKey(now int64, h uint64, key []byte, token uint64, c *Conn, out *Out) WatchStatus {
	if c != nil && c.watchFull(s.t.maxWatchesPerConn) {
		return WatchLimit
	}
	r, e := s.lookup(now, h, key, out)
	if e == nil {
		return WatchNotHeld
	}
	x, xe := s.holder(r, e, token)
	if xe == nil {
		return WatchNotHeld
	}
	if !s.watch(x, xe, c) {
		return WatchLimit
	}
	return Watching
}

// EndWatches gives every watch of the table an EffectLost with
// ReasonCannotTell and forgets them: the node stops answering for its
// grants (shutdown, step-down, demotion, freeze; PROTOCOL.md §9.4). Grants
// and waiters stay.
func (t *Table) EndWatches(out *Out) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.endWatches(out)
		s.mu.Unlock()
	}
}

// Inspection is a key's state as an inspect answers it (PROTOCOL.md §9.5).
type Inspection struct {
	Holders int // 0 when free
	// Limit is 0 when free, 1 for an exclusive holder, and the limit of a
	// shared key (1 too for a key shared with limit 1).
	Limit   int
	Waiters int    // queued acquires
	Token   uint64 // the newest holder's token (0 when free)
	// Deadline is the newest holder's lease deadline (0 when free); the
	// caller answers the time left, Deadline−now.
	Deadline int64
}

// Inspect answers an inspect (PROTOCOL.md §9.5). It changes nothing, but
// what is due at now is processed first (effects in out), so an ended
// lease is not counted.
func (t *Table) Inspect(now int64, key []byte, out *Out) Inspection {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	var in Inspection
	if _, e := s.lookup(now, h, key, out); e != nil {
		y := s.newestEntry(e)
		in = Inspection{Holders: s.holders(e), Limit: 1, Waiters: int(s.waiters(e)), Token: y.token, Deadline: y.deadline}
		if q := s.sharedQueue(e); q != nil {
			in.Limit = int(q.limit)
		}
	}
	s.settle()
	s.mu.Unlock()
	return in
}

// KeyDetail is everything the table knows of one key, for the admin
// endpoint's per-key view (PROTOCOL.md §9.5).
type KeyDetail struct {
	// Limit is 0 when free, 1 for an exclusive key, the limit of a shared
	// key.
	Limit int
	// Shared tells a key shared with limit 1 from an exclusive one.
	Shared  bool
	Holders []HolderInfo // oldest grant first
	Waiters []WaiterInfo // in queue order, the head first
}

// HolderInfo is one holder of a key.
type HolderInfo struct {
	Token    uint64
	Deadline int64  // lease deadline on the table's clock
	Lease    uint8  // lease seconds of its grant or last renew (0 for a restored one)
	Ident    string // the identity the grant was made to ("": none)
}

// WaiterInfo is one queued acquire of a key.
type WaiterInfo struct {
	Owner    uint64
	Ident    string // the identity it came from ("": none)
	Deadline int64  // wait deadline on the table's clock
	Queued   int64  // when it was queued
	Lease    uint8  // the lease it asked for
	// Limit is 0 for an exclusive acquire (A), the limit of an acquire
	// shared (S).
	Limit uint16
}

// Detail returns key's holders and waiters. Like Lookup it processes
// nothing (a lease past its deadline that no Tick or request has ended
// yet is listed), and it allocates: it is for the admin endpoint, not the
// request path.
func (t *Table) Detail(key []byte) KeyDetail {
	h := xxhash.Sum64(key)
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, e := s.find(h, key)
	if e == nil {
		return KeyDetail{}
	}
	d := KeyDetail{Limit: 1}
	if q := s.sharedQueue(e); q != nil {
		d.Limit, d.Shared = int(q.limit), true
	}
	s.eachHolder(e, func(x *entry) {
		d.Holders = append(d.Holders, HolderInfo{Token: x.token, Deadline: x.deadline, Lease: x.lease, Ident: t.idents.lookup(Ident(x.ident)).s})
	})
	slices.SortFunc(d.Holders, func(a, b HolderInfo) int { return cmp.Compare(a.Token, b.Token) })
	if w := s.head(e); w != nil {
		for first := w; ; {
			d.Waiters = append(d.Waiters, WaiterInfo{Owner: w.owner, Ident: t.idents.lookup(w.ident).s, Deadline: w.deadline,
				Queued: w.queued, Lease: w.lease, Limit: w.limit})
			if w = w.next; w == first {
				break
			}
		}
	}
	return d
}
