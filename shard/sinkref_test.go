package shard

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestSinkRefSameRecords: a table with a SinkRef hands it exactly the
// records a table with a Sink gets for the same operations (grants to
// identities, shared keys with their limits, renewals, releases, expiries),
// and never calls a Sink set beside it. The Record is the table's own and
// rewritten for each change, so a field a change does not set (the Ident
// and Limit of a release after a grant, the lease of an expiry) must still
// read empty: the comparison with Sink's copies shows any left over.
func TestSinkRefSameRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shards int
		seed   uint64
	}{
		{"one-shard", 1, 1},
		{"four-shards", 4, 2},
		{"four-shards-again", 4, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := &recorder{shards: make([][]Record, tc.shards)}
			src, err := New(Config{Shards: tc.shards, Sink: want.sink}, NewTokens(1000, 1<<40))
			if err != nil {
				t.Fatal(err)
			}
			got := &recorder{shards: make([][]Record, tc.shards)}
			sinkCalls := 0
			ref, err := New(Config{Shards: tc.shards, Sink: func(Record) { sinkCalls++ },
				SinkRef: func(r *Record) { got.sink(*r) }}, NewTokens(1000, 1<<40))
			if err != nil {
				t.Fatal(err)
			}
			var now1, now2 int64
			drive(src, rand.New(rand.NewPCG(tc.seed, 5)), 3000, &now1, nil)
			drive(ref, rand.New(rand.NewPCG(tc.seed, 5)), 3000, &now2, nil)
			if sinkCalls != 0 {
				t.Fatalf("Sink called %d times beside a SinkRef", sinkCalls)
			}
			kinds := map[RecordKind]int{}
			for i := range want.shards {
				if len(got.shards[i]) != len(want.shards[i]) {
					t.Fatalf("shard %d: %d records by reference, %d by value", i, len(got.shards[i]), len(want.shards[i]))
				}
				for k, w := range want.shards[i] {
					if g := got.shards[i][k]; !reflect.DeepEqual(normIdent(g), normIdent(w)) {
						t.Fatalf("shard %d record %d: by reference %+v, by value %+v", i, k, g, w)
					}
					kinds[w.Kind]++
				}
			}
			for _, k := range []RecordKind{RecordGrant, RecordRelease, RecordExpire, RecordRenew} {
				if kinds[k] == 0 {
					t.Fatalf("no %s record among %v: the test drives too little", k, kinds)
				}
			}
		})
	}
}

// normIdent makes an empty Ident nil, so that DeepEqual compares names.
func normIdent(r Record) Record {
	if len(r.Ident) == 0 {
		r.Ident = nil
	} else {
		r.Ident = slices.Clone(r.Ident)
	}
	return r
}
