package main

import (
	"strings"
	"testing"
)

func TestHeldKey(t *testing.T) {
	for _, i := range []int{0, 7, 1234567, maxHeld - 1} {
		k := appendHeldKey(nil, i)
		if len(k) != heldKeyLen || !strings.HasPrefix(string(k), "held/") {
			t.Errorf("key of %d: %q, want %d bytes", i, k, heldKeyLen)
		}
	}
	if a, b := appendHeldKey(nil, 12), appendHeldKey(nil, 120); string(a) == string(b) {
		t.Errorf("keys of 12 and 120 are both %q", a)
	}
}

// TestHeldWorkload: the held workload holds every key at once, reads the
// server's memory then, and releases every key, so a second run holds them
// all again (none refused as still held).
func TestHeldWorkload(t *testing.T) {
	tg := openTest(t, "lockd")
	cfg := smallConfig()
	cfg.Held = 3000
	for round := range 2 {
		r := run1(t, tg, wlHeld, cfg)
		checkClean(t, r)
		if r.Ops != int64(cfg.Held) || r.Refused != 0 {
			t.Fatalf("round %d: %d of %d locks held, %d refused", round, r.Ops, cfg.Held, r.Refused)
		}
		if r.MemPerLock == nil || r.MemHeld == nil || r.MemHeld.Heap <= 0 || r.MemHeld.RSS <= 0 {
			t.Fatalf("round %d: memory not measured: per lock %v, held %v", round, r.MemPerLock, r.MemHeld)
		}
	}
	ss := summarize([]*Result{run1(t, tg, wlHeld, cfg)})
	if _, rows := tableRows(ss); len(rows) != 1 || rows[0][12] == "" || rows[0][13] == "" {
		t.Fatalf("table rows %q: no memory columns", rows)
	}
}
