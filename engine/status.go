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
