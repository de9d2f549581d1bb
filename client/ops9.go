package client

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// AcquireShared takes one of up to limit grants of key at once
// (PROTOCOL.md §9.2): a semaphore of limit permits, or with
// MaxSharedLimit the read side of a read/write lock whose writers use
// Acquire. Each holder gets its own token and lease; Release, Renew,
// Validate and Watch act on that one holder. The key's limit is set by
// the grant that finds it free and holds until it is free again: an
// acquire with another limit gets an error matching ErrLimitMismatch
// (E 7), at once. The queue is FIFO: while anyone waits (an exclusive
// acquire at its head included), a shared acquire waits behind them even
// if the key has room.
//
// Everything else is Acquire's: the wait, the deadline that decides, the
// delivery gate and its compensating release, M followed with the same
// owner and deadline, and the errors. limit must be 1..65535
// (ErrInvalidLimit). A server without §9 gives ErrUnsupported.
func (cl *Client) AcquireShared(ctx context.Context, key string, limit int, opts AcquireOptions) (Lock, error) {
	return cl.acquireAsync(ctx, proto.OpShared, key, limit, opts).Wait()
}

// AcquireSharedAsync is AcquireShared's AcquireAsync: it starts the
// shared acquire and returns at once; the Ticket's Wait gives the result.
func (cl *Client) AcquireSharedAsync(ctx context.Context, key string, limit int, opts AcquireOptions) *Ticket {
	return cl.acquireAsync(ctx, proto.OpShared, key, limit, opts)
}

// MaxSharedLimit is the largest limit of a shared acquire: what a
// read/write lock's readers use (RWMutex).
const MaxSharedLimit = proto.MaxLimit

// Validate asks lockd whether token is a current holder of key (a grant
// of Acquire or AcquireShared, not released and not expired) and returns
// the lease time it has left, rounded down to milliseconds (PROTOCOL.md
// §9.3). It changes nothing: no renewal. A protected resource calls it
// before acting on a request that carries a token (fence.Validating
// does); it satisfies fence.Validator.
//
// Errors: ErrNotHeld (N: released, expired, never issued, or another
// key's), ErrUnsupported, ErrPermissionDenied, ErrUnauthenticated,
// ErrNoConnection (no server reached within Config.TransportTimeout),
// ErrTimeout (sent, and no answer came back within it), ctx.Err(),
// ErrClosed, a *ServerError. Only lockd's answer is a verdict: a
// resource must not act on an error. Validate is safe to send again,
// and is, across connections, while no answer came.
func (cl *Client) Validate(ctx context.Context, key string, token uint64) (time.Duration, error) {
	if !validKey(key) {
		return 0, invalidKey(key)
	}
	t := cl.getTicket(ctx, proto.OpValidate, key)
	defer cl.putTicket(t)
	t.id = token
	if err := t.asking(cl.cfg.TransportTimeout); err != nil {
		return 0, err
	}
	return time.Duration(t.rinfo.rem) * time.Millisecond, nil
}

// Inspection is a key's state at one moment (PROTOCOL.md §9.5), as
// Inspect returns it.
type Inspection struct {
	Key     string
	Holders int // grants held now: 0 when free, 1 when exclusive
	// Limit is 0 when the key is free, 1 when it is held exclusively (or
	// shared with limit 1), else the limit of its shared holders.
	Limit   int
	Waiters int // acquires queued for it, exclusive and shared
	// Token and Remaining are the newest holder's (the largest token)
	// and its lease time left; 0 and 0 when free.
	Token     uint64
	Remaining time.Duration
}

// Free reports whether no one holds the key.
func (in Inspection) Free() bool { return in.Holders == 0 }

// Inspect returns key's state now: how many hold it and with what limit,
// how many wait, and its newest holder's token and lease left
// (PROTOCOL.md §9.5). It changes nothing. The admin endpoint's
// /keys/{key} lists every holder and waiter. Errors are Validate's, but
// for ErrNotHeld.
func (cl *Client) Inspect(ctx context.Context, key string) (Inspection, error) {
	if !validKey(key) {
		return Inspection{}, invalidKey(key)
	}
	t := cl.getTicket(ctx, proto.OpInspect, key)
	defer cl.putTicket(t)
	t.id = rand.Uint64()
	if err := t.asking(cl.cfg.TransportTimeout); err != nil {
		return Inspection{}, err
	}
	in := &t.rinfo
	return Inspection{
		Key:       key,
		Holders:   int(in.holders),
		Limit:     int(in.limit),
		Waiters:   int(in.waiters),
		Token:     t.rtoken,
		Remaining: time.Duration(in.rem) * time.Millisecond,
	}, nil
}

// asking runs a validate, inspect or watch: each is harmless to send
// again (a validate and an inspect change nothing; a watch lives on its
// connection, so one whose connection was lost is gone with it), so an
// attempt whose connection is lost or that gets no answer is sent again,
// at Config.RetryPause, until window has passed. It returns nil when the
// request's own answer came (t.rop is t.op's answer op).
func (t *Ticket) asking(window time.Duration) error {
	cl := t.cl
	limit := monoNow().add(window)
	t.hardBy, t.sendBy, t.timeout = limit, limit, window
	sent := false     // an attempt may have reached the server
	shutting := false // the last answer was E 4
	for {
		if t.conn == nil && cl.isClosed() {
			return ErrClosed
		}
		o := t.roundTrip()
		shutting = o == outAnswer && t.rop == proto.OpError && t.rcode == proto.CodeShutdown
		switch o {
		case outAnswer:
			switch t.rop {
			case t.op:
				return nil
			case proto.OpNotHeld:
				return ErrNotHeld
			case proto.OpMoved:
				if t.followMoved() {
					continue
				}
			case proto.OpError:
				switch {
				case isAuthCode(t.rcode):
					return t.authErr()
				case t.rcode == proto.CodeLimitReached && t.op == proto.OpWatch && cl.watchRoom(t.from):
					// This connection is full; another to the same
					// server is not.
					continue
				case t.rcode != proto.CodeShutdown:
					return &ServerError{Op: t.op, Code: t.rcode, Msg: t.rtail}
				}
			default:
				return errBadAnswerOp(t)
			}
		case outUnauth, outUnsupported:
			return t.rerr
		case outCtx:
			return t.ctx.Err()
		case outClosed:
			return ErrClosed
		case outLost, outAbandoned:
			sent = true
		case outNoConn, outNotSent:
			if !sent {
				return cl.noConnErr()
			}
		}
		if monoNow() >= limit || !t.sleep(cl.cfg.RetryPause, limit) {
			switch {
			case cl.isClosed():
				return ErrClosed
			case t.ctx.Err() != nil:
				return t.ctx.Err()
			case shutting:
				return &ServerError{Op: t.op, Code: proto.CodeShutdown, Msg: t.rtail}
			case sent:
				return ErrTimeout
			}
			return cl.noConnErr()
		}
	}
}
