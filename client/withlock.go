package client

import (
	"context"
	"errors"
)

// WithLock acquires key, runs fn while holding it, and releases it when fn
// returns. While fn runs, a KeepAlive renews the lease every third of it
// (sooner when less is left); a lock granted after a long wait in the
// queue is renewed before fn starts (Lock.Expires counts from the
// acquire's send, so little of it may be left). The lock is watched: if
// it can no longer be shown to be held — lockd reports its end
// (released from elsewhere, expired, forced: at once), a renew answered
// N, or renewals failed until the lease's conservative end
// (Lock.Expires) — fn's context is cancelled with
// a cause matching ErrLockLost, and WithLock returns, as soon as fn does,
// an error matching ErrLockLost: whatever fn returned from its ended
// context (nil, ctx.Err(), context.Cause(ctx)), or fn's own error joined
// to it (errors.Is sees both). A lost lock is not released again, except
// when renewals merely failed: that release runs in the background (it
// cannot be confirmed now; the lease ends the lock at the latest). fn
// must stop touching the protected resource once its context is done,
// and should pass l.Token to it (see package fence).
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
	if lost := ka.Stop(); lost != nil {
		if lost == errLostDeadline {
			// The server did not answer renewals: it may still hold
			// the lock, and answer a release later.
			cl.compensate(l.Key, l.Token)
		}
		if ferr == nil || errors.Is(ferr, context.Canceled) || errors.Is(ferr, context.DeadlineExceeded) || errors.Is(ferr, ErrLockLost) {
			return lost
		}
		return errors.Join(ferr, lost)
	}
	rerr := cl.Release(context.WithoutCancel(ctx), l)
	switch {
	case ferr != nil:
		return ferr
	case errors.Is(rerr, ErrNotHeld):
		return ErrLockLost
	}
	return rerr
}
