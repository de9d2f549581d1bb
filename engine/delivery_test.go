package engine

import (
	"io"
	"log/slog"
	"testing"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
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
	t.Cleanup(func() { _ = s.closeNode(repl.Discard) })
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
	if _, err := proto.ParseResponse(next.mbox.out, &r); err != nil || r.Op != proto.OpAcquire || r.ID != 3 {
		t.Fatalf("next's mail %q: %v %+v", next.mbox.out, err, r)
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
	b.addGrant(1, delivered, []byte("delivered"))
	b.addGrant(1, buffered, []byte("buffered"))
	fc.buffered = len(b.out) - len(proto.AppendAcquired(nil, 1, delivered, "delivered"))
	ss.afterWrite(b)
	s.putScratch(b)
	if len(ss.pend) != 1 {
		t.Fatalf("pending grants %d, want 1", len(ss.pend))
	}
	// One grant posted but never written.
	e := shard.Effect{Kind: shard.EffectGrant, Conn: ss.tconn, Owner: 1, Token: mailed, Key: []byte("mailed")}
	if ok, _ := ss.post(&e, false, "", 0); !ok {
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
