package shard

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// deferRecorder is a Sink's owner that lets the table hold exclusive
// grants back (Config.Defer) and takes them at times the test chooses:
// it keeps every record the Sink and LockedTake hand it, and every Seq
// LockedTake hands as a skip, per shard.
type deferRecorder struct {
	shards [][]Record
	defers func() bool // whether Defer holds the next grant back
	held   int         // grants Defer held back
}

// newDeferOne is a one-shard table that holds back every exclusive
// grant, and its recorder.
func newDeferOne(t *testing.T) (*deferRecorder, *Table) {
	t.Helper()
	d := &deferRecorder{shards: make([][]Record, 1), defers: func() bool { return true }}
	tab, err := New(Config{Shards: 1, SinkRef: d.sink, Defer: d.deferGrant}, NewTokens(1000, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	return d, tab
}

// keptRecord is a copy of the table's Record r that outlives the call.
func keptRecord(r *Record) Record {
	c := *r
	c.Key = slices.Clone(r.Key)
	return c
}

func (d *deferRecorder) sink(r *Record) { d.shards[r.Shard] = append(d.shards[r.Shard], keptRecord(r)) }

func (d *deferRecorder) deferGrant(shard uint32, pending int) bool {
	if d.defers() {
		d.held++
		return true
	}
	return false
}

// takeAll takes what every shard of tab holds back.
func (d *deferRecorder) takeAll(tab *Table) {
	for i := range tab.Shards() {
		d.takeShard(tab, i)
	}
}

func (d *deferRecorder) takeShard(tab *Table, i int) {
	var skips []uint64
	tab.LockedTake(i, d.sink, &skips, func(int) {})
	for _, seq := range skips {
		d.shards[i] = append(d.shards[i], Record{Kind: RecordSkip, Shard: uint32(i), Seq: seq, From: seq})
	}
}

// stream returns each shard's records and skips in Seq order, and fails
// the test unless they number 1, 2, 3, … up to the shard's Seq, each once.
func (d *deferRecorder) stream(t *testing.T, tab *Table) *recorder {
	t.Helper()
	rec := &recorder{shards: make([][]Record, len(d.shards))}
	for i, list := range d.shards {
		list = slices.Clone(list)
		slices.SortStableFunc(list, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
		for k, r := range list {
			if r.Seq != uint64(k+1) {
				t.Fatalf("shard %d: record %d has Seq %d (%s): every Seq must be handed over once", i, k, r.Seq, r.Kind)
			}
		}
		if got, want := uint64(len(list)), tab.Seq(i); got != want {
			t.Fatalf("shard %d: %d records and skips handed over, Seq is %d", i, got, want)
		}
		rec.shards[i] = list
	}
	return rec
}

// assertCopy takes what src holds back, replays everything src handed
// over into a fresh table (shards interleaved by rng) and fails unless it
// ends equal to src, key by key and Seq by Seq. It returns src's keys.
func (d *deferRecorder) assertCopy(t *testing.T, src *Table, rng *rand.Rand) map[string][]held {
	t.Helper()
	d.takeAll(src)
	rec := d.stream(t, src)
	dst, err := New(Config{Shards: src.Shards()}, NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	replay(t, dst, rec, rng)
	want, wantSeq := dumpAll(src)
	got, gotSeq := dumpAll(dst)
	assertSame(t, want, got)
	if !slices.Equal(wantSeq, gotSeq) {
		t.Fatalf("seqs %v, want %v", gotSeq, wantSeq)
	}
	return want
}

// TestDeferRoundTrip: a table that holds grants back (at random) and hands
// them over at random moments gives, records and skips together, every
// Seq of every shard once, and a table fed them in Seq order ends equal to
// it key by key, with the same Seqs: whatever a held-back grant went
// through before it was taken (an end, renews, a handoff of its key, a
// shared grant of the key after it) reaches the other table as it should.
func TestDeferRoundTrip(t *testing.T) {
	for _, share := range []int{0, 50, 80, 100} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("defer%d/%d", share, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 11))
				drng := rand.New(rand.NewPCG(seed, 12))
				d := &deferRecorder{shards: make([][]Record, 4), defers: func() bool { return drng.IntN(100) < share }}
				src, err := New(Config{Shards: 4, SinkRef: d.sink, Defer: d.deferGrant}, NewTokens(1000, 1<<40))
				if err != nil {
					t.Fatal(err)
				}
				var now int64
				drive(src, rng, 3000, &now, func(op int) {
					switch x := drng.IntN(40); {
					case x == 0:
						d.takeAll(src)
					case x < 4:
						d.takeShard(src, drng.IntN(4))
					}
				})
				if share > 0 && d.held == 0 {
					t.Fatal("no grant was held back: the test defers nothing")
				}
				d.assertCopy(t, src, rng)
			})
		}
	}
}

// TestDeferPairsCostNoRecord: an acquire and release of a key whose grant
// was held back reach the Sink as nothing, and LockedTake hands both Seqs
// as skips; a grant still held when it is taken comes as its record, with
// the lease of its last renew (the renew's own record follows it).
func TestDeferPairsCostNoRecord(t *testing.T) {
	d, tab := newDeferOne(t)
	id := tab.Ident([]byte("orders"))
	var out Out
	_, t1 := tab.AcquireAs(0, []byte("a"), 0, 5, 1, id, nil, &out)
	_, t2 := tab.AcquireAs(0, []byte("b"), 0, 5, 1, NoIdent, nil, &out)
	if !tab.Release(1, []byte("a"), t1, &out) {
		t.Fatal("release a")
	}
	if !tab.Renew(2*second, []byte("b"), 9, t2, &out) {
		t.Fatal("renew b")
	}
	if len(d.shards[0]) != 0 {
		t.Fatalf("the Sink got %+v before the take: want nothing", d.shards[0])
	}
	var skips []uint64
	tab.LockedTake(0, d.sink, &skips, func(int) {})
	slices.Sort(skips)
	if !slices.Equal(skips, []uint64{1, 3}) {
		t.Fatalf("skips %v, want [1 3] (a's grant and its release)", skips)
	}
	got := d.shards[0]
	if len(got) != 2 || got[0].Kind != RecordGrant || got[0].Seq != 2 || string(got[0].Key) != "b" || got[0].Token != t2 ||
		got[0].Lease != 9 || got[0].Deadline != 11*second || got[1].Kind != RecordRenew || got[1].Seq != 4 || got[1].Lease != 9 {
		t.Fatalf("taken %+v, want b's grant (Seq 2, lease 9 to 11 s) then its renew (Seq 4)", got)
	}
	// Nothing is held back any more: a second take hands nothing, and the
	// release of b now goes to the Sink.
	d.shards[0] = nil
	skips = skips[:0]
	tab.LockedTake(0, d.sink, &skips, func(int) {})
	if len(skips) != 0 || len(d.shards[0]) != 0 {
		t.Fatalf("second take: %v %+v, want nothing", skips, d.shards[0])
	}
	tab.Release(3*second, []byte("b"), t2, &out)
	if got := d.shards[0]; len(got) != 1 || got[0].Kind != RecordRelease || got[0].Seq != 5 {
		t.Fatalf("after the take, the release of b: %+v, want one release record, Seq 5", got)
	}
}

// TestDeferAcrossCompact: grants held back whose entries a compact moves
// (most keys of a large shard released) are taken from where they moved
// to.
func TestDeferAcrossCompact(t *testing.T) {
	d, src := newDeferOne(t)
	var out Out
	const n = 4 * chunkLen
	toks := make([]uint64, n)
	for i := range n {
		_, toks[i] = src.Acquire(0, fmt.Appendf(nil, "key-%05d", i), 0, 30, 1, nil, &out)
	}
	// Release all but every 16th, from the bottom up, so that the live
	// entries left are high in the slab and the compact moves them.
	for i := range n {
		if i%16 != 15 {
			src.Release(0, fmt.Appendf(nil, "key-%05d", i), toks[i], &out)
		}
	}
	if c := len(src.shards[0].slab.chunks); c != 1 {
		t.Fatalf("the slab kept %d chunks: no compact ran, the test proves nothing", c)
	}
	if want := d.assertCopy(t, src, rand.New(rand.NewPCG(1, 1))); len(want) != n/16 {
		t.Fatalf("source holds %d keys, want %d", len(want), n/16)
	}
}

// TestDeferReset: Reset forgets what the table held back.
func TestDeferReset(t *testing.T) {
	d, tab := newDeferOne(t)
	var out Out
	tab.Acquire(0, []byte("a"), 0, 5, 1, nil, &out)
	tab.Reset(&out)
	var skips []uint64
	tab.LockedTake(0, d.sink, &skips, func(int) {})
	if len(skips) != 0 || len(d.shards[0]) != 0 {
		t.Fatalf("after Reset, taken %v %+v: want nothing", skips, d.shards[0])
	}
}

// TestDeferRenewsBounded: past maxHeldRenews, renews of a grant held
// back go to the Sink as they happen, and the stream stays whole whether
// the grant is still held at the take or ended before it.
func TestDeferRenewsBounded(t *testing.T) {
	for _, end := range []bool{false, true} {
		t.Run(fmt.Sprint("end=", end), func(t *testing.T) {
			d, src := newDeferOne(t)
			var out Out
			_, tok := src.Acquire(0, []byte("k"), 0, 5, 1, nil, &out)
			src.Acquire(0, []byte("other"), 0, 5, 1, nil, &out)
			for i := range maxHeldRenews + 10 {
				if !src.Renew(int64(i), []byte("k"), 5, tok, &out) {
					t.Fatal("renew")
				}
			}
			if got := len(src.shards[0].renews); got != maxHeldRenews {
				t.Fatalf("%d renews held back, want the bound %d", got, maxHeldRenews)
			}
			if got := len(d.shards[0]); got != 10 {
				t.Fatalf("%d records reached the Sink before the take, want the 10 renews past the bound", got)
			}
			if end {
				src.Release(1e9, []byte("k"), tok, &out)
			}
			d.assertCopy(t, src, rand.New(rand.NewPCG(1, 1)))
		})
	}
}

// cutRecorder is a Sink's owner that cuts as the priority stream does:
// what the Sink buffered since the last cut, what the cut took (records
// and skips) and what the last cut kept, split at the Seq the table kept
// on (LockedCut); the part below it is sent, the rest kept for the next
// cut.
type cutRecorder struct {
	defers func() bool
	buf    [][]Record // per shard: what the Sink buffered since the last cut
	carry  [][]Record // per shard: what the last cut kept
	sent   [][]Record // per shard: what the cuts sent, in the order sent
	taken  []Record   // what the running cut took
	kept   int        // cuts that kept something
	prev   []uint64   // per shard: its Seq at its last cut
}

func newCutRecorder(shards int, defers func() bool) *cutRecorder {
	return &cutRecorder{defers: defers, buf: make([][]Record, shards), carry: make([][]Record, shards), sent: make([][]Record, shards),
		prev: make([]uint64, shards)}
}

func (c *cutRecorder) sink(r *Record) { c.buf[r.Shard] = append(c.buf[r.Shard], keptRecord(r)) }

func (c *cutRecorder) take(r *Record) { c.taken = append(c.taken, keptRecord(r)) }

func (c *cutRecorder) deferGrant(uint32, int) bool { return c.defers() }

// cut cuts shard i of tab at since (everything when all) and fails the
// test unless what it sends numbers on from what the shard sent last,
// without a gap or a repeat, up to the Seq the table kept on (or to the
// shard's Seq when it kept nothing).
func (c *cutRecorder) cut(t *testing.T, tab *Table, i int, since int64, all bool) {
	t.Helper()
	var skips []uint64
	var buffered []Record
	c.taken = c.taken[:0]
	swap := func(int) { buffered, c.buf[i] = c.buf[i], nil }
	var keep uint64
	if all {
		tab.LockedTake(i, c.take, &skips, swap)
	} else {
		keep = tab.LockedCut(i, since, c.take, &skips, swap)
	}
	part := append(c.carry[i], buffered...)
	c.carry[i] = nil
	for _, r := range c.taken {
		if keep != 0 && r.Seq >= keep {
			t.Fatalf("shard %d: the cut took %s Seq %d, at or after the Seq it kept on (%d)", i, r.Kind, r.Seq, keep)
		}
	}
	part = append(part, c.taken...)
	for _, seq := range skips {
		part = append(part, Record{Kind: RecordSkip, Shard: uint32(i), Seq: seq, From: seq})
	}
	if keep != 0 {
		c.kept++
		now := part[:0]
		for _, r := range part {
			if r.Seq >= keep {
				c.carry[i] = append(c.carry[i], r)
			} else {
				now = append(now, r)
			}
		}
		part = now
		if p := tab.shards[i].pend; len(p) == 0 || p[0].seq != keep {
			t.Fatalf("shard %d: kept on from %d, but held back %+v", i, keep, p)
		}
	}
	slices.SortStableFunc(part, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	last := uint64(len(c.sent[i]))
	for k, r := range part {
		if r.Seq != last+uint64(k)+1 {
			t.Fatalf("shard %d: the cut sends Seq %d (%s) after %d: a gap or a repeat", i, r.Seq, r.Kind, last+uint64(k))
		}
	}
	end := tab.Seq(i)
	if keep != 0 {
		end = keep - 1
	}
	if got := last + uint64(len(part)); got != end {
		t.Fatalf("shard %d: the cut sends up to Seq %d, want %d (kept on from %d)", i, got, end, keep)
	}
	if end < c.prev[i] {
		t.Fatalf("shard %d: the cut sends up to Seq %d, but the last cut was at %d: a change waited two cuts", i, end, c.prev[i])
	}
	c.prev[i] = tab.Seq(i)
	c.sent[i] = append(c.sent[i], part...)
}

// TestDeferCutKeepsPrefix: cuts that keep the young grants still held
// (LockedCut, at random times and shares) send each shard's Seqs as an
// unbroken prefix, every Seq once, and a table fed the cuts in the order
// sent ends equal to the source, whatever the grants kept went through
// before the cut that took them (ends, renews, handoffs, shared grants
// after them, ends of older grants after them).
func TestDeferCutKeepsPrefix(t *testing.T) {
	for _, share := range []int{50, 100} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("defer%d/%d", share, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 21))
				crng := rand.New(rand.NewPCG(seed, 22))
				c := newCutRecorder(4, func() bool { return crng.IntN(100) < share })
				src, err := New(Config{Shards: 4, SinkRef: c.sink, Defer: c.deferGrant}, NewTokens(1000, 1<<40))
				if err != nil {
					t.Fatal(err)
				}
				var now int64
				drive(src, rng, 3000, &now, func(op int) {
					if x := crng.IntN(20); x < 3 {
						// since: the grants made at this moment are young
						// (x 0), none are (1), those of the last 500 ms (2).
						since := []int64{now, now + 1, now - 500*1e6}[x]
						c.cut(t, src, crng.IntN(4), since, false)
					} else if x == 3 {
						c.cut(t, src, crng.IntN(4), 0, true)
					}
				})
				for i := range src.Shards() {
					c.cut(t, src, i, 0, true)
				}
				if c.kept == 0 {
					t.Fatal("no cut kept anything: the test proves nothing")
				}
				dst, err := New(Config{Shards: src.Shards()}, NewTokens(0, 0))
				if err != nil {
					t.Fatal(err)
				}
				replay(t, dst, &recorder{shards: c.sent}, rng)
				want, wantSeq := dumpAll(src)
				got, gotSeq := dumpAll(dst)
				assertSame(t, want, got)
				if !slices.Equal(wantSeq, gotSeq) {
					t.Fatalf("seqs %v, want %v", gotSeq, wantSeq)
				}
			})
		}
	}
}
