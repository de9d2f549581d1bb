package engine_test

import (
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// BenchmarkContended: W waiter connections on H hot keys, each looping
// acquire(wait 5 s) → release. One b.N op is one grant. Reports grants/s
// and the handoff latency p50/p99: from the moment a holder writes its
// release to the moment the next holder of that key reads its A.
func BenchmarkContended(b *testing.B) {
	const waiters, hot = 256, 8
	ts := startServer(b, nil) // LOCKD_BENCH_LOOPS sets the loops
	var (
		grants    atomic.Int64
		relAt     [hot]atomic.Int64 // unix ns of the last release written per key
		mu        sync.Mutex
		handoffs  []time.Duration
		wg        sync.WaitGroup
		stop      atomic.Bool
		target    = int64(b.N)
		startedAt = time.Now()
	)
	b.ResetTimer()
	for i := 0; i < waiters; i++ {
		nc, err := net.Dial("tcp", ts.Addr())
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func(nc net.Conn, k int) {
			defer wg.Done()
			defer nc.Close()
			key := "hot/" + strconv.Itoa(k)
			var out, in []byte
			var r proto.Response
			buf := make([]byte, 4096)
			var local []time.Duration
			owner := uint64(k) << 32
			for !stop.Load() {
				owner++
				out = proto.AppendAcquire(out[:0], 5, 10, owner, key)
				if _, err := nc.Write(out); err != nil {
					return
				}
				got := false
				for !got {
					_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
					n, err := nc.Read(buf)
					if err != nil {
						stop.Store(true)
						break
					}
					in = append(in, buf[:n]...)
					for {
						m, err := proto.ParseResponse(in, &r)
						if err != nil {
							break
						}
						in = in[m:]
						if r.Op == proto.OpAcquire {
							if t0 := relAt[k].Load(); t0 != 0 {
								local = append(local, time.Duration(time.Now().UnixNano()-t0))
							}
							got = true
							if grants.Add(1) >= target {
								stop.Store(true)
							}
							relAt[k].Store(time.Now().UnixNano())
							out = proto.AppendRelease(out[:0], r.Token, key)
							if _, err := nc.Write(out); err != nil {
								return
							}
						} else if r.Op == proto.OpTimeout || r.Op == proto.OpBusy {
							got = true
						}
					}
				}
			}
			mu.Lock()
			handoffs = append(handoffs, local...)
			mu.Unlock()
		}(nc, i%hot)
	}
	wg.Wait()
	el := time.Since(startedAt)
	b.StopTimer()
	sort.Slice(handoffs, func(i, j int) bool { return handoffs[i] < handoffs[j] })
	b.ReportMetric(float64(grants.Load())/el.Seconds(), "grants/s")
	if n := len(handoffs); n > 0 {
		b.ReportMetric(float64(handoffs[n/2].Microseconds()), "handoff-p50-µs")
		b.ReportMetric(float64(handoffs[n*99/100].Microseconds()), "handoff-p99-µs")
	}
}
