package priority

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/memberauth"
)

// The member link: every member dials every other member (peer, one
// outbound connection each, re-dialled with back-off) and accepts their
// connections. Everything member X says to member Y travels on X's
// outbound connection to Y, in order; Y never writes on it. So a stream,
// the reservations and a Handoff that follows them arrive in the order the
// active sent them.
//
// The link is transport only: it moves frames and knows nothing of what
// they mean. It tells its user what happens through linkEvents, and its
// user queues frames on a peer.

const (
	dialTimeout = time.Second
	redialMin   = 20 * time.Millisecond
	redialMax   = 200 * time.Millisecond
)

// linkEvents is what the link tells its user, from the link's goroutines.
type linkEvents struct {
	// changed: the outbound link to member i came up (up, before anything
	// but the Hello is written on it: the user may put a frame first) or
	// went down.
	changed func(i int, up bool)
	// accepted: member from connected with a Hello that agrees with this
	// member's; pm says how its --peers reads here (peers.go). It returns
	// the handler of every later frame on that connection, called on the
	// connection's reader goroutine; an error closes the connection.
	accepted func(from int, pm peerMap) func(t msgType, payload []byte) error
	// refused: a connection with member i (None: one whose member is not
	// known) was refused for a reason that lasts — a cluster secret,
	// certificate, configuration or version that differs — not one that
	// passes (a slow or frozen peer, the port's limits).
	refused func(i int)
}

// link is this member's side of the member link.
type link struct {
	cfg   repl.ClusterConfig
	hello hello // what this member says first on every link
	log   *slog.Logger
	ev    linkEvents
	peers []*peer // by member index; nil at Self
	quit  <-chan struct{}
	wg    *sync.WaitGroup
	ln    net.Listener

	auth   *memberauth.Auth // §8.4: every connection's exchange (auth.go)
	ctx    context.Context  // the dials', cancelled by close
	cancel context.CancelFunc
}

func newLink(cfg repl.ClusterConfig, h hello, log *slog.Logger, ev linkEvents, quit <-chan struct{}, wg *sync.WaitGroup) *link {
	l := &link{cfg: cfg, hello: h, log: log, ev: ev, peers: make([]*peer, len(cfg.Peers)), quit: quit, wg: wg,
		auth: newAuth(cfg, log)}
	l.ctx, l.cancel = authContext()
	for i := range cfg.Peers {
		if i != cfg.Self {
			l.peers[i] = &peer{l: l, i: i, addr: cfg.MemberAddr(i), wake: make(chan struct{}, 1), redial: make(chan struct{}, 1)}
		}
	}
	return l
}

// start listens on ln for members and dials every other member.
func (l *link) start(ln net.Listener) {
	l.ln = l.listen(ln)
	for _, pe := range l.peers {
		if pe != nil {
			l.wg.Add(1)
			go pe.run()
		}
	}
	l.wg.Add(1)
	go l.accept()
}

// close closes the listener and every outbound connection; the goroutines
// end once quit is closed.
func (l *link) close() {
	l.cancel()
	if l.ln != nil {
		l.ln.Close()
	}
	for _, pe := range l.peers {
		if pe != nil {
			pe.close()
		}
	}
}

// outItem is what a peer's writer sends next: a frame, or (write set)
// something written in place on its own, such as a snapshot cut when the
// writer reaches it. An item written in place writes through an
// itemWriter, which keeps the heartbeats going whatever its size.
type outItem struct {
	frame []byte
	write func(w *itemWriter) error
}

// itemWriter is what an item written in place writes through. Heartbeats
// jump the queue (each is the member's latest word, and liveness must not
// depend on what else the link carries): frame writes the pending
// heartbeat first, flushed, and wait keeps writing heartbeats as they come.
// So an item of any size holds a heartbeat back by one frame at most.
type itemWriter struct {
	pe       *peer
	w        *bufio.Writer
	deadline func()
	hb       []byte
}

// beat writes the pending heartbeat, if there is one, and reports whether
// it did.
func (iw *itemWriter) beat() (bool, error) {
	pe := iw.pe
	pe.mu.Lock()
	iw.hb = append(iw.hb[:0], pe.hb...)
	pe.hb = pe.hb[:0]
	closed := pe.closed
	pe.mu.Unlock()
	switch {
	case closed:
		return false, net.ErrClosed
	case len(iw.hb) == 0:
		return false, nil
	}
	iw.deadline()
	_, err := iw.w.Write(iw.hb)
	return err == nil, err
}

// frame writes f after the pending heartbeat (flushed at once when there
// was one).
func (iw *itemWriter) frame(f []byte) error {
	sent, err := iw.beat()
	if err != nil {
		return err
	}
	iw.deadline()
	if _, err := iw.w.Write(f); err != nil {
		return err
	}
	if sent {
		return iw.w.Flush()
	}
	return nil
}

// flush sends everything written so far.
func (iw *itemWriter) flush() error {
	iw.deadline()
	return iw.w.Flush()
}

// waitFor waits until done is closed, writing heartbeats meanwhile; on an
// error of the link it still waits for done (the work it stands for may
// use what the caller owns) before returning the error.
func (iw *itemWriter) waitFor(done <-chan struct{}) error {
	for {
		select {
		case <-done:
			return nil
		default:
		}
		if err := iw.wait(done, time.Second); err != nil {
			<-done
			return err
		}
	}
}

// wait flushes, then waits until ready is closed or d has passed, writing
// every heartbeat set meanwhile. It consumes the peer's wake-ups; the
// writer looks at its queue after the item anyway.
func (iw *itemWriter) wait(ready <-chan struct{}, d time.Duration) error {
	if err := iw.flush(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ready:
			return nil
		case <-t.C:
			return nil
		case <-iw.pe.l.quit:
			return net.ErrClosed
		case <-iw.pe.wake:
			sent, err := iw.beat()
			if err != nil {
				return err
			}
			if sent {
				if err := iw.flush(); err != nil {
					return err
				}
			}
		}
	}
}

// peer is this member's outbound link to member i.
type peer struct {
	l    *link
	i    int
	addr string

	mu     sync.Mutex
	wake   chan struct{} // capacity 1: something to send
	redial chan struct{} // capacity 1: the peer reached us, dial it now
	hb     []byte        // the latest heartbeat frame, sent before anything queued
	queue  []outItem     // in order
	qbytes int           // the frames' bytes in queue
	conn   net.Conn
	closed bool
}

func (pe *peer) kick() {
	select {
	case pe.wake <- struct{}{}:
	default:
	}
}

// send queues a frame if the link is up (control messages, reservations).
func (pe *peer) send(frame []byte) {
	pe.mu.Lock()
	if !pe.closed && pe.conn != nil {
		pe.queue = append(pe.queue, outItem{frame: frame})
		pe.qbytes += len(frame)
	}
	pe.mu.Unlock()
	pe.kick()
}

// sendWithin queues a frame if the link is up and the queue stays within
// limit bytes: queued says whether it did, full whether the limit stopped
// it.
func (pe *peer) sendWithin(frame []byte, limit int) (queued, full bool) {
	pe.mu.Lock()
	switch {
	case pe.closed || pe.conn == nil:
	case pe.qbytes+len(frame) > limit:
		full = true
	default:
		pe.queue = append(pe.queue, outItem{frame: frame})
		pe.qbytes += len(frame)
		queued = true
	}
	pe.mu.Unlock()
	if queued {
		pe.kick()
	}
	return queued, full
}

// restart drops everything queued and queues first alone.
func (pe *peer) restart(first outItem) {
	pe.mu.Lock()
	pe.queue, pe.qbytes = []outItem{first}, 0
	pe.mu.Unlock()
	pe.kick()
}

// putFirst queues it ahead of everything queued.
func (pe *peer) putFirst(it outItem) {
	pe.mu.Lock()
	pe.queue = append([]outItem{it}, pe.queue...)
	pe.mu.Unlock()
	pe.kick()
}

// setHeartbeat replaces the pending heartbeat.
func (pe *peer) setHeartbeat(hb *heartbeat) {
	pe.mu.Lock()
	pe.hb = hb.Append(pe.hb[:0])
	pe.mu.Unlock()
	pe.kick()
}

// connected reports whether the link to i is up.
func (pe *peer) connected() bool {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return pe.conn != nil
}

func (pe *peer) close() {
	pe.mu.Lock()
	pe.closed = true
	c := pe.conn
	pe.mu.Unlock()
	if c != nil {
		c.Close()
	}
	pe.kick()
}

// run dials i and writes to it until Close, re-dialling with back-off.
func (pe *peer) run() {
	defer pe.l.wg.Done()
	backoff := redialMin
	for {
		select {
		case <-pe.l.quit:
			return
		default:
		}
		c, err := pe.l.dial(pe.i, pe.addr)
		if err != nil {
			if lasting(err) {
				pe.l.ev.refused(pe.i)
			}
			select {
			case <-pe.l.quit:
				return
			case <-time.After(backoff):
			case <-pe.redial:
				backoff = redialMin
			}
			backoff = min(2*backoff, redialMax)
			continue
		}
		backoff = redialMin
		pe.mu.Lock()
		if pe.closed {
			pe.mu.Unlock()
			c.Close()
			return
		}
		pe.conn = c
		pe.queue, pe.qbytes = nil, 0
		pe.mu.Unlock()
		pe.l.ev.changed(pe.i, true)
		err = pe.write(c)
		pe.mu.Lock()
		pe.conn = nil
		pe.mu.Unlock()
		pe.l.ev.changed(pe.i, false)
		c.Close()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			pe.l.log.Debug("member link down", "peer", pe.l.cfg.Peers[pe.i], "err", err)
		}
	}
}

// greet opens a new outbound connection: this member's Hello, before
// anything else is written on it. (A handshake that grows — a hello
// exchange, an authentication — belongs here and in greeted.)
func (pe *peer) greet(c net.Conn, w *bufio.Writer) error {
	_ = c.SetWriteDeadline(time.Now().Add(pe.l.cfg.FailoverTimeout))
	if _, err := w.Write(pe.l.hello.Append(nil)); err != nil {
		return err
	}
	return w.Flush()
}

// write sends Hello, then the heartbeats and what is queued until an
// error or Close. An item written in place goes on its own: what was
// queued behind it is taken after it.
func (pe *peer) write(c net.Conn) error {
	w := bufio.NewWriterSize(c, 64<<10)
	deadline := func() { _ = c.SetWriteDeadline(time.Now().Add(pe.l.cfg.FailoverTimeout)) }
	if err := pe.greet(c, w); err != nil {
		return err
	}
	iw := &itemWriter{pe: pe, w: w, deadline: deadline}
	var hb []byte
	for {
		pe.mu.Lock()
		if pe.closed {
			pe.mu.Unlock()
			return net.ErrClosed
		}
		hb = append(hb[:0], pe.hb...)
		pe.hb = pe.hb[:0]
		var q []outItem
		var inPlace func(*itemWriter) error
		if len(pe.queue) > 0 && pe.queue[0].write != nil {
			inPlace = pe.queue[0].write
			pe.queue = pe.queue[1:]
		} else {
			n := 0
			for n < len(pe.queue) && pe.queue[n].write == nil {
				pe.qbytes -= len(pe.queue[n].frame)
				n++
			}
			q, pe.queue = pe.queue[:n:n], pe.queue[n:]
			if len(pe.queue) == 0 {
				pe.queue = nil
			}
		}
		pe.mu.Unlock()
		deadline()
		if len(hb) > 0 {
			if _, err := w.Write(hb); err != nil {
				return err
			}
		}
		if inPlace != nil {
			if err := inPlace(iw); err != nil {
				return err
			}
			if err := iw.flush(); err != nil {
				return err
			}
			continue // then what was queued behind it
		}
		for _, it := range q {
			if _, err := w.Write(it.frame); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if len(hb) == 0 && len(q) == 0 {
			select {
			case <-pe.wake:
			case <-pe.l.quit:
				return net.ErrClosed
			}
		}
	}
}

// accept takes member connections until Close.
func (l *link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.quit:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.wg.Add(1)
		go l.serveInbound(c)
	}
}

// greeted reads a new inbound connection's Hello and returns the member it
// comes from (pm.from, its index here; mapPeers matches the members of a
// --peers that differs by address); a connection it refuses (ok false) is logged and must be
// closed before anything else is read from it.
func (l *link) greeted(c net.Conn, r *frameReader) (pm peerMap, ok bool) {
	_ = c.SetReadDeadline(time.Now().Add(l.cfg.FailoverTimeout))
	t, payload, err := r.Next()
	if err != nil || t != msgHello {
		l.log.Warn("member link refused: no hello", "remote", c.RemoteAddr().String(), "err", err)
		return peerMap{}, false
	}
	if v, ok := helloVersion(payload); ok && v != l.hello.Version {
		// Another lockd version: it would misread this one's messages and
		// records (and this one its). Every member of a cluster runs one
		// version of the member link; nothing more of this Hello is read
		// (its layout may differ).
		l.log.Error("member link refused: the peer speaks another version of the member link (a cluster mixes lockd versions: run one version on every member)",
			"remote", c.RemoteAddr().String(), "its_version", v, "version", l.hello.Version)
		from := l.provenMember(c)
		if i := helloSelf(payload); from < 0 && i >= 0 && i < len(l.cfg.Peers) && i != l.cfg.Self {
			from = i // as it says: every version's Hello starts version, mode, members, self
		}
		l.ev.refused(from)
		return peerMap{}, false
	}
	var h hello
	if err := h.Decode(payload); err != nil {
		l.log.Warn("member link refused: bad hello", "remote", c.RemoteAddr().String(), "err", err)
		return peerMap{}, false
	}
	if err := h.Check(l.hello); err != nil {
		l.log.Error("member link refused", "remote", c.RemoteAddr().String(), "err", err)
		l.ev.refused(l.provenMember(c))
		return peerMap{}, false
	}
	pm, err = mapPeers(&h, l.cfg.Peers, l.cfg.Self)
	if err != nil {
		l.log.Error("member link refused", "remote", c.RemoteAddr().String(), "err", err)
		l.ev.refused(l.provenMember(c))
		return peerMap{}, false
	}
	if pm.differs {
		l.log.Info("member link from a member whose --peers differs (a change of --peers in progress): members matched by address",
			"peer", l.cfg.Peers[pm.from], "its_peers", h.Peers)
	}
	return pm, true
}

// serveInbound reads what one member says on its outbound link to us.
func (l *link) serveInbound(c net.Conn) {
	defer l.wg.Done()
	defer c.Close()
	go func() {
		<-l.quit
		c.Close()
	}()
	r := newFrameReader(c)
	pm, ok := l.greeted(c, r)
	if !ok {
		return
	}
	from := pm.from
	if err := provedAs(c, from); err != nil {
		l.log.Error("member link refused", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	// The peer is up: dial it back now rather than at the end of a back-off,
	// so a member that (re)starts hears from the others within its first
	// failover timeout.
	if pe := l.peers[from]; pe != nil {
		select {
		case pe.redial <- struct{}{}:
		default:
		}
	}
	handle := l.ev.accepted(from, pm)
	for {
		_ = c.SetReadDeadline(time.Now().Add(2 * l.cfg.FailoverTimeout))
		t, payload, err := r.Next()
		if err != nil {
			return
		}
		if err := handle(t, payload); err != nil {
			l.log.Warn("member link: bad message; closing it", "peer", l.cfg.Peers[from], "type", t.String(), "err", err)
			return
		}
	}
}
