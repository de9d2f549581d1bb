package client

import (
	"context"
	"errors"
	"time"
)

// WithLock acquires key, runs fn while holding it, and releases it when fn
// returns. While fn runs, the lease is renewed in the background every
// third of the lease (sooner when less is left). A lock granted after a
// long wait in the queue is renewed before fn starts: Lock.Expires counts
// from the acquire's send, so little of it may be left. If the lock can no longer be shown to be held — a
// renew answered N, or renewals failed until the lease's conservative end
// (Lock.Expires) — fn's context is cancelled with cause ErrLockLost, and
// WithLock returns fn's error or, if fn returned nil, ErrLockLost. fn must
// stop touching the protected resource once its context is done, and
// should pass l.Token to it (see package fence).
//
// An acquire error is returned as it is and fn is not run. The release at
// the end runs even if ctx has been cancelled; its failure is returned
// only when fn succeeded and the lock was not lost.
func (cl *Client) WithLock(ctx context.Context, key string, opts AcquireOptions, fn func(ctx context.Context, l Lock) error) error {
	lease := opts.Lease
	if lease == 0 {
		lease = cl.cfg.DefaultLease
	}
	lease = (lease + time.Second - 1) / time.Second * time.Second
	l, err := cl.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	// Lock.Expires counts from the acquire's send: after a long wait in the
	// queue little of it may be left, though the server's lease has just
	// begun. Renew first, so that fn starts with a lease it can keep.
	if time.Until(l.Expires) < 2*lease/3 {
		nl, err := cl.Renew(ctx, l, lease)
		if err != nil {
			_ = cl.Release(context.WithoutCancel(ctx), l)
			if errors.Is(err, ErrNotHeld) {
				return ErrLockLost
			}
			return err
		}
		l = nl
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	done := make(chan bool, 1)
	go func() { done <- cl.keepAlive(ctx, stop, l, lease, cancel) }()
	ferr := fn(fctx, l)
	close(stop)
	lost := <-done
	cancel(nil)
	rerr := cl.Release(context.WithoutCancel(ctx), l)
	switch {
	case ferr != nil:
		return ferr
	case lost:
		return ErrLockLost
	case errors.Is(rerr, ErrNotHeld):
		return ErrLockLost
	}
	return rerr
}

// keepAlive renews l until stop is closed; it reports whether the lock was
// lost (and then has cancelled fn's context with ErrLockLost).
func (cl *Client) keepAlive(ctx context.Context, stop <-chan struct{}, l Lock, lease time.Duration, cancel context.CancelCauseFunc) bool {
	every := lease / 3
	tm := time.NewTimer(every)
	defer tm.Stop()
	rctx := context.WithoutCancel(ctx)
	for {
		select {
		case <-stop:
			return false
		case <-tm.C:
		}
		if !time.Now().Before(l.Expires) {
			cancel(ErrLockLost)
			return true
		}
		c, cc := context.WithDeadline(rctx, l.Expires)
		nl, err := cl.Renew(c, l, lease)
		cc()
		switch {
		case err == nil:
			l = nl
			tm.Reset(min(every, time.Until(l.Expires)/2))
		case errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
			cancel(ErrLockLost)
			return true
		default:
			// Try again soon; the expiry check above ends it.
			d := time.Until(l.Expires)
			if d > cl.cfg.RetryPause {
				d = cl.cfg.RetryPause
			}
			tm.Reset(d)
		}
	}
}
