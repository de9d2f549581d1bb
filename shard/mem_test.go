package shard

import (
	"math"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

const (
	millionLocks = 1_000_000
	maxHeapMB    = 80 // budget for a million held locks with 16-byte keys (69 MB measured)
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
// checks the heap it takes (≤ 80 MB), then releases them all and checks the
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
	// What may remain: each shard's first chunk of entries.
	if limit := int64(len(tab.shards)*chunkLen*int(unsafe.Sizeof(entry{}))) + 1e6; left > limit {
		t.Errorf("heap %.1f MB above the empty table after releasing every lock, want ≤ %.1f MB",
			float64(left)/1e6, float64(limit)/1e6)
	}
	runtime.KeepAlive(tab)
	runtime.KeepAlive(toks)
}

// TestEntrySize keeps the per-lock struct at 48 bytes (a million held locks
// means a million entries) with room for a 16-byte key inline, the chunk a
// Go size class, and the index slot at 8 bytes.
func TestEntrySize(t *testing.T) {
	if sz := unsafe.Sizeof(entry{}); sz > 48 {
		t.Errorf("entry is %d bytes, want ≤ 48", sz)
	}
	if inlineKey < 16 {
		t.Errorf("keys of %d bytes are inline, want 16 at least", inlineKey)
	}
	if sz := unsafe.Sizeof([chunkLen]entry{}); sz != 24576 {
		t.Errorf("a chunk is %d bytes, want 24576 (a size class)", sz)
	}
	if maxIdents-1 > math.MaxUint16 {
		t.Errorf("identity handles up to %d do not fit the entry's 16 bits", maxIdents-1)
	}
	if sz := unsafe.Sizeof(islot{}); sz > 8 {
		t.Errorf("index slot is %d bytes, want ≤ 8", sz)
	}
	// The GC never scans what holds no pointer: entries, index slots and
	// the wheel's lease heads.
	for _, v := range []any{entry{}, islot{}, ref(0)} {
		if p := pointerField(reflect.TypeOf(v)); p != "" {
			t.Errorf("%T holds a pointer (%s): the GC would scan every held lock", v, p)
		}
	}
}

// pointerField names a field of t that is or holds a pointer ("" if none).
func pointerField(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if p := pointerField(t.Field(i).Type); p != "" {
				return t.Field(i).Name + "." + p
			}
		}
		return ""
	case reflect.Array:
		return pointerField(t.Elem())
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return ""
	}
	return t.Kind().String()
}

// TestMemorySharedHolders measures what a shared key's further holders
// cost: 1000 keys of limit 100, each with 100 holders (99,000 holder
// entries: a 48-byte entry and a holder-index slot each), within a budget
// of 100 bytes a holder; and that the memory comes back once they leave.
func TestMemorySharedHolders(t *testing.T) {
	const keys, limit = 1000, 100
	tab, err := New(Config{}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	empty := heapAlloc()
	var buf [16]byte
	var out Out
	toks := make([]uint64, 0, keys*limit)
	for i := range keys {
		key := key16(&buf, i)
		for range limit {
			st, tok := tab.AcquireShared(0, key, 0, 255, 0, limit, NoIdent, nil, &out)
			if st != Granted {
				t.Fatalf("key %d: %v", i, st)
			}
			toks = append(toks, tok)
		}
	}
	full := heapAlloc()
	extra := keys * (limit - 1)
	used := float64(full) - float64(empty) - float64(cap(toks)*8) - float64(keys)*(48+16) // the keys themselves, as exclusive ones
	perHolder := used / float64(extra)
	t.Logf("%d further holders of %d shared keys: %.1f MB, %.0f bytes a holder (with each key's queue)", extra, keys, used/1e6, perHolder)
	if perHolder > 100 {
		t.Errorf("a further holder costs %.0f bytes, want ≤ 100", perHolder)
	}
	if st := tab.Stats(); st.Keys != keys || st.Holders != extra {
		t.Fatalf("stats %+v", st)
	}
	for i := range keys {
		key := key16(&buf, i)
		for j := range limit {
			if !tab.Release(0, key, toks[i*limit+j], &out) {
				t.Fatalf("release %d/%d", i, j)
			}
		}
	}
	toks = nil
	left := int64(heapAlloc()) - int64(empty)
	if limit := int64(len(tab.shards)*chunkLen*int(unsafe.Sizeof(entry{}))) + 1e6; left > limit {
		t.Errorf("heap %.1f MB above the empty table after every holder left, want ≤ %.1f MB", float64(left)/1e6, float64(limit)/1e6)
	}
	runtime.KeepAlive(tab)
	runtime.KeepAlive(toks)
}
