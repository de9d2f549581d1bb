package shard

import (
	"sync/atomic"
	"testing"
	"time"
)

// The ways one service-wide token sequence can be kept (docs/DESIGN.md,
// "Tokens"), measured side by side: each hands out strictly increasing
// tokens up to a reserved limit and answers 0 beyond it. They differ in
// what the hot word costs when every event loop takes tokens from it.

// casTokens is a compare-and-swap loop that checks the limit before it
// takes a token: a failed swap (another loop took one meanwhile) tries
// again.
type casTokens struct {
	last  atomic.Uint64
	_     [56]byte
	limit atomic.Uint64
}

func (t *casTokens) next() uint64 {
	for {
		v := t.last.Load()
		if v >= t.limit.Load() {
			return 0
		}
		if t.last.CompareAndSwap(v, v+1) {
			return v + 1
		}
	}
}

// addTokens is one atomic add, the limit checked after it: a token taken
// above the limit is never handed out (0), and never comes back.
type addTokens struct {
	last  atomic.Uint64
	_     [56]byte
	limit atomic.Uint64
}

func (t *addTokens) next() uint64 {
	if v := t.last.Add(1); v <= t.limit.Load() {
		return v
	}
	return 0
}

// clockTokens is a compare-and-swap loop with a clock floor: the next
// token is the larger of the last one + 1 and the wall clock in ns, so
// that tokens follow the clock while the load is below 10⁹ a second.
type clockTokens struct {
	last  atomic.Uint64
	_     [56]byte
	limit atomic.Uint64
}

func (t *clockTokens) next() uint64 {
	for {
		v := t.last.Load()
		n := max(v+1, uint64(time.Now().UnixNano()))
		if n > t.limit.Load() {
			return 0
		}
		if t.last.CompareAndSwap(v, n) {
			return n
		}
	}
}

// BenchmarkTokenSchemes takes tokens from every parallel goroutine, with
// nothing else between two takes (the worst case: in lockd a token is one
// step of a request that costs 100 times more).
func BenchmarkTokenSchemes(b *testing.B) {
	for _, c := range []struct {
		name string
		next func() uint64
	}{
		{"cas", func() func() uint64 { t := &casTokens{}; t.limit.Store(1 << 62); return t.next }()},
		{"add", func() func() uint64 { t := &addTokens{}; t.limit.Store(1 << 62); return t.next }()},
		{"clock", func() func() uint64 { t := &clockTokens{}; t.limit.Store(1 << 62); return t.next }()},
		{"Tokens", NewTokens(0, 1<<62).Next},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if c.next() == 0 {
						b.Error("no token")
						return
					}
				}
			})
		})
	}
}
