package shard

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The benchmarks below run the table's request paths from parallel
// goroutines (b.RunParallel; run them with -cpu 1,2,4,8), each goroutine
// on keys of its own: no two goroutines ever want the same key, so what
// they share is only what the table shares between all requests — the
// token sequence, capacity counts, and shards (a shard's mutex and
// entries, met by chance: 64 shards). A per-request write to state that
// every request touches shows as ns/op that does not fall (or rises) from
// -cpu 1 to -cpu 2 on two cores; with -cpu 4 and 8 the goroutines
// time-slice, which still moves such a line between the cores at every
// switch.

// ownKeys returns the keys of parallel goroutine g: n distinct 16-byte
// keys that no other goroutine has.
func ownKeys(g, n int) [][]byte {
	keys := make([][]byte, n)
	var buf [16]byte
	for i := range keys {
		keys[i] = append([]byte(nil), key16(&buf, g*n+i)...)
	}
	return keys
}

// BenchmarkParallelPairs: acquire and release of a key nobody else holds
// (the uncontended path: a new entry, a token, a record, a free entry),
// cycling over 1024 keys per goroutine. One op is one pair.
func BenchmarkParallelPairs(b *testing.B) {
	tab := benchTable(b)
	var g atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		keys := ownKeys(int(g.Add(1)), 1024)
		var out Out
		for i := 0; pb.Next(); i++ {
			key := keys[i&1023]
			_, tok := tab.Acquire(int64(i), key, 0, 10, 1, nil, &out)
			tab.Release(int64(i), key, tok, &out)
		}
	})
}

// BenchmarkParallelHandoff: an acquire queues on a held key of the
// goroutine's own, then the holder releases and the key goes to the
// waiter (the contended path of one key: a waiter counted and uncounted,
// a handoff's token). One op is one handoff.
func BenchmarkParallelHandoff(b *testing.B) {
	tab := benchTable(b)
	var g atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := ownKeys(int(g.Add(1)), 1)[0]
		c := NewConn(nil)
		var out Out
		_, tok := tab.Acquire(0, key, 0, 10, 0, nil, &out)
		for i := 0; pb.Next(); i++ {
			tab.Acquire(int64(i), key, 5, 10, uint64(i), c, &out)
			tab.Release(int64(i), key, tok, &out)
			tok = out.Effects[0].Token
			out.Reset()
		}
	})
}

// BenchmarkParallelShared: two holders of a shared key (limit 2) of the
// goroutine's own, acquired and released (the first holder counts as a
// key, the second as a further holder). One op is the four requests.
func BenchmarkParallelShared(b *testing.B) {
	tab := benchTable(b)
	var g atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		keys := ownKeys(int(g.Add(1)), 1024)
		var out Out
		for i := 0; pb.Next(); i++ {
			key := keys[i&1023]
			_, t1 := tab.AcquireShared(int64(i), key, 0, 10, 1, 2, NoIdent, nil, &out)
			_, t2 := tab.AcquireShared(int64(i), key, 0, 10, 2, 2, NoIdent, nil, &out)
			tab.Release(int64(i), key, t2, &out)
			tab.Release(int64(i), key, t1, &out)
		}
	})
}

// BenchmarkParallelPairsIsolated is ParallelPairs with the chance sharing
// of shards taken out, to show what every request still shares: in
// "own-shard" each goroutine's keys all lie in a shard of its own (one
// table: the goroutines share only what every request writes — the token
// sequence, and any table-wide count), in "own-table" each goroutine has
// a table of its own (nothing shared at all). The difference between the
// two at -cpu 2 and more is the cost of the table-wide writes.
func BenchmarkParallelPairsIsolated(b *testing.B) {
	for _, own := range []string{"own-shard", "own-table"} {
		b.Run(own, func(b *testing.B) {
			shared := benchTable(b)
			var g atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				id := int(g.Add(1))
				tab := shared
				if own == "own-table" {
					tab = benchTable(b)
				}
				keys := shardKeys(tab, id%len(tab.shards), id, 1024)
				var out Out
				for i := 0; pb.Next(); i++ {
					key := keys[i&1023]
					_, tok := tab.Acquire(int64(i), key, 0, 10, 1, nil, &out)
					tab.Release(int64(i), key, tok, &out)
				}
			})
		})
	}
}

// shardKeys returns n distinct keys of goroutine g that all lie in shard i
// of tab.
func shardKeys(tab *Table, i, g, n int) [][]byte {
	keys := make([][]byte, 0, n)
	for k := 0; len(keys) < n; k++ {
		key := []byte("iso/" + strconv.Itoa(g) + "/" + strconv.Itoa(k))
		if tab.shardOf(xxhash.Sum64(key)) == &tab.shards[i] {
			keys = append(keys, key)
		}
	}
	return keys
}
