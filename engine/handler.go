package engine

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// Texts of E frames.
const (
	msgBadFrame = "bad frame: unknown op, tail over 1024 bytes, or non-empty ping tail"
	msgBadLease = "bad lease: must be 1..255 seconds"
	msgShutdown = "server shutting down"
	// PROTOCOL.md §9: an S with limit 0 or a limit other than the key's
	// holders' (E 7), a W beyond the connection's bound (E 8).
	msgBadLimit     = "limit mismatch: an acquire shared needs limit 1..65535, the limit of the key's holders"
	msgLimitReached = "limit reached: this connection has --max-watches-per-conn watches"
)

// dropInline is how many queued acquires of a closing connection OnClose
// drops on its loop (tens of µs); a connection with more has the rest
// dropped on a goroutine of its own.
const dropInline = 1024

// handler adapts Server to gnet's callbacks.
type handler struct {
	gnet.BuiltinEventEngine
	s         *Server
	msgBadKey string

	// Refusals at --max-conns and failed TLS handshakes: one log line a
	// second at most for each, counting those since the last line (table
	// clock); hsLast is the last failed handshake's cause.
	refusedLog ratelog.Atomic
	hsLog      ratelog.Atomic
	hsLast     atomic.Pointer[string]

	// Sessions that may hold a partial frame, for the --frame-timeout
	// sweep (OnTick, every sweepEvery).
	partialMu    sync.Mutex
	partial      []*session
	partialSpare []*session
	sweepEvery   int64
	lastSweep    int64 // OnTick's goroutine only

	// Goroutines dropping the waiters of closed connections; once
	// stopping, OnClose drops them all inline.
	dropMu   sync.Mutex
	stopping bool
	drops    sync.WaitGroup
}

func (h *handler) OnBoot(gnet.Engine) gnet.Action {
	h.msgBadKey = "bad key: must be 1.." + strconv.Itoa(h.s.cfg.MaxKey) + " bytes of UTF-8 without 0x0A"
	h.sweepEvery = int64(min(time.Second, h.s.cfg.FrameTimeout))
	return gnet.None
}

func (h *handler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	s := h.s
	if s.draining.Load() {
		return nil, gnet.Close
	}
	if n := s.conns.Add(1); n > int64(s.cfg.MaxConns) {
		s.conns.Add(-1)
		h.connRefused(s.now())
		return nil, gnet.Close
	}
	loop := c.EventLoop()
	c.SetContext(h.open(c, loop, s.statsFor(loop), ""))
	return nil, gnet.None
}

// open makes the session of a new connection (counted in s.conns by the
// caller) and lists it; cn is its verified client certificate's Common
// Name (TLS), or "".
func (h *handler) open(c wire, loop gnet.EventLoop, st *loopStats, cn string) *session {
	ss := &session{c: c, loop: loop, st: st, certCN: cn}
	ss.tconn = shard.NewConn(ss)
	h.s.addSession(ss)
	return ss
}

func (h *handler) OnClose(c gnet.Conn, _ error) gnet.Action {
	ss, _ := c.Context().(*session)
	if ss == nil || ss.gone {
		return gnet.None
	}
	mail := h.closeBegin(ss)
	// gnet writes what is left in its buffer after this callback returns,
	// to a peer that may still read (a half-close, a bad frame): a grant
	// in those bytes would reach its client after being released below.
	// So hand the socket what it takes now (those grants are delivered and
	// stay), then shut the write side: nothing more can be handed to it,
	// and what is still buffered is not delivered, ever.
	if c.OutboundBuffered() > 0 {
		_ = c.Flush()
		if c.OutboundBuffered() > 0 {
			_ = unix.Shutdown(c.Fd(), unix.SHUT_WR)
		}
	}
	h.closeEnd(ss, &mail)
	return gnet.None
}

// closeBegin is the first half of a connection's close, on the goroutine
// that runs its batches: the session leaves the server's lists, its
// mailbox takes no more mail (what it holds is returned: never written,
// so undelivered) and its queued acquires leave their queues.
func (h *handler) closeBegin(ss *session) (mail answers) {
	s := h.s
	ss.gone = true
	ss.partialSince.Store(0) // the sweep forgets it
	if ss.local {
		s.localConns.Add(-1)
	} else {
		s.conns.Add(-1)
	}
	s.removeSession(ss)

	// No more mail; what was posted and never written is undeliverable.
	ss.mu.Lock()
	ss.closed = true
	mail, ss.mbox = ss.mbox, answers{}
	ss.mu.Unlock()

	// Queued acquires leave their queues silently: the first dropInline
	// here (this marks the Conn dropped: nothing more queues), the rest on
	// a goroutine, so that closing a connection with a huge queue does not
	// stall this loop. A waiter not dropped yet may still be handed a key:
	// its grant cannot be posted to this session any more, and the poster
	// releases it.
	if !s.table.DropWaiters(ss.tconn, dropInline) {
		h.dropLater(ss.tconn)
	}
	return mail
}

// closeEnd is the second half, once nothing more can reach the socket
// (ss.c.OutboundBuffered is final): grants that did not reach it are
// released at once (PROTOCOL.md §4: no phantom lock).
func (h *handler) closeEnd(ss *session, mail *answers) {
	s := h.s
	b := s.getScratch()
	now := s.now()
	if !s.serving(now) {
		// A standby's or follower's table changes only as the active's or
		// the log does: it releases nothing of its own (an undelivered
		// grant of an active that just stepped down ends with its lease).
		ss.pend, ss.pkeys = nil, nil
		s.forgetHeld(ss)
		s.putScratch(b)
		return
	}
	s.releaseHeld(ss, b, now)
	if w := ss.writing; w != nil {
		// The write itself failed: none of that batch left.
		s.releaseGrants(&w.answers, b, now)
	}
	delivered := ss.written - uint64(ss.c.OutboundBuffered())
	for i := range ss.pend {
		if p := &ss.pend[i]; p.end > delivered {
			s.table.Release(now, ss.pendingKey(p), p.token, &b.fx)
		}
	}
	s.releaseGrants(mail, b, now)
	ss.pend, ss.pkeys = nil, nil
	s.deliver(b, nil, now)
	s.putScratch(b)
}

// dropLater drops the queued acquires of a closed connection on a goroutine
// of its own (inline once the engine is stopping: OnShutdown waits for the
// goroutines).
func (h *handler) dropLater(c *shard.Conn) {
	h.dropMu.Lock()
	if h.stopping {
		h.dropMu.Unlock()
		h.s.table.DropConn(c)
		return
	}
	h.drops.Add(1)
	h.dropMu.Unlock()
	go func() {
		defer h.drops.Done()
		// Slices with a yield between them: the loops, whose threads
		// need a P back after each epoll_wait, go first.
		for !h.s.table.DropWaiters(c, dropInline) {
			runtime.Gosched()
		}
	}()
}

// OnShutdown runs once the engine stops, before the loops close their
// connections: from here on closes drop their waiters inline, and the
// drops already started finish before Serve returns.
func (h *handler) OnShutdown(gnet.Engine) {
	h.dropMu.Lock()
	h.stopping = true
	h.dropMu.Unlock()
	h.drops.Wait()
}

func (h *handler) OnTraffic(c gnet.Conn) gnet.Action {
	ss, _ := c.Context().(*session)
	if ss == nil || ss.gone {
		return gnet.Close
	}
	return h.traffic(ss)
}

// traffic is one batch of a session, on the goroutine that owns it (its
// event loop, or a TLS connection's reader): the mail, then every complete
// request ss.c has buffered, then one Write of all the answers. It returns
// the action for the connection.
func (h *handler) traffic(ss *session) gnet.Action {
	s, c := h.s, ss.c
	b := s.getScratch()
	defer s.putScratch(b)
	ss.heldWake.Store(false)
	// The barrier's read lock covers the whole batch, writes included: once
	// GateChanged has its write lock, no batch that executed under the old
	// gate is still on its way to a socket (Abandon relies on it).
	s.barrier.RLock()
	defer s.barrier.RUnlock()
	b.gen = s.abandonsA.Load() // what this batch executes comes after these Abandon calls
	spec := ss.takeMail(b)     // answers made from the table's state
	action := gnet.None

	auth := s.acl.Load() != nil
	buf, _ := c.Peek(-1)
	// The clock is read after the bytes were: the event loop (or the TLS
	// reader) read them from the socket before it called traffic, and Peek
	// only returns what it read. So every request in buf arrived before
	// now, a freeze (SIGSTOP, a stall) that ended before one of them
	// arrived ended before now too, and the gate, which expires half a
	// failover timeout after the ticker's last tick, has expired for it
	// (PROTOCOL.md §6.2: nothing executes from a frozen member's stale
	// state). Any clock read inside traffic has this property; reading it
	// next to the bytes keeps that visible.
	now := s.now()
	if auth && !s.refreshAuth(ss) {
		// A reload removed this connection's identity: close, unread.
		buf, action = nil, gnet.Close
	}
	if len(buf) > 0 {
		draining := s.draining.Load()
		gate := s.node.Gate()
		state := gate.Effective(now)
		spec = spec || state == repl.Serve
		if state == repl.Hold {
			// Read nothing: the requests wait in the connection's buffer
			// until GateChanged wakes it under the next gate.
			buf = nil
		}
		// Validation order (PROTOCOL.md §3, §6.2, §8.3, §9.6): E 1, E 5,
		// E 2, E 3, E 7 for an S with limit 0, E 6, then E 4 or M, then
		// the table's answers (E 7 for another limit and E 8 before N, T
		// and B: apply).
		n := 0
		for n < len(buf) {
			m, err := proto.ParseRequest(buf[n:], s.cfg.MaxKey, &b.req)
			if err == proto.ErrIncomplete {
				break
			}
			r := &b.req
			if err == proto.ErrBadFrame {
				// Framing is lost: answer and close (PROTOCOL.md §3).
				b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeBadFrame, msgBadFrame)
				b.cnt.error(r.Op, proto.CodeBadFrame)
				n = len(buf)
				action = gnet.Close
				break
			}
			n += m
			if auth && !h.admit(ss, b) {
				// E 5: nothing after it is read; the connection closes.
				n = len(buf)
				action = gnet.Close
				break
			}
			if err == proto.ErrBadKey {
				b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeBadKey, h.msgBadKey)
				b.cnt.error(r.Op, proto.CodeBadKey)
				continue
			}
			if err == proto.ErrBadLease {
				b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeBadLease, msgBadLease)
				b.cnt.error(r.Op, proto.CodeBadLease)
				continue
			}
			if err == proto.ErrBadLimit {
				// An S with limit 0: E 7 right after E 3, it needs no
				// state (PROTOCOL.md §9.6).
				b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeLimitMismatch, msgBadLimit)
				b.cnt.error(r.Op, proto.CodeLimitMismatch)
				continue
			}
			if auth && !h.permit(ss, b) {
				continue
			}
			if state == repl.Redirect && r.Op != proto.OpHello {
				// Every member answers a hello itself: it changes no
				// lock state (PROTOCOL.md §8.3). A member that drains
				// after naming a successor answers M, not E 4 (§6.2).
				b.out = proto.AppendMoved(b.out, r.Op, r.ID, gate.Addr)
				b.cnt.request(r.Op, resMoved)
				continue
			}
			if h.apply(ss, b, now, draining) == gnet.Close {
				// A hello that failed (E 5): nothing after it is read.
				n = len(buf)
				action = gnet.Close
				break
			}
		}
		if auth && ss.auth.id != nil && ss.auth.gen != s.acl.Load() && !s.refreshAuth(ss) {
			// A reload during this batch removed the identity it
			// authenticated as (SetACL's sweep may not have seen it).
			action = gnet.Close
		}
		if n > 0 {
			_, _ = c.Discard(n)
		}
		if n < len(buf) {
			h.partialFrame(ss, now, n > 0)
		} else if ss.partialSince.Load() != 0 {
			ss.partialSince.Store(0)
		}
	}
	if len(b.fx.Effects) > 0 {
		s.deliver(b, ss, now)
	}
	ss.st.add(&b.cnt)
	action = h.write(ss, b, action, spec)
	// Sessions of this loop that this batch handed a grant to: write their
	// mail now instead of waking them through the loop's task queue.
	for _, o := range b.local {
		if !o.gone {
			ob := s.getScratch()
			spec := o.takeMail(ob)
			if h.write(o, ob, gnet.None, spec) == gnet.Close {
				_ = o.c.Close()
			}
			s.putScratch(ob)
		}
	}
	return action
}

// write hands b.out to ss's connection (one Write), tracks the grants in it
// and enforces --max-outbound. It returns the action for the connection.
//
// spec says the answers were made from the table's state (see hold): with
// a node that commits before answering they wait for it.
func (h *handler) write(ss *session, b *scratch, action gnet.Action, spec bool) gnet.Action {
	s, c := h.s, ss.c
	if s.committer != nil && h.hold(ss, b, spec) {
		s.log.Warn("closing a connection whose answers wait for changes that will not commit, or for too long",
			"remote", c.RemoteAddr(), "held", len(ss.held.out))
		return gnet.Close
	}
	if len(b.out) > 0 {
		ss.writing = b
		_, _ = c.Write(b.out)
		ss.writing = nil
		if ss.gone {
			return gnet.None // the write failed and closed the connection
		}
		ss.afterWrite(b)
		if buffered := c.OutboundBuffered(); buffered > s.cfg.MaxOutbound && action == gnet.None {
			s.log.Warn("closing connection that does not read its answers", "remote", c.RemoteAddr(), "buffered", buffered)
			action = gnet.Close
		}
	} else if len(ss.pend) > 0 {
		ss.prune(ss.written - uint64(c.OutboundBuffered()))
	}
	if s.draining.Load() {
		ss.backlog.Store(int64(c.OutboundBuffered()))
	}
	return action
}

// acquireResult maps a shard status to its counter (a Mismatch, E 7, is
// counted as an error by its caller).
var acquireResult = [...]int{shard.Granted: resGranted, shard.TimedOut: resTimeout, shard.Busy: resBusy, shard.Queued: resQueued,
	shard.Mismatch: resError}

// apply executes one well-formed request that passed the ACL's checks and
// appends its immediate answer. It returns gnet.Close after a failed hello
// (E 5).
func (h *handler) apply(ss *session, b *scratch, now int64, draining bool) gnet.Action {
	s, r := h.s, &b.req
	if draining && r.Op != proto.OpPing && r.Op != proto.OpHello {
		b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeShutdown, msgShutdown)
		b.cnt.error(r.Op, proto.CodeShutdown)
		return gnet.None
	}
	who := ss.auth.who // the zero Who without an ACL: the token alone decides
	switch r.Op {
	case proto.OpAcquire:
		if len(ss.pend)+len(b.grants) >= s.cfg.MaxPendingGrants && h.pendingFull(ss, b) {
			// Grants this client has not taken pin as many keys already.
			b.out = proto.AppendBusy(b.out, r.ID, r.Key)
			b.cnt.request(proto.OpAcquire, resBusy)
			return gnet.None
		}
		st, token := s.table.AcquireAs(now, r.Key, r.Wait, r.Lease, r.ID, who.Ident, ss.tconn, &b.fx)
		switch st {
		case shard.Granted:
			b.addGrant(r.ID, token, r.Key)
		case shard.TimedOut:
			b.out = proto.AppendTimeout(b.out, r.ID, r.Key)
		case shard.Busy:
			b.out = proto.AppendBusy(b.out, r.ID, r.Key)
		}
		b.cnt.request(proto.OpAcquire, acquireResult[st])
	case proto.OpRelease:
		// Another identity's grant is N, as a stale token, unless who is
		// an admin (PROTOCOL.md §8.3).
		res, holder := s.table.ReleaseAs(now, r.Key, r.ID, who, &b.fx)
		if res.Done() {
			b.out = proto.AppendReleased(b.out, r.ID, r.Key)
			b.cnt.request(proto.OpRelease, resReleased)
		} else {
			b.out = proto.AppendNotHeld(b.out, proto.OpRelease, r.ID, r.Key)
			b.cnt.request(proto.OpRelease, resNotHeld)
		}
		if res == shard.ResultForced || res == shard.ResultRefused {
			s.logOther(res, r.Op, r.Key, r.ID, ss.auth.id.Name, holder)
		}
	case proto.OpRenew:
		res, holder := s.table.RenewAs(now, r.Key, r.Lease, r.ID, who, &b.fx)
		if res.Done() {
			b.out = proto.AppendRenewed(b.out, r.ID, r.Key)
			b.cnt.request(proto.OpRenew, resRenewed)
		} else {
			b.out = proto.AppendNotHeld(b.out, proto.OpRenew, r.ID, r.Key)
			b.cnt.request(proto.OpRenew, resNotHeld)
		}
		if res == shard.ResultForced || res == shard.ResultRefused {
			s.logOther(res, r.Op, r.Key, r.ID, ss.auth.id.Name, holder)
		}
	case proto.OpPing:
		b.out = proto.AppendPong(b.out, r.ID)
		b.cnt.request(proto.OpPing, resPong)
	case proto.OpShared:
		h.acquireShared(ss, b, now, who)
	case proto.OpValidate:
		h.validate(b, now)
	case proto.OpWatch:
		h.watch(ss, b, now)
	case proto.OpInspect:
		h.inspect(b, now)
	case proto.OpHello:
		if s.acl.Load() != nil {
			return h.hello(ss, b)
		}
		// Without an ACL a hello is accepted and changes nothing: the
		// answer names the identity it gave, unchecked (PROTOCOL.md §8.3).
		b.out = proto.AppendWelcome(b.out, r.ID, proto.HelloIdentity(r.Key))
		b.cnt.request(proto.OpHello, resWelcome)
	}
	return gnet.None
}

// pendingFull reports whether ss has --max-pending-grants grants that did
// not reach its socket: those gnet still buffers from earlier writes and,
// if it buffers anything (so this batch's Write can only add to it), the
// grants of this batch.
func (h *handler) pendingFull(ss *session, b *scratch) bool {
	buffered := ss.c.OutboundBuffered()
	ss.prune(ss.written - uint64(buffered))
	return buffered > 0 && len(ss.pend)+len(b.grants) >= h.s.cfg.MaxPendingGrants
}

func (h *handler) OnTick() (time.Duration, gnet.Action) {
	s := h.s
	if s.stopped.Load() {
		return tickEvery, gnet.None
	}
	now := s.now()
	s.lastTick.Store(now) // Live
	s.barrier.RLock()
	if s.node.Gate().Effective(now) == repl.Serve {
		b := s.getScratch()
		s.table.Tick(now, &b.fx)
		if len(b.fx.Effects) > 0 {
			s.deliver(b, nil, now)
		}
		s.putScratch(b)
	}
	s.barrier.RUnlock()
	if now-h.lastSweep >= h.sweepEvery {
		h.lastSweep = now
		h.sweep(now)
	}
	return tickEvery, gnet.None
}

// partialFrame notes (on ss's loop) that ss's inbound buffer ends with a
// partial frame; fresh says it began in this batch (frames before it were
// complete), so its age counts from now.
func (h *handler) partialFrame(ss *session, now int64, fresh bool) {
	if fresh || ss.partialSince.Load() == 0 {
		ss.partialSince.Store(max(now, 1))
	}
	if !ss.listed.Load() && ss.listed.CompareAndSwap(false, true) {
		h.partialMu.Lock()
		h.partial = append(h.partial, ss)
		h.partialMu.Unlock()
	}
}

// sweep (OnTick, every sweepEvery) closes the connections whose partial
// frame is older than --frame-timeout, forgets the sessions that have none
// any more, and logs the refusals not logged yet. Its cost is proportional
// to the sessions listed by partialFrame, not to all of them.
func (h *handler) sweep(now int64) {
	if n, ok := h.refusedLog.Flush(now); ok {
		h.logRefused(n)
	}
	if n, ok := h.hsLog.Flush(now); ok {
		h.logHandshakes(n)
	}
	h.partialMu.Lock()
	list := h.partial
	h.partial = h.partialSpare[:0]
	h.partialMu.Unlock()

	timeout := int64(h.s.cfg.FrameTimeout)
	keep, closed := list[:0], 0
	for _, ss := range list {
		since := ss.partialSince.Load()
		switch {
		case since != 0 && now-since > timeout:
			_ = ss.c.Close() // safe from any goroutine; OnClose clears partialSince
			ss.listed.Store(false)
			closed++
		case since != 0:
			keep = append(keep, ss)
		default:
			// Unlist, then look again: a loop that saw listed still true
			// in between did not list it.
			ss.listed.Store(false)
			if ss.partialSince.Load() != 0 && ss.listed.CompareAndSwap(false, true) {
				keep = append(keep, ss)
			}
		}
	}
	if closed > 0 {
		h.s.log.Warn("closed connections whose partial frame was older than the frame timeout",
			"closed", closed, "frame_timeout", h.s.cfg.FrameTimeout)
	}

	h.partialMu.Lock()
	h.partial = append(h.partial, keep...)
	clear(list[:cap(list)])
	h.partialSpare = list[:0]
	h.partialMu.Unlock()
}

// connRefused logs a connection refused at --max-conns: one line a second
// at most, with the refusals since the last one (a flood of connects makes
// one line a second, not one per connect; the sweep logs its tail).
func (h *handler) connRefused(now int64) {
	if held, ok := h.refusedLog.Allow(now); ok {
		h.logRefused(held + 1)
	}
}

// logRefused logs n connections refused at --max-conns.
func (h *handler) logRefused(n int) {
	h.s.log.Warn("connections refused: --max-conns reached", "refused", n, "max", h.s.cfg.MaxConns)
}

// deliver hands every effect in b.fx to its connection: appended to b.out
// when it is cur (the connection whose batch this is), else posted to the
// connection's mailbox — with a Wake, or, for a connection of cur's own
// loop, listed in b.local for the caller to flush after its batch. A grant for a connection that is gone is released
// at once, which may hand the key on to the next waiter (appended to b.fx
// and delivered in the same loop).
func (s *Server) deliver(b *scratch, cur *session, now int64) {
	for i := 0; i < len(b.fx.Effects); i++ {
		e := b.fx.Effects[i] // a copy: Release below may grow the slice
		ss := e.Conn.Tag.(*session)
		switch e.Kind {
		case shard.EffectGrant:
			s.wait.observe(now - e.Queued)
		case shard.EffectCancel:
			s.cancelled.Add(1)
		case shard.EffectMoved:
			s.moved.Add(1)
		}
		if ss == cur {
			b.addEffect(&e, s.node.Gate().Addr)
			if e.Kind == shard.EffectLost {
				s.lostL[min(e.Reason, shard.ReasonCannotTell)].Add(1)
			}
			continue
		}
		// A TLS or local session (loop nil) has no loop-mates: it is
		// woken.
		local := cur != nil && cur.loop != nil && ss.loop == cur.loop
		ok, flush := ss.post(&e, local, s.node.Gate().Addr, b.gen)
		if !ok && e.Kind == shard.EffectGrant {
			s.table.Release(now, e.Key, e.Token, &b.fx)
		}
		if ok && e.Kind == shard.EffectLost {
			s.lostL[min(e.Reason, shard.ReasonCannotTell)].Add(1)
		}
		if flush {
			b.local = append(b.local, ss)
		}
	}
	b.fx.Reset()
}
