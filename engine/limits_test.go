package engine_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
)

// holdKeys grants n keys "prefix/i" to w (lease 60 s) in one write.
func holdKeys(w *wire, prefix string, n int) {
	w.t.Helper()
	var req []byte
	for i := range n {
		req = proto.AppendAcquire(req, 0, 60, uint64(i), prefix+"/"+strconv.Itoa(i))
	}
	w.send(req)
	for range n {
		if f, err := w.next(5 * time.Second); err != nil || f.Op != proto.OpAcquire {
			w.t.Fatalf("holding %s keys: %+v %v", prefix, f, err)
		}
	}
}

// TestWaitersPerConnCap, with the defaults: one connection could once queue
// every waiter slot of the server (1,048,576), after which every wait>0
// acquire on a held key, from anyone, got B. Now one connection queues at
// most --max-waiters-per-conn (16,384) and gets B beyond it, and others
// still queue.
func TestWaitersPerConnCap(t *testing.T) {
	ts := startServer(t, nil)
	const (
		keys  = 8     // × 4096 waiters per key: room for more than the cap
		cap   = 16384 // the default --max-waiters-per-conn
		extra = 100
	)
	holder, x, y := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	holdKeys(holder, "held", keys)
	var req []byte
	for i := range cap + extra {
		req = proto.AppendAcquire(req, 60, 10, uint64(1000+i), "held/"+strconv.Itoa(i%keys))
	}
	req = proto.AppendPing(req, 1)
	x.send(req)
	busy := 0
	for {
		f, err := x.next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d B: %v", busy, err)
		}
		if f.Op == proto.OpPing {
			break
		}
		if f.Op != proto.OpBusy {
			t.Fatalf("queued acquire answered %c id=%d", f.Op, f.ID)
		}
		busy++
	}
	if busy != extra {
		t.Fatalf("%d acquires answered B, want %d (the ones beyond the per-connection cap)", busy, extra)
	}
	if n := ts.Table().Stats().Waiters; n != cap {
		t.Fatalf("waiters = %d, want %d", n, cap)
	}
	// Another connection still queues on a held key.
	y.acquire("held/0", 30, 10, 7)
	y.send(proto.AppendPing(nil, 2))
	y.expect(proto.OpPing, 2)
	if n := ts.Table().Stats().Waiters; n != cap+1 {
		t.Fatalf("waiters = %d after another connection's acquire, want %d", n, cap+1)
	}
}

// TestPendingGrantsCap: a connection that does not take its answers pins
// at most --max-pending-grants keys with grants it has not received; its
// further acquires get B, and once it reads, it is granted again.
func TestPendingGrantsCap(t *testing.T) {
	const max = 8
	ts := startServer(t, func(c *engine.Config) {
		c.MaxOutbound = 64 << 20
		c.MaxPendingGrants = max
	})
	nc, err := net.DialTimeout("tcp", ts.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// 10 MB of pongs, more than loopback's socket buffers hold: the grants
	// after them stay in the server's outbound buffer.
	const pings = 1 << 20
	req := bytes.Repeat(proto.AppendPing(nil, 0), pings)
	for i := range 3 * max {
		req = proto.AppendAcquire(req, 0, 30, uint64(100+i), "pin/"+strconv.Itoa(i))
	}
	writeErr := make(chan error, 1)
	go func() {
		_ = nc.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_, err := nc.Write(req)
		writeErr <- err
	}()
	lockdtest.WaitFor(t, "the grants made", func() bool { return ts.Table().Stats().Keys > 0 })
	w := &wire{t: t, c: nc}
	granted, busy := 0, 0
	for granted+busy < 3*max {
		f, err := w.next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d A and %d B: %v", granted, busy, err)
		}
		switch f.Op {
		case proto.OpPing:
		case proto.OpAcquire:
			granted++
		case proto.OpBusy:
			busy++
		default:
			t.Fatalf("answer %c id=%d", f.Op, f.ID)
		}
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	if granted != max || busy != 2*max {
		t.Fatalf("%d granted, %d B; want %d granted, then B", granted, busy, max)
	}
	// Everything read: the connection is granted again.
	w.acquire("pin/after", 0, 30, 1)
	w.expect(proto.OpAcquire, 1)
}

// hugeQueueClose is what closing a connection with n queued acquires does
// to its loop: worst is the worst ping round trip of another connection on
// that loop across the close, dropped how long the waiters took to go, and
// left how many were still queued when that loop answered a ping sent once
// the drop had begun.
type hugeQueueClose struct {
	worst, dropped time.Duration
	left           int
}

func closeHugeQueue(tb testing.TB, n int) hugeQueueClose {
	ts := startServer(tb, func(c *engine.Config) {
		c.Loops = 1 // every connection shares the loop that runs the close
		c.Table.MaxWaiters = n
		c.Table.MaxWaitersPerConn = n
	})
	keys := n / 4096
	holder, x, y := dial(tb, ts.Addr()), dial(tb, ts.Addr()), dial(tb, ts.Addr())
	holdKeys(holder, "q", keys)
	var req []byte
	for i := range n {
		req = proto.AppendAcquire(req, 120, 10, uint64(i), "q/"+strconv.Itoa(i%keys))
	}
	req = proto.AppendPing(req, 1)
	x.send(req)
	x.expect(proto.OpPing, 1) // every acquire before it was queued
	if got := ts.Table().Stats().Waiters; got != n {
		tb.Fatalf("waiters = %d, want %d", got, n)
	}

	// A pinger on the same loop measures its round trips from the close
	// on (after a collection: queueing allocated a million waiters).
	runtime.GC()
	pinger := dial(tb, ts.Addr())
	var (
		r      hugeQueueClose
		closed atomic.Int64 // UnixNano of the close, 0 before
	)
	stop := make(chan struct{})
	pinged := make(chan error, 1)
	go func() {
		ping := proto.AppendPing(nil, 0)
		for {
			select {
			case <-stop:
				pinged <- nil
				return
			default:
			}
			t0 := time.Now()
			if _, err := pinger.c.Write(ping); err != nil {
				pinged <- err
				return
			}
			if _, err := pinger.next(10 * time.Second); err != nil {
				pinged <- err
				return
			}
			if c := closed.Load(); c != 0 && t0.UnixNano() >= c {
				r.worst = max(r.worst, time.Since(t0))
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)

	began := time.Now()
	closed.Store(began.UnixNano())
	x.c.Close()
	lockdtest.WaitFor(tb, "the drop began", func() bool { return ts.Table().Stats().Waiters < n })
	y.send(proto.AppendPing(nil, 2))
	y.expect(proto.OpPing, 2)
	r.left = ts.Table().Stats().Waiters
	deadline := time.Now().Add(20 * time.Second)
	for ts.Table().Stats().Waiters > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	r.dropped = time.Since(began)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	if err := <-pinged; err != nil {
		tb.Fatal(err)
	}
	if got := ts.Table().Stats().Waiters; got != 0 {
		tb.Fatalf("%d waiters left 20 s after the close", got)
	}
	return r
}

// TestCloseWithHugeQueueDoesNotStallLoop: dropping the 1,048,576 waiters
// of a closing connection once stalled its loop (37 ms measured): every
// connection of that loop waited.
// With the caps raised so one connection can queue that many, the loop
// must answer another connection while the closed one's waiters are still
// being dropped. The figures (BenchmarkCloseHugeQueue measures them) are
// logged.
func TestCloseWithHugeQueueDoesNotStallLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: queues a million waiters")
	}
	n := 1 << 20
	if raceEnabled {
		n = 1 << 17
	}
	r := closeHugeQueue(t, n)
	t.Logf("%d waiters: dropped within %v of the close; worst ping round trip on the loop meanwhile %v; %d waiters left when the loop answered",
		n, r.dropped.Round(time.Millisecond), r.worst.Round(10*time.Microsecond), r.left)
	if r.left == 0 {
		t.Fatal("the loop answered only once every waiter was dropped: the close stalled it")
	}
}

// BenchmarkCloseHugeQueue reports what closing a connection with 1,048,576
// queued acquires costs the other connections of its loop: the worst ping
// round trip across the close (stall-µs) and the time until every waiter
// is gone (drop-ms). Run it with -cpu 4 (cores + loops, see DESIGN.md):
// with GOMAXPROCS = cores the in-process pinger's own scheduling dominates.
func BenchmarkCloseHugeQueue(b *testing.B) {
	for range b.N {
		r := closeHugeQueue(b, 1<<20)
		b.ReportMetric(float64(r.worst.Microseconds()), "stall-µs")
		b.ReportMetric(float64(r.dropped.Milliseconds()), "drop-ms")
	}
}

// TestFrameTimeout: a frame that has started but never completes once kept
// its connection forever. A connection whose partial frame is older than
// --frame-timeout is closed, whether it sends nothing more or trickles
// bytes; a connection idle between frames, or one whose frame completes in
// time, stays.
func TestFrameTimeout(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.FrameTimeout = 300 * time.Millisecond })
	frame := proto.AppendAcquire(nil, 0, 10, 1, "partial/key")
	stuck, trickle, idle, slow := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	stuck.send(frame[:len(frame)-1]) // all but the newline
	// 1023 bytes of a frame that never completes, a byte every 50 ms.
	long := append([]byte{byte(proto.OpAcquire), 0, 10, 0, 0, 0, 0, 0, 0, 0, 2}, bytes.Repeat([]byte("k"), 1012)...)
	trickleDone := make(chan struct{})
	go func() {
		defer close(trickleDone)
		for _, c := range long {
			if _, err := trickle.c.Write([]byte{c}); err != nil {
				return // closed by the server
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	// Half a frame, the rest 100 ms later: answered.
	slow.send(frame[:5])
	time.Sleep(100 * time.Millisecond)
	slow.send(frame[5:])
	slow.expect(proto.OpAcquire, 1)

	stuck.closed(5 * time.Second)
	trickle.closed(5 * time.Second)
	<-trickleDone
	time.Sleep(time.Second) // three timeouts, at least one sweep
	for i, w := range []*wire{idle, slow} {
		w.send(proto.AppendPing(nil, uint64(i)))
		w.expect(proto.OpPing, uint64(i))
	}
}

// logBuffer collects JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the records whose msg is msg.
func (l *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(l.b.Bytes(), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestMaxConnsRefusalsLoggedOncePerSecond: every connection refused at
// --max-conns once logged a WARN of its own (10,982 lines in 2 s). Refusals
// are logged at most once a second, with the count refused since the last
// line; no refusal goes uncounted.
func TestMaxConnsRefusalsLoggedOncePerSecond(t *testing.T) {
	var logs logBuffer
	ts := startServer(t, func(c *engine.Config) {
		c.MaxConns = 1
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	first := dial(t, ts.Addr())
	first.send(proto.AppendPing(nil, 1))
	first.expect(proto.OpPing, 1)
	const refused = 200
	began := time.Now()
	for range refused {
		c, err := net.DialTimeout("tcp", ts.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		w := &wire{t: t, c: c}
		w.closed(5 * time.Second)
		c.Close()
	}
	took := time.Since(began)
	const msg = "connections refused: --max-conns reached"
	total := func() int {
		n := 0
		for _, rec := range logs.lines(t, msg) {
			v, _ := rec["refused"].(float64)
			n += int(v)
		}
		return n
	}
	lockdtest.WaitFor(t, "every refusal counted in the log", func() bool { return total() == refused })
	lines := len(logs.lines(t, msg))
	if maxLines := 2 + int(took/time.Second); lines > maxLines {
		t.Fatalf("%d log lines for %d refusals in %v, want at most %d (one a second)", lines, refused, took, maxLines)
	}
	t.Logf("%d refusals in %v: %d log lines", refused, took.Round(time.Millisecond), lines)
}
