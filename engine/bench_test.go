package engine_test

import (
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// BenchmarkPipelinedPairs is the end-to-end figure of issue 2 until bench/
// exists: C connections × D acquires in flight each; every acquire of a
// random key (out of 1M) is followed by the release of its token as soon as
// the grant arrives. One b.N op is one acquire+release pair. It reports
// pairs/s and the acquire round-trip latency p50/p99 (request written →
// grant read).
func BenchmarkPipelinedPairs(b *testing.B) {
	for _, c := range []struct{ conns, depth int }{{16, 32}, {1, 1}} {
		b.Run(strconv.Itoa(c.conns)+"x"+strconv.Itoa(c.depth), func(b *testing.B) {
			benchPairs(b, c.conns, c.depth)
		})
	}
}

func benchPairs(b *testing.B, conns, depth int) {
	ts := startServer(b, func(c *engine.Config) {
		if l, _ := strconv.Atoi(os.Getenv("LOCKD_BENCH_LOOPS")); l > 0 {
			c.Loops = l
		}
	})
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = "bench/key/" + strconv.Itoa(i) // ~16 bytes
	}
	per := b.N/conns + 1
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lats []time.Duration
	)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < conns; i++ {
		nc, err := net.Dial("tcp", ts.Addr())
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func(nc net.Conn, seed uint64) {
			defer wg.Done()
			defer nc.Close()
			l := runConn(b, nc, keys, per, depth, seed)
			mu.Lock()
			lats = append(lats, l...)
			mu.Unlock()
		}(nc, uint64(i))
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		b.ReportMetric(float64(per*conns)/el.Seconds(), "pairs/s")
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
	}
}

// runConn drives one connection: keeps depth acquires in flight, answers
// each grant with its release, until n pairs are done. Latencies are
// sampled (1 in 16) to keep the slice small.
func runConn(b *testing.B, nc net.Conn, keys []string, n, depth int, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, 7))
	sent := make(map[uint64]time.Time, depth)
	var out, in []byte
	var owner uint64
	var lats []time.Duration
	inflight, done, issued := 0, 0, 0
	var resp proto.Response
	buf := make([]byte, 64<<10)
	for done < n {
		out = out[:0]
		for inflight < depth && issued < n {
			owner++
			out = proto.AppendAcquire(out, 0, 30, owner, keys[rng.IntN(len(keys))])
			if owner%16 == 0 {
				sent[owner] = time.Now()
			}
			inflight++
			issued++
		}
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				b.Error(err)
				return lats
			}
		}
		m, err := nc.Read(buf)
		if err != nil {
			b.Error(err)
			return lats
		}
		in = append(in, buf[:m]...)
		out = out[:0]
		for {
			k, err := proto.ParseResponse(in, &resp)
			if err != nil {
				break
			}
			switch resp.Op {
			case proto.OpAcquire:
				if t0, ok := sent[resp.ID]; ok {
					lats = append(lats, time.Since(t0))
					delete(sent, resp.ID)
				}
				// The acquire's slot now carries its release.
				out = proto.AppendRelease(out, resp.Token, resp.Tail)
			case proto.OpTimeout, proto.OpBusy:
				delete(sent, resp.ID)
				inflight--
				done++
			case proto.OpRelease, proto.OpNotHeld:
				inflight--
				done++
			}
			in = in[k:]
		}
		in = append(in[:0], in...)
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				b.Error(err)
				return lats
			}
		}
	}
	return lats
}
