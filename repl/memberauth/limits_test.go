package memberauth

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

// pendingNow is how many connections are in the exchange.
func (l *Listener) pendingNow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// dialRaw opens n TCP connections to addr that send first (if not nil)
// and then nothing.
func dialRaw(t *testing.T, addr string, n int, first []byte) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if first != nil {
			_, _ = c.Write(first)
		}
		out = append(out, c)
	}
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	return out
}

// stalledHello is the start of a TLS record that announces a 16 KiB
// handshake record holding a 64 KiB ClientHello, and never sends it: the
// most a peer can make crypto/tls wait for before it has proved anything.
var stalledHello = append([]byte{0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xff, 0xff}, make([]byte, 16000)...)

// TestFlood: a flood of connections that never finish the exchange (silent
// ones on a secret port, stalled TLS records on a TLS port) holds at most
// MaxPending of them at once — goroutines and memory bounded — and a real
// member still connects during the flood.
func TestFlood(t *testing.T) {
	_, mats := repltest.MemberTLS(t, hosts)
	sec := repltest.Secret(1)
	for _, tc := range []struct {
		name     string
		acc, dia side
		first    []byte
	}{
		{"secret, silent", side{secret: sec, opt: Options{MaxPending: 8}}, side{self: 1, secret: sec}, nil},
		{"tls, stalled record", side{tls: mats[0], secret: sec, opt: Options{MaxPending: 8}}, side{self: 1, tls: mats[1], secret: sec}, stalledHello},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, d := tc.acc.auth(t), tc.dia.auth(t)
			l, got := serve(t, a)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			g0 := runtime.NumGoroutine()
			const flood = 300
			dialRaw(t, l.Addr().String(), flood, tc.first)
			wait.For(t, "the flood to be taken in", func() bool {
				return a.Refused(ReasonLimit) >= flood-8
			})
			if n := l.pendingNow(); n > 8 {
				t.Fatalf("%d connections in the exchange, want at most 8", n)
			}
			// An evicted connection is counted refused when it is closed;
			// its exchange's goroutine ends once its read fails, a moment
			// later on a loaded machine. What must hold is that they do end:
			// the flood leaves MaxPending exchanges and a few goroutines.
			peak := runtime.NumGoroutine() - g0
			wait.For(t, "the goroutines of the flood to come down to MaxPending (8) and a few", func() bool {
				return runtime.NumGoroutine()-g0 <= 8+4
			})
			runtime.GC()
			runtime.ReadMemStats(&after)
			grown := int64(after.HeapInuse) - int64(before.HeapInuse)
			t.Logf("%d connections flooded: %d in the exchange, %d refused (limit), %d more goroutines (%d when the last was refused), heap in use %+d KiB",
				flood, l.pendingNow(), a.Refused(ReasonLimit), runtime.NumGoroutine()-g0, peak, grown>>10)
			if grown > 4<<20 {
				t.Errorf("the heap grew by %d KiB during the flood", grown>>10)
			}
			// A real member gets in: its connection is the newest, the flood's
			// oldest make room for it.
			c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second)
			if err != nil {
				t.Fatalf("a real member could not connect during the flood: %v", err)
			}
			defer c.Close()
			select {
			case in := <-got:
				if m, _ := MemberOf(in); m != 1 {
					t.Fatalf("accepted member %d", m)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the real member's connection was not accepted")
			}
		})
	}
}

// TestHandshakeDeadline: a connection that says nothing is closed after
// HandshakeTimeout and counted.
func TestHandshakeDeadline(t *testing.T) {
	a := side{secret: repltest.Secret(1), opt: Options{HandshakeTimeout: 150 * time.Millisecond}}.auth(t)
	l, _ := serve(t, a)
	c := dialRaw(t, l.Addr().String(), 1, []byte("LKMA"))[0]
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Fatal("the silent connection got an answer")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("closed after %v, want about 150ms", took)
	}
	wait.For(t, "the refusal counted", func() bool { return a.Refused(ReasonHandshake) == 1 })
}

// TestMaxConns: at most MaxConns authenticated connections are open; one
// more is refused as it authenticates, and closing one makes room.
func TestMaxConns(t *testing.T) {
	sec := repltest.Secret(1)
	a := side{secret: sec, opt: Options{MaxConns: 2}}.auth(t)
	d := side{self: 1, secret: sec}.auth(t)
	l, got := serve(t, a)
	var open []net.Conn
	for range 2 {
		c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, <-got)
	}
	if c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second); err == nil {
		// The dialer's side completes before the acceptor counts it:
		// the connection must be closed without a byte.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a third connection carried data")
		}
		c.Close()
	}
	wait.For(t, "the third refused", func() bool { return a.Refused(ReasonLimit) == 1 })
	open[0].Close()
	c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case in := <-got:
		in.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no room after a close")
	}
	open[1].Close()
	// With the exchange off the count is bounded too.
	off := side{opt: Options{MaxConns: 1}}.auth(t)
	lo, gotOff := serve(t, off)
	c1 := dialRaw(t, lo.Addr().String(), 1, nil)[0]
	<-gotOff
	c2 := dialRaw(t, lo.Addr().String(), 1, nil)[0]
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil {
		t.Fatal("a second plain connection was kept")
	}
	_ = c1
	wait.For(t, "the plain one refused", func() bool { return off.Refused(ReasonLimit) == 1 })
}

// TestRelay: a man in the middle that holds a certificate the members
// trust, naming their host, terminates the dialer's TLS and opens its own
// to the acceptor, relaying every byte of the exchange: the TLS exporter
// in the MACs differs on its two legs, so the dialer refuses the
// acceptor's proof and nothing is accepted.
func TestRelay(t *testing.T) {
	// One host for all: the man in the middle's certificate names it too.
	one := []string{"127.0.0.1:7070", "127.0.0.1:7080", "127.0.0.1:7090"}
	ca, mats := repltest.MemberTLS(t, []string{"127.0.0.1", "127.0.0.1", "127.0.0.1"})
	mitmPair, err := ca.Issue("mitm", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	sec := repltest.Secret(1)
	a := side{self: 0, peers: one, tls: mats[0], secret: sec}.auth(t)
	d := side{self: 1, peers: one, tls: mats[1], secret: sec}.auth(t)
	l, got := serve(t, a)
	mitm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mitm.Close()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		relay []net.Conn
	)
	keep := func(c net.Conn) {
		mu.Lock()
		relay = append(relay, c)
		mu.Unlock()
	}
	defer func() { // ends the relay whatever happened
		mitm.Close()
		mu.Lock()
		for _, c := range relay {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		raw, err := mitm.Accept()
		if err != nil {
			return
		}
		keep(raw)
		front := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{mitmPair.TLS}, MinVersion: tls.VersionTLS13})
		back, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{mitmPair.TLS}, MinVersion: tls.VersionTLS13})
		if err != nil {
			return
		}
		keep(back)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(back, front)
			back.Close()
		}()
		_, _ = io.Copy(front, back)
		raw.Close()
	}()
	c, err := d.Dial(context.Background(), 0, mitm.Addr().String(), time.Second)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, ErrRefused) || d.Refused(ReasonSecret) != 1 {
		t.Fatalf("dial through the relay: %v, %v; want a refusal for the secret", err, d.Refusals())
	}
	select {
	case c := <-got:
		c.Close()
		t.Fatal("the relayed connection was accepted")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestReload: the TLS material is read per handshake: a member whose
// certificate a new CA issued is refused until the acceptor's material
// trusts that CA, then accepted, without restarting anything.
func TestReload(t *testing.T) {
	ca1, mats1 := repltest.MemberTLS(t, hosts)
	ca2, mats2 := repltest.MemberTLS(t, hosts)
	_ = ca1
	accMat := repltest.NewTLSMaterial(*mats1[0].Certificate(), ca1.Pool())
	a := side{tls: accMat}.auth(t)
	d := side{self: 1, tls: repltest.NewTLSMaterial(*mats2[1].Certificate(), ca2.Pool())}.auth(t)
	l, got := serve(t, a)
	if _, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second); err == nil {
		t.Fatal("accepted before the reload")
	}
	accMat.Set(*mats2[0].Certificate(), ca2.Pool()) // the reload
	c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second)
	if err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	defer c.Close()
	select {
	case in := <-got:
		in.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("nothing accepted after the reload")
	}
}

// TestDialCancel: cancelling the context ends a dial whose peer never
// answers, at once, and counts nothing.
func TestDialCancel(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	d := side{self: 1, secret: repltest.Secret(1)}.auth(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := d.Dial(ctx, 0, silent.Addr().String(), time.Second); err == nil {
		t.Fatal("dial to a silent peer succeeded")
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the cancelled dial took %v", took)
	}
	if n := total(d); n != 0 {
		t.Fatalf("a cancelled dial counted %v", d.Refusals())
	}
}
