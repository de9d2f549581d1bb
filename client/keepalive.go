package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// KeepAliveOptions configure Client.KeepAlive. Zero fields take the
// defaults named on each.
type KeepAliveOptions struct {
	// Lease is the lease each renewal asks for, rounded up to whole
	// seconds, 1..255 s; 0 means Config.DefaultLease.
	Lease time.Duration
	// Every is the interval between renewals (0: a third of Lease). A
	// renewal also comes at the latest halfway to StopBy, so it comes
	// sooner when less than two intervals are left.
	Every time.Duration
	// Retry is the pause before a failed renewal is tried again (0:
	// Config.RetryPause).
	Retry time.Duration
	// Margin is how long before the lease's conservative end
	// (Lock.Expires) the holder must have stopped: StopBy is Expires -
	// Margin, and the lock is reported lost when StopBy passes without a
	// renewal. 0 means at Expires. It must be below Lease.
	Margin time.Duration
	// OnRenewError, if not nil, is called on the keep-alive's goroutine
	// with every renewal error that is retried (connection trouble, a
	// server error); not with N or Close, which end the keep-alive. It
	// must not block for long: the next renewal waits for it.
	OnRenewError func(error)
	// NoWatch turns off the watch of the lock (PROTOCOL.md §9.4). By
	// default a KeepAlive also watches its lock, so that lockd's report
	// of its end — released from elsewhere, expired, forced — loses it
	// at once instead of at the next renewal. Without the watch a loss
	// is learned from a renewal, up to Every later. A lockd without §9
	// needs no NoWatch: the client finds that out (at the cost of one
	// connection, which that lockd closes) and renews alone.
	NoWatch bool
}

// ErrInvalidKeepAlive rejects KeepAliveOptions with a negative duration or a
// Margin not below the lease.
var ErrInvalidKeepAlive = errors.New("client: keep-alive durations must not be negative, and Margin must be below the lease")

// Why a keep-alive ended the lock. Each matches ErrLockLost.
var (
	errLostNotHeld  error = &bothErr{"client: lock lost: a renewal was answered N (not held)", ErrLockLost, ErrNotHeld}
	errLostDeadline error = &bothErr{"client: lock lost: no renewal succeeded before the holder's stop time", ErrLockLost, ErrLockLost}
	errLostClosed   error = &bothErr{"client: lock lost: the client was closed", ErrLockLost, ErrClosed}
	// A watch registered again (after a member could no longer tell, or
	// a lost connection) found the grant gone.
	errLostWatchNotHeld error = &bothErr{"client: lock lost: lockd answered a watch of it N (not held)", ErrLockLost, ErrNotHeld}
)

// lostRefused is a keep-alive ended by a renewal the server refused for
// the identity (E 5, E 6): no retry can succeed, so the lock is given up
// at once rather than at StopBy. It matches ErrLockLost and the cause.
type lostRefused struct{ cause error }

func (e *lostRefused) Error() string {
	return "client: lock lost: a renewal was refused: " + e.cause.Error()
}

func (e *lostRefused) Is(target error) bool { return target == ErrLockLost }

func (e *lostRefused) Unwrap() error { return e.cause }

// A KeepAlive renews a lock in the background, every Every, until Stop or
// until the lock is lost: lockd reported the grant's end (the lock is
// watched: released from elsewhere, expired, or forced, known at once;
// Err is then a *GrantEndedError), a renewal answered N, the client
// closed, or StopBy (the lease's conservative end less Margin) passed
// without a renewal, or a renewal refused for the identity (E 5, E 6).
// Loss closes Lost and cancels Context with a cause matching ErrLockLost
// (and ErrNotHeld, ErrClosed, ErrUnauthenticated or ErrPermissionDenied
// where that is the reason). A holder must stop touching the protected
// resource by StopBy, and should pass the lock's token to it (package
// fence).
//
// The watch (KeepAliveOptions.NoWatch turns it off) is one W on a
// connection to the member that serves. When that member can no longer
// tell (an L with reason 4: it is stopping or stepping down) or the
// connection is lost, the KeepAlive renews at once — the renewal goes to
// the member that serves now, and confirms or denies the lock — and
// watches again there.
//
// A KeepAlive never releases the lock; the holder does, after Stop.
// Its methods are safe for concurrent use.
type KeepAlive struct {
	cl     *Client
	opts   KeepAliveOptions
	lease  time.Duration
	window time.Duration // one renewal's limit (attemptWindow)

	ctx    context.Context // the holder's: cancelled on loss and by Stop
	cancel context.CancelCauseFunc
	rbase  context.Context // renewals: the caller's values, cancelled by Stop only
	rstop  context.CancelFunc

	stopOnce sync.Once
	stop     chan struct{} // closed by Stop
	done     chan struct{} // closed when the goroutine has ended
	lost     chan struct{} // closed on loss, after err is set

	mu   sync.Mutex
	lock Lock  // the current lock (Expires moves with each renewal)
	err  error // why the lock was lost; set once, before lost closes

	w     *watcher      // the lock's watch; nil with NoWatch
	nudge chan struct{} // cap 1: the watch lapsed, renew now
}

// KeepAlive starts renewing l in the background and returns at once,
// unless less than two renewal intervals are left before StopBy (a lock
// granted after a long wait in the queue: Lock.Expires counts from the
// acquire's send): then it renews once first, bounded by ctx, so that the
// holder starts with a lease it can keep. That first renewal's error is
// returned as it is (an N as an error matching both ErrLockLost and
// ErrNotHeld), and the keep-alive is not started.
//
// ctx bounds only that first renewal, and is the parent of Context; the
// background renewals keep its values but not its cancellation: they run
// until Stop or loss. Call Stop when the work under the lock is done,
// then release the lock.
func (cl *Client) KeepAlive(ctx context.Context, l Lock, opts KeepAliveOptions) (*KeepAlive, error) {
	if !validKey(l.Key) {
		return nil, invalidKey(l.Key)
	}
	ls, err := cl.leaseSecs(opts.Lease)
	if err != nil {
		return nil, err
	}
	lease := time.Duration(ls) * time.Second
	if opts.Every < 0 || opts.Retry < 0 || opts.Margin < 0 || opts.Margin >= lease {
		return nil, ErrInvalidKeepAlive
	}
	if opts.Every == 0 {
		opts.Every = lease / 3
	}
	if opts.Retry == 0 {
		opts.Retry = cl.cfg.RetryPause
	}
	if cl.isClosed() {
		return nil, ErrClosed
	}
	if time.Until(l.Expires.Add(-opts.Margin)) < 2*opts.Every {
		nl, err := cl.Renew(ctx, l, lease)
		if errors.Is(err, ErrNotHeld) {
			return nil, errLostNotHeld
		}
		if err != nil {
			return nil, err
		}
		l = nl
	}
	k := &KeepAlive{
		cl:     cl,
		opts:   opts,
		lease:  lease,
		window: attemptWindow(opts.Every, cl.cfg.TransportTimeout),
		lock:   l,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		lost:   make(chan struct{}),
	}
	k.ctx, k.cancel = context.WithCancelCause(ctx)
	k.rbase, k.rstop = context.WithCancel(context.WithoutCancel(ctx))
	if !opts.NoWatch {
		k.nudge = make(chan struct{}, 1)
		k.w = cl.newWatcher(k.rbase, l.Key, l.Token)
		k.w.onLapse = func() { signal(k.nudge) }
		// Every connection at the server's bound of watches: try again a
		// renewal interval later, the renewals guarding the lock
		// meanwhile.
		k.w.limitRetry = opts.Every
	}
	if !cl.goBackground(k.run) {
		k.lose(errLostClosed)
		k.rstop()
		close(k.done)
		if k.w != nil {
			k.w.end(ErrClosed)
			close(k.w.done)
		}
		return k, nil
	}
	if k.w != nil && !cl.goBackground(func() { k.w.run(nil) }) {
		k.w.end(ErrClosed)
		close(k.w.done)
	}
	return k, nil
}

// Lock returns the lock with the Expires of its latest renewal.
func (k *KeepAlive) Lock() Lock {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lock
}

// StopBy is the instant by which the holder must have stopped acting
// under the lock unless a renewal moves it: the latest renewal's
// Lock.Expires less Margin. It carries a monotonic clock reading.
func (k *KeepAlive) StopBy() time.Time {
	return k.Lock().Expires.Add(-k.opts.Margin)
}

// Context is the holder's context: a child of the ctx given to
// KeepAlive, cancelled when the lock is lost (context.Cause then matches
// ErrLockLost) and by Stop.
func (k *KeepAlive) Context() context.Context { return k.ctx }

// Lost is closed when the lock is lost; Err says why.
func (k *KeepAlive) Lost() <-chan struct{} { return k.lost }

// Err is nil while the lock is not lost; then an error matching
// ErrLockLost: a *GrantEndedError when lockd reported the grant's end
// (released, expired, forced); matching ErrNotHeld too when a renewal or
// a watch was answered N, ErrClosed when the client was closed, or
// ErrUnauthenticated or ErrPermissionDenied when the server refused a
// renewal for the identity.
func (k *KeepAlive) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Stop ends the renewals (a renewal in flight is abandoned) and cancels
// Context; it returns once the keep-alive's goroutine has ended, with Err.
// It does not release the lock. Calling it again returns Err again.
func (k *KeepAlive) Stop() error {
	k.stopOnce.Do(func() {
		close(k.stop)
		k.rstop()
		<-k.done
		k.cancel(nil)
	})
	return k.Err()
}

// lose records why the lock was lost, once.
func (k *KeepAlive) lose(err error) {
	k.mu.Lock()
	first := k.err == nil
	if first {
		k.err = err
	}
	k.mu.Unlock()
	if first {
		k.cancel(err) // before lost: whoever sees Lost sees the cause
		close(k.lost)
	}
}

// minAttemptWindow is the shortest window attemptWindow gives a renewal:
// below it, a loaded machine's scheduling alone could fail healthy
// connections.
const minAttemptWindow = 250 * time.Millisecond

// attemptWindow is how long one renewal of a keep-alive renewing every
// every may take: half the interval, within minAttemptWindow and the
// transport timeout. A renewal that gets no answer in its window closes
// its connection (a frozen or partitioned server: taken to be broken) and
// fails; the next, Retry later, goes to another connection, and so to
// another member of a cluster, which has taken over or names the one that
// has. So the renewals that a dead or frozen member swallows cost a
// fraction of the lease, not Config.TransportTimeout, which may be longer
// than the lease itself.
func attemptWindow(every, transport time.Duration) time.Duration {
	return max(min(every/2, transport), min(minAttemptWindow, transport))
}

// nextRenewal is the pause before the next renewal: Every, or half the
// time left before StopBy if that is sooner.
func (k *KeepAlive) nextRenewal() time.Duration {
	return max(0, min(k.opts.Every, time.Until(k.StopBy())/2))
}

// run renews until Stop, the client's Close or loss.
func (k *KeepAlive) run() {
	defer close(k.done)
	renew := time.NewTimer(k.nextRenewal())
	defer renew.Stop()
	deadline := time.NewTimer(time.Until(k.StopBy()))
	defer deadline.Stop()
	var watchEnded <-chan struct{}
	if k.w != nil {
		watchEnded = k.w.done
	}
	for {
		select {
		case <-k.stop:
			return
		case <-k.cl.closing:
			k.lose(errLostClosed)
			return
		case <-deadline.C:
			k.lose(errLostDeadline)
			return
		case <-watchEnded:
			switch err := k.w.Err(); {
			case errors.Is(err, ErrLockLost): // lockd reported the grant's end
				k.lose(err)
				return
			case errors.Is(err, ErrNotHeld):
				k.lose(errLostWatchNotHeld)
				return
			}
			// No watch (a server without §9, Stop, ...): the renewals
			// alone tell.
			watchEnded = nil
			continue
		case <-k.nudge:
			// The watch lapsed (its member can no longer tell, or its
			// connection was lost): a renewal now confirms the lock
			// where the cluster serves, or denies it.
		case <-renew.C:
		}
		by := k.StopBy()
		ctx, cancel := context.WithDeadline(k.rbase, by)
		nl, err := k.cl.renew(ctx, k.Lock(), uint8(k.lease/time.Second), k.window)
		cancel()
		switch {
		case err == nil:
			k.mu.Lock()
			k.lock = nl
			k.mu.Unlock()
			deadline.Reset(time.Until(k.StopBy()))
			renew.Reset(k.nextRenewal())
			continue
		case errors.Is(err, ErrNotHeld):
			k.lose(errLostNotHeld)
			return
		case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrPermissionDenied):
			k.lose(&lostRefused{err})
			return
		case errors.Is(err, ErrClosed):
			k.lose(errLostClosed)
			return
		case k.rbase.Err() != nil: // Stop
			return
		case !time.Now().Before(by):
			k.lose(errLostDeadline)
			return
		}
		if k.opts.OnRenewError != nil {
			k.opts.OnRenewError(err)
		}
		renew.Reset(min(k.opts.Retry, time.Until(by)))
	}
}
