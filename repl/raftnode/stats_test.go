package raftnode

import (
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
)

// TestCommitHistogram: each commit latency lands in the first bucket whose
// bound it does not exceed (bounds inclusive, as Prometheus's le), one
// above every bound in the last; the sum is exact to the nanosecond.
func TestCommitHistogram(t *testing.T) {
	var s raftStats
	in := []time.Duration{50 * time.Microsecond, 100 * time.Microsecond, 101 * time.Microsecond,
		3 * time.Millisecond, 10 * time.Second, 11 * time.Second}
	var sum time.Duration
	for _, d := range in {
		s.addLatency(d)
		sum += d
	}
	var st repl.RaftStatus
	s.histogram(&st)
	want := map[int]uint64{0: 2, 1: 1, 5: 1, len(repl.CommitBuckets) - 1: 1, len(repl.CommitBuckets): 1}
	for i, n := range st.CommitCounts {
		if n != want[i] {
			t.Errorf("bucket %d (le %v): %d, want %d", i, bound(i), n, want[i])
		}
	}
	if got := time.Duration(st.CommitSum * 1e9); got != sum {
		t.Fatalf("sum %s, want %s", got, sum)
	}
}

func bound(i int) any {
	if i < len(repl.CommitBuckets) {
		return repl.CommitBuckets[i]
	}
	return "+Inf"
}
