package shard

import (
	"sync"
	"sync/atomic"
)

// Tokens allocates fencing tokens: strictly increasing across every key and
// shard of a table, never 0. Tokens above the reserved limit are never handed
// out: the owner of persistence reserves ranges ahead (watching Want) and
// calls Extend once a range is safe (durable, replicated or committed). Next
// never waits: at the limit it returns 0 and the table answers Busy, so a
// slow or failing disk costs grants, never a stalled event loop. Safe for
// concurrent use.
//
// The sequence is one word that every grant of every event loop adds to
// (docs/DESIGN.md, "Tokens": one atomic add, measured against a
// compare-and-swap loop and a clock floor). A value taken above the limit
// is never handed out, and never comes back: Last may exceed every token
// handed out by the requests that found the limit reached at the same
// moment as another Next (a refusal alone gives its value back).
type Tokens struct {
	_    [64]byte      // keep the hot counter off whatever is allocated before
	last atomic.Uint64 // highest value taken (handed out, observed, or taken above the limit); start if none
	_    [56]byte      // and on its own cache line
	// limit, span and dry are read by every Next, written by Extend (and
	// dry by a Next that found the limit reached).
	limit atomic.Uint64 // highest token that may be handed out
	span  atomic.Uint64 // size of the range reserved at the last Extend (or creation)
	dry   atomic.Bool   // a Next found the limit reached and no Extend came since
	// floor is the highest value observed: last never goes below it. It
	// is stored under mu once last is raised to it.
	floor atomic.Uint64

	// mu serialises Extend, Observe and a refused Next's give-back.
	mu   sync.Mutex
	want chan struct{}
}

// NewTokens returns an allocator whose first token is start+1 and that may
// hand out tokens up to limit (inclusive) before the next Extend.
func NewTokens(start, limit uint64) *Tokens {
	t := &Tokens{want: make(chan struct{}, 1)}
	t.last.Store(start)
	t.limit.Store(limit)
	if limit > start {
		t.span.Store(limit - start)
	}
	return t
}

// Next returns the next token, or 0 if the reserved limit is reached (Want
// is then signalled; the caller answers Busy and tries again later).
//
// The limit is read before the add: Extend only raises it, so a value at
// or below the limit read is below the current one too. A value above it
// is dropped (0): taken from the sequence, never handed out.
func (t *Tokens) Next() uint64 {
	lim := t.limit.Load()
	if t.dry.Load() {
		// Refused since the last Extend: refuse without taking a value
		// (a hammering client would otherwise burn one per request).
		if t.last.Load() >= lim {
			t.signal()
			return 0
		}
	}
	v := t.last.Add(1)
	if v > lim {
		t.giveBack(v)
		t.dry.Store(true)
		t.signal()
		return 0
	}
	t.check(v, lim)
	return v
}

// giveBack returns v, a value that a refused Next took above the limit,
// unless another Next moved the sequence since or an Observe covers it:
// alone, a refusal takes nothing from the sequence. The floor is read
// under mu, which Observe holds from its read of last to its store of the
// floor: an Observe of v itself that found last at v (this very take)
// left it there and raised the floor, so v stays taken.
func (t *Tokens) giveBack(v uint64) {
	t.mu.Lock()
	if t.floor.Load() < v {
		t.last.CompareAndSwap(v, v-1)
	}
	t.mu.Unlock()
}

// check signals Want if fewer than half of the reserved range remains after
// handing out v under limit lim.
func (t *Tokens) check(v, lim uint64) {
	rest := lim - v
	span := t.span.Load() // loaded after lim: Extend stores span before limit
	if rest == 0 || (rest <= span && rest < span-rest) {
		t.signal()
	}
}

// signal sends on want without blocking. The runtime checks a full buffered
// channel without taking its lock, so repeated signals are cheap.
func (t *Tokens) signal() {
	select {
	case t.want <- struct{}{}:
	default:
	}
}

// Extend raises the reserved limit (a lower value is ignored).
func (t *Tokens) Extend(limit uint64) {
	t.mu.Lock()
	if limit > t.limit.Load() {
		var span uint64
		if last := t.last.Load(); limit > last {
			span = limit - last
		}
		t.span.Store(span)
		t.limit.Store(limit)
		t.dry.Store(false)
	}
	t.mu.Unlock()
}

// Observe raises the last token to v if v is larger: a token made elsewhere
// (a replicated grant, a restored lock) that this allocator must never hand
// out again or go below. It does not raise the limit: tokens above v need a
// reservation of their own.
func (t *Tokens) Observe(v uint64) {
	if v <= t.floor.Load() {
		return // last was raised to the floor, and never goes below it
	}
	t.mu.Lock()
	for {
		cur := t.last.Load()
		if v <= cur || t.last.CompareAndSwap(cur, v) {
			break
		}
	}
	if v > t.floor.Load() {
		t.floor.Store(v)
	}
	t.mu.Unlock()
}

// Want is signalled (non-blocking, capacity 1) whenever fewer than half of
// the last reserved range remains, or Next found none left, telling the
// persistence owner to reserve more.
func (t *Tokens) Want() <-chan struct{} { return t.want }

// Last returns the highest value taken so far: every token handed out or
// observed is at most Last (start if none). It may be above all of them by
// values that concurrent Next calls took above the limit and dropped.
func (t *Tokens) Last() uint64 { return t.last.Load() }

// Limit returns the reserved limit.
func (t *Tokens) Limit() uint64 { return t.limit.Load() }
