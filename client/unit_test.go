package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// TestPendFIFO: requests with the same correlation key are answered in
// send order; one abandoned in the middle of its chain keeps its place as
// a stand-in, which takes its answer (so the next request with that id
// does not).
func TestPendFIFO(t *testing.T) {
	c := newConn(nil, "x", nil)
	ts := make([]*Ticket, 4)
	for i := range ts {
		ts[i] = &Ticket{op: proto.OpRelease, id: 7}
		c.addPendLocked(ts[i])
	}
	other := &Ticket{op: proto.OpRenew, id: 7}
	c.addPendLocked(other)
	c.abandonPendLocked(ts[2])
	for i, want := range []*Ticket{ts[0], ts[1], nil, ts[3]} {
		got := c.takePendLocked(proto.OpRelease, 7)
		switch {
		case want == nil && (got == nil || !got.tomb || got == ts[2]):
			t.Fatalf("answer %d went to %+v, want the abandoned request's stand-in", i, got)
		case want != nil && got != want:
			t.Fatalf("answer %d went to %p, want %p", i, got, want)
		}
	}
	if got := c.takePendLocked(proto.OpRelease, 7); got != nil {
		t.Fatalf("chain not empty: %p", got)
	}
	if got := c.takePendLocked(proto.OpRenew, 7); got != other {
		t.Fatal("renew with the same token lost")
	}
	if got := c.takePendLocked(proto.OpTimeout, 7); got != nil {
		t.Fatal("a non-request op matched")
	}
}

// TestServerBadFrame: E 1 closes the connection (framing is lost); a
// request possibly sent on it is indeterminate. An E 1 that is the
// server's first frame on a connection is its refusal of the connection
// (what a TLS port answers a plaintext client): nothing sent there ran,
// the call fails with ErrNoConnection and the server's message, at once,
// and nothing is sent again.
func TestServerBadFrame(t *testing.T) {
	t.Run("after an answer", func(t *testing.T) {
		f := newFake(t, func(fc *fconn, r freq) {
			if r.Op == proto.OpAcquire {
				fc.send(proto.AppendError(nil, proto.Op('?'), 0, proto.CodeBadFrame, "bad frame"))
				_ = fc.nc.Close()
				return
			}
			fc.auto(r)
		})
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		hear(t, cl, f)
		_, err := cl.Acquire(ctxT(t, 5*time.Second), "e1", AcquireOptions{Wait: time.Second})
		wantErr(t, err, ErrIndeterminate)
	})
	t.Run("first frame", func(t *testing.T) {
		const msg = "this port speaks TLS only: connect with TLS"
		f := newFake(t, func(fc *fconn, r freq) {
			fc.send(proto.AppendError(nil, r.Op, 0, proto.CodeBadFrame, msg))
			_ = fc.nc.Close()
		})
		cfg := fastConfig(f.addr())
		cfg.ReconnectInterval = time.Hour // no redial: each connection refuses once
		cl := newClient(t, cfg)
		start := time.Now()
		_, err := cl.Acquire(ctxT(t, 5*time.Second), "e1", AcquireOptions{Wait: 3 * time.Second})
		if !errors.Is(err, ErrNoConnection) || errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), msg) {
			t.Fatalf("err = %v, want ErrNoConnection with the server's message", err)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("failed after %v, want at once", el)
		}
		if n := len(f.reqs); n > 2 {
			t.Fatalf("the server saw %d acquires on 2 connections: one was sent again on a refused one", n)
		}
	})
}

// TestWithLockRenewalsFail: renewals that get no answer until the lease's
// conservative end lose the lock: fn's context ends with ErrLockLost, not
// before the lease.
func TestWithLockRenewalsFail(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpRenew {
			fc.auto(r)
		}
	})
	cl := newClient(t, fastConfig(f.addr()))
	start := time.Now()
	var lostAfter time.Duration
	err := cl.WithLock(ctxT(t, 10*time.Second), "renew-fails", AcquireOptions{Lease: time.Second}, func(ctx context.Context, l Lock) error {
		select {
		case <-ctx.Done():
			lostAfter = time.Since(start)
			if !errors.Is(context.Cause(ctx), ErrLockLost) {
				t.Errorf("cause %v", context.Cause(ctx))
			}
		case <-time.After(5 * time.Second):
			t.Error("fn's context not cancelled within 5 s")
		}
		return nil
	})
	wantErr(t, err, ErrLockLost)
	if lostAfter < time.Second {
		t.Fatalf("lock reported lost after %v, before the 1 s lease", lostAfter)
	}
}

// TestWithLockLostWhateverFnReturns: once the lock is lost (the server
// stops answering: renewals fail until the stop time), WithLock returns an
// error matching ErrLockLost whatever fn returns from its ended context
// (nil, ctx.Err(), context.Cause, its own error, which is kept too), and
// returns as soon as fn does: the release that cannot be confirmed goes on
// in the background instead of holding the caller for its retries.
func TestWithLockLostWhateverFnReturns(t *testing.T) {
	errOwn := errors.New("fn's own error")
	for _, c := range []struct {
		name string
		ret  func(ctx context.Context) error
		also error // besides ErrLockLost
	}{
		{"nil", func(context.Context) error { return nil }, nil},
		{"ctx.Err", func(ctx context.Context) error { return ctx.Err() }, nil},
		{"context.Cause", context.Cause, nil},
		{"wrapped ctx.Err", func(ctx context.Context) error { return fmt.Errorf("writing: %w", ctx.Err()) }, nil},
		{"its own error", func(context.Context) error { return errOwn }, errOwn},
	} {
		t.Run(c.name, func(t *testing.T) {
			var silent atomic.Bool
			f := newFake(t, func(fc *fconn, r freq) {
				if !silent.Load() {
					fc.auto(r)
				}
			})
			cfg := fastConfig(f.addr())
			cfg.ReleaseRetry = 3 * time.Second
			cl := newClient(t, cfg)
			var returned time.Time
			err := cl.WithLock(ctxT(t, 10*time.Second), "lost-"+c.name, AcquireOptions{Lease: time.Second}, func(ctx context.Context, l Lock) error {
				silent.Store(true) // the server dies
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
					t.Error("fn's context not cancelled within 5 s")
				}
				returned = time.Now()
				return c.ret(ctx)
			})
			if el := time.Since(returned); el > 500*time.Millisecond {
				t.Errorf("WithLock returned %v after fn, want at once (not after the release's retries)", el)
			}
			if !errors.Is(err, ErrLockLost) {
				t.Fatalf("err = %v, want ErrLockLost", err)
			}
			if c.also != nil && !errors.Is(err, c.also) {
				t.Fatalf("err = %v, want %v too", err, c.also)
			}
		})
	}
}

// TestUnansweredPingClosesConnection: an answer overdue by a whole
// transport timeout means a broken connection: it is closed.
func TestUnansweredPingClosesConnection(t *testing.T) {
	f := newFake(t, func(*fconn, freq) {})
	cfg := fastConfig(f.addr())
	cfg.TransportTimeout = 300 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	start := time.Now()
	_, err := cl.Ping(ctxT(t, 5*time.Second))
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("gave up after %v", el)
	}
	r := f.next(time.Second)
	select {
	case <-r.Conn.closed:
	case <-time.After(2 * time.Second):
		t.Fatal("connection not closed")
	}
}

// TestUnansweredReleaseClosesConnection: a release whose only attempt went
// out late in its retry window (the connection came up late) and was never
// answered, though it waited more than half a transport timeout: the
// connection is taken to be broken and closed.
func TestUnansweredReleaseClosesConnection(t *testing.T) {
	addr := deadAddr(t)
	cfg := fastConfig(addr)
	cfg.TransportTimeout = 400 * time.Millisecond
	cfg.ReleaseRetry = 600 * time.Millisecond
	cfg.ReconnectInterval = 20 * time.Millisecond
	cl := newClient(t, cfg)
	done := make(chan error, 1)
	go func() { done <- cl.Release(context.Background(), Lock{Key: "k", Token: 9}) }()
	time.Sleep(200 * time.Millisecond)
	f := newFakeAt(t, addr, func(*fconn, freq) {})
	r := f.next(2 * time.Second)
	select {
	case err := <-done:
		wantErr(t, err, ErrIndeterminate)
	case <-time.After(5 * time.Second):
		t.Fatal("release still running")
	}
	select {
	case <-r.Conn.closed:
	case <-time.After(2 * time.Second):
		t.Fatal("connection not closed")
	}
}

// TestTimerEarlyRing: arm leaves a Ticket's timer set for an earlier
// instant (a recycled Ticket's previous deadline) rather than resetting
// it. The early ring must neither end a wait before its own instant nor
// leave it without a ring at that instant.
func TestTimerEarlyRing(t *testing.T) {
	cl := newClient(t, fastConfig("127.0.0.1:1"))
	tk := cl.getTicket(context.Background(), proto.OpPing, "")
	defer cl.putTicket(tk)
	start := monoNow()
	early := start.add(30 * time.Millisecond)
	tk.arm(early)
	tk.arm(start.add(time.Hour))
	if tk.armed != early {
		t.Fatalf("a later instant reset the timer: armed %v, want %v", time.Duration(tk.armed-start), time.Duration(early-start))
	}
	const d = 150 * time.Millisecond
	if !tk.sleep(d, start.add(time.Hour)) {
		t.Fatal("sleep cut short")
	}
	if el := time.Duration(monoNow() - start); el < d || el > d+time.Second {
		t.Fatalf("sleep(%v) took %v", d, el)
	}
	// Rung: the next arm sets the timer again, even for the same instant.
	select {
	case <-tk.done:
		t.Fatal("a wake-up left over after sleep")
	default:
	}
	at := monoNow().add(20 * time.Millisecond)
	tk.arm(at)
	tk.arm(at)
	select {
	case <-tk.done:
		if monoNow() < at {
			t.Fatal("rang before its instant")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no ring after re-arming")
	}
}

// TestInstant: instants are monotonic, never 0, and convert to the
// time.Time they stand for.
func TestInstant(t *testing.T) {
	a := monoNow()
	wall := time.Now()
	if a == 0 {
		t.Fatal("monoNow returned 0, the unset instant")
	}
	if b := monoNow(); b < a {
		t.Fatalf("clock went back: %d after %d", b, a)
	}
	if d := a.add(time.Second).time().Sub(wall); d < 900*time.Millisecond || d > 1100*time.Millisecond {
		t.Fatalf("instant+1s is %v from now", d)
	}
}

// TestPendTableModel: random adds, takes and stand-in replacements (ids drawn from a
// small range so chains and probe clusters form, table grown from its
// minimum) against a model of per-id FIFO lists.
func TestPendTableModel(t *testing.T) {
	for _, idRange := range []uint64{8, 300, 1 << 62} {
		var p pendTable
		model := map[uint64][]*Ticket{}
		rng := rand.New(rand.NewPCG(idRange, 1))
		id := func() uint64 { return rng.Uint64N(idRange) * 0x1000 } // same low bits: clusters
		for step := 0; step < 200000; step++ {
			switch r := rng.IntN(10); {
			case r < 4 || len(model) == 0: // add
				tk := &Ticket{id: id()}
				p.add(tk)
				model[tk.id] = append(model[tk.id], tk)
			case r < 8: // take (more often than add: takes of absent ids miss)
				k := id()
				got := p.take(k)
				var want *Ticket
				if l := model[k]; len(l) > 0 {
					want = l[0]
					if len(l) == 1 {
						delete(model, k)
					} else {
						model[k] = l[1:]
					}
				}
				if got != want {
					t.Fatalf("range %d step %d: take(%d) = %p, want %p", idRange, step, k, got, want)
				}
			default: // put a stand-in in the place of a random pending one
				for _, l := range model {
					i := rng.IntN(len(l))
					n := &Ticket{id: l[i].id}
					p.replace(l[i], n)
					l[i] = n
					break
				}
			}
			if p.n != len(model) {
				t.Fatalf("range %d step %d: %d ids in the table, want %d", idRange, step, p.n, len(model))
			}
		}
		// Every id is still reachable, in order.
		for k, l := range model {
			for i, want := range l {
				if got := p.take(k); got != want {
					t.Fatalf("range %d: final take(%d) #%d = %p, want %p", idRange, k, i, got, want)
				}
			}
		}
		seen := 0
		p.drain(func(*Ticket) { seen++ })
		if seen != 0 || p.n != 0 {
			t.Fatalf("range %d: %d chains left after taking all", idRange, seen)
		}
	}
}

// TestStandInReleasesLateGrant: the stand-in an abandoned acquire leaves in
// the pending table releases (exact token) a grant that arrives for it.
func TestStandInReleasesLateGrant(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	mine, server := net.Pipe()
	c := newConn(cl, "pipe", mine)
	cl.wg.Add(1)
	go c.readLoop()
	defer server.Close()
	tk := &Ticket{op: proto.OpAcquire, id: 42, key: "late"}
	c.mu.Lock()
	c.addPendLocked(tk)
	c.abandonPendLocked(tk)
	c.mu.Unlock()
	if _, err := server.Write(proto.AppendAcquired(nil, 42, 777, "late")); err != nil {
		t.Fatal(err)
	}
	if r := f.next(2 * time.Second); r.Op != proto.OpRelease || r.ID != 777 || r.Key != "late" {
		t.Fatalf("got %c %d %q, want the release of 777", r.Op, r.ID, r.Key)
	}
	if tk.state != stIdle {
		t.Fatal("the abandoned request itself was answered")
	}
}
