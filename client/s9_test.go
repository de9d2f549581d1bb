package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/proto"
)

// The client is the lock service a fence.Validating asks.
var _ fence.Validator = (*Client)(nil)

// nextOp returns the next request of op f received, passing over others,
// failing after d.
func nextOp(t testing.TB, f *fake, op proto.Op, d time.Duration) freq {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case r := <-f.reqs:
			if r.Op == op {
				return r
			}
		case <-deadline:
			t.Fatalf("fake server: no %c request within %v", op, d)
			return freq{}
		}
	}
}

// noneOf asserts that f receives no request of op within d.
func noneOf(t testing.TB, f *fake, op proto.Op, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case r := <-f.reqs:
			if r.Op == op {
				t.Fatalf("fake server: unexpected %c %q id %d", r.Op, r.Key, r.ID)
			}
		case <-deadline:
			return
		}
	}
}

// TestAcquireSharedOutcomes: an S carries the limit, the wire wait and
// the lease, is correlated by owner like an A, and each answer gives the
// outcome Acquire would, E 7 as ErrLimitMismatch; a bad limit sends
// nothing.
func TestAcquireSharedOutcomes(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op != proto.OpShared {
			fc.auto(r)
			return
		}
		switch r.Key {
		case "granted":
			fc.send(proto.AppendAcquired(nil, r.ID, 4242, r.Key))
		case "timeout":
			fc.send(proto.AppendTimeout(nil, r.ID, r.Key))
		case "busy":
			fc.send(proto.AppendBusy(nil, r.ID, r.Key))
		case "mismatch":
			fc.send(proto.AppendError(nil, proto.OpShared, r.ID, proto.CodeLimitMismatch, "the key is held with limit 3"))
		case "denied":
			fc.send(proto.AppendError(nil, proto.OpShared, r.ID, proto.CodePermissionDenied, "no"))
		}
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	cases := []struct {
		key   string
		limit int
		want  error // nil: granted token 4242
		sent  bool
	}{
		{"granted", 5, nil, true},
		{"timeout", 5, ErrTimeout, true},
		{"busy", 65535, ErrBusy, true},
		{"mismatch", 4, ErrLimitMismatch, true},
		{"denied", 4, ErrPermissionDenied, true},
		{"granted", 0, ErrInvalidLimit, false},
		{"granted", 65536, ErrInvalidLimit, false},
		{"", 3, ErrInvalidKey, false},
	}
	for _, c := range cases {
		t.Run(c.key+"/"+strings.Repeat("l", c.limit%7), func(t *testing.T) {
			l, err := cl.AcquireShared(ctxT(t, 5*time.Second), c.key, c.limit, AcquireOptions{Wait: 3 * time.Second, Lease: 7 * time.Second})
			if c.want == nil {
				if err != nil || l.Token != 4242 || l.Key != c.key {
					t.Fatalf("AcquireShared = %+v, %v; want token 4242", l, err)
				}
			} else {
				wantErr(t, err, c.want)
			}
			if !c.sent {
				f.none(50 * time.Millisecond)
				return
			}
			r := f.next(time.Second)
			if r.Op != proto.OpShared || r.Limit != uint16(c.limit) || r.Wait != 3 || r.Lease != 7 || r.Key != c.key {
				t.Fatalf("sent %c limit %d wait %d lease %d key %q", r.Op, r.Limit, r.Wait, r.Lease, r.Key)
			}
		})
	}
	var se *ServerError
	_, err := cl.AcquireShared(ctxT(t, 5*time.Second), "mismatch", 4, AcquireOptions{Wait: time.Second})
	if !errors.As(err, &se) || se.Op != proto.OpShared || se.Code != proto.CodeLimitMismatch || !strings.Contains(err.Error(), "limit 3") {
		t.Fatalf("E 7: %v, want a *ServerError naming the op and the server's message", err)
	}
}

// TestAcquireSharedDeadlineAndDeliveryGate: a shared acquire whose wait
// ends before its answer returns ErrTimeout then, and the grant that
// comes later is released (exact token), as for an exclusive acquire.
func TestAcquireSharedDeadlineAndDeliveryGate(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpShared {
			time.AfterFunc(300*time.Millisecond, func() { fc.send(proto.AppendAcquired(nil, r.ID, 888, r.Key)) })
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	start := time.Now()
	_, err := cl.AcquireShared(context.Background(), "sem-late", 3, AcquireOptions{Wait: 100 * time.Millisecond})
	wantErr(t, err, ErrTimeout)
	if el := time.Since(start); el > 250*time.Millisecond {
		t.Fatalf("ErrTimeout after %v, want at the end of the 100 ms wait", el)
	}
	if r := nextOp(t, f, proto.OpRelease, time.Second); r.ID != 888 || r.Key != "sem-late" {
		t.Fatalf("release of %d %q, want the late grant 888", r.ID, r.Key)
	}
}

// TestAcquireSharedFollowsMoved: an M for an S sends the same request
// (owner, limit) to the member it names.
func TestAcquireSharedFollowsMoved(t *testing.T) {
	var active atomic.Pointer[string]
	ms := []*fake{member(t, &active), member(t, &active)}
	setActive(&active, ms[1].addr())
	cfg := fastConfig(ms[0].addr(), ms[1].addr())
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	cl.preferred.Store(&cfg.Addrs[0]) // ask the standby first
	l, err := cl.AcquireShared(ctxT(t, 5*time.Second), "sem-moved", 9, AcquireOptions{Wait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b := ms[0].next(time.Second), ms[1].next(time.Second)
	if a.Op != proto.OpShared || b.Op != proto.OpShared || a.ID != b.ID || b.Limit != 9 {
		t.Fatalf("standby got %c owner %d, active %c owner %d limit %d: want the same S sent again", a.Op, a.ID, b.Op, b.ID, b.Limit)
	}
	if l.Token == 0 {
		t.Fatal("no token")
	}
}

// TestValidateAndInspect: V and I answers, N, an E, and the M of a
// standby, each correlated with its request.
func TestValidateAndInspect(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		switch {
		case r.Op == proto.OpValidate && r.ID == 7:
			fc.send(proto.AppendNotHeld(nil, proto.OpValidate, r.ID, r.Key))
		case r.Op == proto.OpValidate && r.ID == 8:
			fc.send(proto.AppendError(nil, proto.OpValidate, r.ID, proto.CodePermissionDenied, "monitor only"))
		case r.Op == proto.OpInspect && r.Key == "busy-key":
			fc.send(proto.AppendInspection(nil, r.ID, 3, 5, 11, 9001, 2500, r.Key))
		default:
			fc.auto(r)
		}
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 5*time.Second)
	left, err := cl.Validate(ctx, "v", 6)
	if err != nil || left != fakeRemaining {
		t.Fatalf("Validate = %v, %v; want %v", left, err, fakeRemaining)
	}
	if r := f.next(time.Second); r.Op != proto.OpValidate || r.ID != 6 || r.Key != "v" {
		t.Fatalf("sent %c %d %q", r.Op, r.ID, r.Key)
	}
	_, err = cl.Validate(ctx, "v", 7)
	wantErr(t, err, ErrNotHeld)
	_, err = cl.Validate(ctx, "v", 8)
	wantErr(t, err, ErrPermissionDenied)
	in, err := cl.Inspect(ctx, "busy-key")
	want := Inspection{Key: "busy-key", Holders: 3, Limit: 5, Waiters: 11, Token: 9001, Remaining: 2500 * time.Millisecond}
	if err != nil || in != want {
		t.Fatalf("Inspect = %+v, %v; want %+v", in, err, want)
	}
	in, err = cl.Inspect(ctx, "free-key")
	if err != nil || !in.Free() || in.Limit != 0 || in.Token != 0 {
		t.Fatalf("Inspect of a free key = %+v, %v", in, err)
	}
	_, err = cl.Validate(ctx, "", 1)
	wantErr(t, err, ErrInvalidKey)
	_, err = cl.Inspect(ctx, strings.Repeat("k", 1025))
	wantErr(t, err, ErrInvalidKey)
}

// TestValidateResentAfterLostConnection: a validate whose connection is
// lost before its answer is sent again (it changes nothing).
func TestValidateResentAfterLostConnection(t *testing.T) {
	var dropped atomic.Bool
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpValidate && dropped.CompareAndSwap(false, true) {
			_ = fc.nc.Close()
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	hear(t, cl, f)
	left, err := cl.Validate(ctxT(t, 5*time.Second), "v", 6)
	if err != nil || left != fakeRemaining {
		t.Fatalf("Validate = %v, %v", left, err)
	}
	if a, b := nextOp(t, f, proto.OpValidate, time.Second), nextOp(t, f, proto.OpValidate, time.Second); a.Conn == b.Conn {
		t.Fatal("sent again on the connection that was lost")
	}
}

// watchFake answers every request as auto does, and lets a test push an
// L to the connection that registered a watch of a token.
type watchFake struct {
	*fake
	mu      sync.Mutex
	watched map[uint64][]*fconn // token → connections that registered a W, in order
	answer  func(fc *fconn, r freq) bool
}

func newWatchFake(t *testing.T, answer func(fc *fconn, r freq) bool) *watchFake {
	wf := &watchFake{watched: map[uint64][]*fconn{}, answer: answer}
	wf.fake = newFake(t, func(fc *fconn, r freq) {
		if wf.answer != nil && wf.answer(fc, r) {
			return
		}
		fc.auto(r)
		if r.Op == proto.OpWatch {
			// Recorded once its W answer is written: an L pushed after
			// that follows it on the connection, as lockd's does.
			wf.mu.Lock()
			wf.watched[r.ID] = append(wf.watched[r.ID], fc)
			wf.mu.Unlock()
		}
	})
	return wf
}

// push sends an L for token to the connection of its latest watch.
func (wf *watchFake) push(t testing.TB, token uint64, reason uint8, key string) {
	t.Helper()
	wf.pushAs(t, token, token, reason, key)
}

// pushAs sends an L carrying token to the connection of the latest watch
// of watched.
func (wf *watchFake) pushAs(t testing.TB, watched, token uint64, reason uint8, key string) {
	t.Helper()
	// The fake records a watch just after writing its answer, so the
	// client may have read that answer (and the test gone on) a moment
	// before the record is there.
	var cs []*fconn
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		wf.mu.Lock()
		cs = wf.watched[watched]
		wf.mu.Unlock()
		if len(cs) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(cs) == 0 {
		t.Fatalf("no watch of token %d within 2 s", watched)
	}
	cs[len(cs)-1].send(proto.AppendLost(nil, token, reason, key))
}

func (wf *watchFake) watches(token uint64) int {
	wf.mu.Lock()
	defer wf.mu.Unlock()
	return len(wf.watched[token])
}

// TestWatchEnds: a Watch ends with the reason of its L (1, 2, 3), at
// once; an L for another token changes nothing.
func TestWatchEnds(t *testing.T) {
	for _, reason := range []EndReason{Released, Expired, Forced} {
		t.Run(reason.String(), func(t *testing.T) {
			wf := newWatchFake(t, nil)
			cl := newClient(t, fastConfig(wf.addr()))
			w, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: 55})
			if err != nil {
				t.Fatal(err)
			}
			if r := nextOp(t, wf.fake, proto.OpWatch, time.Second); r.ID != 55 || r.Key != "w" {
				t.Fatalf("W %d %q", r.ID, r.Key)
			}
			wf.pushAs(t, 55, 56, 1, "w") // another grant's: dropped
			select {
			case <-w.Done():
				t.Fatalf("ended by another token's L: %v", w.Err())
			case <-time.After(50 * time.Millisecond):
			}
			start := time.Now()
			wf.push(t, 55, uint8(reason), "w")
			select {
			case <-w.Done():
			case <-time.After(2 * time.Second):
				t.Fatal("not ended within 2 s of the L")
			}
			if el := time.Since(start); el > 100*time.Millisecond {
				t.Fatalf("ended %v after the L", el)
			}
			var ge *GrantEndedError
			if !errors.As(w.Err(), &ge) || ge.Reason != reason || ge.Token != 55 || ge.Key != "w" || !errors.Is(w.Err(), ErrLockLost) || w.Reason() != reason {
				t.Fatalf("Err = %v, Reason %v; want %v", w.Err(), w.Reason(), reason)
			}
			w.Stop() // after the end: nothing changes
			if !errors.As(w.Err(), &ge) {
				t.Fatalf("Err after Stop = %v", w.Err())
			}
		})
	}
}

// TestWatchAnsweredAndEndedInOneRead: a W answer and its L in one write
// (a grant that ended at once) end the watch: the registration is filed
// before the waiter wakes.
func TestWatchAnsweredAndEndedInOneRead(t *testing.T) {
	wf := newWatchFake(t, func(fc *fconn, r freq) bool {
		if r.Op != proto.OpWatch {
			return false
		}
		b := proto.AppendWatching(nil, r.ID, r.Key)
		fc.send(proto.AppendLost(b, r.ID, proto.ReasonExpired, r.Key))
		return true
	})
	cl := newClient(t, fastConfig(wf.addr()))
	w, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w1", Token: 5})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("not ended")
	}
	if w.Reason() != Expired {
		t.Fatalf("Err = %v", w.Err())
	}
}

// TestWatchRefused: N, E 6, E 8 on every connection and E 1 of a server
// without §9 are Watch's errors; E 8 on one connection sends the watch to
// the other.
func TestWatchRefused(t *testing.T) {
	cases := []struct {
		name   string
		answer func(fc *fconn, r freq) []byte
		want   error
		sends  int
	}{
		{"not held", func(fc *fconn, r freq) []byte { return proto.AppendNotHeld(nil, proto.OpWatch, r.ID, r.Key) }, ErrNotHeld, 1},
		{"permission denied", func(fc *fconn, r freq) []byte {
			return proto.AppendError(nil, proto.OpWatch, r.ID, proto.CodePermissionDenied, "no")
		}, ErrPermissionDenied, 1},
		{"limit on every connection", func(fc *fconn, r freq) []byte {
			return proto.AppendError(nil, proto.OpWatch, r.ID, proto.CodeLimitReached, "1024 watches")
		}, ErrWatchLimit, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, func(fc *fconn, r freq) {
				if r.Op == proto.OpWatch {
					fc.send(c.answer(fc, r))
					return
				}
				fc.auto(r)
			})
			cl := newClient(t, fastConfig(f.addr()))
			waitUp(t, cl, 2)
			_, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: 1})
			wantErr(t, err, c.want)
			conns := map[*fconn]bool{}
			for i := 0; i < c.sends; i++ {
				conns[nextOp(t, f, proto.OpWatch, time.Second).Conn] = true
			}
			if len(conns) != c.sends {
				t.Fatalf("%d watches went to %d connections", c.sends, len(conns))
			}
			noneOf(t, f, proto.OpWatch, 100*time.Millisecond)
		})
	}
	t.Run("limit on one connection", func(t *testing.T) {
		var full atomic.Pointer[fconn]
		f := newFake(t, func(fc *fconn, r freq) {
			if r.Op == proto.OpWatch && full.CompareAndSwap(nil, fc) || full.Load() == fc && r.Op == proto.OpWatch {
				fc.send(proto.AppendError(nil, proto.OpWatch, r.ID, proto.CodeLimitReached, "full"))
				return
			}
			fc.auto(r)
		})
		cl := newClient(t, fastConfig(f.addr()))
		waitUp(t, cl, 2)
		for i := uint64(1); i <= 4; i++ {
			if _, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: i}); err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
		}
		refused := 0
		for _, r := range drain(f) {
			if r.Op == proto.OpWatch && r.Conn == full.Load() {
				refused++
			}
		}
		if refused != 1 {
			t.Fatalf("the full connection was sent %d watches, want 1 (the one it refused)", refused)
		}
	})
}

// TestWatchRewatch: after an L with reason 4 (the member can no longer
// tell) or a lost connection, the Watch registers again, following M to
// the member that serves, and ends with the reason lockd gives there; a
// registration answered N ends it with ErrNotHeld.
func TestWatchRewatch(t *testing.T) {
	t.Run("reason 4, then M to the new active", func(t *testing.T) {
		var active atomic.Pointer[string]
		var tells [2]atomic.Pointer[fconn] // the connection of each member's latest W
		mk := func(i int) *fake {
			return newFake(t, func(fc *fconn, r freq) {
				self := fc.nc.LocalAddr().String()
				if p := active.Load(); p == nil || *p != self {
					a := ""
					if p != nil {
						a = *p
					}
					fc.send(proto.AppendMoved(nil, r.Op, r.ID, a))
					return
				}
				if r.Op == proto.OpWatch {
					tells[i].Store(fc)
				}
				fc.auto(r)
			})
		}
		ms := []*fake{mk(0), mk(1)}
		setActive(&active, ms[0].addr())
		cl := newClient(t, fastConfig(ms[0].addr(), ms[1].addr()))
		waitUp(t, cl, 2)
		w, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: 77})
		if err != nil {
			t.Fatal(err)
		}
		nextOp(t, ms[0], proto.OpWatch, time.Second)
		waitFor(t, "member 0 has the watch", func() bool { return tells[0].Load() != nil })
		// Member 0 hands over to member 1 and says it can no longer tell.
		setActive(&active, ms[1].addr())
		tells[0].Load().send(proto.AppendLost(nil, 77, proto.ReasonCannotTell, "w"))
		nextOp(t, ms[1], proto.OpWatch, 2*time.Second)
		waitFor(t, "member 1 has the watch", func() bool { return tells[1].Load() != nil })
		select {
		case <-w.Done():
			t.Fatalf("ended by reason 4: %v", w.Err())
		default:
		}
		tells[1].Load().send(proto.AppendLost(nil, 77, proto.ReasonForced, "w"))
		select {
		case <-w.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("not ended")
		}
		if w.Reason() != Forced {
			t.Fatalf("Err = %v, want forced", w.Err())
		}
	})
	t.Run("connection lost, grant gone", func(t *testing.T) {
		var gone atomic.Bool
		wf := newWatchFake(t, func(fc *fconn, r freq) bool {
			if r.Op == proto.OpWatch && gone.Load() {
				fc.send(proto.AppendNotHeld(nil, proto.OpWatch, r.ID, r.Key))
				return true
			}
			return false
		})
		cl := newClient(t, fastConfig(wf.addr()))
		waitUp(t, cl, 2)
		hear(t, cl, wf.fake)
		w, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: 9})
		if err != nil {
			t.Fatal(err)
		}
		first := nextOp(t, wf.fake, proto.OpWatch, time.Second)
		gone.Store(true) // the grant ends while no one watches
		_ = first.Conn.nc.Close()
		second := nextOp(t, wf.fake, proto.OpWatch, 2*time.Second)
		if second.Conn == first.Conn || second.ID != 9 {
			t.Fatalf("registered again on the lost connection, or for token %d", second.ID)
		}
		select {
		case <-w.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("not ended")
		}
		wantErr(t, w.Err(), ErrNotHeld)
	})
	t.Run("stop", func(t *testing.T) {
		wf := newWatchFake(t, nil)
		cl := newClient(t, fastConfig(wf.addr()))
		w, err := cl.Watch(ctxT(t, 5*time.Second), Lock{Key: "w", Token: 3})
		if err != nil {
			t.Fatal(err)
		}
		nextOp(t, wf.fake, proto.OpWatch, time.Second)
		w.Stop()
		wantErr(t, w.Err(), ErrWatchStopped)
		wf.push(t, 3, 1, "w") // absorbed
		noneOf(t, wf.fake, proto.OpWatch, 100*time.Millisecond)
	})
}

// TestKeepAliveWatched: a KeepAlive watches its lock; an L with reason
// 1–3 loses it at once, long before the next renewal, with the reason.
func TestKeepAliveWatched(t *testing.T) {
	for _, reason := range []EndReason{Released, Expired, Forced} {
		t.Run(reason.String(), func(t *testing.T) {
			wf := newWatchFake(t, nil)
			cl := newClient(t, fastConfig(wf.addr()))
			ctx := ctxT(t, 10*time.Second)
			l, err := cl.Acquire(ctx, "ka-w", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer ka.Stop()
			if r := nextOp(t, wf.fake, proto.OpWatch, time.Second); r.ID != l.Token || r.Key != "ka-w" {
				t.Fatalf("watch of %d %q, want the lock's", r.ID, r.Key)
			}
			waitFor(t, "the watch is registered", func() bool { return wf.watches(l.Token) == 1 })
			start := time.Now()
			wf.push(t, l.Token, uint8(reason), l.Key)
			select {
			case <-ka.Lost():
			case <-time.After(2 * time.Second):
				t.Fatal("not lost within 2 s of the L (renewals are 10 s apart)")
			}
			if el := time.Since(start); el > 100*time.Millisecond {
				t.Fatalf("lost %v after the L", el)
			}
			var ge *GrantEndedError
			if !errors.As(ka.Err(), &ge) || ge.Reason != reason || !errors.Is(context.Cause(ka.Context()), ErrLockLost) {
				t.Fatalf("Err = %v, cause %v", ka.Err(), context.Cause(ka.Context()))
			}
		})
	}
}

// TestKeepAliveRewatchRenews: after an L with reason 4 the KeepAlive
// renews at once (the renewal confirms the lock where the cluster serves)
// and watches again; NoWatch sends no watch at all.
func TestKeepAliveRewatchRenews(t *testing.T) {
	wf := newWatchFake(t, nil)
	cl := newClient(t, fastConfig(wf.addr()))
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka-4", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Stop()
	nextOp(t, wf.fake, proto.OpWatch, time.Second)
	waitFor(t, "the watch is registered", func() bool { return wf.watches(l.Token) == 1 })
	wf.push(t, l.Token, proto.ReasonCannotTell, l.Key)
	if r := nextOp(t, wf.fake, proto.OpRenew, time.Second); r.ID != l.Token {
		t.Fatalf("renewal of %d", r.ID)
	}
	nextOp(t, wf.fake, proto.OpWatch, time.Second)
	select {
	case <-ka.Lost():
		t.Fatalf("lost on reason 4: %v", ka.Err())
	default:
	}

	l2, err := cl.Acquire(ctx, "ka-nowatch", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka2, err := cl.KeepAlive(ctx, l2, KeepAliveOptions{Lease: 30 * time.Second, NoWatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ka2.Stop()
	noneOf(t, wf.fake, proto.OpWatch, 200*time.Millisecond)
}

// TestKeepAliveWatchLimit: a KeepAlive whose watch every connection
// refuses (E 8) keeps renewing, not lost, and tries the watch again a
// renewal interval later.
func TestKeepAliveWatchLimit(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpWatch && refuse.Load() {
			fc.send(proto.AppendError(nil, proto.OpWatch, r.ID, proto.CodeLimitReached, "full"))
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka-full", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second, Every: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Stop()
	nextOp(t, f, proto.OpWatch, time.Second)
	nextOp(t, f, proto.OpWatch, time.Second) // the other connection
	refuse.Store(false)
	start := time.Now()
	nextOp(t, f, proto.OpWatch, 2*time.Second)
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("watch sent again after %v, want a renewal interval (300 ms) after the refusals", el)
	}
	nextOp(t, f, proto.OpRenew, time.Second)
	select {
	case <-ka.Lost():
		t.Fatalf("lost: %v", ka.Err())
	default:
	}
}

// oldServer answers like a lockd without §9: the first §9 request it
// reads on a connection gets E 1 (op the byte it read, id 0) and the
// connection closes; nothing after it on that connection is executed.
// Acquires of keys named "queued…" stay queued (never answered).
func oldServer(t *testing.T) *fake {
	var dead sync.Map // *fconn → true once it refused
	return newFake(t, func(fc *fconn, r freq) {
		if _, ok := dead.Load(fc); ok {
			return
		}
		if is9(r.Op) {
			dead.Store(fc, true)
			fc.send(proto.AppendError(nil, r.Op, 0, proto.CodeBadFrame, "bad frame"))
			_ = fc.nc.Close()
			return
		}
		if r.Op == proto.OpAcquire && strings.HasPrefix(r.Key, "queued") {
			return
		}
		fc.auto(r)
	})
}

// TestUnsupported: a server without §9 answers a §9 request E 1 and
// closes. The request fails with ErrUnsupported, naming the server;
// requests sent after it on that connection were not executed and go to
// the other connection; an acquire sent before it, queued, may have been
// granted: ErrIndeterminate. Later §9 requests to that server fail at
// once, unsent; a KeepAlive's watch gives up and its renewals go on.
func TestUnsupported(t *testing.T) {
	f := oldServer(t)
	cfg := fastConfig(f.addr())
	cfg.ConnsPerAddr = 2
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)
	hear(t, cl, f)
	// Put a queued acquire, the §9 request and a release after it on one
	// connection, in that order, in one batch.
	c := (*cl.slots.Load())[0].cur.Load()
	ctx := ctxT(t, 10*time.Second)
	queued := cl.getTicket(ctx, proto.OpAcquire, "queued-1")
	queued.id, queued.lease, queued.waitEnd, queued.sendBy = 1, 30, monoNow().add(5*time.Second), monoNow().add(5*time.Second)
	shared := cl.getTicket(ctx, proto.OpShared, "sem")
	shared.id, shared.lease, shared.limit, shared.waitEnd, shared.sendBy = 2, 30, 3, monoNow().add(5*time.Second), monoNow().add(5*time.Second)
	rel := cl.getTicket(ctx, proto.OpRelease, "other")
	rel.id, rel.hardBy, rel.sendBy, rel.timeout = 99, monoNow().add(2*time.Second), monoNow().add(2*time.Second), 2*time.Second
	c.mu.Lock()
	c.writing = true // this test's goroutine flushes the batch
	for _, tk := range []*Ticket{queued, shared, rel} {
		tk.conn, tk.state = c, stQueued
		c.queue = append(c.queue, tk)
	}
	c.mu.Unlock()
	start := time.Now()
	c.flush()
	_, err := shared.acquire()
	wantErr(t, err, ErrUnsupported)
	if errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), f.addr()) {
		t.Fatalf("err = %v, want ErrUnsupported naming %s", err, f.addr())
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("ErrUnsupported after %v, want at once", el)
	}
	_, err = queued.acquire()
	wantErr(t, err, ErrIndeterminate)
	if errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "closed the connection on refusing a later acquire-shared") {
		t.Fatalf("the queued acquire: %v, want ErrIndeterminate saying the connection ended on a §9 refusal", err)
	}
	if err := rel.retrying(rel.hardBy, cfg.ReleaseRetryInterval); err != nil {
		t.Fatalf("the release sent after the refused request: %v, want it sent again elsewhere and answered", err)
	}
	// The refusing connection's reader records the release after it sent
	// the refusal, so it may come after the retry's answer: wait for it.
	var relConns []*fconn
	for end := time.Now().Add(2 * time.Second); len(relConns) < 2 && time.Now().Before(end); {
		select {
		case r := <-f.reqs:
			if r.Op == proto.OpRelease {
				relConns = append(relConns, r.Conn)
			}
		case <-time.After(10 * time.Millisecond):
		}
	}
	if len(relConns) != 2 || relConns[0] == relConns[1] {
		t.Fatalf("the release was received on %d connections, want 2 (the refusing one, not executing it, then the other)", len(relConns))
	}

	// The server is known not to speak §9: nothing more is sent to it.
	for _, call := range []func() error{
		func() error { _, err := cl.Validate(ctx, "k", 1); return err },
		func() error { _, err := cl.Inspect(ctx, "k"); return err },
		func() error { _, err := cl.AcquireShared(ctx, "k", 2, AcquireOptions{Wait: time.Second}); return err },
		func() error { _, err := cl.Watch(ctx, Lock{Key: "k", Token: 1}); return err },
	} {
		start := time.Now()
		wantErr(t, call(), ErrUnsupported)
		if el := time.Since(start); el > 100*time.Millisecond {
			t.Fatalf("took %v, want at once", el)
		}
	}
	noneOf(t, f, proto.OpValidate, 50*time.Millisecond)

	// A KeepAlive renews without its watch.
	l, err := cl.Acquire(ctx, "ka-old", AcquireOptions{Wait: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second, Every: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	nextOp(t, f, proto.OpRenew, time.Second)
	nextOp(t, f, proto.OpRenew, time.Second)
	if err := ka.Stop(); err != nil {
		t.Fatalf("keep-alive against a server without §9: %v", err)
	}
}

// TestUnsupportedFirstKeepAlive: against a server without §9 that has not
// refused anything yet, a KeepAlive's watch costs that one connection
// (the server closes it) and nothing else: the keep-alive goes on.
func TestUnsupportedFirstKeepAlive(t *testing.T) {
	f := oldServer(t)
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	ctx := ctxT(t, 10*time.Second)
	l, err := cl.Acquire(ctx, "ka-old", AcquireOptions{Wait: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 3 * time.Second, Every: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	nextOp(t, f, proto.OpWatch, time.Second)
	waitFor(t, "the watch gives up", func() bool { return ka.w.Err() != nil })
	wantErr(t, ka.w.Err(), ErrUnsupported)
	nextOp(t, f, proto.OpRenew, time.Second)
	nextOp(t, f, proto.OpRenew, time.Second)
	noneOf(t, f, proto.OpWatch, 100*time.Millisecond)
	if err := ka.Stop(); err != nil {
		t.Fatalf("keep-alive: %v", err)
	}
}
