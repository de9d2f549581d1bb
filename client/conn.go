package client

import (
	"bytes"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// pendIndex gives the pending table of a request op: answers are
// correlated per op — acquires by owner, releases, renews, validates and
// watches by token, pings and inspects by nonce — each in its own
// pendTable keyed by the id alone. A shared acquire shares the acquires'
// table: both are answered A, T or B by owner (owners are random, drawn
// per call). It returns -1 for any other op.
func pendIndex(op proto.Op) int {
	if op == proto.OpShared {
		return 0
	}
	return op.RequestIndex()
}

// conn is one TCP connection: a write path (see enqueue) that encodes every
// queued request just before sending it and writes each batch with one
// Write, and a reader goroutine that parses answers and hands them to their
// Tickets.
//
// mu guards queue, pend, dead and every field of a Ticket attached to this
// conn (Ticket.state, result fields). A Ticket's done channel is only a
// wake-up hint: the reader signals it after unlocking mu (the waiter's
// first step is to take mu), so the waiter always decides by state.
type conn struct {
	cl   *Client
	addr string
	nc   net.Conn

	mu       sync.Mutex
	queue    []*Ticket                        // waiting for the writer: definitely unsent
	spare    []*Ticket                        // the writer's other queue buffer
	pend     [len(proto.RequestOps)]pendTable // sent (possibly), awaiting an answer, by pendIndex and id; FIFO chains via next
	dead     bool                             // set once, by fail
	isDead   atomic.Bool                      // dead, readable without mu
	writing  bool                             // a goroutine is in flush
	gone     chan struct{}                    // closed by fail
	cause    error                            // fail's argument; read after gone
	rejected bool                             // the server closed c at once without a frame (see rejectedLocked); set with cause
	opened   instant                          // when the dial succeeded
	heard    atomic.Bool                      // a byte has been read from the server
	seq      uint64                           // send sequence: the next request written gets this number

	// The watches registered on this connection (W answered, L not yet),
	// by token, in registration order per token; under mu.
	watches map[uint64]*watchReg
	nwatch  int
	// watchFull: the server refused a watch here (E 8) since a watch on
	// it last ended; watches go to other connections meanwhile.
	watchFull atomic.Bool

	// Set by hello before the reader starts, read-only after.
	helloSent  bool        // a hello is this connection's first frame
	helloNonce uint64      // its nonce
	mayAuth    bool        // a hello was sent or a client certificate offered: requests may run authenticated
	welcomed   atomic.Bool // the hello's welcome was read
	werr       error       // a write failed (failWrite); under mu

	// Owned by the goroutine in flush.
	wbuf []byte  // the batch being written
	wdl  instant // when to move the write deadline next
}

func newConn(cl *Client, addr string, nc net.Conn) *conn {
	return &conn{cl: cl, addr: addr, nc: nc, gone: make(chan struct{}), opened: monoNow()}
}

// rejectedWithin is how soon after the dial a connection that ends without
// a byte from the server counts as rejected by it (ErrRejected): lockd at
// its --max-conns accepts and closes at once.
const rejectedWithin = time.Second

// endCause is why c ended, once gone is closed: ErrRejected at c's address
// if the server closed it at once without a frame, else the cause of the
// failure with the address.
func (c *conn) endCause() error {
	switch c.cause.(type) {
	case *authError, *refusedError:
		return c.cause
	}
	if c.rejected {
		return &rejectedError{addr: c.addr, plain: c.cl.cfg.TLS == nil}
	}
	return &addrError{c.addr, c.cause}
}

// rejectedLocked reports whether c, failing with cause, was rejected by
// the server: it ends within rejectedWithin of the dial without a byte
// from the server, for a reason of the server's (not the client's own
// closing or giving up).
func (c *conn) rejectedLocked(cause error) bool {
	switch cause {
	case ErrClosed, errAbandoned, errOverdue, errRetired:
		return false
	}
	return !c.heard.Load() && time.Duration(monoNow()-c.opened) < rejectedWithin
}

// refused records e, the server's refusal of c before any answer, as the
// reason calls without a connection fail with, and returns it.
func (c *conn) refused(e *refusedError) error {
	c.cl.mu.Lock()
	c.cl.connErr = e // before the calls woken by the failure read it
	c.cl.mu.Unlock()
	c.cl.refusedConn.Store(e)
	return e
}

// enqueue attaches t to c for sending, and sends it. It reports false if
// c is dead.
//
// There is no writer goroutine: the goroutine that finds no write in
// progress becomes the writer and flushes the queue, its own request and
// those enqueued meanwhile, one Write per batch, until the queue is empty.
// Requests enqueued while a Write is in progress wait for the next batch;
// that is how concurrent requests share a syscall without a goroutine
// hand-off per request.
func (c *conn) enqueue(t *Ticket) bool {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return false
	}
	t.conn = c
	t.state = stQueued
	c.queue = append(c.queue, t)
	if c.writing {
		c.mu.Unlock()
		return true
	}
	c.writing = true
	c.mu.Unlock()
	c.flush()
	return true
}

// testHookBeforeWrite, if set (by tests), runs before the writer takes the
// queue; returning false makes the connection fail there, with every
// queued request definitely unsent.
var testHookBeforeWrite func(c *conn) bool

// flush writes batches until the queue is empty; only the goroutine that
// set c.writing calls it. A request's wire wait is computed here, just
// before its batch is written; one whose send deadline has passed is
// dropped unsent.
func (c *conn) flush() {
	for {
		// Let the goroutines that are ready to run enqueue their requests
		// first: the batch then leaves in one Write instead of one syscall
		// per request. One yield, not more: measured with 64 goroutines on
		// one Client, yielding until the queue stops growing (up to 4
		// turns) gave 25-40% less throughput than a single turn, by holding
		// back a batch the server could already be working on
		// (BENCHMARKS.md).
		runtime.Gosched()
		if h := testHookBeforeWrite; h != nil && !h(c) {
			c.fail(errAbandoned)
			return
		}
		c.mu.Lock()
		if c.dead || len(c.queue) == 0 {
			c.writing = false
			c.mu.Unlock()
			return
		}
		q := c.queue
		c.queue = c.spare[:0]
		// Round-robin by batch: this batch is closed, the next requests go
		// to the next connection.
		c.cl.rr.Add(1)
		now := monoNow()
		buf := c.wbuf[:0]
		for i, t := range q {
			q[i] = nil
			if now >= t.sendBy {
				t.finishLocked(resExpired)
				continue
			}
			buf = t.encode(buf, now)
			t.state = stSent
			t.sentAt = now
			t.seq = c.seq
			c.seq++
			c.addPendLocked(t)
		}
		c.spare = q[:0]
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		// A write that cannot proceed (the server stopped reading) fails
		// the connection after TransportTimeout; the deadline is moved
		// only when half of it is used, to keep it off the hot path.
		if now > c.wdl {
			c.wdl = now.add(c.cl.cfg.TransportTimeout / 2)
			_ = c.nc.SetWriteDeadline(time.Now().Add(c.cl.cfg.TransportTimeout))
		}
		_, err := c.nc.Write(buf)
		if cap(buf) <= 1<<20 {
			c.wbuf = buf
		}
		if err != nil {
			c.failWrite(err)
			return
		}
	}
}

// writeGrace is how long the reader may still read after a write failed,
// before the connection is failed: answers that arrived before the
// failure decide their requests. A server that refuses a hello (or a
// request without an identity) answers E 5 and closes; a write that then
// fails on the reset must not hide the E 5, which says that nothing on
// the connection ran.
const writeGrace = 100 * time.Millisecond

// failWrite hands the failure of a write to the reader: it reads what
// has arrived, for up to writeGrace, then fails c with err (unless what it
// read decides otherwise). c takes no new batch meanwhile (writing stays
// set); requests queued on it meanwhile stay definitely unsent.
func (c *conn) failWrite(err error) {
	c.mu.Lock()
	if c.werr == nil {
		c.werr = err
	}
	c.mu.Unlock()
	_ = c.nc.SetReadDeadline(time.Now().Add(writeGrace))
}

// addPendLocked appends t to the FIFO chain of its correlation key.
func (c *conn) addPendLocked(t *Ticket) {
	c.pend[pendIndex(t.op)].add(t)
}

// takePendLocked removes and returns the oldest request of op waiting for
// an answer with id.
func (c *conn) takePendLocked(op proto.Op, id uint64) *Ticket {
	i := pendIndex(op)
	if i < 0 {
		return nil
	}
	return c.pend[i].take(id)
}

// abandonPendLocked puts a stand-in for t in t's place in its chain: the
// answer t gave up on may still come, and must go to the stand-in, not to
// a later request with the same id. The stand-in of an acquire releases a
// grant it receives (see readLoop).
func (c *conn) abandonPendLocked(t *Ticket) {
	c.pend[pendIndex(t.op)].replace(t, &Ticket{op: t.op, id: t.id, key: t.key, seq: t.seq, tomb: true})
}

// standInLocked puts a stand-in for t, an acquire whose caller stopped
// waiting (its wait ended, or ctx), in t's place, as abandonPendLocked
// does, and keeps the connection: the stand-in releases a grant it
// receives. The answer is due by t.answerBy() (the server's wait, then
// Config.AnswerAllowance); if none has come then, the server is not
// answering and the connection is failed.
func (c *conn) standInLocked(t *Ticket) {
	s := &Ticket{op: t.op, id: t.id, key: t.key, seq: t.seq, tomb: true}
	c.pend[pendIndex(t.op)].replace(t, s)
	time.AfterFunc(time.Duration(t.answerBy()-monoNow()), func() { c.overdue(s) })
}

// overdue fails c if the stand-in s has not taken its answer yet.
func (c *conn) overdue(s *Ticket) {
	c.mu.Lock()
	late := !c.dead && s.state != stDone
	c.mu.Unlock()
	if late {
		c.fail(errOverdue)
	}
}

// removeQueuedLocked takes t out of the send queue.
func (c *conn) removeQueuedLocked(t *Ticket) {
	for i, q := range c.queue {
		if q == t {
			copy(c.queue[i:], c.queue[i+1:])
			c.queue[len(c.queue)-1] = nil
			c.queue = c.queue[:len(c.queue)-1]
			return
		}
	}
}

// readLoop is the connection's only reader.
func (c *conn) readLoop() {
	defer c.cl.wg.Done()
	buf := make([]byte, 64<<10)
	start, end := 0, 0
	var r proto.Response
	var wake []chan struct{}
	var comp []*Ticket // stand-ins of acquires that received a grant
	heard := false
	frames := 0 // answers parsed
	for {
		if end == len(buf) {
			// A frame is at most proto.MaxResponseLen bytes, far less than buf.
			copy(buf, buf[start:end])
			end -= start
			start = 0
		}
		n, err := c.nc.Read(buf[end:])
		end += n
		if n > 0 {
			if !heard {
				heard = true
				c.heard.Store(true)
				c.cl.established.Store(true)
				c.cl.refusedConn.Store(nil)
			}
			var bad error
			c.mu.Lock()
			for start < end {
				m, perr := proto.ParseResponse(buf[start:end], &r)
				if perr == proto.ErrIncomplete {
					break
				}
				if perr != nil {
					bad = errBadAnswer
					break
				}
				start += m
				frames++
				if r.Op == proto.OpLost {
					c.lostLocked(r.ID, r.Reason)
					continue
				}
				if r.Op == proto.OpError && r.Code == proto.CodeBadFrame {
					if e := c.unsupportedLocked(&r, frames); e != nil {
						// A server without §9: it refused the first §9
						// request it read and stopped reading.
						bad = e
						break
					}
					bad = errServerE1
					if frames == 1 {
						// The server's first word is that it cannot read
						// us: a TLS port answers a plaintext client so.
						// It executed nothing sent here.
						bad = &refusedError{addr: c.addr, msg: string(r.Tail), plain: c.cl.cfg.TLS == nil}
					}
					break
				}
				if r.Op == proto.OpHello || r.Op == proto.OpError && r.ReqOp == proto.OpHello {
					if bad = c.helloAnswerLocked(&r); bad != nil {
						break
					}
					continue
				}
				if r.Op == proto.OpError && r.Code == proto.CodeUnauthenticated && !c.mayAuth {
					// No hello and no client certificate: nothing sent
					// on this connection can have been executed, and the
					// server closes it.
					e := &authError{code: r.Code, op: r.ReqOp, identity: c.cl.cfg.Identity, certCN: c.cl.certCN, addr: c.addr, msg: string(r.Tail)}
					c.cl.refused.Store(e)
					bad = e
					break
				}
				if t := c.dispatchLocked(&r); t != nil {
					if !t.tomb {
						wake = append(wake, t.done)
					} else if t.rop == proto.OpAcquire {
						comp = append(comp, t)
					}
				}
			}
			c.mu.Unlock()
			// Wake the waiters after unlocking: they take c.mu first thing.
			for i, ch := range wake {
				wake[i] = nil
				signal(ch)
			}
			wake = wake[:0]
			// A grant to an acquire whose caller gave up (it is closing
			// this connection): release it at once.
			for i, t := range comp {
				comp[i] = nil
				c.cl.compensate(t.key, t.rtoken)
			}
			comp = comp[:0]
			if bad != nil {
				switch e := bad.(type) {
				case *refusedError:
					c.refused(e)
				case *unsupportedError:
					c.cl.no9.Store(c.addr, e)
				}
				c.fail(bad)
				return
			}
			if start == end {
				start, end = 0, 0
			}
		}
		if err != nil {
			alert := isRemoteAlert(err)
			c.mu.Lock()
			if c.werr != nil && !alert {
				err = c.werr // the reader only drained what had arrived
			}
			c.mu.Unlock()
			if !heard && (alert || isRemoteAlert(err)) {
				// The server's TLS refused us after our side of the
				// handshake was done (TLS 1.3 judges the client
				// certificate then): it read no request.
				err = c.refused(&refusedError{addr: c.addr, err: err})
			}
			c.fail(err)
			return
		}
	}
}

// isRemoteAlert reports whether err is a TLS alert from the peer.
func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// helloAnswerLocked takes the answer to the connection's hello: a welcome,
// or an error that fails the connection (returned). Another welcome is
// dropped, like any answer that matches nothing.
func (c *conn) helloAnswerLocked(r *proto.Response) error {
	if !c.helloSent || r.ID != c.helloNonce {
		return nil
	}
	if r.Op == proto.OpHello {
		c.welcomed.Store(true)
		c.cl.refused.Store(nil)
		return nil
	}
	if r.Code != proto.CodeUnauthenticated {
		return errHelloAnswer
	}
	e := &authError{code: r.Code, op: proto.OpHello, identity: c.cl.cfg.Identity, addr: c.addr, msg: string(r.Tail)}
	c.cl.refused.Store(e)
	return e
}

// dispatchLocked hands one answer to the request it answers and returns
// that request (its waiter is woken once c.mu is unlocked). Answers that
// match nothing are dropped.
func (c *conn) dispatchLocked(r *proto.Response) *Ticket {
	op := r.Op
	switch op {
	case proto.OpTimeout, proto.OpBusy:
		op = proto.OpAcquire
	case proto.OpNotHeld, proto.OpMoved, proto.OpError:
		op = r.ReqOp
	}
	t := c.takePendLocked(op, r.ID)
	if t == nil {
		return nil
	}
	t.rop = r.Op
	t.rtoken = r.Token
	t.rcode = r.Code
	switch r.Op {
	case proto.OpMoved, proto.OpError:
		t.rtail = string(r.Tail)
		if r.Op == proto.OpError && r.ReqOp == proto.OpWatch && r.Code == proto.CodeLimitReached {
			c.watchFull.Store(true)
		}
	case proto.OpValidate:
		t.rinfo.rem = r.Remaining
	case proto.OpInspect:
		t.rinfo = inspected{rem: r.Remaining, waiters: r.Waiters, holders: r.Holders, limit: r.Limit}
	case proto.OpWatch:
		// Filed before the waiter wakes: the L may come in the same read.
		c.addWatchLocked(t)
	}
	t.res = resAnswer
	t.state = stDone
	return t
}

// unsupportedLocked recognizes the E 1 of a server without §9 (r, the
// connection's frames-th answer): its op is a §9 request's and a §9
// request sent here awaits its answer. Such a server read what came
// before that request (a queued acquire among it may yet have been
// granted), refused it and stopped reading: nothing sent after it ran.
// An E 1 that is the connection's first answer and speaks of TLS is
// lockd's TLS port refusing a plaintext client, not this (nil).
func (c *conn) unsupportedLocked(r *proto.Response, frames int) *unsupportedError {
	if !is9(r.ReqOp) || frames == 1 && bytes.Contains(r.Tail, []byte("TLS")) {
		return nil
	}
	first, found := uint64(0), false
	for i := range c.pend {
		c.pend[i].each(func(t *Ticket) {
			if is9(t.op) && (!found || t.seq < first) {
				first, found = t.seq, true
			}
		})
	}
	if !found {
		return nil
	}
	return &unsupportedError{addr: c.addr, op: r.ReqOp, msg: string(r.Tail), seq: first}
}

// fail closes c once: queued requests are finished as definitely unsent,
// sent ones as lost.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	killed := c.killLocked(cause)
	c.mu.Unlock()
	if killed {
		_ = c.nc.Close()
		close(c.gone)
	}
}

// closeIfIdle fails c unless a request is queued on it, being written or
// awaiting an answer (stand-ins aside); it reports whether c is dead.
func (c *conn) closeIfIdle(cause error) bool {
	c.mu.Lock()
	if !c.dead && (len(c.queue) > 0 || c.writing || c.awaitingLocked()) {
		c.mu.Unlock()
		return false
	}
	killed := c.killLocked(cause)
	c.mu.Unlock()
	if killed {
		_ = c.nc.Close()
		close(c.gone)
	}
	return true
}

// awaitingLocked reports whether a request sent on c awaits its answer.
func (c *conn) awaitingLocked() bool {
	for i := range c.pend {
		if c.pend[i].awaiting() {
			return true
		}
	}
	return false
}

// killLocked marks c dead once (false if it was already): queued requests
// are finished as definitely unsent, sent ones as lost. The caller closes
// the socket and gone after unlocking.
func (c *conn) killLocked(cause error) bool {
	if c.dead {
		return false
	}
	c.cause = cause
	c.dead = true
	c.isDead.Store(true)
	// What became of the requests: queued ones are definitely unsent, and
	// sent ones lost (possibly executed), except where the server cannot
	// have executed them: behind a refused hello (or on a connection
	// refused E 5 without any identity) they fail with that E 5, not
	// retried; after a TLS refusal before any answer they are unsent.
	//
	// A connection that the server closes before sending anything, within
	// rejectedWithin of the dial, was rejected: lockd at --max-conns, a
	// TLS port that a plaintext client reached, a server shutting down,
	// all close without executing what they read. Its requests count as
	// unsent too (docs/PROTOCOL.md, Decisions).
	queued, sent := resUnsent, resLost
	var rerr error
	var no9 *unsupportedError
	switch e := cause.(type) {
	case *authError:
		queued, sent, rerr = resUnauth, resUnauth, cause
	case *refusedError:
		sent = resUnsent
	case *unsupportedError:
		no9 = e
	default:
		if c.rejected = c.rejectedLocked(cause); c.rejected {
			sent = resUnsent
		}
	}
	for i, t := range c.queue {
		c.queue[i] = nil
		t.rerr = rerr
		t.finishLocked(queued)
	}
	c.queue = nil
	for i := range c.pend {
		c.pend[i].drain(func(t *Ticket) {
			for t != nil {
				nx := t.next
				t.next = nil
				t.rerr = rerr
				res := sent
				if no9 != nil {
					// The server stopped reading at the §9 request it
					// refused: what came after it did not run, and a §9
					// request behind it would be refused the same way.
					switch {
					case t.seq < no9.seq:
						t.rerr = &closedBy9Error{no9}
					case t.seq == no9.seq || is9(t.op):
						res, t.rerr = resUnsupported, no9
					default:
						res = resUnsent
					}
				}
				t.finishLocked(res)
				t = nx
			}
		})
	}
	c.dropWatchesLocked()
	return true
}
