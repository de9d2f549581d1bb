package ratelog

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is a Limiter's interval when its Every is zero.
const DefaultEvery = time.Second

// Limiter lets the first event through, then one event per Every, and
// counts the events it holds back in between. The zero Limiter lets one
// event a second through. It is not safe for concurrent use (Shared is).
type Limiter struct {
	// Every is the shortest time between two events let through
	// (DefaultEvery when zero).
	Every time.Duration

	last   int64 // when the last event was let through
	passed bool  // an event was let through (last is set)
	held   int   // events held back since
}

// Allow reports whether the event at now (nanoseconds, on a clock that
// does not go back) gets its log line, and, when it does, how many events
// were held back since the last one that did (the line should say so).
// An event held back returns (0, false).
func (l *Limiter) Allow(now int64) (held int, ok bool) {
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	if l.passed && now-l.last < int64(every) {
		l.held++
		return 0, false
	}
	held, l.held, l.last, l.passed = l.held, 0, now, true
	return held, true
}

// Shared is a Limiter safe for concurrent use. Its zero value lets one
// event a second through.
type Shared struct {
	mu sync.Mutex
	l  Limiter
}

// NewShared returns a Shared that lets one event per every through.
func NewShared(every time.Duration) *Shared { return &Shared{l: Limiter{Every: every}} }

// Allow is Limiter.Allow, from any goroutine.
func (s *Shared) Allow(now int64) (held int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l.Allow(now)
}

// Atomic is a Limiter safe for concurrent use without a lock: an event
// costs an atomic load and an atomic add or swap, so the goroutines that
// report a flood (every event loop refusing connections, say) never wait
// on one another, and a caller that must not block may use it. Its zero
// value lets one event a second through; Every must be set before the
// first call and not changed after.
//
// Its answers are Limiter's but for one race: an event held back while
// another is being let through may be counted in that event's line
// instead of the next one (no event is lost from the counts). Any time
// but math.MinInt64 is a time (that one reads as "none let through yet").
type Atomic struct {
	// Every is the shortest time between two events let through
	// (DefaultEvery when zero).
	Every time.Duration

	last atomic.Int64 // when the last event was let through, as stamp(t); 0: none yet
	held atomic.Int64 // events held back since
}

// stamp maps a time to what Atomic.last holds and back: its top bit
// flipped, so that the zero Atomic has let no event through.
func stamp(t int64) int64 { return t ^ math.MinInt64 }

// Allow is Limiter.Allow, from any goroutine.
func (a *Atomic) Allow(now int64) (held int, ok bool) {
	if !a.pass(now) {
		a.held.Add(1)
		return 0, false
	}
	return int(a.held.Swap(0)), true
}

// Flush lets the events held back out without a new one: when some were
// held and a line may be logged at now (as Allow would let an event
// through), it returns how many and true, and the caller logs them; the
// interval then runs from now. A caller whose events may stop calls it
// from time to time, so that the last of a flood is logged without
// waiting for the next event.
func (a *Atomic) Flush(now int64) (held int, ok bool) {
	if a.held.Load() == 0 || !a.pass(now) {
		return 0, false
	}
	n := a.held.Swap(0)
	return int(n), n > 0
}

// pass reports whether an event at now is let through, and if so makes
// now the last event's time: of several callers racing at the same last
// time, one wins.
func (a *Atomic) pass(now int64) bool {
	every := a.Every
	if every <= 0 {
		every = DefaultEvery
	}
	last := a.last.Load()
	if last != 0 && now-stamp(last) < int64(every) {
		return false
	}
	return a.last.CompareAndSwap(last, stamp(now))
}

// DefaultMaxKeys bounds a Keyed's limiters when its Max is zero.
const DefaultMaxKeys = 1024

// Keyed keeps a Limiter per key, so that a flood of one kind of event
// does not hide another. It is safe for concurrent use. Keys are bounded:
// at Max keys, the limiters that let an event through Every or more ago
// are forgotten before a new key is added (the next event of such a key
// is let through as a first one would be, without the count of events it
// held back since), or, when there is none, the one that let an event
// through longest ago.
type Keyed struct {
	// Every is each key's interval (DefaultEvery when zero).
	Every time.Duration
	// Max bounds the keys remembered (DefaultMaxKeys when zero).
	Max int

	mu   sync.Mutex
	keys map[string]*Limiter
}

// NewKeyed returns a Keyed that lets one event per every through for each
// key.
func NewKeyed(every time.Duration) *Keyed { return &Keyed{Every: every} }

// Allow is Limiter.Allow for key's limiter.
func (k *Keyed) Allow(key string, now int64) (held int, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.keys[key]
	if l == nil {
		if k.keys == nil {
			k.keys = map[string]*Limiter{}
		}
		maxKeys := k.Max
		if maxKeys <= 0 {
			maxKeys = DefaultMaxKeys
		}
		if len(k.keys) >= maxKeys {
			k.forget(now)
		}
		l = &Limiter{Every: k.Every}
		k.keys[key] = l
	}
	return l.Allow(now)
}

// forget drops the limiters that let an event through Every or more
// before now, or, if there are none, the one that did longest ago.
func (k *Keyed) forget(now int64) {
	every := k.Every
	if every <= 0 {
		every = DefaultEvery
	}
	var oldest *Limiter
	oldestKey, forgot := "", false
	for key, l := range k.keys {
		if now-l.last >= int64(every) {
			delete(k.keys, key)
			forgot = true
		} else if oldest == nil || l.last < oldest.last {
			oldest, oldestKey = l, key
		}
	}
	if !forgot && oldest != nil {
		delete(k.keys, oldestKey)
	}
}

// Len is the number of keys remembered.
func (k *Keyed) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}
