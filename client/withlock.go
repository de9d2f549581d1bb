package client

import (
	"context"
	"errors"
)

// WithLock acquires key, runs fn while holding it, and releases it when fn
// returns. While fn runs, a KeepAlive renews the lease every third of it
// (sooner when less is left); a lock granted after a long wait in the
// queue is renewed before fn starts (Lock.Expires counts from the
// acquire's send, so little of it may be left). If the lock can no longer
// be shown to be held — a renew answered N, or renewals failed until the
// lease's conservative end (Lock.Expires) — fn's context is cancelled with
// a cause matching ErrLockLost, and WithLock returns fn's error or, if fn
// returned nil, that cause. fn must stop touching the protected resource
// once its context is done, and should pass l.Token to it (see package
// fence).
//
// An acquire error is returned as it is and fn is not run. The release at
// the end runs even if ctx has been cancelled; its failure is returned
// only when fn succeeded and the lock was not lost.
//
// For a different renewal interval, or a holder that must stop some time
// before the lease can end (a child process to kill first), use Acquire
// and KeepAlive directly.
func (cl *Client) WithLock(ctx context.Context, key string, opts AcquireOptions, fn func(ctx context.Context, l Lock) error) error {
	l, err := cl.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: opts.Lease})
	if err != nil {
		_ = cl.Release(context.WithoutCancel(ctx), l)
		return err
	}
	ferr := fn(ka.Context(), ka.Lock())
	lost := ka.Stop()
	rerr := cl.Release(context.WithoutCancel(ctx), l)
	switch {
	case ferr != nil:
		return ferr
	case lost != nil:
		return lost
	case errors.Is(rerr, ErrNotHeld):
		return ErrLockLost
	}
	return rerr
}
