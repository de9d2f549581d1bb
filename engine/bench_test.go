package engine_test

import (
	"strconv"
	"testing"

	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// BenchmarkPipelinedPairs is the engine's end-to-end figure from its own
// tests (go test -bench), without the bench command: C connections × D
// acquires in flight each; every acquire of a random key (out of 1M) is
// followed by the release of its token as soon as the grant arrives. One b.N
// op is one acquire+release pair. It reports pairs/s and the acquire
// round-trip latency p50/p99 (request written → grant read).
func BenchmarkPipelinedPairs(b *testing.B) {
	for _, c := range []struct{ conns, depth int }{{16, 32}, {1, 1}} {
		b.Run(strconv.Itoa(c.conns)+"x"+strconv.Itoa(c.depth), func(b *testing.B) {
			benchPairs(b, c.conns, c.depth)
		})
	}
}

func benchPairs(b *testing.B, conns, depth int) {
	ts := startServer(b, nil) // LOCKD_BENCH_LOOPS sets the loops
	keys := lockdtest.Keys(1 << 20)
	b.ResetTimer()
	r, err := lockdtest.Pipelined(ts.Addr(), keys, conns, depth, b.N, 0)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.PairsPerSec, "pairs/s")
	b.ReportMetric(float64(r.Quantile(0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(r.Quantile(0.99).Microseconds()), "p99-µs")
}
