package shard

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// held is one holder of a dump, for comparing tables.
type held struct {
	token    uint64
	deadline int64
	lease    uint8
	ident    string // the grant's identity
	limit    uint16 // the key's limit (0: exclusive)
}

// dumpAll returns every held key of tab, its holders in token order, and
// each shard's Seq.
func dumpAll(tab *Table) (map[string][]held, []uint64) {
	keys := map[string][]held{}
	seqs := make([]uint64, tab.Shards())
	for i := range tab.Shards() {
		seqs[i] = tab.Dump(i, func(h *HeldLock) {
			keys[string(h.Key)] = append(keys[string(h.Key)], held{h.Token, h.Deadline, h.Lease, string(h.Ident), h.Limit})
		})
	}
	for _, hs := range keys {
		slices.SortFunc(hs, func(a, b held) int { return cmp.Compare(a.token, b.token) })
	}
	return keys, seqs
}

// driveIdents are the identities drive acquires as ("": none).
var driveIdents = []string{"", "orders", "billing", "ops"}

// recorder keeps a table's records per shard, in Seq order (the Sink runs
// under the shard's lock, so each shard's slice needs no lock of its own).
type recorder struct{ shards [][]Record }

func (r *recorder) sink(rec Record) {
	rec.Key = slices.Clone(rec.Key)
	r.shards[rec.Shard] = append(r.shards[rec.Shard], rec)
}

// leaseStart is the instant a Grant or Renew record's lease counts from on
// the table that made it: applying at it gives equal deadlines.
func leaseStart(r *Record) int64 { return r.Deadline - int64(r.Lease)*second }

// replay applies every record of rec to dst, interleaving the shards in a
// random order (records of one shard stay in order).
func replay(t *testing.T, dst *Table, rec *recorder, rng *rand.Rand) {
	t.Helper()
	next := make([]int, len(rec.shards))
	for {
		var open []int
		for i, list := range rec.shards {
			if next[i] < len(list) {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return
		}
		i := open[rng.IntN(len(open))]
		r := &rec.shards[i][next[i]]
		next[i]++
		var out Out
		if _, err := dst.Apply(leaseStart(r), r, &out); err != nil {
			t.Fatalf("apply %s %s seq=%d: %v", r.Kind, r.Key, r.Seq, err)
		}
		if len(out.Effects) != 0 {
			t.Fatalf("apply made effects on a table without waiters: %v", out.Effects)
		}
	}
}

// drive runs n random operations on tab (acquires and acquires shared that
// grant, queue or time out, releases of current and stale tokens, renews,
// ticks that expire leases and hand keys on), on a fake clock starting at
// now. Half the keys are mostly shared, with a limit of their own and
// sometimes another.
// It returns the number of operations after which the key it worked on
// had several holders.
func drive(tab *Table, rng *rand.Rand, n int, now *int64, mid func(op int)) (multi int) {
	conns := []*Conn{NewConn(nil), NewConn(nil), NewConn(nil)}
	tokens := map[string][]uint64{}
	var ids []Ident
	for _, name := range driveIdents {
		ids = append(ids, tab.Ident([]byte(name)))
	}
	var out Out
	for op := range n {
		ki := rng.IntN(40)
		key := fmt.Sprintf("k%d", ki)
		switch x := rng.IntN(10); {
		case x < 4:
			id := ids[rng.IntN(len(ids))]
			wait, lease, c := uint8(rng.IntN(3)), uint8(1+rng.IntN(4)), conns[rng.IntN(3)]
			var st Status
			var tok uint64
			if ki%2 == 0 && rng.IntN(5) > 0 {
				limit := uint16(2 + ki%3)
				if rng.IntN(8) == 0 {
					limit = uint16(1 + rng.IntN(3))
				}
				st, tok = tab.AcquireShared(*now, []byte(key), wait, lease, uint64(op), limit, id, c, &out)
			} else {
				st, tok = tab.AcquireAs(*now, []byte(key), wait, lease, uint64(op), id, c, &out)
			}
			if st == Granted {
				tokens[key] = append(tokens[key], tok)
			}
		case x < 7:
			if list := tokens[key]; len(list) > 0 {
				tab.Release(*now, []byte(key), list[rng.IntN(len(list))], &out)
			}
		case x < 8:
			if list := tokens[key]; len(list) > 0 {
				tab.Renew(*now, []byte(key), uint8(1+rng.IntN(4)), list[max(0, len(list)-1-rng.IntN(3))], &out)
			}
		default:
			*now += int64(rng.IntN(700)) * int64(time.Millisecond)
			tab.Tick(*now, &out)
		}
		for _, e := range out.Effects {
			if e.Kind == EffectGrant {
				tokens[string(e.Key)] = append(tokens[string(e.Key)], e.Token)
			}
		}
		out.Reset()
		if tab.Lookup([]byte(key)).Holders > 1 {
			multi++
		}
		if mid != nil {
			mid(op)
		}
	}
	return multi
}

// TestApplyRoundTrip: a table fed the records of another table, shard by
// shard in order but shards interleaved at random, ends equal to it key by
// key (token, deadline, lease, identity), with the same Seq per shard, and its token
// allocator above every token the source issued.
func TestApplyRoundTrip(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			rec := &recorder{shards: make([][]Record, 4)}
			src, err := New(Config{Shards: 4, Sink: rec.sink}, NewTokens(1000, 1<<40))
			if err != nil {
				t.Fatal(err)
			}
			dst, err := New(Config{Shards: 4}, NewTokens(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			var now int64
			multi := drive(src, rng, 3000, &now, nil)
			replay(t, dst, rec, rng)
			want, wantSeq := dumpAll(src)
			got, gotSeq := dumpAll(dst)
			if len(want) == 0 {
				t.Fatal("source ended with no held key: the test drives too little")
			}
			if multi < 50 {
				t.Fatalf("a key had several holders after %d operations only: the test drives too little", multi)
			}
			assertSame(t, want, got)
			if !slices.Equal(wantSeq, gotSeq) {
				t.Fatalf("seqs %v, want %v", gotSeq, wantSeq)
			}
			var maxGrant uint64
			for _, list := range rec.shards {
				for _, r := range list {
					if r.Kind == RecordGrant {
						maxGrant = max(maxGrant, r.Token)
					}
				}
			}
			if got := dst.Tokens().Last(); got != maxGrant || got != src.Tokens().Last() {
				t.Fatalf("destination's last token %d; largest grant %d, source's last %d", got, maxGrant, src.Tokens().Last())
			}
		})
	}
}

// TestApplyAfterDump: a dump of each shard cut at a different moment of the
// run, loaded into a fresh table, then the whole record stream applied over
// it (records up to each shard's dump Seq are skipped as already applied),
// gives the source's table exactly: no double, no gap.
func TestApplyAfterDump(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			rec := &recorder{shards: make([][]Record, 4)}
			src, err := New(Config{Shards: 4, Sink: rec.sink}, NewTokens(0, 1<<40))
			if err != nil {
				t.Fatal(err)
			}
			dst, err := New(Config{Shards: 4}, NewTokens(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			// Shard i is dumped at op cut[i].
			cut := []int{rng.IntN(2000), rng.IntN(2000), rng.IntN(2000), rng.IntN(2000)}
			var now int64
			multi := drive(src, rng, 2000, &now, func(op int) {
				for i, c := range cut {
					if c != op {
						continue
					}
					seq := src.Dump(i, func(h *HeldLock) {
						if err := dst.RestoreHolder(h); err != nil {
							t.Fatal(err)
						}
						dst.Tokens().Observe(h.Token)
					})
					dst.SetSeq(i, seq)
				}
			})
			skipped := 0
			for i := range rec.shards {
				for j := range rec.shards[i] {
					r := &rec.shards[i][j]
					var out Out
					ok, err := dst.Apply(leaseStart(r), r, &out)
					if err != nil {
						t.Fatalf("apply shard %d seq %d: %v", i, r.Seq, err)
					}
					if !ok {
						skipped++
					}
				}
			}
			want, wantSeq := dumpAll(src)
			got, gotSeq := dumpAll(dst)
			// A restored lock carries no lease seconds; compare those
			// only where the record stream set them.
			for k, hs := range got {
				for i := range hs {
					if w, ok := want[k]; ok && i < len(w) && hs[i].lease == 0 {
						hs[i].lease = w[i].lease
					}
				}
			}
			assertSame(t, want, got)
			if !slices.Equal(wantSeq, gotSeq) {
				t.Fatalf("seqs %v, want %v", gotSeq, wantSeq)
			}
			if skipped == 0 {
				t.Fatal("no record was covered by a dump: the cut points are wrong")
			}
			if multi < 30 {
				t.Fatalf("a key had several holders after %d operations only: the test drives too little", multi)
			}
		})
	}
}

func assertSame(t *testing.T, want, got map[string][]held) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Fatalf("key %s held by %+v on the source, free on the copy", k, w)
		}
		if !slices.Equal(g, w) {
			t.Fatalf("key %s: copy %+v, source %+v", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Fatalf("key %s held by %+v on the copy, free on the source", k, g)
		}
	}
}

// TestApplyConcurrentSource: records made by goroutines working the source
// table at once (each shard's Sink calls serialised by its lock) replay
// into an equal table.
func TestApplyConcurrentSource(t *testing.T) {
	rec := &recorder{shards: make([][]Record, 8)}
	src, err := New(Config{Shards: 8, Sink: rec.sink}, NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			var out Out
			c := NewConn(nil)
			for i := range 5000 {
				key := []byte(fmt.Sprintf("c%d", rng.IntN(64)))
				if st, tok := src.Acquire(int64(i), key, 0, 3, 0, c, &out); st == Granted && rng.IntN(2) == 0 {
					src.Release(int64(i), key, tok, &out)
				}
				out.Reset()
			}
		})
	}
	wg.Wait()
	dst, err := New(Config{Shards: 8}, NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	replay(t, dst, rec, rand.New(rand.NewPCG(1, 1)))
	want, _ := dumpAll(src)
	got, _ := dumpAll(dst)
	assertSame(t, want, got)
}

// keyTable is an empty 4-shard table, a key and the shard it lives in.
func keyTable(t *testing.T) (*Table, []byte, uint32) {
	t.Helper()
	tab, err := New(Config{Shards: 4}, NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("k")
	return tab, key, tab.shardOf(xxhash.Sum64(key)).id
}

// TestApplyErrors: a gap, a record for another shard count and a malformed
// record change nothing; a repeated record is skipped.
func TestApplyErrors(t *testing.T) {
	tab, key, sh := keyTable(t)
	var out Out
	grant := Record{Kind: RecordGrant, Shard: sh, Seq: 1, Key: key, Token: 9, Lease: 5}
	tests := []struct {
		name string
		r    Record
		ok   bool
		err  error
	}{
		{"gap", Record{Kind: RecordGrant, Shard: sh, Seq: 2, Key: key, Token: 9, Lease: 5}, false, ErrGap},
		{"other shard", Record{Kind: RecordGrant, Shard: sh ^ 1, Seq: 1, Key: key, Token: 9, Lease: 5}, false, ErrShardMismatch},
		{"no key", Record{Kind: RecordGrant, Shard: sh, Seq: 1, Token: 9, Lease: 5}, false, ErrBadRecord},
		{"bad kind", Record{Kind: 9, Shard: sh, Seq: 1, Key: key}, false, ErrBadRecord},
		{"first", grant, true, nil},
		{"repeat", grant, false, nil},
		{"stale release", Record{Kind: RecordRelease, Shard: sh, Seq: 2, Key: key, Token: 8}, true, nil},
	}
	for _, tc := range tests {
		ok, err := tab.Apply(0, &tc.r, &out)
		if ok != tc.ok || !errors.Is(err, tc.err) {
			t.Fatalf("%s: applied=%v err=%v, want %v %v", tc.name, ok, err, tc.ok, tc.err)
		}
	}
	if info := tab.Lookup(key); !info.Held || info.Token != 9 || info.Deadline != 5*second {
		t.Fatalf("after the grant and a stale release: %+v", info)
	}
	if tab.Tokens().Last() != 9 {
		t.Fatalf("allocator did not observe the applied token: %d", tab.Tokens().Last())
	}
	tab.Reset(&out)
	if info := tab.Lookup(key); info.Held || tab.Seq(int(sh)) != 0 || tab.Stats().Keys != 0 {
		t.Fatalf("after Reset: %+v seq=%d keys=%d", info, tab.Seq(int(sh)), tab.Stats().Keys)
	}
}

// TestApplySkip: a skip record moves its shard's Seq over the records it
// stands for — when the shard is at From-1 or inside the run (a dump cut
// there), not when it is behind (a gap) or past the run (a repeat) — and
// changes no key.
func TestApplySkip(t *testing.T) {
	tab, key, sh := keyTable(t)
	var out Out
	skip := func(from, to uint64) Record { return Record{Kind: RecordSkip, Shard: sh, Seq: to, From: from} }
	tests := []struct {
		name    string
		r       Record
		ok      bool
		err     error
		seqThen uint64
	}{
		{"gap before the run", skip(2, 4), false, ErrGap, 0},
		{"from 0", skip(0, 4), false, ErrBadRecord, 0},
		{"from above seq", skip(5, 4), false, ErrBadRecord, 0},
		{"no such shard", Record{Kind: RecordSkip, Shard: 4, Seq: 1, From: 1}, false, ErrBadRecord, 0},
		{"next run", skip(1, 3), true, nil, 3},
		{"repeat", skip(1, 3), false, nil, 3},
		{"grant after it", Record{Kind: RecordGrant, Shard: sh, Seq: 4, Key: key, Token: 9, Lease: 5}, true, nil, 4},
		{"the run after it", skip(5, 8), true, nil, 8},
		{"a run a dump cut at 8", skip(7, 10), true, nil, 10},
		{"one record", skip(11, 11), true, nil, 11},
	}
	for _, tc := range tests {
		ok, err := tab.Apply(0, &tc.r, &out)
		if ok != tc.ok || !errors.Is(err, tc.err) || tab.Seq(int(sh)) != tc.seqThen {
			t.Fatalf("%s: applied=%v err=%v seq=%d, want %v %v %d", tc.name, ok, err, tab.Seq(int(sh)), tc.ok, tc.err, tc.seqThen)
		}
	}
	if info := tab.Lookup(key); !info.Held || info.Token != 9 || tab.Stats().Keys != 1 {
		t.Fatalf("skips changed the key: %+v keys=%d", info, tab.Stats().Keys)
	}
	if RecordSkip.String() != "skip" {
		t.Fatalf("RecordSkip.String() = %q", RecordSkip.String())
	}
}

// TestIdentityCounters: forced and refused operations on another
// identity's grant are counted (and forced ones are releases and renews
// too); an identity's own operations, those of no identity, and those on a
// grant of no identity are not.
func TestIdentityCounters(t *testing.T) {
	tab, err := New(Config{Shards: 2}, NewTokens(0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	orders, billing, ops := tab.Ident([]byte("orders")), tab.Ident([]byte("billing")), tab.Ident([]byte("ops"))
	var out Out
	k := []byte("k")
	_, tok := tab.AcquireAs(0, k, 0, 10, 1, orders, nil, &out)
	want := func(fRel, fRen, rRel, rRen, rel, ren uint64) {
		t.Helper()
		c := tab.Counters()
		got := [6]uint64{c.ForcedReleases, c.ForcedRenews, c.RefusedReleases, c.RefusedRenews, c.Releases, c.Renews}
		if got != [6]uint64{fRel, fRen, rRel, rRen, rel, ren} {
			t.Fatalf("forced rel/ren, refused rel/ren, releases, renews = %v, want %v", got, [6]uint64{fRel, fRen, rRel, rRen, rel, ren})
		}
	}
	for _, c := range []struct {
		who  Who
		want Result
	}{
		{Who{Ident: orders}, ResultOK},
		{Who{}, ResultOK},
		{Who{Ident: billing}, ResultRefused},
		{Who{Ident: ops, Admin: true}, ResultForced},
		{Who{Ident: orders, Admin: true}, ResultOK},
	} {
		if r, holder := tab.RenewAs(0, k, 10, tok, c.who, &out); r != c.want || holder != orders {
			t.Fatalf("renew as %+v: %v (holder %d), want %v", c.who, r, holder, c.want)
		}
	}
	want(0, 1, 0, 1, 0, 4)
	if r, holder := tab.RenewAs(0, k, 10, tok+1, Who{Ident: billing}, &out); r != ResultNotHeld || holder != NoIdent {
		t.Fatalf("stale renew: %v, holder %d", r, holder)
	}
	if r, _ := tab.ReleaseAs(0, k, tok, Who{Ident: billing}, &out); r != ResultRefused || !tab.Lookup(k).Held {
		t.Fatalf("refused release: %v, held %v", r, tab.Lookup(k).Held)
	}
	want(0, 1, 1, 1, 0, 4)
	if r, _ := tab.ReleaseAs(0, k, tok, Who{Ident: ops, Admin: true}, &out); r != ResultForced || tab.Lookup(k).Held {
		t.Fatalf("forced release: %v", r)
	}
	want(1, 1, 1, 1, 1, 4)
	// A grant of no identity: anyone with the token, nothing counted.
	_, tok = tab.Acquire(0, k, 0, 10, 1, nil, &out)
	if r, holder := tab.ReleaseAs(0, k, tok, Who{Ident: billing}, &out); r != ResultOK || holder != NoIdent {
		t.Fatalf("release of a grant of no identity: %v", r)
	}
	want(1, 1, 1, 1, 2, 4)
	for r, s := range map[Result]string{ResultNotHeld: "not-held", ResultOK: "ok", ResultForced: "forced", ResultRefused: "refused", 9: "Result(?)"} {
		if r.String() != s {
			t.Errorf("%d.String() = %q", r, r.String())
		}
	}
}

// TestIdentRegistry: names intern to stable handles, distinct names to
// distinct ones, the empty name to NoIdent; past the registry's bound every
// new name is the overflow identity, which no ACL name can be, so its
// grants are an admin's to release, never the token alone's.
func TestIdentRegistry(t *testing.T) {
	tab, err := New(Config{Shards: 1}, NewTokens(0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if tab.Ident(nil) != NoIdent || tab.Ident([]byte{}) != NoIdent || tab.IdentName(NoIdent) != nil {
		t.Fatal("the empty name is not NoIdent")
	}
	a := tab.Ident([]byte("a"))
	name := []byte("b")
	b := tab.Ident(name)
	name[0] = 'x' // the registry copied it
	if a == b || a == NoIdent || tab.Ident([]byte("a")) != a || string(tab.IdentName(b)) != "b" {
		t.Fatalf("a=%d b=%d name(b)=%q", a, b, tab.IdentName(b))
	}
	if tab.IdentName(b+100) != nil {
		t.Fatal("a handle never given has a name")
	}
	for i := 0; tab.idents.n+1 < identOverflow; i++ {
		tab.Ident([]byte(fmt.Sprint("n", i)))
	}
	if tab.Ident([]byte("one-more")) != identOverflow || tab.Ident([]byte("another")) != identOverflow ||
		string(tab.IdentName(identOverflow)) != "(overflow)" || tab.Ident([]byte("a")) != a {
		t.Fatal("the registry's bound")
	}
	var out Out
	_, tok := tab.AcquireAs(0, []byte("k"), 0, 10, 1, tab.Ident([]byte("late")), nil, &out)
	if r, _ := tab.ReleaseAs(0, []byte("k"), tok, Who{Ident: a}, &out); r != ResultRefused {
		t.Fatalf("release of an overflow grant by another identity: %v", r)
	}
	// A handle no registry gives (the entry keeps 16 bits) is the overflow
	// identity too, never a truncation to another name.
	_, tok = tab.AcquireAs(0, []byte("k2"), 0, 10, 1, Ident(1<<16)+a, nil, &out)
	if ki := tab.Lookup([]byte("k2")); ki.Ident != "(overflow)" {
		t.Fatalf("grant to handle %d: identity %q, want the overflow", Ident(1<<16)+a, ki.Ident)
	}
	if r, _ := tab.ReleaseAs(0, []byte("k2"), tok, Who{Ident: a}, &out); r != ResultRefused {
		t.Fatalf("release by a of a grant to a larger handle: %v", r)
	}
}

// TestExtendLeases: the new leader's lease rule moves every deadline
// earlier than the floor up to it and leaves the later ones alone; the
// moved leases fire at the floor (not before, and not at their old
// deadline), the others at their own deadline; nothing is emitted.
func TestExtendLeases(t *testing.T) {
	var emitted int
	tab, err := New(Config{Shards: 4, Sink: func(Record) { emitted++ }}, NewTokens(0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	var out Out
	leases := map[string]uint8{"a": 1, "b": 2, "c": 5, "d": 10}
	for k, l := range leases {
		if st, _ := tab.Acquire(0, []byte(k), 0, l, 0, nil, &out); st != Granted {
			t.Fatalf("acquire %s: %v", k, st)
		}
	}
	emitted = 0
	floor := 3 * second
	if n := tab.ExtendLeases(floor); n != 2 {
		t.Fatalf("ExtendLeases moved %d leases, want 2 (a, b)", n)
	}
	if emitted != 0 {
		t.Fatalf("ExtendLeases emitted %d records", emitted)
	}
	want := map[string]int64{"a": floor, "b": floor, "c": 5 * second, "d": 10 * second}
	for k, d := range want {
		if info := tab.Lookup([]byte(k)); !info.Held || info.Deadline != d {
			t.Fatalf("%s after ExtendLeases: %+v, want deadline %d", k, info, d)
		}
	}
	// The timer wheel follows the new deadlines.
	tests := []struct {
		now  int64
		held []string
	}{
		{2*second + second/2, []string{"a", "b", "c", "d"}}, // past a's and b's old deadlines
		{floor, []string{"c", "d"}},
		{5 * second, []string{"d"}},
		{10 * second, nil},
	}
	for _, tc := range tests {
		for now := int64(0); now <= tc.now; now += 10 * int64(time.Millisecond) {
			tab.Tick(now, &out)
		}
		tab.Tick(tc.now, &out)
		var got []string
		for _, k := range []string{"a", "b", "c", "d"} {
			if tab.Lookup([]byte(k)).Held {
				got = append(got, k)
			}
		}
		if !slices.Equal(got, tc.held) {
			t.Fatalf("at %v: held %v, want %v", time.Duration(tc.now), got, tc.held)
		}
	}
	if n := tab.ExtendLeases(100 * second); n != 0 {
		t.Fatalf("ExtendLeases on an empty table moved %d", n)
	}
}

// TestLockedHoldsTheShardLock: Locked runs its function under the shard's
// lock, so a Sink (which runs under it) and Locked never overlap.
func TestLockedHoldsTheShardLock(t *testing.T) {
	var inSink, overlaps atomic.Int32
	var tab *Table
	var err error
	tab, err = New(Config{Shards: 1, Sink: func(Record) {
		inSink.Add(1)
		time.Sleep(10 * time.Microsecond)
		inSink.Add(-1)
	}}, NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var out Out
		for i := range 2000 {
			tab.Acquire(0, []byte(fmt.Sprint("k", i%50)), 0, 5, 0, nil, &out)
			out.Reset()
		}
	}()
	calls := 0
	for {
		select {
		case <-done:
			if overlaps.Load() != 0 || calls == 0 {
				t.Fatalf("%d of %d Locked calls overlapped a Sink call", overlaps.Load(), calls)
			}
			return
		default:
		}
		tab.Locked(0, func(int) {
			calls++
			if inSink.Load() != 0 {
				overlaps.Add(1)
			}
		})
	}
}

// TestApplyWatches: a table fed records (a node that stopped serving, whose
// watches were not ended yet) still owes each watch one L: a replicated
// release or expiry ends the holder it names (reason 1 or 2), a replicated
// grant that replaces a holder or Reset ends it with reason 4; a
// replicated shared grant joins the key's holders, and the end of one of
// them ends only its own watches.
func TestApplyWatches(t *testing.T) {
	tab, key, sh := keyTable(t)
	var out Out
	seq := uint64(0)
	apply := func(kind RecordKind, token uint64, limit uint16) {
		t.Helper()
		seq++
		r := Record{Kind: kind, Shard: sh, Seq: seq, Key: key, Token: token, Limit: limit}
		if kind == RecordGrant || kind == RecordRenew {
			r.Lease = 10
		}
		if _, err := tab.Apply(0, &r, &out); err != nil {
			t.Fatalf("apply %v %d: %v", kind, token, err)
		}
	}
	watch := func(token uint64) {
		t.Helper()
		if st := tab.Watch(0, key, token, nil, &out); st != Watching {
			t.Fatalf("watch %d: %v", token, st)
		}
	}
	lost := func(want ...string) {
		t.Helper()
		var got []string
		for _, e := range out.Effects {
			got = append(got, fmt.Sprintf("%v %d %v", e.Kind, e.Token, e.Reason))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("effects %v, want %v", got, want)
		}
		out.Reset()
	}
	apply(RecordGrant, 1, 3)
	apply(RecordGrant, 2, 3)
	apply(RecordGrant, 3, 3)
	if info := tab.Lookup(key); info.Holders != 3 || info.Limit != 3 || info.Token != 3 {
		t.Fatalf("three replicated shared grants: %+v", info)
	}
	watch(1)
	watch(2)
	watch(3)
	apply(RecordRelease, 1, 0)
	lost("lost 1 released")
	apply(RecordExpire, 3, 0)
	lost("lost 3 expired")
	apply(RecordRenew, 2, 0)
	lost()
	// An exclusive grant over the key replaces its holder (the stream lost
	// nothing in a real run: this is the table's defence).
	apply(RecordGrant, 4, 0)
	lost("lost 2 cannot-tell")
	watch(4)
	tab.Reset(&out)
	lost("lost 4 cannot-tell")
	if st := tab.Stats(); st != (Stats{}) {
		t.Fatalf("after Reset: %+v", st)
	}
}
