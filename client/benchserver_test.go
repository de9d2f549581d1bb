package client

import (
	"os"
	"sync"
	"testing"
)

// The benchmarks load a lockd in its own process, as in production (an
// in-process server's gnet event loops keep their Ps while they wait in
// epoll_wait, which throttles any client in the same process:
// BENCHMARKS.md). LOCKD_BENCH_ADDR names a running lockd instead.

var (
	benchServerMu sync.Mutex
	benchServer   *lockdProc
)

// benchAddr is the server the benchmarks load: $LOCKD_BENCH_ADDR, or a
// lockd started on first use and stopped by TestMain (stopBenchServer).
func benchAddr(b *testing.B) string {
	if a := os.Getenv("LOCKD_BENCH_ADDR"); a != "" {
		return a
	}
	benchServerMu.Lock()
	defer benchServerMu.Unlock()
	if benchServer == nil {
		benchServer = newServer(b)
	}
	return benchServer.Addr()
}

// stopBenchServer stops the benchmarks' lockd, if one was started.
func stopBenchServer() {
	benchServerMu.Lock()
	defer benchServerMu.Unlock()
	if benchServer != nil {
		_ = benchServer.Close()
		benchServer = nil
	}
}
