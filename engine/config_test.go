package engine

import (
	"runtime"
	"strconv"
	"testing"
)

// TestDefaultLoops: one loop per processor from three processors on, one
// on two or fewer; DefaultConfig follows GOMAXPROCS.
func TestDefaultLoops(t *testing.T) {
	for _, tc := range []struct{ procs, want int }{{1, 1}, {2, 1}, {3, 3}, {4, 4}, {16, 16}} {
		t.Run(strconv.Itoa(tc.procs), func(t *testing.T) {
			if got := DefaultLoops(tc.procs); got != tc.want {
				t.Fatalf("DefaultLoops(%d) = %d, want %d", tc.procs, got, tc.want)
			}
		})
	}
	if got, want := DefaultConfig().Loops, DefaultLoops(runtime.GOMAXPROCS(0)); got != want {
		t.Fatalf("DefaultConfig().Loops = %d with GOMAXPROCS %d, want %d", got, runtime.GOMAXPROCS(0), want)
	}
}
