package records_test

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// readBack returns the records of a batch, keys and identities copied,
// empty ones nil.
func readBack(t *testing.T, raw []byte) []shard.Record {
	t.Helper()
	var rr records.RecordReader
	var got []shard.Record
	var r shard.Record
	for rr.Reset(raw); rr.Next(&r); {
		r.Key, r.Ident = slices.Clone(r.Key), slices.Clone(r.Ident)
		if len(r.Key) == 0 {
			r.Key = nil
		}
		if len(r.Ident) == 0 {
			r.Ident = nil
		}
		got = append(got, r)
	}
	if rr.Err() != nil {
		t.Fatal(rr.Err())
	}
	return got
}

func indexed(t *testing.T, rs []shard.Record) *records.Indexed {
	t.Helper()
	var x records.Indexed
	for i := range rs {
		if err := x.Add(&rs[i]); err != nil {
			t.Fatalf("add %+v: %v", rs[i], err)
		}
	}
	return &x
}

func skip(from, to uint64) shard.Record {
	return shard.Record{Kind: shard.RecordSkip, Shard: 2, Seq: to, From: from}
}

// TestCutMerged: one shard's buffered records, the records of grants it
// held back and the Seqs it withheld come out as one batch in Seq order,
// consecutive Seqs that stand for nothing — withheld, or cancelled out of
// the buffer — as one skip record.
func TestCutMerged(t *testing.T) {
	rel := func(seq, tok uint64) shard.Record {
		return shard.Record{Kind: shard.RecordRelease, Shard: 2, Seq: seq, Key: []byte("r"), Token: tok}
	}
	grant := func(seq, tok uint64, key string) shard.Record {
		return shard.Record{Kind: shard.RecordGrant, Shard: 2, Seq: seq, Key: []byte(key), Token: tok, Lease: 5, Ident: []byte("orders")}
	}
	renew := func(seq, tok uint64, key string) shard.Record {
		return shard.Record{Kind: shard.RecordRenew, Shard: 2, Seq: seq, Key: []byte(key), Token: tok, Lease: 9}
	}
	for _, tc := range []struct {
		name   string
		src    []shard.Record
		def    []shard.Record
		skips  []uint64
		cancel bool
		want   []shard.Record
		taken  int
	}{
		{
			name: "buffer only, cancelling: as Cut",
			src:  []shard.Record{rel(10, 3), grant(11, 20, "a"), rel(12, 20)}, cancel: true,
			want: []shard.Record{rel(10, 3), skip(11, 12)}, taken: 2,
		},
		{
			name: "buffer only, a snapshot cut meanwhile: as it is",
			src:  []shard.Record{rel(10, 3), grant(11, 20, "a"), rel(12, 20)},
			want: []shard.Record{rel(10, 3), grant(11, 20, "a"), rel(12, 20)},
		},
		{
			name:  "all three interleaved",
			src:   []shard.Record{rel(2, 3), grant(5, 30, "b")},
			def:   []shard.Record{grant(1, 10, "a"), renew(4, 10, "a")},
			skips: []uint64{7, 3, 6}, cancel: true,
			want:  []shard.Record{grant(1, 10, "a"), rel(2, 3), skip(3, 3), renew(4, 10, "a"), grant(5, 30, "b"), skip(6, 7)},
			taken: 3,
		},
		{
			name:  "withheld and cancelled Seqs make one skip",
			src:   []shard.Record{grant(3, 30, "b"), rel(4, 30), rel(8, 2)},
			def:   []shard.Record{grant(7, 40, "c")},
			skips: []uint64{5, 1, 2, 6}, cancel: true,
			want:  []shard.Record{skip(1, 6), grant(7, 40, "c"), rel(8, 2)},
			taken: 6,
		},
		{
			name:  "a snapshot cut meanwhile: the buffer stays whole, the withheld Seqs are still skips",
			src:   []shard.Record{grant(3, 30, "b"), rel(4, 30)},
			skips: []uint64{2, 1},
			want:  []shard.Record{skip(1, 2), grant(3, 30, "b"), rel(4, 30)},
			taken: 2,
		},
		{
			name:  "only skips",
			skips: []uint64{9, 4, 5, 6, 8}, cancel: true,
			want:  []shard.Record{skip(4, 6), skip(8, 9)},
			taken: 5,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c records.Canceller
			var out records.BatchWriter
			n := c.CutMerged(&out, 2, indexed(t, tc.src), indexed(t, tc.def), slices.Clone(tc.skips), tc.cancel)
			if n != tc.taken {
				t.Errorf("%d taken out, want %d", n, tc.taken)
			}
			got := readBack(t, out.Bytes())
			want := readBack(t, func() []byte {
				var w records.BatchWriter
				for _, r := range tc.want {
					if r.Kind == shard.RecordSkip {
						if err := w.AddSkip(r.Shard, r.From, r.Seq); err != nil {
							t.Fatal(err)
						}
					} else if err := w.Add(&r); err != nil {
						t.Fatal(err)
					}
				}
				return w.Bytes()
			}())
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("merged\n%+v\nwant\n%+v", got, want)
			}
			if out.Count() != len(tc.want) {
				t.Fatalf("writer counts %d records, want %d", out.Count(), len(tc.want))
			}
		})
	}
}

// TestCutMergedSortsSeqs: whatever order the withheld Seqs come in, and
// however far apart (past the bitmap's reach the merge sorts them), they
// come out in order, each once, as the fewest skip records.
func TestCutMergedSortsSeqs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		name string
		seqs []uint64
	}{
		{"dense", func() []uint64 {
			s := make([]uint64, 500)
			for i := range s {
				s[i] = 1000 + uint64(i)*2
			}
			return s
		}()},
		{"sparse", []uint64{5, 1 << 40, 7, 1<<40 + 1, 6}},
		{"repeated", []uint64{3, 4, 3, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seqs := slices.Clone(tc.seqs)
			rng.Shuffle(len(seqs), func(i, j int) { seqs[i], seqs[j] = seqs[j], seqs[i] })
			var c records.Canceller
			var out records.BatchWriter
			c.CutMerged(&out, 2, &records.Indexed{}, &records.Indexed{}, seqs, true)
			var got []uint64
			for _, r := range readBack(t, out.Bytes()) {
				if r.Kind != shard.RecordSkip {
					t.Fatalf("record %+v: want only skips", r)
				}
				if len(got) > 0 && r.From == got[len(got)-1]+1 {
					t.Fatalf("skip %d..%d follows %d: two skips where one would do", r.From, r.Seq, got[len(got)-1])
				}
				for s := r.From; s <= r.Seq; s++ {
					got = append(got, s)
				}
			}
			want := slices.Compact(slices.Sorted(slices.Values(tc.seqs)))
			if !slices.Equal(got, want) {
				t.Fatalf("skips stand for %v, want %v", got, want)
			}
		})
	}
}

// TestSplitFrom: SplitFrom moves the records numbered at or after a Seq
// (a suffix) to the end of another Indexed, and AppendIndexed puts them
// back in front of later ones: the two round-trip a shard's records kept
// for the next cut.
func TestSplitFrom(t *testing.T) {
	rec := func(seq uint64) shard.Record {
		if seq%3 == 0 {
			return shard.Record{Kind: shard.RecordGrant, Shard: 2, Seq: seq, Key: []byte("g"), Token: seq, Lease: 5, Ident: []byte("orders"), Limit: 3}
		}
		return shard.Record{Kind: shard.RecordRelease, Shard: 2, Seq: seq, Key: []byte("k"), Token: seq}
	}
	seqs := func(from, to uint64) []shard.Record {
		var rs []shard.Record
		for s := from; s <= to; s++ {
			rs = append(rs, rec(s))
		}
		return rs
	}
	for _, tc := range []struct {
		name       string
		have, tail []shard.Record // x's records, tail's before the split
		at         uint64
		moved      int
	}{
		{"middle", seqs(1, 6), nil, 4, 3},
		{"all", seqs(1, 6), nil, 1, 6},
		{"none", seqs(1, 6), nil, 7, 0},
		{"empty", nil, nil, 1, 0},
		{"onto a tail", seqs(5, 9), seqs(1, 2), 8, 2},
		{"between Seqs", []shard.Record{rec(2), rec(4), rec(9)}, nil, 5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, tail := indexed(t, tc.have), indexed(t, tc.tail)
			if got := x.SplitFrom(tc.at, tail); got != tc.moved {
				t.Fatalf("moved %d, want %d", got, tc.moved)
			}
			k := len(tc.have) - tc.moved
			var w records.BatchWriter
			x.AppendTo(&w)
			if got := readBack(t, w.Bytes()); x.Count() != k || !reflect.DeepEqual(got, nilIfEmpty(tc.have[:k])) {
				t.Fatalf("kept %d %+v, want %+v", x.Count(), got, tc.have[:k])
			}
			want := append(slices.Clone(tc.tail), tc.have[k:]...)
			w.Reset()
			tail.AppendTo(&w)
			if got := readBack(t, w.Bytes()); tail.Count() != len(want) || !reflect.DeepEqual(got, nilIfEmpty(want)) {
				t.Fatalf("tail %d %+v, want %+v", tail.Count(), got, want)
			}
			// Back in front of what came later: the same records in order.
			tail.AppendIndexed(x)
			if tail.Count() != len(tc.tail)+len(tc.have) {
				t.Fatalf("after AppendIndexed: %d records, want %d", tail.Count(), len(tc.tail)+len(tc.have))
			}
		})
	}
}

func nilIfEmpty(rs []shard.Record) []shard.Record {
	if len(rs) == 0 {
		return nil
	}
	return rs
}
