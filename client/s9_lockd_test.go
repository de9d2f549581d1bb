package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/fence"
)

// The tests of PROTOCOL.md §9 against the lockd binary.

// forceRelease releases key's grant (every holder of a shared key, or the
// one with token if not 0) through p's admin endpoint: an operator's
// forced release, which lockd reports to watches with reason 3.
func (p *lockdProc) forceRelease(t testing.TB, key string, token uint64) {
	t.Helper()
	u := "http://" + p.admin + "/keys/" + strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
	if token != 0 {
		u += "?token=" + strconv.FormatUint(token, 10)
	}
	req, err := http.NewRequest(http.MethodDelete, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := adminHTTP.Do(req)
	if err != nil {
		t.Fatalf("DELETE %s: %v", u, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE %s: %s", u, resp.Status)
	}
}

// metric returns the value of the metric line name (with its labels, as
// lockd's /metrics prints it), 0 if absent.
func (p *lockdProc) metric(t testing.TB, name string) float64 {
	t.Helper()
	resp, err := adminHTTP.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for _, line := range strings.Split(sb.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// TestSharedOpsRealServer: S, V, I and W against lockd: holders up to
// the limit, each with its own token; the limit in force refuses another
// (E 7); V and I tell the truth; a watch ends with the reason lockd gives.
func TestSharedOpsRealServer(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 20*time.Second)
	const key = "s9/ops"
	opts := AcquireOptions{Wait: time.Second, Lease: 20 * time.Second}
	a, err := cl.AcquireShared(ctx, key, 2, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.AcquireShared(ctx, key, 2, opts)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token <= a.Token {
		t.Fatalf("tokens %d then %d: not increasing", a.Token, b.Token)
	}
	_, err = cl.AcquireShared(ctx, key, 2, AcquireOptions{Wait: 0})
	wantErr(t, err, ErrTimeout)
	_, err = cl.AcquireShared(ctx, key, 3, opts)
	wantErr(t, err, ErrLimitMismatch)
	_, err = cl.Acquire(ctx, key, AcquireOptions{Wait: 0})
	wantErr(t, err, ErrTimeout)

	for _, l := range []Lock{a, b} {
		left, err := cl.Validate(ctx, key, l.Token)
		if err != nil || left <= 19*time.Second || left > 20*time.Second {
			t.Fatalf("Validate(%d) = %v, %v; want about 20 s", l.Token, left, err)
		}
	}
	_, err = cl.Validate(ctx, key, b.Token+1000)
	wantErr(t, err, ErrNotHeld)
	_, err = cl.Validate(ctx, "s9/other", a.Token)
	wantErr(t, err, ErrNotHeld)

	in, err := cl.Inspect(ctx, key)
	if err != nil || in.Holders != 2 || in.Limit != 2 || in.Waiters != 0 || in.Token != b.Token || in.Remaining <= 19*time.Second {
		t.Fatalf("Inspect = %+v, %v", in, err)
	}
	in, err = cl.Inspect(ctx, "s9/free")
	if err != nil || !in.Free() || in.Limit != 0 {
		t.Fatalf("Inspect of a free key = %+v, %v", in, err)
	}

	w, err := cl.Watch(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Watch(ctx, Lock{Key: key, Token: b.Token + 1000})
	wantErr(t, err, ErrNotHeld)
	if err := cl.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("watch not ended by the release")
	}
	if w.Reason() != Released {
		t.Fatalf("watch: %v", w.Err())
	}
	_, err = cl.Validate(ctx, key, a.Token)
	wantErr(t, err, ErrNotHeld)
	if err := cl.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Free again: any limit.
	c, err := cl.AcquireShared(ctx, key, 3, opts)
	if err != nil {
		t.Fatalf("a new limit on a free key: %v", err)
	}
	if err := cl.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreNeverOverRealServer: goroutines sharing a semaphore of N
// permits through lockd are never more than N inside at once, and reach
// N; each checks its token with lockd (fence.Validating) while inside.
func TestSemaphoreNeverOverRealServer(t *testing.T) {
	srv := sharedServer(t)
	const permits, workers, rounds = 3, 12, 15
	var inside, peak, entered atomic.Int32
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			// Clients of their own, as processes of a fleet would be.
			cl := newClient(t, fastConfig(srv.Addr()))
			sem := cl.Semaphore("s9/sem", permits, HoldOptions{Lease: 10 * time.Second})
			check := &fence.Validating{V: cl}
			for i := 0; i < rounds && time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				h, err := sem.Acquire(ctx)
				cancel()
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				n := inside.Add(1)
				entered.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				if n > permits {
					t.Errorf("%d holders inside a semaphore of %d", n, permits)
				}
				err = check.Do(h.Context(), "s9/sem", h.Token(), func(context.Context) error {
					time.Sleep(2 * time.Millisecond)
					return nil
				})
				if err != nil {
					t.Errorf("worker %d: lockd did not confirm a held permit: %v", w, err)
				}
				inside.Add(-1)
				if err := h.Release(); err != nil {
					t.Errorf("worker %d: Release: %v", w, err)
				}
			}
		}(w)
	}
	wg.Wait()
	if peak.Load() != permits {
		t.Fatalf("at most %d inside at once over %d entries, want %d", peak.Load(), entered.Load(), permits)
	}
	t.Logf("%d entries, at most %d inside at once", entered.Load(), peak.Load())
}

// TestRWMutexRealServer: no reader is inside while a writer is, no two
// writers at once; a writer waiting at the queue's head holds back
// readers that come after it, and gets the lock when the readers before
// it leave.
func TestRWMutexRealServer(t *testing.T) {
	srv := sharedServer(t)
	t.Run("exclusion", func(t *testing.T) {
		var mu sync.Mutex
		readers, writers := 0, 0
		var reads, writes atomic.Int32
		var wg sync.WaitGroup
		deadline := time.Now().Add(20 * time.Second)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				cl := newClient(t, fastConfig(srv.Addr()))
				rw := cl.RWMutex("s9/rw", HoldOptions{Lease: 10 * time.Second})
				for i := 0; i < 12 && time.Now().Before(deadline); i++ {
					write := (w+i)%4 == 0
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var h *Held
					var err error
					if write {
						h, err = rw.Lock(ctx)
					} else {
						h, err = rw.RLock(ctx)
					}
					cancel()
					if err != nil {
						t.Errorf("worker %d: %v", w, err)
						return
					}
					mu.Lock()
					if write {
						if readers > 0 || writers > 0 {
							t.Errorf("a writer entered with %d readers and %d writers inside", readers, writers)
						}
						writers++
						writes.Add(1)
					} else {
						if writers > 0 {
							t.Errorf("a reader entered with a writer inside")
						}
						readers++
						reads.Add(1)
					}
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					if write {
						writers--
					} else {
						readers--
					}
					mu.Unlock()
					if err := h.Release(); err != nil {
						t.Errorf("worker %d: Release: %v", w, err)
					}
				}
			}(w)
		}
		wg.Wait()
		if reads.Load() == 0 || writes.Load() == 0 {
			t.Fatalf("%d reads, %d writes", reads.Load(), writes.Load())
		}
	})
	t.Run("waiting writer holds back later readers", func(t *testing.T) {
		cl := newClient(t, fastConfig(srv.Addr()))
		ctx := ctxT(t, 20*time.Second)
		rw := cl.RWMutex("s9/rw-fifo", HoldOptions{Lease: 10 * time.Second})
		r1, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := rw.TryRLock(ctx) // readers share
		if err != nil {
			t.Fatalf("a second reader: %v", err)
		}
		type got struct {
			h   *Held
			err error
			at  time.Time
		}
		wch := make(chan got, 1)
		go func() {
			h, err := rw.Lock(ctx)
			wch <- got{h, err, time.Now()}
		}()
		waitFor(t, "the writer queues", func() bool {
			in, err := cl.Inspect(ctx, "s9/rw-fifo")
			return err == nil && in.Waiters == 1
		})
		_, err = rw.TryRLock(ctx)
		wantErr(t, err, ErrTimeout) // held back, though readers hold the key
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = rw.RLock(rctx)
		cancel()
		wantErr(t, err, context.DeadlineExceeded)
		if err := r1.Release(); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-wch:
			t.Fatalf("the writer got in with a reader inside: %v", g.err)
		case <-time.After(50 * time.Millisecond):
		}
		released := time.Now()
		if err := r2.Release(); err != nil {
			t.Fatal(err)
		}
		g := <-wch
		if g.err != nil {
			t.Fatalf("writer: %v", g.err)
		}
		if d := g.at.Sub(released); d > 500*time.Millisecond {
			t.Fatalf("the writer got the lock %v after the last reader left", d)
		}
		if _, err := rw.TryRLock(ctx); !errors.Is(err, ErrTimeout) {
			t.Fatalf("a reader while the writer holds: %v", err)
		}
		if err := g.h.Release(); err != nil {
			t.Fatal(err)
		}
		r3, err := rw.TryRLock(ctx)
		if err != nil {
			t.Fatalf("a reader after the writer: %v", err)
		}
		_ = r3.Release()
	})
}

// TestLostOnLRealServer: a held lock is reported lost within a few
// milliseconds of its forced release or its expiry, not at the next
// renewal (10 s away).
func TestLostOnLRealServer(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	ctx := ctxT(t, 20*time.Second)
	waitWatches := func(n float64) {
		t.Helper()
		waitFor(t, "lockd counts the watch", func() bool { return srv.metric(t, "lockd_watches") >= n })
	}
	t.Run("forced", func(t *testing.T) {
		h, err := cl.Semaphore("s9/lost-forced", 2, HoldOptions{Lease: 30 * time.Second}).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitWatches(1)
		start := time.Now()
		srv.forceRelease(t, "s9/lost-forced", h.Token())
		select {
		case <-h.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("not lost within 5 s of the forced release")
		}
		el := time.Since(start) // includes the DELETE's own round trip
		t.Logf("lost %v after the DELETE was sent", el)
		if el > 100*time.Millisecond {
			t.Fatalf("lost %v after the forced release, want a few ms", el)
		}
		var ge *GrantEndedError
		if !errors.As(h.Err(), &ge) || ge.Reason != Forced {
			t.Fatalf("Err = %v, want forced", h.Err())
		}
		_ = h.Release()
	})
	t.Run("expired", func(t *testing.T) {
		l, err := cl.Acquire(ctx, "s9/lost-expired", AcquireOptions{Wait: time.Second, Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		w, err := cl.Watch(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("no end within 5 s of a 1 s lease")
		}
		late := time.Since(l.Expires) // Expires: the acquire's send + 1 s, before the server's end
		t.Logf("expiry reported %v after the client's conservative end of the lease", late)
		if late < 0 || late > 100*time.Millisecond {
			t.Fatalf("expiry reported %v after Lock.Expires, want within lockd's 50 ms and a few ms", late)
		}
		if w.Reason() != Expired {
			t.Fatalf("Err = %v, want expired", w.Err())
		}
	})
	t.Run("released elsewhere", func(t *testing.T) {
		l, err := cl.Acquire(ctx, "s9/lost-released", AcquireOptions{Wait: time.Second, Lease: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer ka.Stop()
		other := newClient(t, fastConfig(srv.Addr()))
		waitFor(t, "the keep-alive's watch registered", func() bool {
			return ka.w.Err() == nil && srv.metric(t, "lockd_watches") >= 1
		})
		start := time.Now()
		if err := other.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ka.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("not lost within 5 s")
		}
		if el := time.Since(start); el > 100*time.Millisecond {
			t.Fatalf("lost %v after the release from elsewhere", el)
		}
		var ge *GrantEndedError
		if !errors.As(ka.Err(), &ge) || ge.Reason != Released {
			t.Fatalf("Err = %v", ka.Err())
		}
	})
}

// lowAddr is 127.0.0.1 with a free port below the ephemeral range, for a
// lockd that must come back on the same address.
func lowAddr(t *testing.T) string {
	t.Helper()
	for p := 20000 + int(time.Now().UnixNano()%10000); p < 32000; p += 7 {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err == nil {
			ln.Close()
			return "127.0.0.1:" + strconv.Itoa(p)
		}
	}
	t.Fatal("no free port")
	return ""
}

// TestKeepAliveRewatchAcrossRestart: a single lockd's graceful restart
// ends every watch with reason 4 ("this member can no longer tell"); the
// lock comes back with its token from the shutdown snapshot; the
// keep-alive renews and watches again on the restarted lockd, so a forced
// release there is known at once.
func TestKeepAliveRewatchAcrossRestart(t *testing.T) {
	addr := lowAddr(t)
	dir := t.TempDir()
	srv := startLockd(t, dir, "--listen", addr)
	cfg := fastConfig(addr)
	cl := newClient(t, cfg)
	ctx := ctxT(t, 30*time.Second)
	l, err := cl.Acquire(ctx, "s9/restart", AcquireOptions{Wait: time.Second, Lease: 9 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 9 * time.Second, Every: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Stop()
	waitFor(t, "the watch registered", func() bool { return srv.metric(t, "lockd_watches") == 1 })
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv = startLockd(t, dir, "--listen", addr)
	defer func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "the watch registered again on the restarted lockd", func() bool { return srv.metric(t, "lockd_watches") == 1 })
	select {
	case <-ka.Lost():
		t.Fatalf("lost across the restart: %v", ka.Err())
	default:
	}
	start := time.Now()
	srv.forceRelease(t, "s9/restart", l.Token)
	select {
	case <-ka.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("a forced release after the restart not seen within 2 s")
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Fatalf("lost %v after the forced release", el)
	}
}
