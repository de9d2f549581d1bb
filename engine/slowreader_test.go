package engine_test

import (
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// slowReader is a hostile client: it keeps depth acquires in flight,
// answering each grant it reads with the grant's release and the next
// acquire in one write, but reads only 64 KB per millisecond, so the
// server's answers (grants among them) never all reach its socket.
type slowReader struct {
	c     net.Conn
	keys  []string
	depth int
	next  int // next key
	owner uint64
	in    []byte
	out   []byte
	pairs int // releases answered
}

func newSlowReader(t testing.TB, addr string, id, depth, keyLen int) *slowReader {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.(*net.TCPConn).SetReadBuffer(32 << 10)
	r := &slowReader{c: c, depth: depth}
	pad := strings.Repeat("x", keyLen)
	for i := range 2 * depth {
		k := "slow/" + strconv.Itoa(id) + "/" + strconv.Itoa(i) + "/"
		r.keys = append(r.keys, k+pad[len(k):])
	}
	return r
}

// run drives the pattern until d has passed or stop returns true (checked
// every 100 ms).
func (r *slowReader) run(d time.Duration, stop func() bool) error {
	for range r.depth {
		r.acquire()
	}
	buf := make([]byte, 64<<10)
	end := time.Now().Add(d)
	nextCheck := time.Now().Add(100 * time.Millisecond)
	for now := time.Now(); now.Before(end); now = time.Now() {
		if now.After(nextCheck) {
			nextCheck = now.Add(100 * time.Millisecond)
			if stop != nil && stop() {
				return nil
			}
		}
		if len(r.out) > 0 {
			_ = r.c.SetWriteDeadline(now.Add(5 * time.Second))
			if _, err := r.c.Write(r.out); err != nil {
				return err
			}
			r.out = r.out[:0]
		}
		_ = r.c.SetReadDeadline(now.Add(50 * time.Millisecond))
		n, err := r.c.Read(buf) // at most 64 KB ...
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			return err
		}
		r.in = append(r.in, buf[:n]...)
		r.answer()
		time.Sleep(time.Millisecond) // ... per millisecond
	}
	return nil
}

func (r *slowReader) acquire() {
	r.owner++
	r.out = proto.AppendAcquire(r.out, 0, 30, r.owner, r.keys[r.next])
	r.next = (r.next + 1) % len(r.keys)
}

// answer parses what was read: a grant is released at once; a release's
// answer frees its slot for the next acquire.
func (r *slowReader) answer() {
	var resp proto.Response
	off := 0
	for {
		n, err := proto.ParseResponse(r.in[off:], &resp)
		if err != nil {
			break
		}
		off += n
		switch resp.Op {
		case proto.OpAcquire: // its release and the next acquire, together
			r.out = proto.AppendRelease(r.out, resp.Token, resp.Tail)
			r.acquire()
		case proto.OpRelease:
			r.pairs++
		case proto.OpTimeout, proto.OpBusy: // the slot is free again
			r.acquire()
		}
	}
	r.in = append(r.in[:0], r.in[off:]...)
}

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// slowOutbound and slowDepth make the slow-reader pattern keep gnet's
// outbound buffer non-empty on this machine's loopback (whose send buffers
// grow to 4 MB) without passing --max-outbound: 4096 grants of 1000-byte
// keys in flight, each answered by its release and the next acquire, are
// about 8 MB of answers between the server and the client.
const (
	slowOutbound = 16 << 20
	slowDepth    = 4096
	slowKey      = 1000
)

// TestSlowReaderMemoryBounded: a client pipelining acquire/release pairs and
// reading 64 KB/ms once drove the server from 13 MB to 1 GB in 60 s, because
// the key of every grant that gnet had to buffer was appended to the
// session's pkeys, which prune never cut. The old code grows here by about
// the rate the client reads (20 MB/s and more); the server's memory for the
// connection must stay bounded (DESIGN.md, "Limits against hostile peers").
func TestSlowReaderMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a 6 s load")
	}
	ts := startServer(t, func(c *engine.Config) { c.MaxOutbound = slowOutbound })
	r := newSlowReader(t, ts.Addr(), 0, slowDepth, slowKey)
	const bound = 64 << 20
	base := heapInUse()
	var peak uint64
	grew := func() bool {
		if h := heapInUse(); h > base && h-base > peak {
			peak = h - base
		}
		return peak > bound
	}
	if err := r.run(6*time.Second, grew); err != nil {
		t.Fatalf("slow reader after %d pairs: %v", r.pairs, err)
	}
	grew()
	t.Logf("%d pairs; peak heap growth %.1f MB", r.pairs, float64(peak)/(1<<20))
	if peak > bound {
		t.Fatalf("heap grew by %.0f MB under one slow reader (%d pairs), bound %d MB", float64(peak)/(1<<20), r.pairs, bound>>20)
	}
	if r.pairs == 0 {
		t.Fatal("no pair completed: the pattern did not run")
	}
}

// BenchmarkSlowReaderMemory reports the server's heap for one connection
// under the test's slow-reader pattern for 5 s, sampled every 100 ms after
// a collection (peak-B/conn) and at the end with the connection still open
// (heap-B/conn), and the pairs done: the figure to compare before and
// after a change to the delivery tracking of grants.
func BenchmarkSlowReaderMemory(b *testing.B) {
	for range b.N {
		ts := startServer(b, func(c *engine.Config) { c.MaxOutbound = slowOutbound })
		r := newSlowReader(b, ts.Addr(), 0, slowDepth, slowKey)
		base := heapInUse()
		var peak uint64
		sample := func() bool {
			if h := heapInUse(); h > base {
				peak = max(peak, h-base)
			}
			return false
		}
		if err := r.run(5*time.Second, sample); err != nil {
			b.Fatal(err)
		}
		end := heapInUse()
		b.ReportMetric(float64(end-min(end, base)), "heap-B/conn")
		b.ReportMetric(float64(peak), "peak-B/conn")
		b.ReportMetric(float64(r.pairs), "pairs")
		r.c.Close()
		ts.shutdown()
	}
}
