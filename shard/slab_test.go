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
	live, longs, queues, waiters, holders, stale, shared := 0, 0, 0, 0, 0, 0, 0
	for r := ref(1); r < sl.hwm; r++ {
		e := s.ent(r)
		if e.kl == klFree {
			continue
		}
		live++
		if !inWheel[r] {
			return fmt.Sprintf("ref %d (kl %d) is held but not in the wheel", r, e.kl)
		}
		if e.kl == klHolder {
			holders++
			if msg := holderError(s, r, e); msg != "" {
				return msg
			}
			continue
		}
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
		if e.q != 0 {
			queues++
			q := &s.queues[e.q-1]
			if q.e != r || (q.head == nil && q.limit == 0) || (q.head == nil) != (q.n == 0) {
				return fmt.Sprintf("ref %d: queue %d names ref %d, head %p, %d waiters, limit %d", r, e.q, q.e, q.head, q.n, q.limit)
			}
			if q.limit != 0 {
				shared++
			}
			if q.stale {
				stale++
				if q.limit == 0 {
					return fmt.Sprintf("ref %d: an exclusive key's queue marked stale", r)
				}
			}
			if msg := sharedError(s, r, e, q); msg != "" {
				return msg
			}
			n := uint32(0)
			for w := q.head; w != nil; {
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
	hfilled := 0
	for _, x := range s.hidx.slots {
		if x.r != 0 {
			hfilled++
		}
	}
	switch {
	case live != sl.n || live-holders != s.idx.n || filled != live-holders:
		return fmt.Sprintf("%d live entries (%d holder entries), slab counts %d, index %d (%d slots filled)", live, holders, sl.n, s.idx.n, filled)
	case holders != s.hidx.n || hfilled != holders:
		return fmt.Sprintf("%d holder entries, holder index %d (%d slots filled)", holders, s.hidx.n, hfilled)
	case stale != s.nstale:
		return fmt.Sprintf("%d stale queues, %d counted", stale, s.nstale)
	case shared != s.nshared:
		return fmt.Sprintf("%d shared keys, %d counted", shared, s.nshared)
	case s.hooks != s.nwatch+len(s.forced):
		return fmt.Sprintf("hooks %d, with %d watches and %d forced marks", s.hooks, s.nwatch, len(s.forced))
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
	return watchError(s)
}

// holderError checks the holder entry r (e) of a shared key: named by the
// holder index under its token, in its key's list, which its queue says is
// shared.
func holderError(s *shard, r ref, e *entry) string {
	if e.q == 0 || int(e.q) > len(s.queues) {
		return fmt.Sprintf("holder entry %d names queue %d", r, e.q)
	}
	q := &s.queues[e.q-1]
	if q.limit == 0 || q.hx == 0 {
		return fmt.Sprintf("holder entry %d of a key that is not shared (limit %d, first %d)", r, q.limit, q.hx)
	}
	if x, _ := s.holderOf(s.ent(q.e), e.token); x != r {
		return fmt.Sprintf("holder entry %d (token %d): the holder index finds %d", r, e.token, x)
	}
	for x := q.hx; ; {
		if x == r {
			return ""
		}
		if x = hnext(s.ent(x)); x == q.hx {
			return fmt.Sprintf("holder entry %d is not in its key's list", r)
		}
	}
}

// sharedError checks a key's shared state: its holder list (well linked,
// nx long, each entry a holder entry of this key), fewer holders than its
// limit allows, tokens unique, the bound below every deadline.
func sharedError(s *shard, r ref, e *entry, q *queue) string {
	if q.limit == 0 {
		if q.hx != 0 || q.nx != 0 {
			return fmt.Sprintf("ref %d: an exclusive key with holder entries (%d, first %d)", r, q.nx, q.hx)
		}
		return ""
	}
	if int(q.nx)+1 > int(q.limit) {
		return fmt.Sprintf("ref %d: %d holders over the limit %d", r, q.nx+1, q.limit)
	}
	if e.deadline < q.next {
		return fmt.Sprintf("ref %d: bound %d above its own deadline %d", r, q.next, e.deadline)
	}
	if q.hx == 0 {
		if q.nx != 0 {
			return fmt.Sprintf("ref %d: %d holder entries, no list", r, q.nx)
		}
		return ""
	}
	n := 0
	seen := map[uint64]bool{e.token: true}
	for x, prev := q.hx, hprev(s.ent(q.hx)); ; {
		xe := s.ent(x)
		switch {
		case xe.kl != klHolder || xe.q != e.q:
			return fmt.Sprintf("ref %d: list entry %d (kl %d, queue %d) is not its holder", r, x, xe.kl, xe.q)
		case hprev(xe) != prev:
			return fmt.Sprintf("ref %d: list entry %d: prev %d, want %d", r, x, hprev(xe), prev)
		case seen[xe.token]:
			return fmt.Sprintf("ref %d: token %d twice", r, xe.token)
		case xe.deadline < q.next:
			return fmt.Sprintf("ref %d: bound %d above holder %d's deadline %d", r, q.next, x, xe.deadline)
		case x != q.hx && s.ent(prev).token > xe.token:
			return fmt.Sprintf("ref %d: holder list out of token order (%d after %d)", r, xe.token, s.ent(prev).token)
		}
		seen[xe.token] = true
		n++
		prev = x
		if x = hnext(xe); x == q.hx {
			break
		}
		if n > int(q.nx) {
			return fmt.Sprintf("ref %d: holder list longer than %d", r, q.nx)
		}
	}
	if n != int(q.nx) {
		return fmt.Sprintf("ref %d: holder list of %d, counts %d", r, n, q.nx)
	}
	return ""
}

// watchError checks the watch index: every chain well linked, each watch
// naming a live entry that holds its token, the count right.
func watchError(s *shard) string {
	n, filled := 0, 0
	for _, sl := range s.watches.slots {
		if sl.w == nil {
			continue
		}
		filled++
		var prev *waiter
		for w := sl.w; w != nil; w = w.next {
			e := s.ent(w.e)
			switch {
			case !w.watch || w.owner != sl.token || w.prev != prev:
				return fmt.Sprintf("watch of token %d: watch %v, token %d, prev %p want %p", sl.token, w.watch, w.owner, w.prev, prev)
			case e.kl == klFree || e.token != sl.token:
				return fmt.Sprintf("watch of token %d names ref %d (kl %d, token %d)", sl.token, w.e, e.kl, e.token)
			}
			prev = w
			n++
		}
	}
	if n != s.nwatch || filled != s.watches.n {
		return fmt.Sprintf("%d watches in %d chains, counts %d in %d", n, filled, s.nwatch, s.watches.n)
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
			want := KeyInfo{Held: true, Token: h.token, Deadline: h.dl, Waiters: h.waiters, Holders: 1}
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
