package client

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// state of a Ticket's current attempt. While a Ticket is attached to a
// conn (state stQueued or stSent, or stDone until the waiter takes the
// result) its state and result fields are guarded by that conn's mu.
type state uint8

const (
	stIdle   state = iota // not attached to a connection: owned by the waiter
	stQueued              // in conn.queue: definitely unsent
	stSent                // handed to the writer: possibly sent
	stDone                // finished; result in res
)

// result of one attempt.
type result uint8

const (
	resNone        result = iota
	resAnswer             // an answer was read: rop, rtoken, rcode, rtail
	resUnsent             // the connection died before the request was taken for sending
	resLost               // the connection died after the request was possibly sent
	resExpired            // the writer found the send deadline passed; not sent
	resAbandoned          // the waiter gave up with the request possibly sent
	resUnauth             // not executed: the connection's hello was refused (E 5); rerr says so
	resUnsupported        // not executed: the server does not speak §9 (E 1 to a §9 request); rerr says so
)

// outcome of roundTrip, the waiter's view of one request.
type outcome uint8

const (
	outAnswer      outcome = iota // an answer: t.rop …
	outNotSent                    // the send deadline passed before it was sent
	outNoConn                     // the send deadline passed with no connection available
	outLost                       // the connection died with the request possibly sent
	outAbandoned                  // the answer deadline passed (or ctx ended) with the request possibly sent
	outWaitOver                   // an acquire's wait ended with the request possibly sent: a stand-in takes its answer
	outCtx                        // ctx ended (an acquire: sent or not; others: before it was sent)
	outClosed                     // the client was closed before it was sent
	outUnauth                     // not executed, for want of an accepted identity: t.rerr
	outUnsupported                // not executed: the server does not speak §9: t.rerr
)

// A Ticket is one acquire in flight, returned by AcquireAsync. Call Wait
// exactly once; the Ticket must not be used after Wait returns (it is
// recycled). A Ticket is not safe for concurrent use.
type Ticket struct {
	cl  *Client
	ctx context.Context
	err error // set at creation: the call fails without sending

	// The request, fixed for the whole call.
	op      proto.Op
	key     string
	id      uint64        // owner, token or nonce
	lease   uint8         // acquire, renew: lease seconds
	limit   uint16        // acquire shared: the key's limit
	wait0   bool          // acquire with wait 0
	waitEnd instant       // acquire with wait > 0: the end of the caller's wait
	sendBy  instant       // the request is not sent at or after this instant
	hardBy  instant       // if set, the answer deadline is at most this
	moved   string        // address an M pointed to: send there next
	from    string        // address of the connection of the last attempt
	avoid   string        // address whose node answered M without an address: try others first
	tomb    bool          // a stand-in for an abandoned request: absorbs its late answer
	timeout time.Duration // answer deadline after the send (not for wait>0 acquires)

	// conn is the connection of the current attempt, nil between attempts.
	// Only the waiter's goroutine sets and reads it.
	conn *conn
	// Per attempt, guarded by conn.mu while attached.
	state    state
	next     *Ticket // chain of requests with the same correlation key
	seq      uint64  // the connection's send sequence number of this attempt
	sentAt   instant
	wireWait uint8
	res      result
	rop      proto.Op
	rtoken   uint64
	rcode    uint8
	rtail    string
	rerr     error     // resUnauth, outUnauth: the E 5; resUnsupported: the E 1
	rinfo    inspected // V: remaining; I: the inspection
	// reg is a watch's registration (op W): the reader files it in the
	// connection's watches when the W answer comes, under conn.mu.
	reg *watchReg

	// done wakes the waiter (cap 1): an attempt's result is signalled on
	// it once, and the timer rings it. A wake-up is only a hint to look at
	// state under conn.mu: a ring may come early (see arm), and a ring or a
	// result's signal may come late, after the attempt it was meant for. The waiter of a plain context.Background
	// call thus parks on one channel receive, the cheapest park there is.
	done  chan struct{}
	timer *time.Timer  // an AfterFunc timer that rings done
	armed instant      // the instant timer is armed for; zero if stopped
	rang  *atomic.Bool // the timer rang since it was last armed (or a late ring came)
}

func newTicket() *Ticket {
	done, rang := make(chan struct{}, 1), new(atomic.Bool)
	// The timer's function touches no field of the Ticket, which putTicket
	// rewrites while a late ring may still run.
	timer := time.AfterFunc(time.Hour, func() {
		rang.Store(true)
		signal(done)
	})
	timer.Stop()
	return &Ticket{done: done, timer: timer, rang: rang}
}

// inspected is what a V (rem) or an I answer carried besides the token.
type inspected struct {
	rem     uint32 // ms of lease left
	waiters uint32
	holders uint16
	limit   uint16
}

// acq reports whether t is an acquire, exclusive or shared: both are
// answered A, T or B, correlated by owner, and share every rule of §7.
func (t *Ticket) acq() bool { return t.op == proto.OpAcquire || t.op == proto.OpShared }

// is9 reports whether op is a request of PROTOCOL.md §9, which a server
// without §9 answers E 1.
func is9(op proto.Op) bool {
	switch op {
	case proto.OpShared, proto.OpValidate, proto.OpWatch, proto.OpInspect:
		return true
	}
	return false
}

// An instant is a reading of the client's monotonic clock, in nanoseconds
// since clockBase; 0 means unset. The hot path reads the clock this way:
// time.Now reads the wall clock as well, which costs as much again.
type instant int64

var clockBase = time.Now()

// monoNow is the current instant (never 0).
func monoNow() instant { return instant(time.Since(clockBase)) + 1 }

func (i instant) add(d time.Duration) instant { return i + instant(d) }

// time converts i to a time.Time that carries a monotonic reading.
func (i instant) time() time.Time { return clockBase.Add(time.Duration(i - 1)) }

// getTicket takes a recycled Ticket for a new call.
func (cl *Client) getTicket(ctx context.Context, op proto.Op, key string) *Ticket {
	t := cl.tickets.Get().(*Ticket)
	t.cl = cl
	t.ctx = ctx
	t.op = op
	t.key = key
	return t
}

// putTicket recycles t once its call is over. Its timer stays set (see
// arm).
func (cl *Client) putTicket(t *Ticket) {
	if t.conn != nil {
		t.stopTimer()
		return // still attached to a connection: let the GC have it
	}
	done, timer, rang, armed := t.done, t.timer, t.rang, t.armed
	*t = Ticket{done: done, timer: timer, rang: rang, armed: armed}
	cl.tickets.Put(t)
}

// finishLocked records an attempt's result and wakes the waiter; c.mu held.
func (t *Ticket) finishLocked(r result) {
	t.res = r
	t.state = stDone
	signal(t.done)
}

// signal wakes the waiter of done, unless a wake-up is pending already.
func signal(done chan struct{}) {
	select {
	case done <- struct{}{}:
	default:
	}
}

// encode appends the request's frame, its wire wait computed from the
// remaining time at now (rounded up, capped at 255 s); conn.mu held.
func (t *Ticket) encode(buf []byte, now instant) []byte {
	switch t.op {
	case proto.OpAcquire, proto.OpShared:
		var w uint8
		if !t.wait0 {
			rem := time.Duration(t.waitEnd - now)
			s := (rem + time.Second - 1) / time.Second
			if s > proto.MaxWait {
				s = proto.MaxWait
			}
			if s < 1 {
				s = 1
			}
			w = uint8(s)
		}
		t.wireWait = w
		if t.op == proto.OpShared {
			return proto.AppendShared(buf, w, t.lease, t.id, t.limit, t.key)
		}
		return proto.AppendAcquire(buf, w, t.lease, t.id, t.key)
	case proto.OpRelease:
		return proto.AppendRelease(buf, t.id, t.key)
	case proto.OpRenew:
		return proto.AppendRenew(buf, t.lease, t.id, t.key)
	case proto.OpValidate:
		return proto.AppendValidate(buf, t.id, t.key)
	case proto.OpWatch:
		return proto.AppendWatch(buf, t.id, t.key)
	case proto.OpInspect:
		return proto.AppendInspect(buf, t.id, t.key)
	default:
		return proto.AppendPing(buf, t.id)
	}
}

// callEnd is the call's deadline: the end of the caller's wait, or for a
// wait-0 acquire its transport deadline. A grant taken after it is
// compensated.
func (t *Ticket) callEnd() instant {
	if t.wait0 {
		return t.sendBy
	}
	return t.waitEnd
}

// answerBy is the deadline for the answer of the attempt sent at sentAt.
func (t *Ticket) answerBy() instant {
	var d instant
	if t.acq() && !t.wait0 {
		d = t.sentAt.add(time.Duration(t.wireWait)*time.Second + t.cl.cfg.AnswerAllowance)
	} else {
		d = t.sentAt.add(t.timeout)
	}
	if t.hardBy != 0 && t.hardBy < d {
		d = t.hardBy
	}
	return d
}

// arm makes sure the timer rings at instant at or earlier. A ring before
// a deadline is a spurious wake-up that the waiter answers by arming again,
// so a timer already set for an instant no later than at that has not rung
// is left alone, and a Ticket's timer is not stopped when its call ends.
// That keeps timer operations off the hot path: deadlines are seconds
// away and answers microseconds, so the calls that reuse a Ticket find its
// timer set early enough, and it rings, spuriously, about once per
// deadline's length.
func (t *Ticket) arm(at instant) {
	if t.armed != 0 && t.armed <= at && !t.rang.Load() {
		return
	}
	t.armed = at
	t.rang.Store(false)
	t.timer.Reset(time.Duration(at - monoNow()))
}

func (t *Ticket) stopTimer() {
	if t.armed != 0 {
		t.timer.Stop()
		t.armed = 0
	}
}

// trySend attaches t to a live connection, if one is available now. If
// the address an M named cannot be reached (evicted, or down), t goes to
// another node instead, which answers M again or executes it. A §9
// request bound for a server known not to speak §9 is not sent: t.res
// is resUnsupported, and t.rerr says why.
func (t *Ticket) trySend() bool {
	for {
		c := t.cl.pick(t.moved, t.avoid)
		if c == nil {
			if t.moved != "" && t.cl.unreachableAddr(t.moved) {
				t.avoid, t.moved = t.moved, ""
				continue
			}
			return false
		}
		if is9(t.op) {
			if e := t.cl.lacks9(c.addr); e != nil {
				t.rerr, t.res = e, resUnsupported
				return false
			}
			if t.op == proto.OpWatch && c.watchFull.Load() {
				c = t.cl.pickWatch(c)
			}
		}
		if c.enqueue(t) {
			return true
		}
	}
}

// roundTrip sends t (unless trySend already attached it) and waits for the
// answer. It resends on another connection only while the request is
// definitely unsent, keeping the request (owner, deadline) as it is.
func (t *Ticket) roundTrip() outcome {
	cl := t.cl
	ctxDone := t.ctx.Done()
	for {
		if t.conn == nil {
			if t.ctx.Err() != nil {
				return outCtx
			}
			if cl.isClosed() {
				return outClosed
			}
			if !t.trySend() {
				if t.res == resUnsupported {
					t.res = resNone
					return outUnsupported
				}
				if o, ok := t.waitConn(ctxDone); !ok {
					return o
				}
				continue
			}
		}
		c := t.conn
		t.arm(t.sendBy)
		for {
			cancelled := false
			if ctxDone == nil {
				<-t.done
			} else {
				select {
				case <-t.done:
				case <-ctxDone:
					cancelled = true
				}
			}
			c.mu.Lock()
			if t.state == stDone {
				// If this wake-up was another (a ring, ctx), take the
				// result's signal if it is there already; a late one is a
				// spurious wake-up for a later wait.
				select {
				case <-t.done:
				default:
				}
				t.state = stIdle
				t.conn = nil
				t.from = c.addr
				c.mu.Unlock()
				break
			}
			now := monoNow()
			if t.state == stQueued {
				if cancelled || now >= t.sendBy {
					c.removeQueuedLocked(t)
					t.state = stIdle
					t.conn = nil
					c.mu.Unlock()
					if cancelled {
						return outCtx
					}
					return outNotSent
				}
				c.mu.Unlock()
				t.arm(t.sendBy)
				continue
			}
			// stSent
			if t.acq() && (cancelled || !t.wait0 && now >= t.waitEnd) {
				// The caller's wait is over, or ctx ended: the call ends
				// now and keeps its connection. The answer may still
				// come: a stand-in takes the request's place and releases
				// a grant it receives (readLoop), and closes the
				// connection if no answer comes when one is due.
				c.standInLocked(t)
				t.state = stIdle
				t.conn = nil
				t.from = c.addr
				c.mu.Unlock()
				if cancelled {
					return outCtx
				}
				return outWaitOver
			}
			by := t.answerBy()
			if cancelled || now >= by {
				// Its answer may still come: a stand-in takes its place in
				// the chain and absorbs it, so that it cannot be matched
				// to a later request with the same id (a renew's K to the
				// next renew of that token).
				c.abandonPendLocked(t)
				t.state = stIdle
				t.conn = nil
				t.from = c.addr
				c.mu.Unlock()
				switch {
				case t.acq():
					// A wait-0 acquire's transport deadline: close that
					// exact connection (a grant not yet handed to its
					// socket is released by the server at once).
					c.fail(errAbandoned)
				case !cancelled && now >= t.sentAt.add(t.timeout/2):
					// No answer for half a transport timeout, when the
					// call's window ended, or a whole one: the connection
					// is taken to be broken.
					c.fail(errAbandoned)
				}
				return outAbandoned
			}
			c.mu.Unlock()
			if t.acq() && !t.wait0 {
				by = t.waitEnd
			}
			t.arm(by)
		}
		switch t.res {
		case resAnswer:
			return outAnswer
		case resUnsent:
			continue // definitely unsent: another connection, same request
		case resExpired:
			return outNotSent
		case resUnauth:
			return outUnauth
		case resUnsupported:
			return outUnsupported
		default: // resLost
			return outLost
		}
	}
}

// waitConn waits until a connection may be available. ok false ends the
// attempt with outcome o.
func (t *Ticket) waitConn(ctxDone <-chan struct{}) (o outcome, ok bool) {
	cl := t.cl
	ch := cl.changedCh()
	if t.trySend() {
		return 0, true
	}
	if t.res == resUnsupported {
		t.res = resNone
		return outUnsupported, false
	}
	if e := cl.refused.Load(); e != nil {
		// The server refused the credentials, and no connection is up:
		// a redial would be refused the same way.
		t.rerr = e
		return outUnauth, false
	}
	if cl.refusedConn.Load() != nil {
		return outNoConn, false // with the refusal as the reason
	}
	if monoNow() >= t.sendBy || cl.cfg.FailFast && cl.unreachable() {
		return outNoConn, false
	}
	t.arm(t.sendBy)
	for {
		select {
		case <-ch:
			return 0, true
		case <-t.done: // a ring, maybe an early one: look at the clock
			if monoNow() >= t.sendBy {
				return outNoConn, false
			}
			t.arm(t.sendBy)
		case <-ctxDone:
			return outCtx, false
		case <-cl.closing:
			return outClosed, false
		}
	}
}

// sleep pauses for d; false if ctx ended, the client closed or limit was
// reached first (then it returns at limit: a call does not give up before
// its deadline).
func (t *Ticket) sleep(d time.Duration, limit instant) bool {
	at := monoNow().add(d)
	ok := at < limit
	if !ok {
		at = limit
	}
	t.arm(at)
	for {
		select {
		case <-t.done: // a ring, maybe an early one: look at the clock
			if monoNow() >= at {
				return ok
			}
			t.arm(at)
		case <-t.ctx.Done():
			return false
		case <-t.cl.closing:
			return false
		}
	}
}
