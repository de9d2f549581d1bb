package engine_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, lockdtest.LeakOptions...)
}

// testServer is an in-process lockd on 127.0.0.1 with a temporary data dir
// and the configuration it was started with (to restart on the same dir).
type testServer struct {
	*engine.Server
	t   testing.TB
	cfg engine.Config
}

func startServer(t testing.TB, mod func(*engine.Config)) *testServer {
	t.Helper()
	cfg := lockdtest.Config(t.TempDir())
	if mod != nil {
		mod(&cfg)
	}
	return startWith(t, cfg)
}

func startWith(t testing.TB, cfg engine.Config) *testServer {
	t.Helper()
	return &testServer{Server: lockdtest.StartWith(t, cfg), t: t, cfg: cfg}
}

// shutdown runs the graceful shutdown and fails the test on error.
func (ts *testServer) shutdown() {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := ts.Shutdown(ctx); err != nil {
		ts.t.Fatalf("Shutdown: %v", err)
	}
}

// shutdownAsync starts the graceful shutdown on a goroutine of its own
// (the test goes on talking to the server meanwhile); waitShutdown fails
// the test, on its own goroutine, if it did not end well.
func (ts *testServer) shutdownAsync() <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	return done
}

func (ts *testServer) waitShutdown(done <-chan error) {
	ts.t.Helper()
	if err := <-done; err != nil {
		ts.t.Fatalf("Shutdown: %v", err)
	}
}

// wire is a raw protocol client over one TCP connection.
type wire struct {
	t    testing.TB
	c    net.Conn
	buf  []byte
	resp proto.Response
}

func dial(t testing.TB, addr string) *wire {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &wire{t: t, c: c}
}

func (w *wire) send(b []byte) {
	w.t.Helper()
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatalf("write: %v", err)
	}
}

func (w *wire) acquire(key string, wait, lease uint8, owner uint64) {
	w.t.Helper()
	w.send(proto.AppendAcquire(nil, wait, lease, owner, key))
}

func (w *wire) release(key string, token uint64) {
	w.t.Helper()
	w.send(proto.AppendRelease(nil, token, key))
}

func (w *wire) renew(key string, lease uint8, token uint64) {
	w.t.Helper()
	w.send(proto.AppendRenew(nil, lease, token, key))
}

// frame is a decoded response with its tail copied.
type frame struct {
	Op    proto.Op
	ReqOp proto.Op
	ID    uint64
	Token uint64
	Code  uint8
	Tail  string
	// PROTOCOL.md §9: L's reason; V's and I's lease left; I's counts.
	Reason    uint8
	Remaining uint32
	Holders   uint16
	Limit     uint16
	Waiters   uint32
}

// next reads one response within d; ok is false on timeout or EOF.
func (w *wire) next(d time.Duration) (frame, error) {
	deadline := time.Now().Add(d)
	for {
		if len(w.buf) > 0 {
			n, err := proto.ParseResponse(w.buf, &w.resp)
			if err == nil {
				r := w.resp
				f := frame{Op: r.Op, ReqOp: r.ReqOp, ID: r.ID, Token: r.Token, Code: r.Code, Tail: string(r.Tail),
					Reason: r.Reason, Remaining: r.Remaining, Holders: r.Holders, Limit: r.Limit, Waiters: r.Waiters}
				w.buf = w.buf[n:]
				return f, nil
			}
			if err != proto.ErrIncomplete {
				w.t.Fatalf("server sent a bad frame %q: %v", w.buf, err)
			}
		}
		_ = w.c.SetReadDeadline(deadline)
		var tmp [4096]byte
		n, err := w.c.Read(tmp[:])
		w.buf = append(w.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return frame{}, err
		}
	}
}

// expect reads one response and checks its op and id.
func (w *wire) expect(op proto.Op, id uint64) frame {
	w.t.Helper()
	f, err := w.next(5 * time.Second)
	if err != nil {
		w.t.Fatalf("waiting for %c id=%d: %v", op, id, err)
	}
	if f.Op != op || f.ID != id {
		w.t.Fatalf("got %c id=%d (reqop %c code %d tail %q), want %c id=%d", f.Op, f.ID, f.ReqOp, f.Code, f.Tail, op, id)
	}
	return f
}

// grant acquires key (wait 0) and returns the token, failing otherwise.
func (w *wire) grant(key string, lease uint8, owner uint64) uint64 {
	w.t.Helper()
	w.acquire(key, 0, lease, owner)
	f := w.expect(proto.OpAcquire, owner)
	if f.Tail != key || f.Token == 0 {
		w.t.Fatalf("grant of %q: %+v", key, f)
	}
	return f.Token
}

// silent checks that nothing arrives within d.
func (w *wire) silent(d time.Duration) {
	w.t.Helper()
	f, err := w.next(d)
	if err == nil {
		w.t.Fatalf("unexpected frame %c id=%d tail %q", f.Op, f.ID, f.Tail)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		w.t.Fatalf("connection ended: %v", err)
	}
}

// closed checks that the server closes the connection within d.
func (w *wire) closed(d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		f, err := w.next(time.Until(deadline))
		if err == io.EOF || (err != nil && !isTimeout(err)) {
			return
		}
		if err != nil {
			break
		}
		w.t.Fatalf("frame %c id=%d before close", f.Op, f.ID)
	}
	w.t.Fatal("connection not closed by the server")
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
