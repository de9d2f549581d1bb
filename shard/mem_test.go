package shard

import (
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

const (
	millionLocks = 1_000_000
	maxHeapMB    = 160 // budget for a million held locks with 16-byte keys
)

// heapAlloc returns the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// key16 writes the 16-byte key of lock i into buf.
func key16(buf *[16]byte, i int) []byte {
	copy(buf[:], "key-000000000000")
	b := strconv.AppendInt(buf[:4:4], int64(i), 10)
	n := len(b) - 4
	copy(buf[16-n:], b[4:])
	for j := 4; j < 16-n; j++ {
		buf[j] = '0'
	}
	return buf[:]
}

// fill acquires n distinct 16-byte keys and returns their tokens.
func fill(tb testing.TB, tab *Table, n int) []uint64 {
	var buf [16]byte
	var out Out
	toks := make([]uint64, n)
	for i := range n {
		st, tok := tab.Acquire(0, key16(&buf, i), 0, 255, 0, nil, &out)
		if st != Granted {
			tb.Fatalf("lock %d: %v", i, st)
		}
		toks[i] = tok
	}
	return toks
}

// TestMemoryMillion fills a default table with a million 16-byte keys and
// checks the heap it takes (≤ 160 MB), then releases them all and checks the
// heap returns to near the empty table (bounded free lists, shrinking
// indexes).
func TestMemoryMillion(t *testing.T) {
	start := time.Now()
	base := heapAlloc()
	tab, err := New(Config{}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	empty := heapAlloc()
	toks := fill(t, tab, millionLocks)
	tokBytes := uint64(len(toks) * 8) // the test's own slice of tokens
	full := heapAlloc()
	used := full - base - tokBytes
	t.Logf("empty table %.1f MB; %d held locks %.1f MB (%.0f bytes/lock)",
		float64(empty-base)/1e6, millionLocks, float64(used)/1e6, float64(used)/millionLocks)
	if used > maxHeapMB*1e6 {
		t.Errorf("%d held locks take %.1f MB of heap, want ≤ %d MB", millionLocks, float64(used)/1e6, maxHeapMB)
	}
	if st := tab.Stats(); st.Keys != millionLocks {
		t.Fatalf("stats %+v", st)
	}

	var buf [16]byte
	var out Out
	for i, tok := range toks {
		if !tab.Release(0, key16(&buf, i), tok, &out) {
			t.Fatalf("release %d", i)
		}
	}
	toks = nil
	after := heapAlloc()
	left := int64(after) - int64(empty)
	t.Logf("after releasing all: %.2f MB above the empty table (%v)", float64(left)/1e6, time.Since(start))
	// What may remain: each shard's bounded free list of entries.
	if limit := int64(len(tab.shards)*maxFreeEntries*128) + 1e6; left > limit {
		t.Errorf("heap %.1f MB above the empty table after releasing every lock, want ≤ %.1f MB",
			float64(left)/1e6, float64(limit)/1e6)
	}
	runtime.KeepAlive(tab)
	runtime.KeepAlive(toks)
}

// TestEntrySize keeps the per-lock struct in the 80-byte size class: a
// million held locks means a million entries.
func TestEntrySize(t *testing.T) {
	if sz := unsafe.Sizeof(entry{}); sz > 80 {
		t.Errorf("entry is %d bytes, want ≤ 80", sz)
	}
	if sz := unsafe.Sizeof(islot{}); sz > 16 {
		t.Errorf("index slot is %d bytes, want ≤ 16", sz)
	}
}
