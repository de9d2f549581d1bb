package engine

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// fakeConn is the part of gnet.Conn the delivery code uses.
type fakeConn struct {
	gnet.Conn
	ctx      any
	wakes    int
	buffered int
}

func (f *fakeConn) Wake(gnet.AsyncCallback) error { f.wakes++; return nil }
func (f *fakeConn) Context() any                  { return f.ctx }
func (f *fakeConn) OutboundBuffered() int         { return f.buffered }
func (f *fakeConn) Flush() error                  { return nil }
func (f *fakeConn) Fd() int                       { return -1 }

func newTestServer(t *testing.T) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stopReserver(); s.dir.Close() })
	return s
}

func newSession(s *Server) (*session, *fakeConn) {
	fc := &fakeConn{}
	ss := &session{c: fc}
	ss.tconn = shard.NewConn(ss)
	fc.ctx = ss
	return ss, fc
}

// A grant made for a connection that is already closed is released at once
// and the key moves on to the next waiter (PROTOCOL.md §4).
func TestGrantToClosedConnectionMovesOn(t *testing.T) {
	s := newTestServer(t)
	holder, _ := newSession(s)
	gone, _ := newSession(s)
	next, nextConn := newSession(s)
	var fx shard.Out
	now := s.now()
	st, t1 := s.table.Acquire(now, []byte("k"), 0, 30, 1, holder.tconn, &fx)
	if st != shard.Granted {
		t.Fatalf("acquire: %v", st)
	}
	if st, _ := s.table.Acquire(now, []byte("k"), 10, 30, 2, gone.tconn, &fx); st != shard.Queued {
		t.Fatalf("gone: %v", st)
	}
	if st, _ := s.table.Acquire(now, []byte("k"), 10, 30, 3, next.tconn, &fx); st != shard.Queued {
		t.Fatalf("next: %v", st)
	}
	gone.closed = true // closed after queueing, before its DropConn

	b := s.getScratch()
	if !s.table.Release(now, []byte("k"), t1, &b.fx) {
		t.Fatal("release failed")
	}
	s.deliver(b, nil, now)
	s.putScratch(b)

	if nextConn.wakes != 1 {
		t.Fatalf("next woken %d times", nextConn.wakes)
	}
	var r proto.Response
	if _, err := proto.ParseResponse(next.mbox, &r); err != nil || r.Op != proto.OpAcquire || r.ID != 3 {
		t.Fatalf("next's mail %q: %v %+v", next.mbox, err, r)
	}
	info := s.table.Lookup([]byte("k"))
	if !info.Held || info.Token != r.Token || r.Token <= t1 {
		t.Fatalf("key state %+v, grant token %d, first token %d", info, r.Token, t1)
	}
}

// OnClose releases grants still in the mailbox and grants gnet had not
// handed to the socket, but keeps grants that were delivered.
func TestOnCloseReleasesUndeliveredGrants(t *testing.T) {
	s := newTestServer(t)
	h := &handler{s: s}
	ss, fc := newSession(s)
	s.addSession(ss)
	s.conns.Add(1)
	var fx shard.Out
	now := s.now()
	grant := func(key string) uint64 {
		st, tok := s.table.Acquire(now, []byte(key), 0, 30, 1, ss.tconn, &fx)
		if st != shard.Granted {
			t.Fatalf("acquire %s: %v", key, st)
		}
		return tok
	}
	delivered, buffered, mailed := grant("delivered"), grant("buffered"), grant("mailed")

	// One write carrying two grants, of which gnet kept the second.
	b := s.getScratch()
	b.out = appendGrant(b.out, &b.grants, 1, delivered, []byte("delivered"))
	b.out = appendGrant(b.out, &b.grants, 1, buffered, []byte("buffered"))
	fc.buffered = len(b.out) - len(proto.AppendAcquired(nil, 1, delivered, "delivered"))
	ss.afterWrite(b)
	s.putScratch(b)
	if len(ss.pend) != 1 {
		t.Fatalf("pending grants %d, want 1", len(ss.pend))
	}
	// One grant posted but never written.
	e := shard.Effect{Kind: shard.EffectGrant, Conn: ss.tconn, Owner: 1, Token: mailed, Key: []byte("mailed")}
	if ok, _ := ss.post(&e, false); !ok {
		t.Fatal("post failed")
	}

	h.OnClose(fc, nil)

	for key, want := range map[string]bool{"delivered": true, "buffered": false, "mailed": false} {
		if got := s.table.Lookup([]byte(key)).Held; got != want {
			t.Errorf("%s held = %v, want %v", key, got, want)
		}
	}
	if n := s.conns.Load(); n != 0 {
		t.Errorf("conns = %d after close", n)
	}
}

// Tokens beyond the first reserved block are handed out only after the
// reserver has durably raised the mark: the mark on disk never falls behind
// the last token, so a crash cannot make tokens go back.
func TestTokenReservationStaysAhead(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.TokenBlock = 8
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.stopReserver(); s.dir.Close() }()
	first := s.tokens.Limit() - cfg.TokenBlock // the start
	done := make(chan error, 1)
	go func() {
		var out shard.Out
		for i := 0; i < 200; i++ {
			key := []byte("k" + strconv.Itoa(i))
			if st, tok := s.table.Acquire(s.now(), key, 0, 30, 1, nil, &out); st != shard.Granted {
				done <- fmt.Errorf("acquire %d: %v", i, st)
				return
			} else if mark, err := s.dir.Mark(); err != nil || mark < tok {
				done <- fmt.Errorf("token %d handed out above the durable mark %d (%v)", tok, mark, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("grants stalled: the reserver did not extend the token range")
	}
	if got := s.tokens.Last() - first; got != 200 {
		t.Fatalf("%d tokens issued, want 200", got)
	}
}

// BenchmarkOnCloseHugeQueue measures how long OnClose holds its event loop
// (loop-ms: no other connection of that loop is served meanwhile) for a
// connection with 1,048,576 queued acquires, and how long until they are
// all gone (drop-ms).
func BenchmarkOnCloseHugeQueue(b *testing.B) {
	const n = 1 << 20
	for range b.N {
		b.StopTimer()
		cfg := DefaultConfig()
		cfg.DataDir = b.TempDir()
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.Table.MaxWaiters, cfg.Table.MaxWaitersPerConn = n, n
		s, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		h := &handler{s: s}
		holder, _ := newSession(s)
		ss, fc := newSession(s)
		s.addSession(ss)
		s.conns.Add(1)
		var fx shard.Out
		now := s.now()
		keys := make([][]byte, n/4096)
		for i := range keys {
			keys[i] = []byte("q/" + strconv.Itoa(i))
			s.table.Acquire(now, keys[i], 0, 60, 0, holder.tconn, &fx)
		}
		for i := range n {
			if st, _ := s.table.Acquire(now, keys[i%len(keys)], 120, 10, uint64(i), ss.tconn, &fx); st != shard.Queued {
				b.Fatalf("acquire %d: %v", i, st)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		h.OnClose(fc, nil)
		loop := time.Since(t0)
		h.OnShutdown(gnet.Engine{}) // waits for the drop
		dropped := time.Since(t0)
		b.StopTimer()
		if w := s.table.Stats().Waiters; w != 0 {
			b.Fatalf("%d waiters left", w)
		}
		b.ReportMetric(float64(loop.Microseconds())/1000, "loop-ms")
		b.ReportMetric(float64(dropped.Microseconds())/1000, "drop-ms")
		s.stopReserver()
		s.dir.Close()
	}
}
