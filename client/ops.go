package client

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lockd-dev/lockd/proto"
)

// Lock is a granted lock.
type Lock struct {
	Key   string
	Token uint64 // the fencing token: pass it to the protected resource
	// Expires is the client's conservative estimate of the lease's end: the
	// instant the granting (or renewing) request was sent plus the lease.
	// The server's lease counts from the request's arrival or later, so it
	// never ends before Expires. It carries a monotonic clock reading.
	Expires time.Time
}

// AcquireOptions are the parameters of one acquire.
type AcquireOptions struct {
	// Wait bounds how long the call waits for the key, 0..255 s. 0 makes a
	// single immediate attempt that never queues. There is no infinite
	// wait: loop to wait longer.
	Wait time.Duration
	// Lease is how long the grant stays valid without a release or renew,
	// rounded up to whole seconds, 1..255 s; 0 means Config.DefaultLease.
	Lease time.Duration
}

// leaseSecs validates and converts a lease.
func (cl *Client) leaseSecs(d time.Duration) (uint8, error) {
	if d == 0 {
		d = cl.cfg.DefaultLease
	}
	if d < 0 || d > proto.MaxWait*time.Second {
		return 0, ErrInvalidLease
	}
	return uint8((d + time.Second - 1) / time.Second), nil
}

func validKey(key string) bool {
	if len(key) == 0 || len(key) > proto.MaxKey {
		return false
	}
	// One pass for the usual ASCII key; the rest of a non-ASCII one is
	// checked by the library.
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '\n':
			return false
		case c >= utf8.RuneSelf:
			rest := key[i:]
			return strings.IndexByte(rest, '\n') < 0 && utf8.ValidString(rest)
		}
	}
	return true
}

// invalidKey is ErrInvalidKey with what is wrong with key (which
// validKey refused): a key is 1..1024 bytes of UTF-8 without a newline.
func invalidKey(key string) error {
	why := ""
	switch {
	case len(key) == 0:
		why = "empty"
	case len(key) > proto.MaxKey:
		why = strconv.Itoa(len(key)) + " bytes, longer than the " + strconv.Itoa(proto.MaxKey) + " a key may have"
	case strings.IndexByte(key, '\n') >= 0:
		why = "it contains a newline (0x0A)"
	default:
		why = "not valid UTF-8"
	}
	return &keyError{why}
}

// keyError is ErrInvalidKey with the reason.
type keyError struct{ why string }

func (e *keyError) Error() string { return ErrInvalidKey.Error() + ": " + e.why }

func (e *keyError) Is(target error) bool { return target == ErrInvalidKey }

// Acquire takes the lock on key, waiting up to opts.Wait for it. It returns
// the Lock, or an error: ErrTimeout, ErrBusy (definitive: not granted),
// ErrIndeterminate (may or may not have been granted: do not enter the
// critical section), a *ServerError, ctx.Err(), ErrNoConnection,
// ErrClosed, or a validation error. The call returns ErrTimeout when the
// wait ends, to the millisecond, and ctx.Err() when ctx ends, at once;
// either way its connection stays, and a grant that arrives for the
// request afterwards is released at once.
func (cl *Client) Acquire(ctx context.Context, key string, opts AcquireOptions) (Lock, error) {
	return cl.AcquireAsync(ctx, key, opts).Wait()
}

// AcquireAsync starts an acquire and returns at once; Ticket.Wait gives its
// result. One goroutine can keep many acquires in flight this way: their
// requests are pipelined on the client's connections and answered in any
// order. The call's deadline starts now; ctx is observed by Wait. A grant
// that reaches Wait after the deadline (or after ctx ended) is released
// again at once and reported as ErrTimeout (or ctx.Err()), so call Wait
// promptly.
//
// The server grants whether or not Wait has been called: a grant waiting
// for its Wait holds its key. Two goroutines that each wait on one ticket
// while another of their tickets holds a key the other is queued for
// deadlock until a wait ends; wait in an order that cannot form such a
// cycle (for instance, each goroutine on its own keys), or Wait each
// ticket before starting the next acquire on a contended key.
func (cl *Client) AcquireAsync(ctx context.Context, key string, opts AcquireOptions) *Ticket {
	return cl.acquireAsync(ctx, proto.OpAcquire, key, 0, opts)
}

// acquireAsync starts an acquire (op A) or a shared acquire (op S with
// limit): both follow every rule of §7.
func (cl *Client) acquireAsync(ctx context.Context, op proto.Op, key string, limit int, opts AcquireOptions) *Ticket {
	t := cl.getTicket(ctx, op, key)
	switch {
	case !validKey(key):
		t.err = invalidKey(key)
		return t
	case opts.Wait < 0 || opts.Wait > proto.MaxWait*time.Second:
		t.err = ErrInvalidWait
		return t
	case op == proto.OpShared && (limit < 1 || limit > proto.MaxLimit):
		t.err = ErrInvalidLimit
		return t
	}
	lease, err := cl.leaseSecs(opts.Lease)
	if err != nil {
		t.err = err
		return t
	}
	if cl.isClosed() {
		t.err = ErrClosed
		return t
	}
	now := monoNow()
	t.id = rand.Uint64()
	t.lease = lease
	t.limit = uint16(limit)
	if opts.Wait == 0 {
		// One deadline for the whole call, the answer included.
		t.wait0 = true
		t.sendBy = now.add(cl.cfg.TransportTimeout)
		t.hardBy = t.sendBy
		t.timeout = cl.cfg.TransportTimeout
	} else {
		t.waitEnd = now.add(opts.Wait)
		t.sendBy = t.waitEnd
	}
	if ctx.Err() == nil {
		t.trySend()
	}
	return t
}

// Wait waits for the acquire's result; see Acquire for the errors. It must
// be called exactly once, and the Ticket not used afterwards.
func (t *Ticket) Wait() (Lock, error) {
	l, err := t.acquire()
	t.cl.putTicket(t)
	return l, err
}

func (t *Ticket) acquire() (Lock, error) {
	if t.err != nil {
		return Lock{}, t.err
	}
	cl := t.cl
	for {
		switch t.roundTrip() {
		case outAnswer:
		case outNotSent, outWaitOver:
			if t.wait0 {
				return Lock{}, ErrNoConnection
			}
			return Lock{}, ErrTimeout
		case outNoConn:
			// An outage, not a holder: never ErrTimeout.
			return Lock{}, cl.noConnErr()
		case outCtx:
			return Lock{}, t.ctx.Err()
		case outClosed:
			return Lock{}, ErrClosed
		case outUnauth, outUnsupported:
			return Lock{}, t.rerr
		case outLost:
			if cl.isClosed() {
				return Lock{}, errClosedIndeterminate
			}
			if e, ok := t.rerr.(*closedBy9Error); ok {
				return Lock{}, e // the connection ended on a §9 refusal
			}
			return Lock{}, ErrIndeterminate
		default: // outAbandoned
			if cl.isClosed() {
				return Lock{}, errClosedIndeterminate
			}
			return Lock{}, ErrIndeterminate
		}
		switch t.rop {
		case proto.OpAcquire:
			// The delivery gate: a grant the caller takes after the call's
			// deadline (or after ctx ended, or the client closed) is
			// released again, and the call ends as it would have without
			// it: the caller's deadline or ctx decides.
			if t.ctx.Err() != nil || monoNow() >= t.callEnd() || cl.isClosed() {
				cl.compensate(t.key, t.rtoken)
				switch {
				case cl.isClosed():
					return Lock{}, errClosedIndeterminate
				case t.ctx.Err() != nil:
					return Lock{}, t.ctx.Err()
				case t.wait0:
					// Past the transport deadline.
					return Lock{}, ErrIndeterminate
				}
				return Lock{}, ErrTimeout
			}
			return Lock{Key: t.key, Token: t.rtoken, Expires: t.sentAt.add(time.Duration(t.lease) * time.Second).time()}, nil
		case proto.OpTimeout:
			return Lock{}, ErrTimeout
		case proto.OpBusy:
			return Lock{}, ErrBusy
		case proto.OpMoved:
			if t.followMoved() {
				continue
			}
		case proto.OpError:
			if isAuthCode(t.rcode) {
				return Lock{}, t.authErr()
			}
			if t.rcode != proto.CodeShutdown {
				return Lock{}, &ServerError{Op: t.op, Code: t.rcode, Msg: t.rtail}
			}
		default:
			return Lock{}, errBadAnswerOp(t)
		}
		// Not executed, nowhere to go: pause, then send again (same owner,
		// same deadline).
		if !t.sleep(cl.cfg.RetryPause, t.sendBy) {
			return Lock{}, t.pauseEnded()
		}
	}
}

// followMoved acts on an M answer: an address makes it the preferred one
// and the request goes there next (true: resend at once). An empty address
// (that node knows no active) drops the preference for the node that said
// so, and after a pause (false) the request goes to another node if one is
// up.
func (t *Ticket) followMoved() bool {
	if t.rtail != "" {
		t.cl.follow(t.rtail)
		if t.cl.unreachableAddr(t.rtail) {
			// The node named is down (its last dial failed or its
			// connection ended): the one that answered may not know yet.
			// Pause, then ask another.
			t.moved, t.avoid = "", t.rtail
			return false
		}
		t.moved = t.rtail
		return true
	}
	t.moved = ""
	t.avoid = t.from
	t.cl.unprefer(t.from)
	return false
}

// pauseEnded is the error of a call whose pause before a resend was cut
// short; the request was not executed.
func (t *Ticket) pauseEnded() error {
	switch {
	case t.cl.isClosed():
		return ErrClosed
	case t.ctx.Err() != nil:
		return t.ctx.Err()
	case t.acq() && !t.wait0:
		return ErrTimeout
	}
	return ErrNoConnection
}

func errBadAnswerOp(t *Ticket) error {
	return &ServerError{Op: t.op, Msg: "unexpected answer " + t.rop.String()}
}

// compensate releases a grant the caller will never see, in the
// background, with Release's retries.
func (cl *Client) compensate(key string, token uint64) {
	cl.goBackground(func() {
		_ = cl.Release(cl.bg, Lock{Key: key, Token: token})
	})
}

// Release releases l. It retries for Config.ReleaseRetry (5 s) at
// Config.ReleaseRetryInterval (200 ms), across connections, while attempts
// fail (connection lost, no connection, server shutting down); a release
// acts on the exact token only, so a resend is harmless. It returns nil
// once the server answered R; ErrNotHeld if it answered N (the lease had
// ended, or the token was released already) — unless an earlier attempt
// may have executed, in which case N means that attempt did and nil is
// returned; ErrIndeterminate if no attempt could be confirmed in time;
// ErrNoConnection if none could be sent; or ctx.Err(), ErrClosed, a
// *ServerError. The lease ends an unconfirmed lock at the latest.
func (cl *Client) Release(ctx context.Context, l Lock) error {
	return cl.ReleaseAsync(ctx, l).Wait()
}

// ReleaseAsync starts releasing l and returns at once; the Releasing's
// Wait gives what Release would have returned. One goroutine can keep many
// releases in flight this way, pipelined on the client's connections like
// AcquireAsync's acquires. The retry window starts now; resends after a
// lost connection happen inside Wait, so call it promptly.
func (cl *Client) ReleaseAsync(ctx context.Context, l Lock) Releasing {
	if !validKey(l.Key) {
		return Releasing{err: invalidKey(l.Key)}
	}
	t := cl.getTicket(ctx, proto.OpRelease, l.Key)
	t.id = l.Token
	t.hardBy = monoNow().add(cl.cfg.ReleaseRetry)
	t.sendBy = t.hardBy
	t.timeout = cl.cfg.TransportTimeout
	if ctx.Err() == nil && !cl.isClosed() {
		t.trySend()
	}
	return Releasing{t: t}
}

// A Releasing is a release in flight, returned by ReleaseAsync. Call Wait
// exactly once, from one goroutine.
type Releasing struct {
	t   *Ticket
	err error // the call failed before it started
}

// Wait waits for the release's result; see Release for the errors.
func (r Releasing) Wait() error {
	t := r.t
	if t == nil {
		return r.err
	}
	err := t.retrying(t.hardBy, t.cl.cfg.ReleaseRetryInterval)
	t.cl.putTicket(t)
	return err
}

// Renew restarts l's lease at lease (0: Config.DefaultLease) from the
// server's receipt of the request, and returns the Lock with its new
// conservative Expires. Renewing is safe to repeat, so an attempt whose
// connection is lost is retried (across connections, at RetryPause) until
// Config.TransportTimeout. Errors: ErrNotHeld (the lock is gone),
// ErrIndeterminate, ErrNoConnection, ctx.Err(), ErrClosed, *ServerError.
func (cl *Client) Renew(ctx context.Context, l Lock, lease time.Duration) (Lock, error) {
	if !validKey(l.Key) {
		return Lock{}, invalidKey(l.Key)
	}
	ls, err := cl.leaseSecs(lease)
	if err != nil {
		return Lock{}, err
	}
	return cl.renew(ctx, l, ls, cl.cfg.TransportTimeout)
}

// renew is Renew with a lease in seconds and window in place of
// Config.TransportTimeout: the call's limit, and how long one attempt
// waits for its answer before its connection is taken to be broken.
func (cl *Client) renew(ctx context.Context, l Lock, ls uint8, window time.Duration) (Lock, error) {
	t := cl.getTicket(ctx, proto.OpRenew, l.Key)
	defer cl.putTicket(t)
	t.id = l.Token
	t.lease = ls
	limit := monoNow().add(window)
	t.hardBy = limit
	t.sendBy = limit
	t.timeout = window
	if err := t.retrying(limit, cl.cfg.RetryPause); err != nil {
		return Lock{}, err
	}
	l.Expires = t.sentAt.add(time.Duration(ls) * time.Second).time()
	return l, nil
}

// retrying runs a release or renew: both act only on the exact token, so
// sending one again is harmless and the client resends after a lost
// connection, until limit (t.sendBy, set by the caller).
func (t *Ticket) retrying(limit instant, pause time.Duration) error {
	cl := t.cl
	maybe := false    // an earlier attempt may have executed
	shutting := false // the last answer was E 4: the server is shutting down
	closed := func() error {
		if maybe {
			return errClosedIndeterminate
		}
		return ErrClosed
	}
	for {
		if t.conn == nil && cl.isClosed() {
			return closed()
		}
		o := t.roundTrip()
		shutting = o == outAnswer && t.rop == proto.OpError && t.rcode == proto.CodeShutdown
		if o == outAnswer {
			switch t.rop {
			case proto.OpRelease, proto.OpRenew:
				return nil
			case proto.OpNotHeld:
				if maybe && t.op == proto.OpRelease {
					return nil
				}
				return ErrNotHeld
			case proto.OpMoved:
				if t.followMoved() {
					continue
				}
			case proto.OpError:
				if isAuthCode(t.rcode) {
					return t.authErr()
				}
				if t.rcode != proto.CodeShutdown {
					return &ServerError{Op: t.op, Code: t.rcode, Msg: t.rtail}
				}
			default:
				return errBadAnswerOp(t)
			}
		}
		switch o {
		case outUnauth:
			// Not executed; an earlier attempt that may have been is
			// not confirmed either way.
			if maybe {
				return ErrIndeterminate
			}
			return t.rerr
		case outCtx:
			if maybe {
				return ErrIndeterminate
			}
			return t.ctx.Err()
		case outClosed:
			return closed()
		case outLost, outAbandoned:
			maybe = true
		case outNoConn:
			// The limit passed, or (Config.FailFast) no server can be
			// reached: nothing was sent by this attempt.
			if !maybe {
				return cl.noConnErr()
			}
		}
		if monoNow() >= limit || !t.sleep(pause, limit) {
			switch {
			case cl.isClosed():
				return closed()
			case maybe:
				return ErrIndeterminate
			case t.ctx.Err() != nil:
				return t.ctx.Err()
			case shutting:
				return &ServerError{Op: t.op, Code: proto.CodeShutdown, Msg: t.rtail}
			}
			return cl.noConnErr()
		}
	}
}

// Ping measures the round trip to a server over one of the client's
// connections. It fails with ErrNoConnection if no connection was up within
// Config.TransportTimeout, ErrTimeout if the pong did not come back within
// it, ctx.Err() or ErrClosed.
func (cl *Client) Ping(ctx context.Context) (time.Duration, error) {
	t := cl.getTicket(ctx, proto.OpPing, "")
	defer cl.putTicket(t)
	t.id = rand.Uint64()
	limit := monoNow().add(cl.cfg.TransportTimeout)
	t.sendBy = limit
	t.hardBy = limit
	t.timeout = cl.cfg.TransportTimeout
	for {
		switch t.roundTrip() {
		case outAnswer:
			if t.rop == proto.OpPing {
				return time.Duration(monoNow() - t.sentAt), nil
			}
			if t.rop == proto.OpMoved && t.followMoved() {
				continue
			}
			if !t.sleep(cl.cfg.RetryPause, limit) {
				return 0, t.pauseEnded()
			}
		case outLost:
			if cl.isClosed() {
				return 0, ErrClosed
			}
		case outAbandoned:
			if t.ctx.Err() != nil {
				return 0, t.ctx.Err()
			}
			return 0, ErrTimeout
		case outCtx:
			return 0, t.ctx.Err()
		case outClosed:
			return 0, ErrClosed
		case outUnauth:
			return 0, t.rerr
		default:
			return 0, cl.noConnErr()
		}
	}
}
