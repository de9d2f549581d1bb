package shard

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want Config
		err  error
	}{
		{"zero takes defaults", Config{}, DefaultConfig(), nil},
		{"explicit values stay", Config{Shards: 8, MaxKeys: 5, MaxWaitersPerKey: 2, MaxWaiters: 3, Tick: time.Millisecond},
			Config{Shards: 8, MaxKeys: 5, MaxWaitersPerKey: 2, MaxWaiters: 3, Tick: time.Millisecond}, nil},
		{"one shard", Config{Shards: 1}, Config{Shards: 1, MaxKeys: DefaultMaxKeys, MaxWaitersPerKey: DefaultMaxWaitersPerKey,
			MaxWaiters: DefaultMaxWaiters, Tick: DefaultTick}, nil},
		{"shards not a power of two", Config{Shards: 12}, Config{}, ErrShards},
		{"negative shards", Config{Shards: -4}, Config{}, ErrShards},
		{"too many shards", Config{Shards: 1 << 17}, Config{}, ErrShards},
		{"negative max keys", Config{MaxKeys: -1}, Config{}, ErrLimit},
		{"negative per key", Config{MaxWaitersPerKey: -1}, Config{}, ErrLimit},
		{"negative waiters", Config{MaxWaiters: -1}, Config{}, ErrLimit},
		{"negative per conn", Config{MaxWaitersPerConn: -1}, Config{}, ErrLimit},
		{"negative holders", Config{MaxHolders: -1}, Config{}, ErrLimit},
		{"negative watches per conn", Config{MaxWatchesPerConn: -1}, Config{}, ErrLimit},
		{"tick over 10ms", Config{Tick: 11 * time.Millisecond}, Config{}, ErrTick},
		{"negative tick", Config{Tick: -time.Millisecond}, Config{}, ErrTick},
		{"tick under 1µs", Config{Tick: time.Nanosecond}, Config{}, ErrTick},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			err := cfg.Validate()
			if !errors.Is(err, tc.err) {
				t.Fatalf("Validate = %v, want %v", err, tc.err)
			}
			if err == nil && (cfg.Shards != tc.want.Shards || cfg.MaxKeys != tc.want.MaxKeys ||
				cfg.MaxWaitersPerKey != tc.want.MaxWaitersPerKey || cfg.MaxWaiters != tc.want.MaxWaiters || cfg.Tick != tc.want.Tick) {
				t.Fatalf("Validate filled %+v, want %+v", cfg, tc.want)
			}
			if _, err2 := New(tc.cfg, NewTokens(0, 1)); !errors.Is(err2, tc.err) {
				t.Fatalf("New = %v, want %v", err2, tc.err)
			}
		})
	}
	if c := (Config{}); c.Validate() != nil || c.MaxWaitersPerConn != DefaultMaxWaitersPerConn ||
		c.MaxHolders != DefaultMaxHolders || c.MaxWatchesPerConn != DefaultMaxWatchesPerConn {
		t.Fatalf("defaults: MaxWaitersPerConn %d, MaxHolders %d, MaxWatchesPerConn %d", c.MaxWaitersPerConn, c.MaxHolders, c.MaxWatchesPerConn)
	}
	if DefaultMaxHolders != 1<<20 || DefaultMaxWatchesPerConn != 1024 {
		t.Fatal("the documented defaults changed")
	}
	if _, err := New(Config{}, nil); !errors.Is(err, ErrNilTokens) {
		t.Fatalf("New without tokens = %v", err)
	}
}

func TestNames(t *testing.T) {
	tests := []struct{ got, want string }{
		{Granted.String(), "granted"}, {TimedOut.String(), "timedout"}, {Busy.String(), "busy"},
		{Queued.String(), "queued"}, {Mismatch.String(), "mismatch"}, {Status(0).String(), "Status(?)"},
		{EffectGrant.String(), "grant"}, {EffectTimeout.String(), "timeout"}, {EffectCancel.String(), "cancel"},
		{EffectBusy.String(), "busy"}, {EffectMoved.String(), "moved"}, {EffectLost.String(), "lost"},
		{EffectKind(0).String(), "EffectKind(?)"},
		{ReasonReleased.String(), "released"}, {ReasonExpired.String(), "expired"}, {ReasonForced.String(), "forced"},
		{ReasonCannotTell.String(), "cannot-tell"}, {Reason(0).String(), "Reason(?)"},
		{Watching.String(), "watching"}, {WatchNotHeld.String(), "not-held"}, {WatchLimit.String(), "limit"},
		{WatchStatus(0).String(), "WatchStatus(?)"},
		{RecordGrant.String(), "grant"}, {RecordRelease.String(), "release"}, {RecordExpire.String(), "expire"},
		{RecordRenew.String(), "renew"}, {RecordKind(0).String(), "RecordKind(?)"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestOutKeysStable checks that effect keys stay intact while the arena
// grows within one call and across calls, are capped (appending to one
// cannot overwrite the next), and survive the entry's recycling.
func TestOutKeysStable(t *testing.T) {
	tab, _ := New(Config{Shards: 2}, NewTokens(0, 1<<40))
	var out Out
	c := NewConn("c")
	var want []string
	for i := range 200 {
		key := []byte(strings.Repeat(fmt.Sprint(i%10), 1+i%50) + fmt.Sprint(i))
		tab.Acquire(0, key, 0, 10, 0, nil, &out)
		tab.Acquire(0, key, 5, 10, uint64(i), c, &out)
		want = append(want, string(key))
	}
	tab.CancelWaiters(&out)
	// More effects in later calls on the same Out: time out a second round
	// of waiters, then let the leases expire, which frees (and recycles) the
	// entries whose keys the effects copied.
	for i, k := range want {
		tab.Acquire(1*second, []byte(k), 5, 10, uint64(i), c, &out)
	}
	tab.Tick(6*second, &out)
	tab.Tick(100*second, &out)
	if len(out.Effects) != 400 {
		t.Fatalf("%d effects", len(out.Effects))
	}
	got := map[string]bool{}
	for i, e := range out.Effects {
		if kind := []EffectKind{EffectCancel, EffectTimeout}[i/200]; e.Kind != kind || cap(e.Key) != len(e.Key) {
			t.Fatalf("effect %d: %+v cap %d", i, e, cap(e.Key))
		}
		if string(e.Key) != want[e.Owner] {
			t.Fatalf("effect %d: key %q, want %q", i, e.Key, want[e.Owner])
		}
		got[string(e.Key)] = true
	}
	for _, k := range want {
		if !got[k] {
			t.Fatalf("key %q missing or corrupted", k)
		}
	}
	out.Reset()
	if len(out.Effects) != 0 || tab.Stats() != (Stats{}) {
		t.Fatalf("after reset: %d effects, %+v", len(out.Effects), tab.Stats())
	}
}

// TestIndexGrowShrink fills one shard far beyond its initial index, checks
// every key, and removes them in an order that exercises backward shifts
// across the wrap-around and repeated shrinking.
func TestIndexGrowShrink(t *testing.T) {
	tab, _ := New(Config{Shards: 1}, NewTokens(0, 1<<40))
	var out Out
	const n = 5000
	toks := make([]uint64, n)
	for i := range n {
		_, toks[i] = tab.Acquire(0, fmt.Appendf(nil, "key-%d", i), 0, 10, 0, nil, &out)
	}
	s := &tab.shards[0]
	if s.idx.n != n || len(s.idx.slots) < n*4/3 {
		t.Fatalf("index n=%d size=%d", s.idx.n, len(s.idx.slots))
	}
	for i := 0; i < n; i += 2 {
		if !tab.Release(0, fmt.Appendf(nil, "key-%d", i), toks[i], &out) {
			t.Fatalf("release key-%d", i)
		}
	}
	for i := range n {
		ki := tab.Lookup(fmt.Appendf(nil, "key-%d", i))
		if ki.Held != (i%2 == 1) || (ki.Held && ki.Token != toks[i]) {
			t.Fatalf("key-%d: %+v", i, ki)
		}
	}
	for i := 1; i < n; i += 2 {
		tab.Release(0, fmt.Appendf(nil, "key-%d", i), toks[i], &out)
	}
	if s.idx.n != 0 || len(s.idx.slots) != minIndex {
		t.Fatalf("after releasing all: n=%d size=%d", s.idx.n, len(s.idx.slots))
	}
	if s.slab.n != 0 || len(s.slab.chunks) != 1 {
		t.Fatalf("after releasing all: %d entries in %d chunks, want 0 in 1", s.slab.n, len(s.slab.chunks))
	}
}

// TestKeyBuffers checks that a recycled entry keeps a short key buffer and
// drops a long one, and that keys of any length survive recycling.
func TestKeyBuffers(t *testing.T) {
	tab, _ := New(Config{Shards: 1}, NewTokens(0, 1<<40))
	var out Out
	long := bytes.Repeat([]byte("x"), 1024)
	for _, key := range [][]byte{long, []byte("short"), long[:200], []byte("k")} {
		_, tok := tab.Acquire(0, key, 0, 1, 0, nil, &out)
		if ki := tab.Lookup(key); !ki.Held || ki.Token != tok {
			t.Fatalf("key of %d bytes: %+v", len(key), ki)
		}
		tab.Release(0, key, tok, &out)
		for _, l := range tab.shards[0].longs[:cap(tab.shards[0].longs)] {
			if cap(l.b) > maxKeptKey {
				t.Fatalf("a free long key keeps a %d-byte buffer", cap(l.b))
			}
		}
	}
}

// TestFireWithinOneTick restores locks with deadlines at arbitrary
// nanoseconds (some several wheel rotations away, some before the first
// tick) and queues waiters on them, then calls Tick every Config.Tick: each
// lease and wait must end at the first tick at or after its deadline.
func TestFireWithinOneTick(t *testing.T) {
	const tick = int64(10 * time.Millisecond)
	var now int64
	deadlines := map[string]int64{}
	fired := 0
	check := func(what string, key []byte) {
		dl := deadlines[what+string(key)]
		if now < dl || (now >= dl+tick && now != 0) { // 0: the first tick
			t.Fatalf("%s of %s at %d, deadline %d", what, key, now, dl)
		}
		fired++
	}
	tab, _ := New(Config{Shards: 4, Sink: func(r Record) {
		if r.Kind == RecordExpire {
			check("lease ", r.Key)
		}
	}}, NewTokens(1<<20, 1<<40))
	rng := rand.New(rand.NewPCG(1, 2))
	var out Out
	c := NewConn(nil)
	const n = 1000
	for i := range n {
		key := fmt.Appendf(nil, "k%d", i)
		dl := rng.Int64N(300 * second)
		if i%10 == 0 {
			dl = -rng.Int64N(second) // already passed at the first tick
		}
		deadlines["lease "+string(key)] = dl
		tab.Restore(key, uint64(i+1), dl)
		now = rng.Int64N(second)
		if maxWait := min((dl-now-1)/second, 255); maxWait >= 1 && i%2 == 0 { // a waiter whose wait ends first
			tab.Acquire(now, key, uint8(1+rng.Int64N(maxWait)), 1, uint64(i), c, &out)
			deadlines["wait "+string(key)] = waitDeadline(tab, key)
		}
	}
	for now = 0; now <= 300*second; now += tick {
		out.Reset()
		tab.Tick(now, &out)
		for _, e := range out.Effects {
			if e.Kind != EffectTimeout {
				t.Fatalf("effect %+v", e)
			}
			check("wait ", e.Key)
		}
	}
	if tab.Stats() != (Stats{}) || fired < n {
		t.Fatalf("stats %+v, %d fired", tab.Stats(), fired)
	}
}

// waitDeadline returns the wait deadline of key's only waiter.
func waitDeadline(tab *Table, key []byte) int64 {
	h := xxhash.Sum64(key)
	s := tab.shardOf(h)
	_, e := s.find(h, key)
	return s.head(e).deadline
}

// TestEffectNamesTheWaitersOp: an effect owed to a queued acquire says
// whether it was an acquire shared (its limit) or an acquire (0), so that
// the answers correlated by (op, owner) — M when the node stops executing,
// E 4 at shutdown — name the request's op (PROTOCOL.md §3, §9.1).
func TestEffectNamesTheWaitersOp(t *testing.T) {
	tab, _ := New(Config{Shards: 1}, NewTokens(0, 1<<40))
	var out Out
	c := NewConn("c")
	tab.Acquire(0, []byte("k"), 0, 10, 1, nil, &out)
	tab.Acquire(0, []byte("k"), 5, 10, 2, c, &out)
	tab.AcquireShared(0, []byte("k"), 5, 10, 3, 7, NoIdent, c, &out)
	tab.Acquire(0, []byte("j"), 0, 10, 4, nil, &out)
	tab.AcquireShared(0, []byte("j"), 5, 10, 5, 65535, NoIdent, c, &out)
	tab.CancelWaiters(&out)
	want := map[uint64]uint16{2: 0, 3: 7, 5: 65535}
	if len(out.Effects) != len(want) {
		t.Fatalf("%d effects: %+v", len(out.Effects), out.Effects)
	}
	for _, e := range out.Effects {
		if l, ok := want[e.Owner]; !ok || e.Kind != EffectCancel || e.Limit != l {
			t.Fatalf("effect of owner %d: kind %s limit %d, want cancel limit %d", e.Owner, e.Kind, e.Limit, l)
		}
	}
}
