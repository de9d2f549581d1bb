package engine

import (
	"strconv"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// Texts of E frames.
const (
	msgBadFrame = "bad frame: unknown op, tail over 1024 bytes, or non-empty ping tail"
	msgBadLease = "bad lease: must be 1..255 seconds"
	msgShutdown = "server shutting down"
)

// handler adapts Server to gnet's callbacks.
type handler struct {
	gnet.BuiltinEventEngine
	s         *Server
	msgBadKey string
}

func (h *handler) OnBoot(eng gnet.Engine) gnet.Action {
	h.msgBadKey = "bad key: must be 1.." + strconv.Itoa(h.s.cfg.MaxKey) + " bytes of UTF-8 without 0x0A"
	if !h.s.boot(eng) {
		return gnet.Shutdown
	}
	return gnet.None
}

func (h *handler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	s := h.s
	if s.draining.Load() {
		return nil, gnet.Close
	}
	if n := s.conns.Add(1); n > int64(s.cfg.MaxConns) {
		s.conns.Add(-1)
		s.log.Warn("connection refused: --max-conns reached", "remote", c.RemoteAddr(), "max", s.cfg.MaxConns)
		return nil, gnet.Close
	}
	ss := &session{c: c, loop: c.EventLoop()}
	ss.st = s.statsFor(ss.loop)
	ss.sc = shard.NewConn(ss)
	c.SetContext(ss)
	s.addSession(ss)
	return nil, gnet.None
}

func (h *handler) OnClose(c gnet.Conn, _ error) gnet.Action {
	s := h.s
	ss, _ := c.Context().(*session)
	if ss == nil || ss.gone {
		return gnet.None
	}
	ss.gone = true
	s.conns.Add(-1)
	s.removeSession(ss)

	// No more mail; what was posted and never written is undeliverable.
	ss.mu.Lock()
	ss.closed = true
	mbox, mgrants := ss.mbox, ss.mgrants
	ss.mbox, ss.mgrants = nil, nil
	ss.mu.Unlock()

	// Queued acquires leave their queues silently.
	s.table.DropConn(ss.sc)

	// Grants that did not reach the socket are released at once
	// (PROTOCOL.md §4: no phantom lock). gnet writes what is left in its
	// buffer after this callback returns, to a peer that may still read
	// (a half-close, a bad frame): a grant in those bytes would reach its
	// client after being released here. So hand the socket what it takes
	// now (those grants are delivered and stay), then shut the write side:
	// nothing more can be handed to it, and what is still buffered is not
	// delivered, ever.
	if c.OutboundBuffered() > 0 {
		_ = c.Flush()
		if c.OutboundBuffered() > 0 {
			_ = unix.Shutdown(c.Fd(), unix.SHUT_WR)
		}
	}
	sc := s.getScratch()
	now := s.now()
	if w := ss.writing; w != nil {
		// The write itself failed: none of that batch left.
		for _, off := range w.grants {
			token, key, _ := grantAt(w.out, off)
			s.table.Release(now, key, token, &sc.fx)
		}
	}
	delivered := ss.written - uint64(c.OutboundBuffered())
	for _, p := range ss.pend {
		if p.end > delivered {
			s.table.Release(now, ss.pkeys[p.koff:p.koff+p.klen], p.token, &sc.fx)
		}
	}
	for _, off := range mgrants {
		token, key, _ := grantAt(mbox, off)
		s.table.Release(now, key, token, &sc.fx)
	}
	ss.pend, ss.pkeys = nil, nil
	s.deliver(sc, nil, now)
	s.putScratch(sc)
	return gnet.None
}

func (h *handler) OnTraffic(c gnet.Conn) gnet.Action {
	s := h.s
	ss, _ := c.Context().(*session)
	if ss == nil || ss.gone {
		return gnet.Close
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	ss.takeMail(sc)
	now := s.now()
	action := gnet.None

	buf, _ := c.Peek(-1)
	if len(buf) > 0 {
		s.barrier.RLock()
		draining := s.draining.Load()
		gate := s.node.Gate()
		state := gate.Effective(now)
		if state == repl.Hold {
			// Read nothing: the requests wait in the connection's buffer
			// until GateChanged wakes it under the next gate.
			buf = nil
		}
		n := 0
		for n < len(buf) {
			m, err := proto.ParseRequest(buf[n:], s.cfg.MaxKey, &sc.req)
			if err == nil {
				n += m
				if state == repl.Redirect {
					r := &sc.req
					sc.out = proto.AppendMoved(sc.out, r.Op, r.ID, gate.Addr)
					sc.cnt.request(r.Op, resMoved)
					continue
				}
				h.apply(ss, sc, now, draining)
				continue
			}
			if err == proto.ErrIncomplete {
				break
			}
			r := &sc.req
			if err == proto.ErrBadFrame {
				// Framing is lost: answer and close (PROTOCOL.md §3).
				sc.out = proto.AppendError(sc.out, r.Op, r.ID, proto.CodeBadFrame, msgBadFrame)
				sc.cnt.error(r.Op, proto.CodeBadFrame)
				n = len(buf)
				action = gnet.Close
				break
			}
			n += m
			if err == proto.ErrBadKey {
				sc.out = proto.AppendError(sc.out, r.Op, r.ID, proto.CodeBadKey, h.msgBadKey)
				sc.cnt.error(r.Op, proto.CodeBadKey)
			} else {
				sc.out = proto.AppendError(sc.out, r.Op, r.ID, proto.CodeBadLease, msgBadLease)
				sc.cnt.error(r.Op, proto.CodeBadLease)
			}
		}
		s.barrier.RUnlock()
		if n > 0 {
			_, _ = c.Discard(n)
		}
	}
	if len(sc.fx.Effects) > 0 {
		s.deliver(sc, ss, now)
	}
	ss.st.add(&sc.cnt)
	action = h.write(ss, sc, action)
	// Sessions of this loop that this batch handed a grant to: write their
	// mail now instead of waking them through the loop's task queue.
	for _, o := range sc.local {
		if !o.gone {
			osc := s.getScratch()
			o.takeMail(osc)
			if h.write(o, osc, gnet.None) == gnet.Close {
				_ = o.c.Close()
			}
			s.putScratch(osc)
		}
	}
	return action
}

// write hands sc.out to ss's connection (one Write), tracks the grants in it
// and enforces --max-outbound. It returns the action for the connection.
func (h *handler) write(ss *session, sc *scratch, action gnet.Action) gnet.Action {
	s, c := h.s, ss.c
	if len(sc.out) > 0 {
		ss.writing = sc
		_, _ = c.Write(sc.out)
		ss.writing = nil
		if ss.gone {
			return gnet.None // the write failed and closed the connection
		}
		ss.afterWrite(sc)
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

// acquireResult maps a shard status to its counter.
var acquireResult = [...]int{shard.Granted: resGranted, shard.TimedOut: resTimeout, shard.Busy: resBusy, shard.Queued: resQueued}

// apply executes one well-formed request and appends its immediate answer.
func (h *handler) apply(ss *session, sc *scratch, now int64, draining bool) {
	s, r := h.s, &sc.req
	if draining && r.Op != proto.OpPing {
		sc.out = proto.AppendError(sc.out, r.Op, r.ID, proto.CodeShutdown, msgShutdown)
		sc.cnt.error(r.Op, proto.CodeShutdown)
		return
	}
	switch r.Op {
	case proto.OpAcquire:
		st, token := s.table.Acquire(now, r.Key, r.Wait, r.Lease, r.ID, ss.sc, &sc.fx)
		switch st {
		case shard.Granted:
			sc.grants = append(sc.grants, len(sc.out))
			sc.out = proto.AppendAcquired(sc.out, r.ID, token, r.Key)
		case shard.TimedOut:
			sc.out = proto.AppendTimeout(sc.out, r.ID, r.Key)
		case shard.Busy:
			sc.out = proto.AppendBusy(sc.out, r.ID, r.Key)
		}
		sc.cnt.request(proto.OpAcquire, acquireResult[st])
	case proto.OpRelease:
		if s.table.ReleaseFrom(now, r.Key, r.ID, ss.sc, &sc.fx) {
			sc.out = proto.AppendReleased(sc.out, r.ID, r.Key)
			sc.cnt.request(proto.OpRelease, resReleased)
		} else {
			sc.out = proto.AppendNotHeld(sc.out, proto.OpRelease, r.ID, r.Key)
			sc.cnt.request(proto.OpRelease, resNotHeld)
		}
	case proto.OpRenew:
		if s.table.RenewFrom(now, r.Key, r.Lease, r.ID, ss.sc, &sc.fx) {
			sc.out = proto.AppendRenewed(sc.out, r.ID, r.Key)
			sc.cnt.request(proto.OpRenew, resRenewed)
		} else {
			sc.out = proto.AppendNotHeld(sc.out, proto.OpRenew, r.ID, r.Key)
			sc.cnt.request(proto.OpRenew, resNotHeld)
		}
	case proto.OpPing:
		sc.out = proto.AppendPong(sc.out, r.ID)
		sc.cnt.request(proto.OpPing, resPong)
	}
}

func (h *handler) OnTick() (time.Duration, gnet.Action) {
	s := h.s
	if s.stopped.Load() {
		return tickEvery, gnet.None
	}
	now := s.now()
	if s.node.Gate().Effective(now) != repl.Serve {
		return tickEvery, gnet.None
	}
	sc := s.getScratch()
	s.table.Tick(now, &sc.fx)
	if len(sc.fx.Effects) > 0 {
		s.deliver(sc, nil, now)
	}
	s.putScratch(sc)
	return tickEvery, gnet.None
}

// deliver hands every effect in sc.fx to its connection: appended to sc.out
// when it is cur (the connection whose batch this is), else posted to the
// connection's mailbox — with a Wake, or, for a connection of cur's own
// loop, listed in sc.local for the caller to flush after its batch. A grant for a connection that is gone is released
// at once, which may hand the key on to the next waiter (appended to sc.fx
// and delivered in the same loop).
func (s *Server) deliver(sc *scratch, cur *session, now int64) {
	for i := 0; i < len(sc.fx.Effects); i++ {
		e := sc.fx.Effects[i] // a copy: Release below may grow the slice
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
			sc.out = appendEffect(sc.out, &sc.grants, &e, s.node.Gate().Addr)
			continue
		}
		local := cur != nil && ss.loop == cur.loop
		ok, flush := ss.post(&e, local, s.node.Gate().Addr)
		if !ok && e.Kind == shard.EffectGrant {
			s.table.Release(now, e.Key, e.Token, &sc.fx)
		}
		if flush {
			sc.local = append(sc.local, ss)
		}
	}
	sc.fx.Reset()
}
