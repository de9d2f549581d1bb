package engine_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
)

// rawTLS dials a TLS connection and finishes its handshake.
func rawTLS(t testing.TB, addr string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	return rawTLSBuf(t, addr, cfg, 0)
}

// rawTLSBuf is rawTLS with a socket receive buffer of rcvbuf bytes (0: the
// default), set before the connection is made: a client that will not
// read then leaves little for the kernel to hold. (Shrunk after the
// window scale was agreed, the kernel would drop segments the window
// allowed, and a closed server socket's retransmissions back off for many
// seconds.)
func rawTLSBuf(t testing.TB, addr string, cfg *tls.Config, rcvbuf int) *tls.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			return errors.Join(err, serr)
		}
	}
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, cfg)
	t.Cleanup(func() { raw.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Time{})
	return c
}

// TestTLSNoPhantomGrant is TestNoPhantomGrantAfterHalfClose over TLS: a
// client with megabytes of unread answers has a handoff grant queued behind
// them, then ends its side (close_notify, or a bad frame the server answers
// E 1 and closes on) and reads to the end. A grant whose TLS record had not
// wholly reached the kernel is released and handed to the next waiter; one
// the client did receive must still be held by it. Never both. The last
// rounds have a backlog small enough for the kernel's buffers, so that the
// grant is delivered there. Rounds alternate TLS 1.3 and 1.2.
func TestTLSNoPhantomGrant(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.MaxOutbound = 64 << 20 })
	const (
		rounds = 6
		many   = 600_000 // 6 MB of pongs: more than the loopback buffers hold
		few    = 20_000  // 200 KB: less
		sOwner = 0x77
		wOwner = 0x88
	)
	handedOn, delivered := 0, 0
	for round := range rounds {
		pings := many
		if round >= rounds-2 {
			pings = few
		}
		p.version = tls.VersionTLS13
		if round%2 == 1 {
			p.version = tls.VersionTLS12 // records with an explicit nonce
		}
		key := fmt.Sprintf("phantom/%d", round)
		holder := dialTLS(t, ts.Addr(), p.clientTLS(nil))
		tok0 := holder.grant(key, 30, 1)

		s := rawTLS(t, ts.Addr(), p.clientTLS(nil))
		req := bytes.Repeat(proto.AppendPing(nil, 7), pings)
		req = proto.AppendAcquire(req, 20, 30, sOwner, key)
		go func() { _, _ = s.Write(req) }()
		lockdtest.WaitFor(t, "one waiter", func() bool { return ts.Table().Lookup([]byte(key)).Waiters == 1 })
		w := dialTLS(t, ts.Addr(), p.clientTLS(nil))
		w.acquire(key, 20, 30, wOwner)
		lockdtest.WaitFor(t, "two waiters", func() bool { return ts.Table().Lookup([]byte(key)).Waiters == 2 })

		holder.release(key, tok0)
		holder.expect(proto.OpRelease, tok0)

		got := make([]byte, 0, 8<<20)
		buf := make([]byte, 128<<10)
		_ = s.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, _ := io.ReadFull(s, buf)
		got = append(got, buf[:n]...)
		if round%2 == 0 {
			_ = s.CloseWrite()
		} else {
			_, _ = s.Write([]byte{'Z'})
		}
		for {
			n, err := s.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		s.Close()

		var sTok uint64
		var r proto.Response
		for off := 0; off < len(got); {
			m, err := proto.ParseResponse(got[off:], &r)
			if err != nil {
				break
			}
			off += m
			if r.Op == proto.OpAcquire && r.ID == sOwner {
				sTok = r.Token
			}
		}
		wTok := uint64(0)
		if f, err := w.next(5 * time.Second); err == nil && f.Op == proto.OpAcquire {
			wTok = f.Token
		}
		info := ts.Table().Lookup([]byte(key))
		switch {
		case sTok != 0 && wTok != 0:
			t.Fatalf("round %d: phantom lock: the closed client received token %d, and the next waiter was granted %d", round, sTok, wTok)
		case sTok != 0 && (!info.Held || info.Token != sTok):
			t.Fatalf("round %d: the closed client received token %d, which the server no longer holds (%+v)", round, sTok, info)
		case sTok == 0 && wTok == 0:
			t.Fatalf("round %d: the undelivered grant was not handed on (%+v)", round, info)
		}
		if wTok != 0 {
			handedOn++
		} else {
			delivered++
		}
		t.Logf("round %d: delivered to the closing client: %v (%d bytes read)", round, sTok != 0, len(got))
		holder.release(key, info.Token)
	}
	if handedOn == 0 || delivered == 0 {
		t.Fatalf("grants handed on in %d rounds, delivered in %d: both must happen for the test to test anything", handedOn, delivered)
	}
}

// TestTLSSlowReaderClosed: a TLS client that sends and never reads is
// closed once its unread answers pass --max-outbound; its queued acquire
// leaves the queue, and a release then leaves the key free.
func TestTLSSlowReaderClosed(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.MaxOutbound = 64 << 10 })
	holder := dialTLS(t, ts.Addr(), p.clientTLS(nil))
	tok := holder.grant("slow", 30, 1)
	s := rawTLSBuf(t, ts.Addr(), p.clientTLS(nil), 16<<10)
	req := proto.AppendAcquire(nil, 60, 30, 2, "slow")
	req = append(req, bytes.Repeat(proto.AppendPing(nil, 7), 1_000_000)...)
	writeErr := make(chan error, 1)
	go func() {
		_ = s.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_, err := s.Write(req)
		writeErr <- err
	}()
	// Megabytes of pongs fill the kernel's buffers first: allow for a
	// loaded machine (and the race detector).
	deadline := time.Now().Add(30 * time.Second)
	for ts.Metrics().Conns != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the slow reader not closed within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-writeErr; err == nil {
		t.Fatal("10 MB written to a connection the server closed")
	}
	if n := ts.Table().Lookup([]byte("slow")).Waiters; n != 0 {
		t.Fatalf("%d waiters after the slow reader closed", n)
	}
	holder.release("slow", tok)
	holder.expect(proto.OpRelease, tok)
	if ts.Key([]byte("slow")).Held {
		t.Fatal("the key went to the closed connection")
	}
}

// TestTLSShutdownDrains: Shutdown answers a TLS connection's queued acquire
// E 4 and its new acquires E 4 (pings still pong), and closes every TLS
// connection — one that never reads included — within 5 s.
func TestTLSShutdownDrains(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.MaxOutbound = 64 << 20 })
	a, b := dialTLS(t, ts.Addr(), p.clientTLS(nil)), dialTLS(t, ts.Addr(), p.clientTLS(nil))
	a.grant("k", 30, 1)
	b.acquire("k", 30, 10, 2)
	b.silent(50 * time.Millisecond)
	slow := rawTLSBuf(t, ts.Addr(), p.clientTLS(nil), 16<<10)
	go func() { _, _ = slow.Write(bytes.Repeat(proto.AppendPing(nil, 7), 1_000_000)) }()
	time.Sleep(100 * time.Millisecond)

	began := time.Now()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	if f := b.expect(proto.OpError, 2); f.Code != proto.CodeShutdown {
		t.Fatalf("queued acquire at shutdown: %+v", f)
	}
	a.send(append(proto.AppendAcquire(nil, 0, 30, 3, "j"), proto.AppendPing(nil, 4)...))
	if f := a.expect(proto.OpError, 3); f.Code != proto.CodeShutdown {
		t.Fatalf("acquire while draining: %+v", f)
	}
	a.expect(proto.OpPing, 4)
	a.closed(6 * time.Second)
	b.closed(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > engine.ShutdownGrace+500*time.Millisecond {
		t.Fatalf("TLS connections closed %v after the shutdown began", d)
	}
	// What reached the kernel before the close arrives first, then the end.
	_ = slow.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		if _, err := slow.Read(make([]byte, 64<<10)); err != nil {
			if isTimeout(err) {
				t.Fatal("the slow TLS reader's connection is still open")
			}
			break
		}
	}
}

// TestTLSFrameTimeout: --frame-timeout closes a TLS connection that stops
// within a frame, within a TLS record, or before finishing its handshake.
func TestTLSFrameTimeout(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.FrameTimeout = 200 * time.Millisecond })
	cases := []struct {
		name string
		open func(t *testing.T) net.Conn
	}{
		{"partial frame", func(t *testing.T) net.Conn {
			w := dialTLS(t, ts.Addr(), p.clientTLS(nil))
			w.send(proto.AppendAcquire(nil, 0, 30, 1, "k")[:5])
			return w.c
		}},
		{"partial record", func(t *testing.T) net.Conn {
			raw, err := net.Dial("tcp", ts.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			c := tls.Client(raw, p.clientTLS(nil))
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			// An application-data record header announcing 64 bytes, and 3.
			if _, err := raw.Write([]byte{23, 3, 3, 0, 64, 1, 2, 3}); err != nil {
				t.Fatal(err)
			}
			return raw
		}},
		{"no handshake", func(t *testing.T) net.Conn {
			raw, err := net.Dial("tcp", ts.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			return raw
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn := c.open(t)
			began := time.Now()
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := conn.Read(make([]byte, 4096)); err != nil {
					if isTimeout(err) {
						t.Fatal("not closed within 5 s")
					}
					break
				}
			}
			if d := time.Since(began); d < 150*time.Millisecond {
				t.Fatalf("closed after %v, before the frame timeout", d)
			}
		})
	}
	lockdWait(t, "one handshake failure (the connection that never began)", func() bool {
		return ts.Metrics().TLSHandshakeFailures == 1
	})
}

// TestTLSMaxConnsCountsHandshakes: a connection still in its handshake
// counts under --max-conns; one beyond is closed at once.
func TestTLSMaxConnsCountsHandshakes(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.MaxConns = 2 })
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ts.Addr())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	lockdtest.WaitFor(t, "two connections counted", func() bool { return ts.Metrics().Conns == 2 })
	began := time.Now()
	if _, err := tryTLS(ts.Addr(), p.clientTLS(nil)); err == nil {
		t.Fatal("a third connection was served with --max-conns 2")
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("the refused connection took %v to close", d)
	}
	for _, c := range idle {
		c.Close()
	}
	lockdtest.WaitFor(t, "the idle connections gone", func() bool { return ts.Metrics().Conns == 0 })
	w := dialTLS(t, ts.Addr(), p.clientTLS(nil))
	w.send(proto.AppendPing(nil, 1))
	w.expect(proto.OpPing, 1)
}

// TestTLSHandshakeFailuresLoggedOncePerSecond: a flood of failed
// handshakes makes a log line a second at most, with the failures since
// the last line and the last one's cause; the frame-timeout sweep logs
// the flood's tail, so every failure is in the log soon after it stops.
func TestTLSHandshakeFailuresLoggedOncePerSecond(t *testing.T) {
	p := newPKI(t)
	var logs logBuffer
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	// A client that does not trust the server's certificate ends the
	// handshake with an alert.
	distrust := &tls.Config{RootCAs: p.other.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	const failures = 100
	began := time.Now()
	for range failures {
		if w, err := tryTLS(ts.Addr(), distrust); err == nil {
			w.c.Close()
			t.Fatal("a client that does not trust the server's certificate finished its handshake")
		}
	}
	took := time.Since(began)
	const msg = "TLS handshakes failed; connections closed"
	total := func() int {
		n := 0
		for _, rec := range logs.lines(t, msg) {
			v, _ := rec["failed"].(float64)
			n += int(v)
		}
		return n
	}
	lockdtest.WaitFor(t, "every failed handshake counted in the log", func() bool { return total() == failures })
	recs := logs.lines(t, msg)
	if maxLines := 2 + int(took/time.Second); len(recs) > maxLines {
		t.Fatalf("%d log lines for %d failed handshakes in %v, want at most %d (one a second)", len(recs), failures, took, maxLines)
	}
	if last, _ := recs[len(recs)-1]["last"].(string); !strings.Contains(last, "(from 127.0.0.1:") {
		t.Fatalf("the last line's cause is %q, want the error and the client's address", last)
	}
	if m := ts.Metrics(); m.TLSHandshakeFailures != failures {
		t.Fatalf("%d failed handshakes in the metrics, want %d", m.TLSHandshakeFailures, failures)
	}
	t.Logf("%d failed handshakes in %v: %d log lines", failures, took.Round(time.Millisecond), len(recs))
}

// TestTLSAnswersWaitForCommit: with a committing node, a TLS connection's
// grant leaves only once its record is committed, and a ping behind it
// waits too; a Hold gate leaves requests unread (more than the reader's
// buffer holds) until the gate opens.
func TestTLSAnswersWaitForCommit(t *testing.T) {
	p := newPKI(t)
	ts, node := startCommittingWith(t, func(c *engine.Config) { c.TLS = p.serverTLS(false) })
	w := dialTLS(t, ts.Addr(), p.clientTLS(nil))
	w.send(append(proto.AppendAcquire(nil, 0, 30, 1, "k"), proto.AppendPing(nil, 2)...))
	noAnswer(t, w, 100*time.Millisecond)
	ts.Committed(node.Barrier())
	w.expect(proto.OpAcquire, 1)
	w.expect(proto.OpPing, 2)

	node.gate.Store(&repl.Gate{State: repl.Hold})
	ts.GateChanged()
	const n = 1000 // 10 KB of pings: more than the reader's 4 KB buffer
	w.send(bytes.Repeat(proto.AppendPing(nil, 3), n))
	noAnswer(t, w, 200*time.Millisecond)
	node.gate.Store(nil)
	ts.GateChanged()
	for range n {
		w.expect(proto.OpPing, 3)
	}
}

// TestTLSCommonName: a session exposes its verified client certificate's
// Common Name (the identity code's hook), and "" without one.
func TestTLSCommonName(t *testing.T) {
	p := newPKI(t)
	for _, c := range []struct {
		name   string
		mod    func(*engine.Config)
		client func(string) *wire
		want   string
	}{
		{"mutual TLS", func(c *engine.Config) { c.TLS = p.serverTLS(true) },
			func(a string) *wire { return dialTLS(t, a, p.clientTLS(p.alice)) }, "alice"},
		{"TLS, no client CA", func(c *engine.Config) { c.TLS = p.serverTLS(false) },
			func(a string) *wire { return dialTLS(t, a, p.clientTLS(p.alice)) }, ""},
		{"plaintext", nil, func(a string) *wire { return dial(t, a) }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, c.mod)
			w := c.client(ts.Addr())
			w.send(proto.AppendPing(nil, 1))
			w.expect(proto.OpPing, 1)
			if got := engine.SessionCommonNames(ts.Server); !slices.Equal(got, []string{c.want}) {
				t.Fatalf("common names %q, want [%q]", got, c.want)
			}
		})
	}
}

// TestTLSContendedLoad: 8 TLS connections, each with 16 acquires (wait 5 s)
// in flight on 16 hot keys, releasing every grant at once, for a second
// (less under -race): handoffs between TLS connections, woken by their
// mail. Every acquire is answered, tokens grow per key, and the table ends
// empty.
func TestTLSContendedLoad(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, nil)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		pairs int
		errs  []error
	)
	end := time.Now().Add(time.Second)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := contendedPairs(ts.Addr(), p.clientTLS(nil), uint64(i), 16, 16, end)
			mu.Lock()
			pairs += n
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if pairs == 0 {
		t.Fatal("no pair done")
	}
	lockdtest.WaitFor(t, "the table empty", func() bool { m := ts.Metrics(); return m.Keys == 0 && m.Waiters == 0 })
	t.Logf("%d contended pairs over TLS; handoffs %d", pairs, ts.Metrics().Table.Handoffs)
}

// contendedPairs drives one connection until end, then lets what is in
// flight finish; it checks that tokens grow per key.
func contendedPairs(addr string, cfg *tls.Config, seed uint64, depth, hot int, end time.Time) (int, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(end.Add(10 * time.Second))
	rng := rand.New(rand.NewPCG(seed, 1))
	last := map[string]uint64{}
	var out, in []byte
	var resp proto.Response
	owner, inflight, pairs := seed<<32, 0, 0
	buf := make([]byte, 16<<10)
	for {
		for inflight < depth && time.Now().Before(end) {
			owner++
			out = proto.AppendAcquire(out, 5, 30, owner, fmt.Sprintf("hot/%d", rng.IntN(hot)))
			inflight++
		}
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return pairs, err
			}
			out = out[:0]
		}
		if inflight == 0 {
			return pairs, nil
		}
		n, err := c.Read(buf)
		if err != nil {
			return pairs, err
		}
		in = append(in, buf[:n]...)
		for {
			m, err := proto.ParseResponse(in, &resp)
			if err != nil {
				break
			}
			switch resp.Op {
			case proto.OpAcquire:
				k := string(resp.Tail)
				if resp.Token <= last[k] {
					return pairs, fmt.Errorf("key %s: token %d after %d", k, resp.Token, last[k])
				}
				last[k] = resp.Token
				out = proto.AppendRelease(out, resp.Token, resp.Tail)
			case proto.OpRelease:
				inflight--
				pairs++
			default:
				return pairs, fmt.Errorf("unexpected answer %c id %d", resp.Op, resp.ID)
			}
			in = in[m:]
		}
		in = append(in[:0], in...)
	}
}

// TestTLSPendingGrantsCap is TestPendingGrantsCap over TLS: while a
// connection has --max-pending-grants grants in records that have not
// reached the kernel, its acquires are answered B; once it reads, it is
// granted again.
func TestTLSPendingGrantsCap(t *testing.T) {
	const max = 8
	p := newPKI(t)
	ts := startTLSServer(t, p, false, func(c *engine.Config) {
		c.MaxOutbound = 64 << 20
		c.MaxPendingGrants = max
	})
	nc := rawTLS(t, ts.Addr(), p.clientTLS(nil))
	const pings = 1 << 20 // 10 MB of pongs: the grants after them stay in the server
	req := bytes.Repeat(proto.AppendPing(nil, 0), pings)
	for i := range 3 * max {
		req = proto.AppendAcquire(req, 0, 30, uint64(100+i), fmt.Sprintf("pin/%d", i))
	}
	writeErr := make(chan error, 1)
	go func() {
		_ = nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := nc.Write(req)
		writeErr <- err
	}()
	lockdtest.WaitFor(t, "the grants made", func() bool { return ts.Table().Stats().Keys > 0 })
	w := &wire{t: t, c: nc}
	granted, busy := 0, 0
	for granted+busy < 3*max {
		f, err := w.next(20 * time.Second)
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
	w.acquire("pin/after", 0, 30, 1)
	w.expect(proto.OpAcquire, 1)
}

// TestTLSRedirect: when the gate turns to Redirect, a TLS connection's
// queued acquire and its new requests are answered M naming the active;
// a hello is still answered by this member.
func TestTLSRedirect(t *testing.T) {
	p := newPKI(t)
	ts, node := startCommittingWith(t, func(c *engine.Config) { c.TLS = p.serverTLS(false) })
	a, b := dialTLS(t, ts.Addr(), p.clientTLS(nil)), dialTLS(t, ts.Addr(), p.clientTLS(nil))
	a.acquire("k", 0, 30, 1)
	lockdtest.WaitFor(t, "the grant made", func() bool { return ts.Table().Lookup([]byte("k")).Held })
	ts.Committed(node.Barrier())
	a.expect(proto.OpAcquire, 1)
	b.acquire("k", 30, 30, 2)
	lockdtest.WaitFor(t, "b queued", func() bool { return ts.Table().Lookup([]byte("k")).Waiters == 1 })
	ts.Committed(node.Barrier())

	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	if f := b.expect(proto.OpMoved, 2); f.Tail != "127.0.0.1:1" {
		t.Fatalf("queued acquire: M names %q", f.Tail)
	}
	a.send(append(proto.AppendAcquire(nil, 0, 30, 3, "j"), proto.AppendHello(nil, 4, "orders", "s")...))
	if f := a.expect(proto.OpMoved, 3); f.Tail != "127.0.0.1:1" {
		t.Fatalf("new acquire: M names %q", f.Tail)
	}
	a.expect(proto.OpHello, 4)
}

// TestTLSRequestsBeforeCloseNotify: requests that arrive in the same
// segment as the client's close_notify are executed and answered before
// the connection closes, as a plaintext connection's requests before its
// EOF are (TLS 1.2 and 1.3).
func TestTLSRequestsBeforeCloseNotify(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, nil)
	for i := range 10 {
		raw, err := net.Dial("tcp", ts.Addr())
		if err != nil {
			t.Fatal(err)
		}
		bc := &batchConn{Conn: raw}
		cfg := p.clientTLS(nil)
		if i%2 == 0 {
			// TLS 1.2's alert record is not encrypted as application data:
			// crypto/tls then returns the requests' bytes with io.EOF.
			cfg.MaxVersion = tls.VersionTLS12
		}
		c := tls.Client(bc, cfg)
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("bye/%d", i)
		bc.hold = true // the request's record and the alert: one write
		if _, err := c.Write(append(proto.AppendAcquire(nil, 0, 30, 1, key), proto.AppendPing(nil, 2)...)); err != nil {
			t.Fatal(err)
		}
		_ = c.CloseWrite()
		bc.hold = false
		_ = raw.SetWriteDeadline(time.Time{}) // CloseWrite set it to now
		if _, err := raw.Write(bc.buf); err != nil {
			t.Fatal(err)
		}
		w := &wire{t: t, c: c}
		w.expect(proto.OpAcquire, 1)
		w.expect(proto.OpPing, 2)
		if !ts.Key([]byte(key)).Held {
			t.Fatalf("round %d: the delivered grant is not held", i)
		}
		raw.Close()
	}
}

// batchConn keeps what is written while hold is set.
type batchConn struct {
	net.Conn
	hold bool
	buf  []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	if b.hold {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}
