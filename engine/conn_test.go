package engine_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
)

func TestDisconnectDropsQueuedWaiters(t *testing.T) {
	ts := startServer(t, nil)
	a, b, c := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("dc", 30, 1)
	b.acquire("dc", 10, 30, 2)
	c.acquire("dc", 10, 30, 3)
	b.send(proto.AppendPing(nil, 0))
	b.expect(proto.OpPing, 0)
	c.send(proto.AppendPing(nil, 0))
	c.expect(proto.OpPing, 0)
	if got := ts.Table().Stats().Waiters; got != 2 {
		t.Fatalf("waiters = %d, want 2", got)
	}
	b.c.Close()
	lockdtest.WaitFor(t, "one waiter", func() bool { return ts.Table().Stats().Waiters == 1 })
	// The release skips the departed waiter and hands to c.
	a.release("dc", tok)
	a.expect(proto.OpRelease, tok)
	g := c.expect(proto.OpAcquire, 3)
	c.c.Close()
	// c's grant was delivered: it stays although c left.
	d := dial(t, ts.Addr())
	d.acquire("dc", 0, 5, 4)
	d.expect(proto.OpTimeout, 4)
	d.release("dc", g.Token)
	d.expect(proto.OpRelease, g.Token)
}

func TestMaxConns(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.MaxConns = 2 })
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	for _, w := range []*wire{a, b} {
		w.send(proto.AppendPing(nil, 1))
		w.expect(proto.OpPing, 1)
	}
	c := dial(t, ts.Addr())
	c.closed(5 * time.Second)
	a.c.Close()
	lockdtest.WaitFor(t, "a connection accepted again below --max-conns", func() bool {
		d, err := net.DialTimeout("tcp", ts.Addr(), time.Second)
		if err != nil {
			return false
		}
		defer d.Close()
		w := &wire{t: t, c: d}
		w.send(proto.AppendPing(nil, 2))
		_, err = w.next(200 * time.Millisecond)
		return err == nil
	})
}

func TestSlowConsumerIsClosed(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.MaxOutbound = 64 << 10 })
	tc, err := net.DialTimeout("tcp", ts.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	_ = tc.(*net.TCPConn).SetReadBuffer(4096)
	var chunk []byte
	for i := 0; i < 6000; i++ {
		chunk = proto.AppendPing(chunk, uint64(i))
	}
	// Never read; keep writing until the server gives up on us. Bounded
	// in bytes (256 MiB) and time (20 s).
	deadline := time.Now().Add(20 * time.Second)
	var sent int
	for sent < 256<<20 && time.Now().Before(deadline) {
		_ = tc.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, err := tc.Write(chunk)
		sent += n
		if err != nil {
			if isTimeout(err) {
				continue // our send buffer is full: the server stopped reading us
			}
			t.Logf("closed after %d MiB sent: %v", sent>>20, err)
			return
		}
	}
	// A closed peer may also show as a read EOF.
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1<<20)
	for {
		_, err := tc.Read(buf)
		if err != nil {
			if isTimeout(err) {
				t.Fatalf("server kept a non-reading client after %d MiB", sent>>20)
			}
			return
		}
	}
}

func TestShutdownSequence(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	tok := a.grant("sd", 60, 1)
	b.acquire("sd", 30, 10, 77)
	b.acquire("sd2", 0, 10, 78)
	b.expect(proto.OpAcquire, 78)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	// The queued acquire is answered E 4 with its owner.
	f := b.expect(proto.OpError, 77)
	if f.ReqOp != proto.OpAcquire || f.Code != proto.CodeShutdown {
		t.Fatalf("queued acquire: %+v", f)
	}
	// New requests: A/R/K answered E 4 (not executed), P answered P.
	a.send(proto.AppendPing(nil, 5))
	a.expect(proto.OpPing, 5)
	a.acquire("new", 0, 10, 6)
	if f := a.expect(proto.OpError, 6); f.Code != proto.CodeShutdown {
		t.Fatalf("A during shutdown: %+v", f)
	}
	a.release("sd", tok)
	if f := a.expect(proto.OpError, tok); f.Code != proto.CodeShutdown || f.ReqOp != proto.OpRelease {
		t.Fatalf("R during shutdown: %+v", f)
	}
	a.renew("sd", 10, tok)
	if f := a.expect(proto.OpError, tok); f.Code != proto.CodeShutdown || f.ReqOp != proto.OpRenew {
		t.Fatalf("K during shutdown: %+v", f)
	}
	start := time.Now()
	a.closed(6 * time.Second)
	b.closed(6 * time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("connections closed after %v", took)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Restart on the same data dir: the held locks come back with the same
	// tokens (the release above was not executed), the next token is larger.
	cfg := ts.cfg
	ts2 := startWith(t, cfg)
	c := dial(t, ts2.Addr())
	c.acquire("sd", 0, 10, 9)
	c.expect(proto.OpTimeout, 9)
	c.acquire("sd2", 0, 10, 10)
	c.expect(proto.OpTimeout, 10)
	nt := c.grant("fresh", 10, 11)
	if nt <= tok {
		t.Fatalf("token after restart %d not above %d", nt, tok)
	}
	c.release("sd", tok)
	c.expect(proto.OpRelease, tok)
	ts2.shutdown()
	// The snapshot was consumed and rewritten: a third start has sd2 and
	// fresh but not sd.
	ts3 := startWith(t, cfg)
	d := dial(t, ts3.Addr())
	d.grant("sd", 10, 12)
	d.acquire("fresh", 0, 10, 13)
	d.expect(proto.OpTimeout, 13)
}

func TestRestartKeepsDeadline(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	granted := time.Now()
	tok := w.grant("dl", 2, 1)
	ts.shutdown()
	ts2 := startWith(t, ts.cfg)
	v := dial(t, ts2.Addr())
	v.acquire("dl", 5, 5, 2)
	g := v.expect(proto.OpAcquire, 2)
	held := time.Since(granted)
	if held < 2*time.Second || held > 3*time.Second {
		t.Fatalf("restored lease ended %v after the grant, want ~2 s", held)
	}
	if g.Token <= tok {
		t.Fatalf("token %d not above %d", g.Token, tok)
	}
}

func TestCrashLosesLocksNotTokens(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	var last uint64
	for i := 0; i < 100; i++ {
		last = w.grant("c"+string(rune('a'+i%26))+string(rune('a'+i/26)), 60, uint64(i))
	}
	_ = ts.Close() // no snapshot
	ts2 := startWith(t, ts.cfg)
	v := dial(t, ts2.Addr())
	tok := v.grant("ca", 5, 1) // lost on crash: free again
	if tok <= last {
		t.Fatalf("token after crash %d not above %d", tok, last)
	}
}
