package shard

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
)

func benchTable(b *testing.B) *Table {
	tab, err := New(Config{}, NewTokens(0, 1<<62))
	if err != nil {
		b.Fatal(err)
	}
	return tab
}

// BenchmarkAcquireRelease: an uncontended key, acquired and released.
func BenchmarkAcquireRelease(b *testing.B) {
	tab := benchTable(b)
	key := []byte("0123456789abcdef")
	var out Out
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_, tok := tab.Acquire(int64(i), key, 0, 10, 1, nil, &out)
		tab.Release(int64(i), key, tok, &out)
	}
}

// BenchmarkAcquireReleaseManyKeys cycles over 64Ki distinct keys, so entries
// and key buffers come from the free lists of many shards.
func BenchmarkAcquireReleaseManyKeys(b *testing.B) {
	tab := benchTable(b)
	keys := make([][]byte, 1<<16)
	var buf [16]byte
	for i := range keys {
		keys[i] = append([]byte(nil), key16(&buf, i)...)
	}
	var out Out
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := keys[i&(len(keys)-1)]
		_, tok := tab.Acquire(int64(i), key, 0, 10, 1, nil, &out)
		tab.Release(int64(i), key, tok, &out)
	}
}

// BenchmarkQueueHandoff: an acquire queues on a held key, then the holder
// releases and the key is handed to the waiter with a new token.
func BenchmarkQueueHandoff(b *testing.B) {
	tab := benchTable(b)
	key := []byte("0123456789abcdef")
	c := NewConn(nil)
	var out Out
	_, tok := tab.Acquire(0, key, 0, 10, 0, nil, &out)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tab.Acquire(int64(i), key, 5, 10, uint64(i), c, &out)
		tab.Release(int64(i), key, tok, &out)
		tok = out.Effects[0].Token
		out.Reset()
	}
}

// BenchmarkRenew: the lease of a held key restarted (a wheel move).
func BenchmarkRenew(b *testing.B) {
	tab := benchTable(b)
	key := []byte("0123456789abcdef")
	var out Out
	_, tok := tab.Acquire(0, key, 0, 10, 0, nil, &out)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tab.Renew(int64(i)*1000, key, 10, tok, &out)
	}
}

// BenchmarkTickIdle: one Tick of an empty 64-shard table.
func BenchmarkTickIdle(b *testing.B) {
	tab := benchTable(b)
	var out Out
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tab.Tick(int64(i)*int64(DefaultTick), &out)
	}
}

// BenchmarkTickMillion: one Tick (10 ms step) of a table holding a million
// locks with 255 s leases granted over 41 s (one wheel rotation), so their
// deadlines cover every slot; nothing is due: the per-tick cost of walking
// the slots' future rotations.
func BenchmarkTickMillion(b *testing.B) {
	tab := benchTable(b)
	var buf [16]byte
	var out Out
	const spread = 41 * second
	for i := range millionLocks {
		tab.Acquire(int64(i)*(spread/millionLocks), key16(&buf, i), 0, 255, 0, nil, &out)
	}
	now := int64(spread)
	b.ReportAllocs()
	for b.Loop() {
		now += int64(DefaultTick)
		if now >= 254*second {
			now = spread // keep nothing due
		}
		tab.Tick(now, &out)
	}
	if len(out.Effects) != 0 || tab.Stats().Keys != millionLocks {
		b.Fatal("something expired")
	}
}

// BenchmarkParallelAcquireRelease: RunParallel over 1Mi keys, each goroutine
// acquiring and releasing random keys (mostly uncontended, some collisions).
func BenchmarkParallelAcquireRelease(b *testing.B) {
	tab := benchTable(b)
	const nkeys = 1 << 20
	keys := make([][]byte, nkeys)
	var buf [16]byte
	for i := range keys {
		keys[i] = append([]byte(nil), key16(&buf, i)...)
	}
	var seed atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 1))
		var out Out
		for pb.Next() {
			key := keys[rng.IntN(nkeys)]
			if st, tok := tab.Acquire(0, key, 0, 10, 1, nil, &out); st == Granted {
				tab.Release(0, key, tok, &out)
			}
		}
	})
}

// BenchmarkTokensNext: the allocator's fast path, contended.
func BenchmarkTokensNext(b *testing.B) {
	tk := NewTokens(0, 1<<62)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk.Next()
		}
	})
}

// BenchmarkMemoryPerLock reports the heap bytes per held lock of a table of
// a million 16-byte keys.
func BenchmarkMemoryPerLock(b *testing.B) {
	b.ReportAllocs()
	var perLock float64
	for b.Loop() {
		b.StopTimer()
		base := heapAlloc()
		tab := benchTable(b)
		b.StartTimer()
		toks := fill(b, tab, millionLocks)
		b.StopTimer()
		perLock = (float64(heapAlloc()) - float64(base) - float64(len(toks)*8)) / millionLocks
		runtime.KeepAlive(tab)
		b.StartTimer()
	}
	b.ReportMetric(perLock, "B/lock")
}
