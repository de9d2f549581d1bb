package engine

import (
	"errors"
	"time"

	"github.com/lockd-dev/lockd/repl"
)

// KeyState is what the server knows of one key right now.
type KeyState struct {
	Held      bool
	Token     uint64        // the current grant's token, when held
	LeaseLeft time.Duration // until the lease ends, when held
	Waiters   int           // queued acquires
	Ident     string        // the identity the grant was made to ("": none, PROTOCOL.md §8.3)
}

// Key returns key's state. A lease that has ended but that no timer has
// processed yet is reported free.
func (s *Server) Key(key []byte) KeyState {
	info := s.table.Lookup(key)
	if !info.Held {
		return KeyState{}
	}
	left := time.Duration(info.Deadline - s.now())
	if left <= 0 {
		return KeyState{}
	}
	return KeyState{Held: true, Token: info.Token, LeaseLeft: left, Waiters: info.Waiters, Ident: info.Ident}
}

// KeyDetail is everything the server knows of one key right now: every
// holder and every waiter (PROTOCOL.md §9.5), for the admin endpoint's
// per-key view.
type KeyDetail struct {
	// Limit is 0 when free, 1 for an exclusive key, the limit of a shared
	// key; Shared tells a key shared with limit 1 from an exclusive one.
	Limit  int
	Shared bool
	// Holders are the grants whose lease has not ended, oldest first.
	Holders []HolderState
	// Waiters are the queued acquires in queue order, the head first.
	Waiters []WaiterState
}

// HolderState is one holder of a key.
type HolderState struct {
	Token     uint64
	Ident     string        // the identity it was granted to ("": none)
	LeaseLeft time.Duration // until its lease ends
}

// WaiterState is one queued acquire of a key.
type WaiterState struct {
	Owner    uint64
	Ident    string        // the identity it came from ("": none)
	WaitLeft time.Duration // until its wait ends (0 once it has: its T is on its way)
	Lease    uint8         // the lease it asked for, seconds
	// Limit is 0 for an exclusive acquire (A), the limit of an acquire
	// shared (S).
	Limit uint16
}

// KeyDetail returns key's holders and waiters. Like Key it reports a
// lease that has ended, but that no timer has processed yet, as gone. It
// allocates (for the admin endpoint, not the request path).
func (s *Server) KeyDetail(key []byte) KeyDetail {
	d := s.table.Detail(key)
	now := s.now()
	out := KeyDetail{Limit: d.Limit, Shared: d.Shared, Holders: []HolderState{}, Waiters: []WaiterState{}}
	for _, x := range d.Holders {
		if x.Deadline > now {
			out.Holders = append(out.Holders, HolderState{Token: x.Token, Ident: x.Ident, LeaseLeft: time.Duration(x.Deadline - now)})
		}
	}
	for _, w := range d.Waiters {
		out.Waiters = append(out.Waiters, WaiterState{Owner: w.Owner, Ident: w.Ident, WaitLeft: time.Duration(max(w.Deadline-now, 0)),
			Lease: w.Lease, Limit: w.Limit})
	}
	if len(out.Holders) == 0 && len(out.Waiters) == 0 {
		out.Limit, out.Shared = 0, false
	}
	return out
}

// Locks calls fn for every held key whose lease has not ended, with its
// token and the lease time left, one shard at a time. Each shard is copied
// under its lock and fn runs after the lock is released, so a slow fn (an
// HTTP client reading /debug/locks slowly) never holds up requests. key is
// valid only during the call.
func (s *Server) Locks(fn func(key []byte, token uint64, left time.Duration)) {
	type held struct {
		end   int // of the key in keys
		token uint64
		left  time.Duration
	}
	var (
		keys []byte
		list []held
	)
	for i := range s.table.Shards() {
		keys, list = keys[:0], list[:0]
		now := s.now()
		s.table.DumpShard(i, func(key []byte, token uint64, deadline int64, _ uint8) {
			if deadline > now {
				keys = append(keys, key...)
				list = append(list, held{len(keys), token, time.Duration(deadline - now)})
			}
		})
		start := 0
		for _, h := range list {
			fn(keys[start:h.end], h.token, h.left)
			start = h.end
		}
	}
}

// NodeStatus is the node's account of itself (mode, role, active, epoch,
// token reservations, members).
func (s *Server) NodeStatus() repl.Status { return s.node.Status() }

// Draining reports whether the shutdown sequence has begun (PROTOCOL.md §4):
// the node is about to stop and should take no new work. It reads one
// atomic, takes no lock, and is cheap enough for a health probe.
func (s *Server) Draining() bool { return s.draining.Load() }

// ErrDraining is Health's answer once shutdown has begun.
var ErrDraining = errors.New("engine: shutting down")

// Health is nil while the server serves normally: not shutting down, and
// its node healthy (token reservations succeeding, an active known). It
// takes no table lock.
func (s *Server) Health() error {
	if s.draining.Load() {
		return ErrDraining
	}
	return s.node.Health()
}
