package engine_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/proto"
)

// pki is a test's certificates: a CA, the server's certificate from it (for
// 127.0.0.1), a client certificate from it (CN "alice") and one from a CA
// the server does not trust.
type pki struct {
	ca, other *testcerts.CA
	server    *testcerts.Pair
	alice     *testcerts.Pair
	stranger  *testcerts.Pair
	version   uint16 // the clients' highest TLS version (0: crypto/tls's)
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	p := &pki{}
	var err error
	p.ca, err = testcerts.NewCA("lockd test CA")
	must(err)
	p.other, err = testcerts.NewCA("another CA")
	must(err)
	p.server, err = p.ca.Issue("lockd", "127.0.0.1", "localhost")
	must(err)
	p.alice, err = p.ca.Issue("alice")
	must(err)
	p.stranger, err = p.other.Issue("mallory")
	must(err)
	return p
}

// serverTLS is the server side: the certificate, and with mutual set a
// client certificate required against the CA.
func (p *pki) serverTLS(mutual bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{p.server.TLS}, MinVersion: tls.VersionTLS12}
	if mutual {
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, p.ca.Pool()
	}
	return c
}

// clientTLS trusts the CA and presents cert if not nil.
func (p *pki) clientTLS(cert *testcerts.Pair) *tls.Config {
	c := &tls.Config{RootCAs: p.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, MaxVersion: p.version}
	if cert != nil {
		c.Certificates = []tls.Certificate{cert.TLS}
	}
	return c
}

// startTLSServer serves TLS with p's certificate (mutual: clients must
// present one from p.ca).
func startTLSServer(t testing.TB, p *pki, mutual bool, mod func(*engine.Config)) *testServer {
	t.Helper()
	return startServer(t, func(c *engine.Config) {
		c.TLS = p.serverTLS(mutual)
		if mod != nil {
			mod(c)
		}
	})
}

// dialTLS opens a TLS connection and finishes its handshake.
func dialTLS(t testing.TB, addr string, cfg *tls.Config) *wire {
	t.Helper()
	w, err := tryTLS(addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	t.Cleanup(func() { w.c.Close() })
	w.t = t
	return w
}

// tryTLS dials and handshakes, returning the error.
func tryTLS(addr string, cfg *tls.Config) (*wire, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	// TLS 1.3: a client certificate the server refuses fails the
	// server's side of the handshake after the client's is done; the
	// alert arrives on the first read.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Time{})
	return &wire{c: c}, nil
}

// TestTLSEveryRequest: over TLS every request kind gets the answer it gets
// in plaintext — grant, queued handoff to another connection, timeout,
// busy, release, not held, renew, ping, hello, bad key, bad lease, and a
// bad frame closes the connection. Over TLS 1.2 and 1.3.
func TestTLSEveryRequest(t *testing.T) {
	p := newPKI(t)
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		p.version = v
		t.Run(tls.VersionName(v), func(t *testing.T) { everyRequest(t, p) })
	}
}

func everyRequest(t *testing.T, p *pki) {
	ts := startTLSServer(t, p, false, func(c *engine.Config) { c.Table.MaxKeys = 4; c.MaxKey = 64 })
	a := dialTLS(t, ts.Addr(), p.clientTLS(nil))
	b := dialTLS(t, ts.Addr(), p.clientTLS(nil))

	tok := a.grant("k", 30, 1)
	b.acquire("k", 5, 30, 2)
	b.silent(50 * time.Millisecond) // queued
	a.release("k", tok)
	a.expect(proto.OpRelease, tok)
	f := b.expect(proto.OpAcquire, 2) // handed off across connections
	if f.Token <= tok || f.Tail != "k" {
		t.Fatalf("handoff: %+v after token %d", f, tok)
	}
	b.renew("k", 30, f.Token)
	b.expect(proto.OpRenew, f.Token)
	b.renew("k", 30, f.Token+100)
	b.expect(proto.OpNotHeld, f.Token+100)
	b.release("k", f.Token+100)
	b.expect(proto.OpNotHeld, f.Token+100)

	a.acquire("k", 1, 30, 3) // held by b: times out after 1 s
	if f, err := a.next(3 * time.Second); err != nil || f.Op != proto.OpTimeout || f.ID != 3 {
		t.Fatalf("wait 1 s on a held key: %+v %v", f, err)
	}
	for i, k := range []string{"x1", "x2", "x3"} {
		a.grant(k, 30, uint64(10+i))
	}
	a.acquire("x4", 0, 30, 20) // a fifth key beyond --max-keys 4
	a.expect(proto.OpBusy, 20)

	a.send(proto.AppendPing(nil, 42))
	a.expect(proto.OpPing, 42)
	a.send(proto.AppendHello(nil, 43, "orders", "s3cret"))
	if f := a.expect(proto.OpHello, 43); f.Tail != "orders" {
		t.Fatalf("welcome names %q", f.Tail)
	}
	a.acquire(strings.Repeat("k", 65), 0, 30, 44)
	if f := a.expect(proto.OpError, 44); f.Code != proto.CodeBadKey {
		t.Fatalf("long key: %+v", f)
	}
	a.acquire("k", 0, 0, 45)
	if f := a.expect(proto.OpError, 45); f.Code != proto.CodeBadLease {
		t.Fatalf("lease 0: %+v", f)
	}
	a.send([]byte("Z garbage\n"))
	if f := a.expect(proto.OpError, 0); f.Code != proto.CodeBadFrame {
		t.Fatalf("bad frame: %+v", f)
	}
	a.closed(5 * time.Second)
	// a's grants were delivered: they are held until released or expired.
	if !ts.Key([]byte("x1")).Held {
		t.Fatal("a delivered grant was released when its connection closed")
	}
	if v := a.c.(*tls.Conn).ConnectionState().Version; v != p.version {
		t.Fatalf("negotiated %s, want %s", tls.VersionName(v), tls.VersionName(p.version))
	}
	m := ts.Metrics()
	if m.TLSHandshakes != 2 || m.TLSHandshakeFailures != 0 {
		t.Fatalf("handshakes %d, failures %d; want 2, 0", m.TLSHandshakes, m.TLSHandshakeFailures)
	}
}

// TestTLSRefusesPlaintext: a plaintext client on the TLS port gets one
// plaintext E 1 (op: its first byte, id 0) saying that the port speaks
// TLS, and nothing else; its connection is closed, nothing it sent is
// executed, and the failure is counted.
func TestTLSRefusesPlaintext(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, false, nil)
	w := dial(t, ts.Addr())
	w.send(proto.AppendAcquire(nil, 0, 30, 1, "k"))
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(w.c)
	if isTimeout(err) {
		t.Fatal("connection not closed")
	}
	want := proto.AppendError(nil, proto.OpAcquire, 0, proto.CodeBadFrame, engine.PlaintextOnTLS)
	if !bytes.Equal(got, want) {
		t.Fatalf("a plaintext client read %q, want %q", got, want)
	}
	lockdWait(t, "the failure counted", func() bool { return ts.Metrics().TLSHandshakeFailures == 1 })
	if ts.Key([]byte("k")).Held {
		t.Fatal("a plaintext acquire was executed")
	}
	if n := ts.Metrics().Conns; n != 0 {
		t.Fatalf("%d connections still counted", n)
	}
}

// TestTLSMutual: with a client CA, a client without a certificate, or
// with one from another CA, fails its handshake (counted); one with a
// certificate from the CA is served.
func TestTLSMutual(t *testing.T) {
	p := newPKI(t)
	ts := startTLSServer(t, p, true, nil)
	for i, c := range []struct {
		name string
		cert *testcerts.Pair
	}{{"no certificate", nil}, {"another CA", p.stranger}} {
		t.Run(c.name, func(t *testing.T) {
			w, err := tryTLS(ts.Addr(), p.clientTLS(c.cert))
			if err == nil {
				// The server may fail the handshake only after the client's
				// side completed: then the connection must be dead.
				w.c.SetDeadline(time.Now().Add(5 * time.Second))
				_, werr := w.c.Write(proto.AppendPing(nil, 1))
				_, rerr := w.c.Read(make([]byte, 64))
				w.c.Close()
				if werr == nil && rerr == nil {
					t.Fatal("handshake accepted and a ping answered")
				}
			}
			lockdWait(t, "the failure counted", func() bool { return ts.Metrics().TLSHandshakeFailures == uint64(i+1) })
		})
	}
	w := dialTLS(t, ts.Addr(), p.clientTLS(p.alice))
	w.send(proto.AppendPing(nil, 7))
	w.expect(proto.OpPing, 7)
}

// lockdWait polls cond for up to 5 s.
func lockdWait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var _ = errors.New
