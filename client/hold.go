package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// HoldOptions configure the locks that a Semaphore or an RWMutex hands
// out: each is held until its Release, its lease renewed in the
// background and its grant watched (KeepAlive).
type HoldOptions struct {
	// Lease is each grant's lease, rounded up to whole seconds, 1..255 s
	// (0: Config.DefaultLease). It is renewed every third of it while the
	// lock is held; it bounds how long a permit outlives a holder that
	// died without releasing it.
	Lease time.Duration
	// Margin is KeepAliveOptions.Margin: when renewals fail, the lock is
	// reported lost this long before its lease could end.
	Margin time.Duration
	// OnRenewError is KeepAliveOptions.OnRenewError.
	OnRenewError func(error)
}

// A Held is a lock held until Release: a permit of a Semaphore, or a
// read or write lock of an RWMutex. Its lease is renewed in the
// background and its grant is watched (see KeepAlive), so when it is
// lost — lockd reports it released from elsewhere, expired or forced,
// or renewals fail until StopBy — Context is cancelled and Lost closed
// at once, Err saying why. The holder must then stop touching what the
// lock protects, and should pass Token to it (package fence). Its
// methods are safe for concurrent use.
type Held struct {
	cl   *Client
	ka   *KeepAlive
	once sync.Once
	err  error // Release's result
}

// Lock returns the lock, with the Expires of its latest renewal.
func (h *Held) Lock() Lock { return h.ka.Lock() }

// Token is the lock's fencing token.
func (h *Held) Token() uint64 { return h.ka.Lock().Token }

// Context is cancelled when the lock is lost (context.Cause then matches
// ErrLockLost) and by Release.
func (h *Held) Context() context.Context { return h.ka.Context() }

// Lost is closed when the lock is lost; Err says why.
func (h *Held) Lost() <-chan struct{} { return h.ka.Lost() }

// Err is nil while the lock is held; then KeepAlive.Err's error.
func (h *Held) Err() error { return h.ka.Err() }

// StopBy is KeepAlive.StopBy: the holder must have stopped by then
// unless a renewal moves it.
func (h *Held) StopBy() time.Time { return h.ka.StopBy() }

// errReleaseNotHeld is Release's N: the lock had ended before it.
var errReleaseNotHeld error = &bothErr{"client: lock lost: the release was answered N (not held)", ErrLockLost, ErrNotHeld}

// Release stops the renewals and the watch, and releases the grant. It
// returns nil once lockd released it; an error matching ErrLockLost if
// the lock had been lost (then it is not released again, except that a
// lock whose renewals merely failed is released in the background: lockd
// may still hold it); or Client.Release's error (ErrIndeterminate: the
// lease frees it at the latest). It retries as Client.Release does, for
// Config.ReleaseRetry. Calling it again returns the same.
func (h *Held) Release() error {
	h.once.Do(func() {
		lost := h.ka.Stop()
		l := h.ka.Lock()
		if lost != nil {
			if lost == errLostDeadline {
				h.cl.compensate(l.Key, l.Token)
			}
			h.err = lost
			return
		}
		err := h.cl.Release(h.cl.bg, l)
		if errors.Is(err, ErrNotHeld) {
			err = errReleaseNotHeld
		}
		h.err = err
	})
	return h.err
}

// hold keeps l, just granted, until its Release. A lock that cannot be
// kept (its first renewal failed) is released in the background, unless
// it is known lost.
func (cl *Client) hold(ctx context.Context, l Lock, o HoldOptions) (*Held, error) {
	ka, err := cl.KeepAlive(context.WithoutCancel(ctx), l, KeepAliveOptions{Lease: o.Lease, Margin: o.Margin, OnRenewError: o.OnRenewError})
	if err != nil {
		if !errors.Is(err, ErrLockLost) {
			cl.compensate(l.Key, l.Token)
		}
		return nil, err
	}
	return &Held{cl: cl, ka: ka}, nil
}

// acquireHeld takes key with op (A, or S with limit) and holds it. It
// waits until the grant or until ctx ends, in waits of at most 255 s (a
// wait that ends goes back to the queue's tail: the protocol has no
// longer wait); with try, it makes one immediate attempt.
func (cl *Client) acquireHeld(ctx context.Context, op proto.Op, key string, limit int, o HoldOptions, try bool) (*Held, error) {
	for {
		wait := time.Duration(0)
		if !try {
			wait = proto.MaxWait * time.Second
			if dl, ok := ctx.Deadline(); ok {
				left := time.Until(dl)
				if left <= 0 {
					return nil, context.DeadlineExceeded
				}
				wait = min(wait, left)
			}
		}
		l, err := cl.acquireAsync(ctx, op, key, limit, AcquireOptions{Wait: wait, Lease: o.Lease}).Wait()
		switch {
		case err == nil:
			return cl.hold(ctx, l, o)
		case try || !errors.Is(err, ErrTimeout):
			return nil, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
	}
}

// A Semaphore is a counted lock that every client of lockd shares: at
// most Permits holders of its key at once, across every process that
// uses it (PROTOCOL.md §9.2: a shared acquire with limit Permits). A
// permit whose holder dies is freed when its lease ends. Every user of
// a key must give it the same number of permits: an acquire with
// another number while the key is held fails with ErrLimitMismatch. Its
// methods are safe for concurrent use.
type Semaphore struct {
	cl      *Client
	key     string
	permits int
	opts    HoldOptions
}

// Semaphore returns the semaphore of key with permits permits
// (1..65535; outside that range its acquires fail with
// ErrInvalidLimit). It sends nothing.
func (cl *Client) Semaphore(key string, permits int, opts HoldOptions) *Semaphore {
	return &Semaphore{cl: cl, key: key, permits: permits, opts: opts}
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Permits returns the semaphore's number of permits.
func (s *Semaphore) Permits() int { return s.permits }

// Acquire takes a permit, waiting for one until ctx is done (then it
// returns ctx.Err(), as golang.org/x/sync/semaphore does), and returns
// it held: release it with Held.Release. Waiters are served in FIFO
// order. Other errors are AcquireShared's: ErrNoConnection (an outage,
// never a wait for a permit), ErrIndeterminate, ErrBusy, ErrLimitMismatch,
// ErrUnsupported, ...
func (s *Semaphore) Acquire(ctx context.Context) (*Held, error) {
	return s.cl.acquireHeld(ctx, proto.OpShared, s.key, s.permits, s.opts, false)
}

// TryAcquire takes a permit if one is free now and no one waits for
// one, else returns ErrTimeout (lockd answered: no permit now); one
// attempt, without waiting. Other errors as Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Held, error) {
	return s.cl.acquireHeld(ctx, proto.OpShared, s.key, s.permits, s.opts, true)
}

// An RWMutex is a read/write lock that every client of lockd shares:
// any number of readers at once, or one writer (PROTOCOL.md §9.2:
// readers acquire shared with limit MaxSharedLimit, writers acquire
// exclusively). The queue is FIFO: a writer waiting at its head holds
// back every reader that comes after it, so readers cannot starve a
// writer. Its methods are safe for concurrent use.
type RWMutex struct {
	cl   *Client
	key  string
	opts HoldOptions
}

// RWMutex returns the read/write lock of key. It sends nothing. Every
// reader of a key must use it (or AcquireShared with MaxSharedLimit):
// a shared acquire with another limit fails with ErrLimitMismatch while
// readers hold the key.
func (cl *Client) RWMutex(key string, opts HoldOptions) *RWMutex {
	return &RWMutex{cl: cl, key: key, opts: opts}
}

// Key returns the lock's key.
func (rw *RWMutex) Key() string { return rw.key }

// RLock takes the lock for reading, waiting until ctx is done (then
// ctx.Err()), and returns it held: release it with Held.Release. Errors
// otherwise as Semaphore.Acquire.
func (rw *RWMutex) RLock(ctx context.Context) (*Held, error) {
	return rw.cl.acquireHeld(ctx, proto.OpShared, rw.key, MaxSharedLimit, rw.opts, false)
}

// Lock takes the lock for writing, waiting until ctx is done (then
// ctx.Err()), and returns it held: release it with Held.Release. Errors
// otherwise as Acquire's.
func (rw *RWMutex) Lock(ctx context.Context) (*Held, error) {
	return rw.cl.acquireHeld(ctx, proto.OpAcquire, rw.key, 0, rw.opts, false)
}

// TryRLock takes the lock for reading if no writer holds it and no one
// waits, else returns ErrTimeout; one attempt, without waiting.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Held, error) {
	return rw.cl.acquireHeld(ctx, proto.OpShared, rw.key, MaxSharedLimit, rw.opts, true)
}

// TryLock takes the lock for writing if no one holds it, else returns
// ErrTimeout; one attempt, without waiting.
func (rw *RWMutex) TryLock(ctx context.Context) (*Held, error) {
	return rw.cl.acquireHeld(ctx, proto.OpAcquire, rw.key, 0, rw.opts, true)
}
