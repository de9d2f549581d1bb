package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopBenchServer()
	sharedMu.Lock()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "the shared lockd:", err)
			code = 1
		}
	}
	sharedMu.Unlock()
	removeLockdBuild()
	dataDirsMu.Lock()
	for _, d := range dataDirs {
		_ = os.RemoveAll(d)
	}
	dataDirsMu.Unlock()
	adminHTTP.CloseIdleConnections()
	if code == 0 {
		if leaked := leakedGoroutines(); leaked != "" {
			fmt.Fprintln(os.Stderr, "goroutines of the client or its tests still running after the tests:\n"+leaked)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	sharedMu sync.Mutex
	shared   *lockdProc
	dataDirs []string // every server's data dir, removed by TestMain (guarded by dataDirsMu)

	dataDirsMu sync.Mutex
)

// sharedServer is one lockd for every test that needs no special
// configuration. Tests use distinct keys (named after the test).
func sharedServer(t testing.TB) *lockdProc {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		shared = newServer(t)
	}
	return shared
}

// newServer starts a lockd on 127.0.0.1 with the flags args; the caller
// closes it, and TestMain removes its data dir.
func newServer(t testing.TB, args ...string) *lockdProc {
	t.Helper()
	lockdBinary(t) // skips or fails before a data dir is made
	dir, err := os.MkdirTemp("", "lockd-client-test-")
	if err != nil {
		t.Fatal(err)
	}
	dataDirsMu.Lock()
	dataDirs = append(dataDirs, dir)
	dataDirsMu.Unlock()
	return startLockd(t, dir, args...)
}

// ownServer starts a server with the flags args, closed at the end of the
// test.
func ownServer(t *testing.T, args ...string) *lockdProc {
	t.Helper()
	srv := newServer(t, args...)
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	return srv
}

// fastConfig is a Config with short intervals, so fault tests run fast.
func fastConfig(addrs ...string) Config {
	return Config{
		Addrs:                addrs,
		DialTimeout:          time.Second,
		ReconnectInterval:    100 * time.Millisecond,
		TransportTimeout:     2 * time.Second,
		AnswerAllowance:      300 * time.Millisecond,
		ReleaseRetry:         2 * time.Second,
		ReleaseRetryInterval: 50 * time.Millisecond,
		RetryPause:           30 * time.Millisecond,
	}
}

// newClient starts a client closed at the end of the test.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	cl, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// waitUp waits until n connections of cl are live.
func waitUp(t testing.TB, cl *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if liveConns(cl) >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("only %d of %d connections up after 5 s", liveConns(cl), n)
}

// hear makes every live connection of cl read an answer from f (a
// ping's), so that f dropping one later counts as a lost connection, not
// as a server that rejected it before answering anything; the pings are
// taken off f's requests.
func hear(t testing.TB, cl *Client, f *fake) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, heard := 0, 0
		for _, s := range *cl.slots.Load() {
			if c := s.cur.Load(); c != nil && !c.isDead.Load() {
				n++
				if c.heard.Load() {
					heard++
				}
			}
		}
		if n > 0 && heard == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections heard from the server after 5 s", heard, n)
		}
		if _, err := cl.Ping(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
	for {
		select {
		case r := <-f.reqs:
			if r.Op != proto.OpPing {
				t.Fatalf("fake server: unexpected request %c while pinging", r.Op)
			}
		default:
			return
		}
	}
}

func liveConns(cl *Client) int {
	n := 0
	for _, s := range *cl.slots.Load() {
		if c := s.cur.Load(); c != nil && !c.isDead.Load() {
			n++
		}
	}
	return n
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantErr(t testing.TB, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

// ---- scripted fake server ----

// freq is a request the fake server received.
type freq struct {
	Op    proto.Op
	Wait  uint8
	Lease uint8
	Limit uint16 // S
	ID    uint64
	Key   string
	At    time.Time
	Conn  *fconn
}

// fake is a scripted lockd: it parses requests and, unless a test's
// handler answers otherwise, answers like a server that grants everything.
type fake struct {
	t       testing.TB
	ln      net.Listener
	handler func(fc *fconn, r freq) // nil: auto; set before the client connects
	reqs    chan freq               // every request received, in order
	accepts chan *fconn
	token   atomic.Uint64

	mu    sync.Mutex
	conns []*fconn
	wg    sync.WaitGroup
}

type fconn struct {
	f      *fake
	nc     net.Conn
	wmu    sync.Mutex
	closed chan struct{} // closed when the client's side is seen closed
}

func newFake(t testing.TB, handler func(fc *fconn, r freq)) *fake {
	t.Helper()
	return newFakeAt(t, "127.0.0.1:0", handler)
}

func newFakeAt(t testing.TB, addr string, handler func(fc *fconn, r freq)) *fake {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{t: t, ln: ln, handler: handler, reqs: make(chan freq, 4096), accepts: make(chan *fconn, 64)}
	f.token.Store(1000)
	f.wg.Add(1)
	go f.acceptLoop()
	t.Cleanup(f.close)
	return f
}

func (f *fake) addr() string { return f.ln.Addr().String() }

func (f *fake) acceptLoop() {
	defer f.wg.Done()
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		fc := &fconn{f: f, nc: nc, closed: make(chan struct{})}
		f.mu.Lock()
		f.conns = append(f.conns, fc)
		f.mu.Unlock()
		select {
		case f.accepts <- fc:
		default:
		}
		f.wg.Add(1)
		go fc.readLoop()
	}
}

func (f *fake) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for _, fc := range f.conns {
		_ = fc.nc.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fake) numConns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

func (fc *fconn) readLoop() {
	defer fc.f.wg.Done()
	defer close(fc.closed)
	var in []byte
	buf := make([]byte, 4096)
	var r proto.Request
	for {
		n, err := fc.nc.Read(buf)
		in = append(in, buf[:n]...)
		for {
			m, perr := proto.ParseRequest(in, 0, &r)
			if perr == proto.ErrIncomplete {
				break
			}
			if perr != nil && perr != proto.ErrBadKey && perr != proto.ErrBadLease {
				fc.f.t.Errorf("fake server: bad request frame %q: %v", in, perr)
				_ = fc.nc.Close()
				return
			}
			q := freq{Op: r.Op, Wait: r.Wait, Lease: r.Lease, Limit: r.Limit, ID: r.ID, Key: string(r.Key), At: time.Now(), Conn: fc}
			in = in[m:]
			select {
			case fc.f.reqs <- q:
			default:
			}
			if h := fc.f.handler; h != nil {
				h(fc, q)
			} else {
				fc.auto(q)
			}
		}
		if err != nil {
			_ = fc.nc.Close()
			return
		}
	}
}

// auto answers like a server that grants every acquire, shared or not,
// finds every token valid (with fakeRemaining left) and watches it,
// and says every key is free.
func (fc *fconn) auto(r freq) {
	switch r.Op {
	case proto.OpAcquire, proto.OpShared:
		fc.send(proto.AppendAcquired(nil, r.ID, fc.f.token.Add(1), r.Key))
	case proto.OpValidate:
		fc.send(proto.AppendValid(nil, r.ID, uint32(fakeRemaining/time.Millisecond), r.Key))
	case proto.OpWatch:
		fc.send(proto.AppendWatching(nil, r.ID, r.Key))
	case proto.OpInspect:
		fc.send(proto.AppendInspection(nil, r.ID, 0, 0, 0, 0, 0, r.Key))
	case proto.OpRelease:
		fc.send(proto.AppendReleased(nil, r.ID, r.Key))
	case proto.OpRenew:
		fc.send(proto.AppendRenewed(nil, r.ID, r.Key))
	case proto.OpPing:
		fc.send(proto.AppendPong(nil, r.ID))
	}
}

// fakeRemaining is the lease time left a fake answers a validate with.
const fakeRemaining = 12345 * time.Millisecond

func (fc *fconn) send(b []byte) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_, _ = fc.nc.Write(b)
}

// next returns the next request the fake received, failing after d.
func (f *fake) next(d time.Duration) freq {
	f.t.Helper()
	select {
	case r := <-f.reqs:
		return r
	case <-time.After(d):
		f.t.Fatalf("fake server: no request within %v", d)
		return freq{}
	}
}

// none asserts that no request arrives within d.
func (f *fake) none(d time.Duration) {
	f.t.Helper()
	select {
	case r := <-f.reqs:
		f.t.Fatalf("fake server: unexpected request %c %q owner/token %d", r.Op, r.Key, r.ID)
	case <-time.After(d):
	}
}

// ---- TCP proxy that cuts connections ----

// proxy forwards to target; each connection is cut (both sides closed)
// after a byte offset drawn by cut (0: never), counted over both
// directions.
type proxy struct {
	ln     net.Listener
	target string
	cut    func() int64
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	cuts   atomic.Int64
}

func newProxy(t testing.TB, target string, cut func() int64) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, cut: cut}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = a.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, a, b)
		p.mu.Unlock()
		var budget atomic.Int64
		limit := p.cut()
		if limit <= 0 {
			limit = 1 << 62
		}
		budget.Store(limit)
		p.wg.Add(2)
		go p.pipe(a, b, &budget)
		go p.pipe(b, a, &budget)
	}
}

// pipe copies src to dst until the shared budget is spent, then cuts both.
func (p *proxy) pipe(src, dst net.Conn, budget *atomic.Int64) {
	defer p.wg.Done()
	defer func() { _ = src.Close(); _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			left := budget.Add(-int64(n))
			if left < 0 {
				keep := int64(n) + left
				if keep > 0 {
					_, _ = dst.Write(buf[:keep])
				}
				p.cuts.Add(1)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// randCut returns a cut function drawing offsets in [1, max].
func randCut(seed uint64, max int64) func() int64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 1))
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return 1 + r.Int64N(max)
	}
}
