package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// TestHeldLostOnL: a semaphore's permit is held (renewed, watched) until
// Release; an L loses it at once; Release of a lost permit returns the
// loss and sends no release.
func TestHeldLostOnL(t *testing.T) {
	wf := newWatchFake(t, nil)
	cl := newClient(t, fastConfig(wf.addr()))
	ctx := ctxT(t, 10*time.Second)
	sem := cl.Semaphore("sem-h", 3, HoldOptions{Lease: 30 * time.Second})
	h, err := sem.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r := nextOp(t, wf.fake, proto.OpShared, time.Second); r.Limit != 3 || r.Lease != 30 || r.Wait != 255 {
		t.Fatalf("S limit %d lease %d wait %d", r.Limit, r.Lease, r.Wait)
	}
	nextOp(t, wf.fake, proto.OpWatch, time.Second)
	waitFor(t, "the watch is registered", func() bool { return wf.watches(h.Token()) == 1 })
	wf.push(t, h.Token(), proto.ReasonForced, "sem-h")
	select {
	case <-h.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("not lost")
	}
	if !errors.Is(context.Cause(h.Context()), ErrLockLost) {
		t.Fatalf("Context's cause %v", context.Cause(h.Context()))
	}
	var ge *GrantEndedError
	if err := h.Release(); !errors.As(err, &ge) || ge.Reason != Forced {
		t.Fatalf("Release of a lost permit: %v", err)
	}
	noneOf(t, wf.fake, proto.OpRelease, 100*time.Millisecond)

	h2, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h2.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if r := nextOp(t, wf.fake, proto.OpRelease, time.Second); r.ID != h2.Token() {
		t.Fatalf("released %d, want %d", r.ID, h2.Token())
	}
	if err := h2.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	select {
	case <-h2.Context().Done():
	default:
		t.Fatal("Context not done after Release")
	}
}

// TestHoldWaits: Semaphore.Acquire and RWMutex's locks wait until ctx
// ends, in waits of at most 255 s; the Try forms make one attempt; a
// writer is an exclusive acquire, a reader a shared one with the largest
// limit.
func TestHoldWaits(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if (r.Op == proto.OpShared || r.Op == proto.OpAcquire) && strings.HasPrefix(r.Key, "held") {
			// Held elsewhere: T when the wire wait ends, as lockd.
			time.AfterFunc(time.Duration(r.Wait)*time.Second, func() { fc.send(proto.AppendTimeout(nil, r.ID, r.Key)) })
			return
		}
		fc.auto(r)
	})
	cl := newClient(t, fastConfig(f.addr()))
	waitUp(t, cl, 2)
	rw := cl.RWMutex("held-rw", HoldOptions{})
	sem := cl.Semaphore("held-sem", 2, HoldOptions{})
	cases := []struct {
		name  string
		call  func(ctx context.Context) (*Held, error)
		op    proto.Op
		limit uint16
		try   bool
	}{
		{"sem", sem.Acquire, proto.OpShared, 2, false},
		{"sem try", sem.TryAcquire, proto.OpShared, 2, true},
		{"rlock", rw.RLock, proto.OpShared, MaxSharedLimit, false},
		{"rlock try", rw.TryRLock, proto.OpShared, MaxSharedLimit, true},
		{"lock", rw.Lock, proto.OpAcquire, 0, false},
		{"lock try", rw.TryLock, proto.OpAcquire, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			h, err := c.call(ctx)
			if h != nil {
				t.Fatal("granted")
			}
			r := nextOp(t, f, c.op, time.Second)
			if r.Limit != c.limit {
				t.Fatalf("limit %d, want %d", r.Limit, c.limit)
			}
			if c.try {
				wantErr(t, err, ErrTimeout)
				if r.Wait != 0 {
					t.Fatalf("wire wait %d, want 0", r.Wait)
				}
				return
			}
			wantErr(t, err, context.DeadlineExceeded)
			if el := time.Since(start); el < 280*time.Millisecond || el > 600*time.Millisecond {
				t.Fatalf("gave up after %v, want at ctx's deadline (300 ms)", el)
			}
			if r.Wait != 1 {
				t.Fatalf("wire wait %d, want ctx's 300 ms rounded up", r.Wait)
			}
		})
	}
	_, err := cl.Semaphore("held-sem", 0, HoldOptions{}).Acquire(context.Background())
	wantErr(t, err, ErrInvalidLimit)
}
