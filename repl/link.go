package repl

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"time"
)

// The member link: every member dials every other member (peer, one
// outbound connection each, re-dialled with back-off) and accepts their
// connections. Everything member X says to member Y travels on X's
// outbound connection to Y, in order; Y never writes on it. So a stream,
// the reservations and a Handoff that follows them arrive in the order the
// active sent them.

const (
	dialTimeout  = time.Second
	maxQueue     = 64 << 20 // bytes queued for one standby before it is resynced instead
	maxUnacked   = 4096     // batches tracked for lag figures
	redialMin    = 20 * time.Millisecond
	redialMax    = 200 * time.Millisecond
	helloVersion = 1
)

// sentBatch is a batch sent to a standby and not yet acknowledged.
type sentBatch struct {
	seq     uint64
	records int
	bytes   int
	at      time.Time
}

// peer is this member's outbound link to member i, and — when this member
// is the active — i as a stream target.
type peer struct {
	p    *Priority
	i    int
	addr string

	mu      sync.Mutex
	wake    chan struct{} // capacity 1: something to send
	redial  chan struct{} // capacity 1: the peer reached us, dial it now
	hb      []byte        // the latest heartbeat frame, sent before anything queued
	queue   [][]byte      // frames in order
	qbytes  int
	conn    net.Conn
	closed  bool
	stream  bool // gets the active's batches
	needSnp bool // send a snapshot before the queue
	resAck  uint64
	resCond chan struct{} // closed and replaced on each reserve ack
	unacked []sentBatch
	snaps   uint64
	synced  time.Time // when the last snapshot to i ended (or a resync began)
	snaping bool      // the writer is sending i a snapshot
}

func newPeer(p *Priority, i int) *peer {
	return &peer{p: p, i: i, addr: p.cfg.MemberAddr(i), wake: make(chan struct{}, 1), redial: make(chan struct{}, 1),
		resCond: make(chan struct{})}
}

func (pe *peer) kick() {
	select {
	case pe.wake <- struct{}{}:
	default:
	}
}

// send queues a frame (control messages, reservations).
func (pe *peer) send(frame []byte) {
	pe.mu.Lock()
	if !pe.closed && pe.conn != nil {
		pe.queue = append(pe.queue, frame)
		pe.qbytes += len(frame)
	}
	pe.mu.Unlock()
	pe.kick()
}

// sendHeartbeat replaces the pending heartbeat.
//
// An active's heartbeat to a standby in its stream carries the lag it
// measures for that standby (the age of the oldest batch not acknowledged),
// which the standby reports as its own.
func (pe *peer) sendHeartbeat(hb Heartbeat) {
	pe.mu.Lock()
	hb.Echo = pe.p.echoFor(pe.i)
	if hb.Role == RoleActive {
		hb.LagNS = 0
		if pe.stream && len(pe.unacked) > 0 {
			hb.LagNS = uint64(time.Since(pe.unacked[0].at))
		}
	}
	pe.hb = hb.Append(pe.hb[:0])
	pe.mu.Unlock()
	pe.kick()
}

// streaming reports whether i gets this active's batches.
func (pe *peer) streaming() bool {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return pe.stream && pe.conn != nil
}

// enqueueBatch queues a batch frame for a streaming standby; a standby too
// far behind is dropped from the stream and resynced.
func (pe *peer) enqueueBatch(frame []byte, seq uint64, records, raw int) {
	pe.mu.Lock()
	if !pe.stream || pe.closed || pe.conn == nil {
		pe.mu.Unlock()
		return
	}
	if pe.qbytes+len(frame) > maxQueue {
		pe.mu.Unlock()
		pe.p.log.Warn("a standby fell too far behind: resyncing it", "member", pe.p.cfg.Peers[pe.i])
		pe.resync()
		return
	}
	pe.queue = append(pe.queue, frame)
	pe.qbytes += len(frame)
	if len(pe.unacked) < maxUnacked {
		pe.unacked = append(pe.unacked, sentBatch{seq: seq, records: records, bytes: raw, at: time.Now()})
	}
	pe.mu.Unlock()
	pe.kick()
}

// resyncIfStale resyncs a standby that follows this active but is not in
// the stream, or has been out of sync for longer than after since its last
// resync began.
func (pe *peer) resyncIfStale(inSync bool, after time.Duration) {
	pe.mu.Lock()
	stale := pe.conn != nil && (!pe.stream || (!inSync && !pe.needSnp && !pe.snaping && time.Since(pe.synced) > after))
	pe.mu.Unlock()
	if stale {
		pe.resync()
	}
}

// resync puts i in the stream with a fresh snapshot first: batches queued
// from here on follow the snapshot, which is cut after this point.
func (pe *peer) resync() {
	pe.mu.Lock()
	pe.synced = time.Now()
	pe.stream, pe.needSnp = true, true
	pe.queue, pe.qbytes, pe.unacked = nil, 0, nil
	pe.mu.Unlock()
	pe.p.out.retarget()
	pe.kick()
}

// unstream takes i out of the stream.
func (pe *peer) unstream() {
	pe.mu.Lock()
	pe.stream, pe.needSnp = false, false
	pe.unacked = nil
	pe.mu.Unlock()
	pe.p.out.retarget()
}

// acked records the standby's acknowledgement of batch seq.
func (pe *peer) acked(seq uint64) {
	pe.mu.Lock()
	k := 0
	for k < len(pe.unacked) && pe.unacked[k].seq <= seq {
		k++
	}
	pe.unacked = pe.unacked[k:]
	pe.mu.Unlock()
}

// reserveAcked records the standby's acknowledgement of reservation id.
func (pe *peer) reserveAcked(id uint64) {
	pe.mu.Lock()
	if id > pe.resAck {
		pe.resAck = id
		close(pe.resCond)
		pe.resCond = make(chan struct{})
	}
	pe.mu.Unlock()
}

// waitReserveAck waits until the standby acknowledged reservation id, it
// left the stream, or deadline.
func (pe *peer) waitReserveAck(id uint64, deadline time.Time) bool {
	for {
		pe.mu.Lock()
		ok, gone, c := pe.resAck >= id, !pe.stream || pe.conn == nil, pe.resCond
		pe.mu.Unlock()
		if ok || gone {
			return ok || gone
		}
		d := time.Until(deadline)
		if d <= 0 {
			return false
		}
		select {
		case <-c:
		case <-time.After(d):
		case <-pe.p.quit:
			return false
		}
	}
}

// status fills the active's view of i's replication lag.
func (pe *peer) status(m *Member) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if !pe.stream {
		return
	}
	for _, b := range pe.unacked {
		m.LagRecords += uint64(b.records)
		m.LagBytes += uint64(b.bytes)
	}
	if len(pe.unacked) > 0 {
		m.LagSeconds = time.Since(pe.unacked[0].at).Seconds()
	}
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
	defer pe.p.wg.Done()
	backoff := redialMin
	for {
		select {
		case <-pe.p.quit:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", pe.addr, dialTimeout)
		if err != nil {
			select {
			case <-pe.p.quit:
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
		if pe.stream {
			pe.needSnp = true // what was in flight is lost: resync
		}
		pe.mu.Unlock()
		pe.p.out.retarget()
		err = pe.write(c)
		pe.mu.Lock()
		pe.conn = nil
		pe.unacked = nil
		pe.mu.Unlock()
		pe.p.out.retarget()
		c.Close()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			pe.p.log.Debug("member link down", "member", pe.p.cfg.Peers[pe.i], "err", err)
		}
	}
}

// write sends Hello, then heartbeats, snapshots and queued frames until an
// error or Close.
func (pe *peer) write(c net.Conn) error {
	w := bufio.NewWriterSize(c, 64<<10)
	deadline := func() { _ = c.SetWriteDeadline(time.Now().Add(pe.p.cfg.FailoverTimeout)) }
	deadline()
	hello := pe.p.hello()
	if _, err := w.Write(hello.Append(nil)); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var hb []byte
	for {
		pe.mu.Lock()
		if pe.closed {
			pe.mu.Unlock()
			return net.ErrClosed
		}
		hb = append(hb[:0], pe.hb...)
		pe.hb = pe.hb[:0]
		snap := pe.needSnp
		pe.needSnp = false
		var q [][]byte
		if !snap {
			q, pe.queue, pe.qbytes = pe.queue, nil, 0
		}
		pe.mu.Unlock()
		deadline()
		if len(hb) > 0 {
			if _, err := w.Write(hb); err != nil {
				return err
			}
		}
		if snap {
			pe.mu.Lock()
			pe.snaping = true
			pe.mu.Unlock()
			err := pe.p.out.writeSnapshot(w, pe, deadline)
			pe.mu.Lock()
			pe.snaping, pe.synced = false, time.Now()
			pe.mu.Unlock()
			if err != nil {
				return err
			}
			continue // then the batches queued meanwhile
		}
		for _, f := range q {
			if _, err := w.Write(f); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if len(hb) == 0 && len(q) == 0 {
			select {
			case <-pe.wake:
			case <-pe.p.quit:
				return net.ErrClosed
			}
		}
	}
}

// hello is what this member says first on every link.
func (p *Priority) hello() Hello {
	return Hello{Version: helloVersion, Mode: ModePriority, Members: uint8(len(p.cfg.Peers)), Self: uint8(p.cfg.Self),
		Offset: uint32(p.cfg.PeerOffset), Shards: uint32(p.table.Shards()), FailoverMS: uint32(p.cfg.FailoverTimeout / time.Millisecond)}
}

// echoFor is the highest heartbeat probe this member has received from
// member i (it echoes it back for the freeze rule).
func (p *Priority) echoFor(i int) uint64 {
	p.echoMu.Lock()
	defer p.echoMu.Unlock()
	return p.echoes[i]
}

// accept takes member connections until Close.
func (p *Priority) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.quit:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.serveInbound(c)
	}
}

// serveInbound reads what one member says on its outbound link to us.
func (p *Priority) serveInbound(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	go func() {
		<-p.quit
		c.Close()
	}()
	r := NewFrameReader(c)
	_ = c.SetReadDeadline(time.Now().Add(p.cfg.FailoverTimeout))
	t, payload, err := r.Next()
	if err != nil || t != MsgHello {
		p.log.Warn("member link refused: no hello", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	var h Hello
	if err := h.Decode(payload); err != nil {
		p.log.Warn("member link refused: bad hello", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	if err := h.Check(p.hello()); err != nil {
		p.log.Error("member link refused", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	from := int(h.Self)
	if from == p.cfg.Self || from >= len(p.cfg.Peers) {
		p.log.Error("member link refused: it says it is this member", "remote", c.RemoteAddr().String())
		return
	}
	// The peer is up: dial it back now rather than at the end of a back-off,
	// so a member that (re)starts hears from the others within its first
	// failover timeout.
	if pe := p.peers[from]; pe != nil {
		select {
		case pe.redial <- struct{}{}:
		default:
		}
	}
	in := &inbound{p: p, from: from}
	for {
		_ = c.SetReadDeadline(time.Now().Add(2 * p.cfg.FailoverTimeout))
		t, payload, err := r.Next()
		if err != nil {
			return
		}
		if err := in.handle(t, payload); err != nil {
			p.log.Warn("member link: bad message; closing it", "member", p.cfg.Peers[from], "type", t.String(), "err", err)
			return
		}
	}
}
