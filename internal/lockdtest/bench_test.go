package lockdtest_test

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// The raw generator's reference figures for the client library's
// benchmarks (client/bench_test.go; make bench-client runs both): Pipelined
// against a lockd in a process of its own, as the client's benchmarks load
// one. They live here, not beside the client's, because the client
// module's tests import nothing of this module: client/go.mod would carry
// the server's dependencies to every program that imports the client.

func TestMain(m *testing.M) {
	// A server under the race detector is not what the figures compare:
	// the binary is built without it unless LOCKD_RACE says otherwise.
	if os.Getenv("LOCKD_RACE") == "" {
		os.Setenv("LOCKD_RACE", "0")
	}
	code := m.Run()
	raw.mu.Lock()
	if raw.c != nil {
		if err := raw.c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "the benchmarks' lockd:", err)
		}
	}
	raw.mu.Unlock()
	clustertest.RemoveBuild()
	os.Exit(code)
}

var rawKeys = lockdtest.Keys(1 << 16)

var raw struct {
	mu sync.Mutex
	c  *clustertest.Cluster // started on first use, closed by TestMain
}

// rawAddr is the lockd the benchmarks load: $LOCKD_BENCH_ADDR, or one lockd
// process for all of them ($LOCKD_BIN, or cmd/lockd built).
func rawAddr(b *testing.B) string {
	if a := os.Getenv("LOCKD_BENCH_ADDR"); a != "" {
		return a
	}
	raw.mu.Lock()
	defer raw.mu.Unlock()
	if raw.c == nil {
		c, err := clustertest.New(clustertest.Options{Mode: clustertest.ModeSingle, Members: 1})
		if err != nil {
			b.Fatal(err)
		}
		raw.c = c
	}
	return raw.c.Member(0).Addr()
}

// BenchmarkRawPipelined is the client benchmarks' reference: the raw load
// generator on 16 connections × 32 acquires in flight, each grant answered
// by its release at once; reports pairs/s.
func BenchmarkRawPipelined(b *testing.B) {
	benchRaw(b, 16, 32)
}

// BenchmarkRawPipelined2x32 is the raw generator at the client
// benchmark's concurrency: 2 connections (the client's default for one
// address) × 32 in flight = 64.
func BenchmarkRawPipelined2x32(b *testing.B) {
	benchRaw(b, 2, 32)
}

func benchRaw(b *testing.B, conns, depth int) {
	addr := rawAddr(b)
	b.ResetTimer()
	r, err := lockdtest.Pipelined(addr, rawKeys, conns, depth, b.N, 5)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.PairsPerSec, "pairs/s")
}
