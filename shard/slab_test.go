package shard

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// checkLayout verifies every link of every shard's compact layout (slab.go)
// between Table calls: each live entry is named by exactly one index slot,
// under its key's hash; sits in exactly the wheel slot it records, with
// consistent links; owns its queue and long key, which name it back; the
// free list holds exactly the other refs below the high-water mark; the
// counts agree; and tidy left nothing due.
func checkLayout(t *testing.T, tab *Table) {
	t.Helper()
	for si := range tab.shards {
		s := &tab.shards[si]
		s.mu.Lock()
		err := layoutError(s)
		s.mu.Unlock()
		if err != "" {
			t.Fatalf("shard %d: %s", si, err)
		}
	}
}

func layoutError(s *shard) string {
	sl := &s.slab
	if sl.hwm < 1 || sl.hwm > 1 && int(sl.hwm) > len(sl.chunks)*chunkLen {
		return fmt.Sprintf("hwm %d with %d chunks", sl.hwm, len(sl.chunks))
	}
	if len(sl.chunks) > 1 && sl.n*4 < len(sl.chunks)*chunkLen {
		return fmt.Sprintf("%d live entries in %d chunks: compaction was due", sl.n, len(sl.chunks))
	}
	// The wheel: every list well linked, each entry in the slot it names.
	inWheel := map[ref]bool{}
	for slot, head := range s.wheel.leases {
		prev := headMark | ref(slot)
		for r := head; r != 0; r = s.ent(r).tnext {
			e := s.ent(r)
			switch {
			case r >= sl.hwm || e.kl == klFree:
				return fmt.Sprintf("wheel slot %d names free ref %d", slot, r)
			case inWheel[r]:
				return fmt.Sprintf("ref %d twice in the wheel", r)
			case e.tprev != prev:
				return fmt.Sprintf("ref %d in wheel slot %d: prev %#x, want %#x", r, slot, e.tprev, prev)
			}
			inWheel[r] = true
			prev = r
		}
	}
	live, longs, queues, waiters := 0, 0, 0, 0
	for r := ref(1); r < sl.hwm; r++ {
		e := s.ent(r)
		if e.kl == klFree {
			continue
		}
		live++
		key := s.keyOf(e)
		if e.kl == klLong {
			longs++
			if i := longIndex(e); int(i) >= len(s.longs) || s.longs[i].e != r || len(key) <= inlineKey {
				return fmt.Sprintf("ref %d: long key %d does not name it back", r, i)
			}
		} else if len(key) > inlineKey {
			return fmt.Sprintf("ref %d: inline key of %d bytes", r, len(key))
		}
		if fr, _ := s.find(xxhash.Sum64(key), key); fr != r {
			return fmt.Sprintf("ref %d (key %q): the index finds %d", r, key, fr)
		}
		if !inWheel[r] {
			return fmt.Sprintf("ref %d (key %q) is held but not in the wheel", r, key)
		}
		if e.q != 0 {
			queues++
			q := &s.queues[e.q-1]
			if q.e != r || q.head == nil {
				return fmt.Sprintf("ref %d: queue %d names ref %d, head %p", r, e.q, q.e, q.head)
			}
			n := uint32(0)
			for w := q.head; ; {
				if w.q != e.q || w.next.prev != w {
					return fmt.Sprintf("ref %d: a waiter of queue %d names queue %d", r, e.q, w.q)
				}
				n++
				if w = w.next; w == q.head {
					break
				}
			}
			if n != q.n {
				return fmt.Sprintf("ref %d: queue of %d waiters counts %d", r, n, q.n)
			}
			waiters += int(n)
		}
	}
	nfree := 0
	for r := sl.free; r != 0; r = s.ent(r).tnext {
		if r >= sl.hwm || s.ent(r).kl != klFree || nfree > int(sl.hwm) {
			return fmt.Sprintf("free list names ref %d", r)
		}
		nfree++
	}
	filled := 0
	for _, x := range s.idx.slots {
		if x.r != 0 {
			filled++
		}
	}
	switch {
	case live != sl.n || live != s.idx.n || filled != live:
		return fmt.Sprintf("%d live entries, slab counts %d, index %d (%d slots filled)", live, sl.n, s.idx.n, filled)
	case nfree != int(sl.hwm)-1-live:
		return fmt.Sprintf("free list of %d, want %d", nfree, int(sl.hwm)-1-live)
	case len(inWheel) != live:
		return fmt.Sprintf("%d entries in the wheel, %d live", len(inWheel), live)
	case longs != len(s.longs):
		return fmt.Sprintf("%d long keys, table of %d", longs, len(s.longs))
	case queues != s.nq:
		return fmt.Sprintf("%d queues, %d counted", queues, s.nq)
	}
	nw := 0
	for _, head := range s.wheel.waits {
		for w := head; w != nil; w = w.tnext {
			nw++
		}
	}
	if nw != waiters {
		return fmt.Sprintf("%d waiters in the wheel, %d queued", nw, waiters)
	}
	return ""
}

// TestCompaction fills one shard with thousands of keys of every length
// class (inline and long), some with waiters and spread over the wheel,
// then releases them in random order: the slab compacts as it empties, and
// after every step each key still answers with its own token, deadline and
// waiters, the layout's links hold, and handoffs reach the waiters of keys
// that moved.
func TestCompaction(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runCompaction(t, seed) })
	}
}

func runCompaction(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	tab, err := New(Config{Shards: 1}, NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	type held struct {
		key     []byte
		token   uint64
		dl      int64
		waiters int
	}
	keys := make([]*held, n)
	c := NewConn(nil)
	var out Out
	for i := range keys {
		key := fmt.Appendf(nil, "k%d/", i)
		key = append(key, bytes.Repeat([]byte{'x'}, rng.IntN(40))...)
		lease := uint8(40 + rng.IntN(216)) // none ends before the releases at 20 s
		now := rng.Int64N(10 * second)
		st, tok := tab.Acquire(now, key, 0, lease, 0, nil, &out)
		if st != Granted {
			t.Fatalf("acquire %q: %v", key, st)
		}
		h := &held{key: key, token: tok, dl: now + int64(lease)*second}
		for range rng.IntN(3) * rng.IntN(2) {
			if st, _ := tab.Acquire(now, key, 255, 10, uint64(i), c, &out); st != Queued {
				t.Fatalf("queue on %q: %v", key, st)
			}
			h.waiters++
		}
		keys[i] = h
	}
	checkLayout(t, tab)
	check := func(step int) {
		t.Helper()
		for _, h := range keys {
			want := KeyInfo{Held: true, Token: h.token, Deadline: h.dl, Waiters: h.waiters}
			if ki := tab.Lookup(h.key); ki != want {
				t.Fatalf("step %d: %q: %+v, want %+v", step, h.key, ki, want)
			}
		}
		checkLayout(t, tab)
	}
	check(0)
	for step := 1; len(keys) > 0; step++ {
		i := rng.IntN(len(keys))
		h := keys[i]
		out.Reset()
		if !tab.Release(20*second, h.key, h.token, &out) {
			t.Fatalf("release %q", h.key)
		}
		if h.waiters > 0 {
			// The head waiter gets the key: it stays held (lease 10 s).
			if len(out.Effects) != 1 || out.Effects[0].Kind != EffectGrant || !bytes.Equal(out.Effects[0].Key, h.key) {
				t.Fatalf("release %q with waiters: effects %+v", h.key, out.Effects)
			}
			h.token, h.dl = out.Effects[0].Token, 30*second
			h.waiters--
		} else {
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
		}
		if step%97 == 0 || len(keys) < 50 {
			check(step)
		}
	}
	s := &tab.shards[0]
	if s.slab.n != 0 || len(s.slab.chunks) != 1 || s.idx.n != 0 || len(s.longs) != 0 || s.nq != 0 {
		t.Fatalf("empty shard keeps %d entries in %d chunks, index %d, %d long keys, %d queues",
			s.slab.n, len(s.slab.chunks), s.idx.n, len(s.longs), s.nq)
	}
	if cap(s.queues) > minKeptQ || cap(s.longs) > 16 {
		t.Fatalf("empty shard keeps a queues table of %d and a long-key table of %d", cap(s.queues), cap(s.longs))
	}
}
