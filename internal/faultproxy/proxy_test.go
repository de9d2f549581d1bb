package faultproxy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/wait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target is the server behind a proxy under test: it hands every accepted
// connection to the test.
type target struct {
	ln    net.Listener
	conns chan net.Conn
	wg    sync.WaitGroup
}

func newTarget(t *testing.T) *target {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{ln: ln, conns: make(chan net.Conn, 64)}
	tg.wg.Add(1)
	go func() {
		defer tg.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tg.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		tg.wg.Wait()
		close(tg.conns)
		for c := range tg.conns {
			c.Close()
		}
	})
	return tg
}

// accept returns the next connection the target accepted.
func (tg *target) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-tg.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("the target accepted no connection in 5 s")
		return nil
	}
}

// none checks that the target accepts no connection within d.
func (tg *target) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case c := <-tg.conns:
		c.Close()
		t.Fatal("the target accepted a connection")
	case <-time.After(d):
	}
}

// setup starts a target and a proxy in front of it.
func setup(t *testing.T) (*Proxy, *target) {
	t.Helper()
	tg := newTarget(t)
	p, err := New("127.0.0.1:0", tg.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, tg
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connect dials the proxy and returns both ends: the client's and the
// target's.
func connect(t *testing.T, p *Proxy, tg *target) (client, server net.Conn) {
	t.Helper()
	client = dial(t, p.Addr())
	return client, tg.accept(t)
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// expect reads exactly len(want) bytes from c within 5 s.
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading %q: got %q, %v", want, got, err)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// silent checks that c receives nothing for d and is still open (the read
// times out, it does not end).
func silent(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("expected silence on an open connection; read %q, %v", b[:n], err)
	}
}

// ends checks that c ends (EOF or reset, no data) within 5 s.
func ends(t *testing.T, c net.Conn) error {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [64]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("expected the connection to end; read %q, %v", b[:n], err)
	}
	return err
}

const quiet = 200 * time.Millisecond // how long "nothing arrives" is watched

func TestNewRejectsBadAddresses(t *testing.T) {
	for _, tc := range []struct{ listen, target string }{
		{"127.0.0.1:0", "nocolon"},
		{"nocolon", "127.0.0.1:1"},
	} {
		if p, err := New(tc.listen, tc.target); !errors.Is(err, ErrBadAddr) {
			if p != nil {
				p.Close()
			}
			t.Errorf("New(%q, %q): %v, want ErrBadAddr", tc.listen, tc.target, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := New(ln.Addr().String(), "127.0.0.1:1"); err == nil || !strings.HasPrefix(err.Error(), "faultproxy: ") {
		t.Fatalf("New on a taken address: %v", err)
	}
}

func TestForwardsBothWays(t *testing.T) {
	p, tg := setup(t)
	c, s := connect(t, p, tg)
	write(t, c, "ping")
	expect(t, s, "ping")
	write(t, s, "pong")
	expect(t, c, "pong")

	// 1 MiB each way at once, byte for byte.
	const size = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	up, down := make([]byte, size), make([]byte, size)
	for i := range up {
		up[i], down[i] = byte(rng.Uint32()), byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	xfer := func(w, r net.Conn, data []byte) {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_ = w.SetWriteDeadline(time.Now().Add(30 * time.Second))
			_, err := w.Write(data)
			errs <- err
		}()
		go func() {
			defer wg.Done()
			_ = r.SetReadDeadline(time.Now().Add(30 * time.Second))
			got := make([]byte, len(data))
			if _, err := io.ReadFull(r, got); err != nil {
				errs <- err
				return
			}
			if sha256.Sum256(got) != sha256.Sum256(data) {
				errs <- errors.New("bytes differ")
				return
			}
			errs <- nil
		}()
	}
	xfer(c, s, up)
	xfer(s, c, down)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	if st.TxBytes != size+4 || st.RxBytes != size+4 || st.Accepted != 1 || st.Open != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBlackhole: a blackholed direction drops its bytes while the
// connection stays open and the other direction flows; lifting it resets
// the connections that lost bytes and lets new ones through.
func TestBlackhole(t *testing.T) {
	for _, d := range []Dir{Tx, Rx, Both} {
		t.Run(d.String(), func(t *testing.T) {
			p, tg := setup(t)
			idleC, idleS := connect(t, p, tg) // carries nothing during the partition
			c, s := connect(t, p, tg)
			p.Blackhole(d)
			write(t, c, "up")
			write(t, s, "down")
			if d&Tx != 0 {
				silent(t, s, quiet)
			} else {
				expect(t, s, "up")
			}
			if d&Rx != 0 {
				silent(t, c, quiet)
			} else {
				expect(t, c, "down")
			}
			// A connection made during the partition is accepted and
			// loses its bytes too.
			nc, ns := connect(t, p, tg)
			write(t, nc, "x")
			write(t, ns, "y")
			if d&Tx != 0 {
				silent(t, ns, quiet)
			} else {
				expect(t, ns, "x")
			}
			if d&Rx != 0 {
				silent(t, nc, quiet)
			} else {
				expect(t, nc, "y")
			}
			st := p.Stats()
			if d&Tx != 0 && st.TxDropped != 3 || d&Rx != 0 && st.RxDropped != 5 {
				t.Fatalf("dropped: %+v", st)
			}
			if st.Open != 3 {
				t.Fatalf("connections closed by the blackhole: %+v", st)
			}

			p.Unblackhole(d)
			// Both connections that lost bytes are reset, both sides.
			for _, conn := range []net.Conn{c, s, nc, ns} {
				ends(t, conn)
			}
			// The idle one carries on, and new ones pass.
			write(t, idleC, "after")
			expect(t, idleS, "after")
			write(t, idleS, "heal")
			expect(t, idleC, "heal")
			c2, s2 := connect(t, p, tg)
			write(t, c2, "new")
			expect(t, s2, "new")
			write(t, s2, "bytes")
			expect(t, c2, "bytes")
			if st := p.Stats(); st.Resets != 2 {
				t.Fatalf("resets: %+v", st)
			}
		})
	}
}

// TestBlackholeHoldsTheEndOfStream: a close behind a blackhole is not seen
// until the blackhole lifts, like a FIN lost in a partition and
// retransmitted after it.
func TestBlackholeHoldsTheEndOfStream(t *testing.T) {
	p, tg := setup(t)
	c, s := connect(t, p, tg)
	p.Blackhole(Rx)
	s.Close()
	silent(t, c, quiet)
	p.Heal()
	if err := ends(t, c); !errors.Is(err, io.EOF) {
		t.Fatalf("after the heal: %v, want EOF (no byte was lost)", err)
	}
}

// TestPause: a paused direction holds what it was sent, in order, and
// delivers all of it on resume; the other direction flows meanwhile.
func TestPause(t *testing.T) {
	for _, d := range []Dir{Tx, Rx} {
		t.Run(d.String(), func(t *testing.T) {
			p, tg := setup(t)
			c, s := connect(t, p, tg)
			from, to := c, s
			if d == Rx {
				from, to = s, c
			}
			p.Pause(d)
			write(t, from, "abc")
			write(t, from, "def")
			silent(t, to, quiet)
			write(t, to, "other way")
			expect(t, from, "other way")
			p.Resume(d)
			expect(t, to, "abcdef")
			if st := p.Stats(); st.TxDropped+st.RxDropped != 0 {
				t.Fatalf("a pause dropped bytes: %+v", st)
			}
		})
	}
}

// TestPauseIsBounded: a paused direction stops reading after a few chunks,
// so the sender's writes block (the proxy does not buffer without bound),
// and every byte written before the block arrives after the resume.
func TestPauseIsBounded(t *testing.T) {
	p, tg := setup(t)
	c, s := connect(t, p, tg)
	p.Pause(Tx)
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	written := 0
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	for written < 256<<20 {
		n, err := c.Write(chunk)
		written += n
		if err != nil {
			break
		}
	}
	if written >= 256<<20 {
		t.Fatalf("a paused proxy took %d bytes", written)
	}
	t.Logf("a paused direction took %d bytes before the sender blocked", written)
	p.Resume(Tx)
	got := 0
	buf := make([]byte, 64<<10)
	_ = s.SetReadDeadline(time.Now().Add(30 * time.Second))
	for got < written {
		n, err := s.Read(buf)
		for i := range n {
			if buf[i] != chunk[(got+i)%len(chunk)] {
				t.Fatalf("byte %d differs after the resume", got+i)
			}
		}
		got += n
		if err != nil {
			t.Fatalf("read %d of %d bytes: %v", got, written, err)
		}
	}
}

// TestDelay: each chunk arrives no earlier than the latency after it was
// sent; chunks in flight overlap.
func TestDelay(t *testing.T) {
	const latency = 150 * time.Millisecond
	for _, d := range []Dir{Tx, Rx} {
		t.Run(d.String(), func(t *testing.T) {
			p, tg := setup(t)
			c, s := connect(t, p, tg)
			from, to := c, s
			if d == Rx {
				from, to = s, c
			}
			p.Delay(d, latency)
			sent := make([]time.Time, 3)
			for i := range sent {
				sent[i] = time.Now()
				write(t, from, string(rune('a'+i)))
				time.Sleep(latency / 5)
			}
			for i := range sent {
				expect(t, to, string(rune('a'+i)))
				if got := time.Since(sent[i]); got < latency {
					t.Fatalf("chunk %d arrived after %v, before the %v latency", i, got, latency)
				}
			}
			// The other direction is not delayed: far below the
			// latency on any machine would be a timed assertion, so
			// only check that it arrives.
			write(t, to, "back")
			expect(t, from, "back")
			p.Delay(d, 0)
			write(t, from, "now")
			expect(t, to, "now")
		})
	}
}

// TestPauseAccept: new connections wait in the kernel's queue, their bytes
// with them, until the accept resumes.
func TestPauseAccept(t *testing.T) {
	p, tg := setup(t)
	p.PauseAccept()
	c := dial(t, p.Addr()) // the kernel completes the handshake
	write(t, c, "queued")
	tg.none(t, quiet)
	p.ResumeAccept()
	s := tg.accept(t)
	expect(t, s, "queued")
}

func TestResetAll(t *testing.T) {
	p, tg := setup(t)
	c1, s1 := connect(t, p, tg)
	c2, s2 := connect(t, p, tg)
	p.ResetAll()
	for _, c := range []net.Conn{c1, s1, c2, s2} {
		ends(t, c)
	}
	wait.For(t, "connections untracked", func() bool { return p.Stats().Open == 0 })
	c, s := connect(t, p, tg)
	write(t, c, "again")
	expect(t, s, "again")
	if st := p.Stats(); st.Resets != 2 || st.Accepted != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHalfClose: a FIN is forwarded as a half-close; the other way keeps
// flowing until it closes too.
func TestHalfClose(t *testing.T) {
	p, tg := setup(t)
	c, s := connect(t, p, tg)
	write(t, c, "request")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	expect(t, s, "request")
	if err := ends(t, s); !errors.Is(err, io.EOF) {
		t.Fatalf("target side: %v, want EOF", err)
	}
	write(t, s, "answer")
	expect(t, c, "answer")
	s.Close()
	if err := ends(t, c); !errors.Is(err, io.EOF) {
		t.Fatalf("client side: %v, want EOF", err)
	}
	wait.For(t, "the pair ends", func() bool { return p.Stats().Open == 0 })
}

// TestTargetDown: a connection whose target cannot be dialled is reset.
func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := New("127.0.0.1:0", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The reset may come before connect returns on loopback.
	if c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		defer c.Close()
		ends(t, c)
	}
	wait.For(t, "a reset counted", func() bool { return p.Stats().Resets == 1 })
}

// TestClose: Close ends every connection, stops listening and is
// idempotent; the methods do nothing afterwards (goleak, in TestMain,
// checks that no goroutine is left).
func TestClose(t *testing.T) {
	p, tg := setup(t)
	c, s := connect(t, p, tg)
	p.Pause(Both)
	write(t, c, "held")
	p.PauseAccept()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	ends(t, c)
	ends(t, s)
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("the proxy still accepts after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p.Heal()
	p.ResetAll()
	if !strings.Contains(p.String(), "closed") {
		t.Fatalf("String after Close: %s", p)
	}
}

func TestString(t *testing.T) {
	p, _ := setup(t)
	p.Blackhole(Both)
	p.Pause(Rx)
	p.Delay(Tx, 50*time.Millisecond)
	p.PauseAccept()
	s := p.String()
	for _, want := range []string{p.Addr() + "→" + p.Target(), "blackhole=both", "pause=rx", "delay(tx)=50ms", "accept-paused"} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %q lacks %q", s, want)
		}
	}
	p.Heal()
	if s := p.String(); !strings.HasSuffix(s, "[]") {
		t.Errorf("String() after Heal = %q", s)
	}
}

// TestFaultsUnderTraffic flips every fault from several goroutines while
// echo traffic flows (for the race detector and for leaks), then heals and
// checks that the proxy still forwards.
func TestFaultsUnderTraffic(t *testing.T) {
	p, tg := setup(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Echo on the target side.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case s := <-tg.conns:
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer s.Close()
					_, _ = io.Copy(s, s)
				}()
			case <-stop:
				return
			}
		}
	}()
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			buf := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
				if err != nil {
					continue
				}
				for range 20 {
					_ = c.SetDeadline(time.Now().Add(20 * time.Millisecond))
					if _, err := c.Write(buf[:1+rng.IntN(len(buf)-1)]); err != nil {
						break
					}
					_, _ = c.Read(buf)
				}
				c.Close()
			}
		}()
	}
	var faults sync.WaitGroup
	for i := range 3 {
		faults.Add(1)
		go func() {
			defer faults.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(rng.IntN(5)) * time.Millisecond):
				}
				d := Dir(1 + rng.IntN(3))
				switch rng.IntN(10) {
				case 0:
					p.Blackhole(d)
				case 1:
					p.Unblackhole(d)
				case 2:
					p.Pause(d)
				case 3:
					p.Resume(d)
				case 4:
					p.Delay(d, time.Duration(rng.IntN(3))*time.Millisecond)
				case 5:
					p.PauseAccept()
				case 6:
					p.ResumeAccept()
				case 7:
					p.ResetAll()
				case 8:
					_ = p.Stats()
					_ = p.String()
				case 9:
					p.Heal()
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	faults.Wait() // no fault is injected after the heal below
	p.Heal()
	p.ResetAll()
	wg.Wait()
	if st := p.Stats(); st.Accepted == 0 || st.TxBytes == 0 {
		t.Fatalf("no traffic flowed: %+v", st)
	}
	// Drop what the traffic left, then a fresh connection.
	p.ResetAll()
	wait.For(t, "every connection ends", func() bool { return p.Stats().Open == 0 })
	for len(tg.conns) > 0 {
		(<-tg.conns).Close()
	}
	c := dial(t, p.Addr())
	s := tg.accept(t)
	write(t, c, "still works")
	expect(t, s, "still works")
}

func TestDirString(t *testing.T) {
	for d, want := range map[Dir]string{0: "none", Tx: "tx", Rx: "rx", Both: "both", 7: "both"} {
		if d.String() != want {
			t.Errorf("Dir(%d) = %q, want %q", d, d.String(), want)
		}
	}
}
