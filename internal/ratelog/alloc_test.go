//go:build !race

package ratelog

import "testing"

// TestAtomicAllocs: the engine calls Atomic on its event loops, where a
// refusal must cost no allocation.
func TestAtomicAllocs(t *testing.T) {
	var a Atomic
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() {
		now += ms
		a.Allow(now)
		a.Flush(now)
	}); n != 0 {
		t.Fatalf("Atomic.Allow and Flush: %v allocations per call, want 0", n)
	}
}
