package engine

import (
	"encoding/binary"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
)

// The request path without the network: each parallel goroutine plays an
// event loop with sessions of its own on a fake wire, and runs batches
// through handler.traffic as OnTraffic does (b.RunParallel; run with -cpu
// 1,2,4,8). The goroutines share nothing but the Server: what rises with
// -cpu is state that every batch or request writes.

// benchWire is a connection whose inbound bytes the benchmark sets and
// whose answers it reads back: Write keeps the last batch's answers.
type benchWire struct {
	in    []byte
	off   int
	got   []byte
	wakes int
}

func (w *benchWire) Peek(int) ([]byte, error)      { return w.in[w.off:], nil }
func (w *benchWire) Discard(n int) (int, error)    { w.off += n; return n, nil }
func (w *benchWire) Write(b []byte) (int, error)   { w.got = append(w.got[:0], b...); return len(b), nil }
func (w *benchWire) OutboundBuffered() int         { return 0 }
func (w *benchWire) Wake(gnet.AsyncCallback) error { w.wakes++; return nil }
func (w *benchWire) Close() error                  { return nil }
func (w *benchWire) RemoteAddr() net.Addr          { return &net.TCPAddr{} }

// feed sets the next batch's inbound bytes.
func (w *benchWire) feed(b []byte) { w.in, w.off = b, 0 }

// benchServer is a Server that never serves: its table and node, and a
// handler to run batches through.
func benchServer(b *testing.B) (*Server, *handler) {
	s, err := New(Config{DataDir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.closeNode(repl.Discard) })
	h := &handler{s: s}
	h.OnBoot(gnet.Engine{})
	return s, h
}

// benchLoop is what one parallel goroutine owns: its loop's counters and
// its sessions.
type benchLoop struct{ st *loopStats }

func newBenchLoop(s *Server) *benchLoop {
	st := s.newLoopStats()
	s.loops.Store(st, st)
	return &benchLoop{st: st}
}

func (l *benchLoop) session(h *handler) (*session, *benchWire) {
	w := &benchWire{}
	return h.open(w, nil, l.st, ""), w
}

// tokens reads the tokens of the A frames in answers (each frame A, owner,
// token, key, 0x0A), appending them to dst.
func tokens(tb testing.TB, dst []uint64, answers []byte) []uint64 {
	var r proto.Response
	for len(answers) > 0 {
		n, err := proto.ParseResponse(answers, &r)
		if err != nil {
			tb.Fatalf("answer %q: %v", answers, err)
		}
		if r.Op != proto.OpAcquire {
			tb.Fatalf("answer %q, want A", answers[:n])
		}
		dst = append(dst, r.Token)
		answers = answers[n:]
	}
	return dst
}

// BenchmarkRequestPath runs batches of acquire and release requests:
// pairs8 is one batch of 8 acquires of keys the goroutine alone uses, then
// one batch of their 8 releases (one op: 8 pairs, 16 requests, 2
// batches); handoff is one key per goroutine passed between its two
// sessions: each release hands it to the other session's queued acquire
// (mail and a wake-up), whose batch takes the grant, queues again and
// releases (one op: one handoff, 2 batches).
func BenchmarkRequestPath(b *testing.B) {
	b.Run("pairs8", func(b *testing.B) {
		s, h := benchServer(b)
		var g atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			l := newBenchLoop(s)
			ss, w := l.session(h)
			id := int(g.Add(1))
			const depth, nkeys = 8, 1024
			var acq [nkeys / depth][]byte
			for i := range acq {
				for k := range depth {
					key := "bench/" + strconv.Itoa(id) + "/" + strconv.Itoa(i*depth+k)
					acq[i] = proto.AppendAcquire(acq[i], 0, 30, uint64(k), []byte(key))
				}
			}
			var rel []byte
			var toks []uint64
			var r proto.Request
			for i := 0; pb.Next(); i++ {
				req := acq[i%len(acq)]
				w.feed(req)
				h.traffic(ss)
				toks = tokens(b, toks[:0], w.got)
				rel = rel[:0]
				for k, n := 0, 0; n < len(req); k++ {
					m, _ := proto.ParseRequest(req[n:], 1024, &r)
					rel = proto.AppendRelease(rel, toks[k], r.Key)
					n += m
				}
				w.feed(rel)
				h.traffic(ss)
			}
		})
	})
	b.Run("handoff", func(b *testing.B) {
		s, h := benchServer(b)
		var g atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			l := newBenchLoop(s)
			key := []byte("bench/hot/" + strconv.Itoa(int(g.Add(1))))
			var ss [2]*session
			var w [2]*benchWire
			for i := range ss {
				ss[i], w[i] = l.session(h)
			}
			// Session 0 holds the key, session 1 waits for it.
			var buf, relb []byte
			w[0].feed(proto.AppendAcquire(nil, 0, 30, 1, key))
			h.traffic(ss[0])
			tok := binary.BigEndian.Uint64(w[0].got[9:17])
			w[1].feed(proto.AppendAcquire(nil, 5, 30, 2, key))
			h.traffic(ss[1])
			cur := 0
			for pb.Next() {
				// The holder releases: the key goes to the other session's
				// waiter, by mail. The holder queues again in the same batch.
				relb = proto.AppendRelease(relb[:0], tok, key)
				buf = proto.AppendAcquire(append(buf[:0], relb...), 5, 30, 1, key)
				w[cur].feed(buf)
				h.traffic(ss[cur])
				cur ^= 1
				w[cur].feed(nil)
				h.traffic(ss[cur]) // takes the mail: the grant
				tok = binary.BigEndian.Uint64(w[cur].got[9:17])
			}
		})
	})
}
