package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Dir selects the directions of a connection a fault applies to.
type Dir uint8

// The directions. A value outside Both selects nothing more than its Tx
// and Rx bits.
const (
	Tx   Dir = 1 << iota // client → target: what the proxy's callers send
	Rx                   // target → client: what the target answers
	Both = Tx | Rx
)

// String returns "tx", "rx", "both" or "none".
func (d Dir) String() string {
	switch d & Both {
	case Tx:
		return "tx"
	case Rx:
		return "rx"
	case Both:
		return "both"
	}
	return "none"
}

const (
	chunkSize   = 32 << 10        // bytes read at once
	queueLen    = 8               // chunks read ahead of the writer, per direction
	dialTimeout = 5 * time.Second // dialling the target
)

// ErrBadAddr is returned by New for an address that is not host:port.
var ErrBadAddr = errors.New("faultproxy: address is not host:port")

// faults are the faults of one direction.
type faults struct {
	blackhole bool
	paused    bool
	delay     time.Duration
}

// Proxy forwards every connection accepted on its address to its target,
// both ways, with the faults a test sets. The zero value is not usable: call
// New. Every method is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // cancelled by Close: ends dials and waits
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu           sync.Mutex
	dir          [2]faults // Tx, Rx
	acceptPaused bool
	changed      chan struct{} // closed and replaced on every change of the faults
	pairs        map[*pair]struct{}
	closed       bool

	accepted, resets    atomic.Uint64
	forwarded, dropped  [2]atomic.Uint64
	bufs                sync.Pool
	chunkSize, queueLen int
}

// New listens on listenAddr ("127.0.0.1:0" picks a free port: see Addr)
// and forwards every connection it accepts to targetAddr, which is dialled
// per connection and need not be up yet (a connection whose dial fails is
// reset). The proxy starts with no fault.
func New(listenAddr, targetAddr string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(targetAddr); err != nil {
		return nil, fmt.Errorf("%w: target %q", ErrBadAddr, targetAddr)
	}
	if _, _, err := net.SplitHostPort(listenAddr); err != nil {
		return nil, fmt.Errorf("%w: listen %q", ErrBadAddr, listenAddr)
	}
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln: ln, target: targetAddr, ctx: ctx, cancel: cancel,
		changed: make(chan struct{}), pairs: make(map[*pair]struct{}),
		chunkSize: chunkSize, queueLen: queueLen,
	}
	p.bufs.New = func() any { b := make([]byte, p.chunkSize); return &b }
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the proxy listens on (host:port, the port resolved).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.target }

// Stats are a proxy's counters.
type Stats struct {
	Accepted  uint64 // connections accepted since New
	Open      int    // connections accepted and not yet ended
	Resets    uint64 // connections the proxy reset: ResetAll, a healed blackhole that dropped bytes, a failed dial
	TxBytes   uint64 // bytes forwarded client → target
	RxBytes   uint64 // bytes forwarded target → client
	TxDropped uint64 // bytes a blackhole dropped, client → target
	RxDropped uint64 // bytes a blackhole dropped, target → client
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.pairs)
	p.mu.Unlock()
	return Stats{
		Accepted: p.accepted.Load(), Open: open, Resets: p.resets.Load(),
		TxBytes: p.forwarded[0].Load(), RxBytes: p.forwarded[1].Load(),
		TxDropped: p.dropped[0].Load(), RxDropped: p.dropped[1].Load(),
	}
}

// String describes the proxy and its faults, e.g.
// "127.0.0.1:4001→127.0.0.1:3001 [blackhole=both delay(rx)=50ms]".
func (p *Proxy) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s→%s [", p.ln.Addr(), p.target)
	n := b.Len()
	add := func(s string) {
		if b.Len() > n {
			b.WriteByte(' ')
		}
		b.WriteString(s)
	}
	var bh, pz Dir
	for i := range p.dir {
		if p.dir[i].blackhole {
			bh |= Dir(1) << i
		}
		if p.dir[i].paused {
			pz |= Dir(1) << i
		}
		if p.dir[i].delay > 0 {
			add(fmt.Sprintf("delay(%s)=%s", Dir(1)<<i, p.dir[i].delay))
		}
	}
	if bh != 0 {
		add("blackhole=" + bh.String())
	}
	if pz != 0 {
		add("pause=" + pz.String())
	}
	if p.acceptPaused {
		add("accept-paused")
	}
	if p.closed {
		add("closed")
	}
	b.WriteByte(']')
	return b.String()
}

// update applies f to the faults of the directions in d and wakes every
// goroutine waiting on a fault; it resets the pairs that lost bytes to a
// blackhole that f lifted.
func (p *Proxy) update(d Dir, f func(*faults)) {
	p.mu.Lock()
	reset := map[*pair]struct{}{}
	for i := range p.dir {
		if d&(Dir(1)<<i) == 0 {
			continue
		}
		was := p.dir[i].blackhole
		f(&p.dir[i])
		if was && !p.dir[i].blackhole {
			for pr := range p.pairs {
				if pr.tainted[i] {
					reset[pr] = struct{}{}
				}
			}
		}
	}
	p.broadcastLocked()
	p.mu.Unlock()
	for pr := range reset {
		p.resets.Add(1)
		pr.close(true)
	}
}

// broadcastLocked wakes every waiter. p.mu must be held.
func (p *Proxy) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Blackhole makes the directions in d drop every byte: they are read and
// discarded, and the connections stay open, as in a network partition. An
// end of stream waits for the blackhole to lift. New connections are
// accepted and dialled as usual, and lose their bytes too.
func (p *Proxy) Blackhole(d Dir) { p.update(d, func(f *faults) { f.blackhole = true }) }

// Unblackhole lifts the blackhole of the directions in d. A connection that
// lost bytes in one of them is reset (TCP never delivers a stream with a
// gap); the others carry on, and new bytes pass.
func (p *Proxy) Unblackhole(d Dir) { p.update(d, func(f *faults) { f.blackhole = false }) }

// Pause stops forwarding in the directions in d: what was read is held
// (what was not waits in the kernel), in order, until Resume.
func (p *Proxy) Pause(d Dir) { p.update(d, func(f *faults) { f.paused = true }) }

// Resume delivers what Pause held in the directions in d and forwards
// again.
func (p *Proxy) Resume(d Dir) { p.update(d, func(f *faults) { f.paused = false }) }

// Delay delivers every chunk in the directions in d no earlier than
// latency after the proxy read it (0 or less removes the delay). Chunks in
// flight overlap: it adds latency, it does not throttle.
func (p *Proxy) Delay(d Dir, latency time.Duration) {
	p.update(d, func(f *faults) { f.delay = max(latency, 0) })
}

// PauseAccept leaves new connections in the kernel's accept queue (their
// clients see them connected; nothing is forwarded) until ResumeAccept. A
// connection the proxy was already accepting when it was called is held
// before its target is dialled.
func (p *Proxy) PauseAccept() {
	p.mu.Lock()
	p.acceptPaused = true
	p.broadcastLocked()
	p.mu.Unlock()
}

// ResumeAccept accepts and forwards new connections again.
func (p *Proxy) ResumeAccept() {
	p.mu.Lock()
	p.acceptPaused = false
	p.broadcastLocked()
	p.mu.Unlock()
}

// Heal lifts every fault: blackholes (as Unblackhole does), pauses,
// delays and a paused accept.
func (p *Proxy) Heal() {
	p.ResumeAccept()
	p.update(Both, func(f *faults) { *f = faults{} })
}

// ResetAll closes every connection the proxy holds, with a reset, both
// sides. New connections are forwarded as usual.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	all := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		all = append(all, pr)
	}
	p.mu.Unlock()
	for _, pr := range all {
		p.resets.Add(1)
		pr.close(true)
	}
}

// Close stops listening, closes every connection and returns once every
// goroutine of the proxy has ended. Later calls do nothing; the faults'
// methods do nothing after it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	all := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		all = append(all, pr)
	}
	p.broadcastLocked()
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, pr := range all {
		pr.close(false)
	}
	p.wg.Wait()
	return err
}

// acceptLoop accepts connections until Close.
func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		if !p.waitAccept(p.ctx.Done()) {
			return
		}
		nc, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			// A transient error (EMFILE, say): back off, until Close.
			select {
			case <-time.After(10 * time.Millisecond):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		p.accepted.Add(1)
		pr := newPair(p.ctx, nc)
		if !p.track(pr) {
			pr.close(false)
			return
		}
		// acceptLoop holds a count of p.wg, so this Add cannot race
		// Close's Wait to zero.
		p.wg.Add(1)
		go p.serve(pr)
	}
}

// waitAccept waits while accepting is paused; false once done is closed.
func (p *Proxy) waitAccept(done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		paused, changed := p.acceptPaused, p.changed
		p.mu.Unlock()
		if !paused {
			select {
			case <-done:
				return false
			default:
				return true
			}
		}
		select {
		case <-changed:
		case <-done:
			return false
		}
	}
}

func (p *Proxy) track(pr *pair) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.pairs[pr] = struct{}{}
	return true
}

func (p *Proxy) untrack(pr *pair) {
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// serve dials the target for pr and forwards until both ends are done.
func (p *Proxy) serve(pr *pair) {
	defer p.wg.Done()
	defer p.untrack(pr)
	if !p.waitAccept(pr.ctx.Done()) {
		pr.close(false)
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	tc, err := d.DialContext(pr.ctx, "tcp", p.target)
	if err != nil {
		if pr.ctx.Err() == nil {
			p.resets.Add(1) // the target is down: the client sees a reset, as if refused
		}
		pr.close(true)
		return
	}
	if !pr.setTarget(tc) {
		tc.Close()
		return
	}
	var wg sync.WaitGroup
	for i, ends := range [2][2]net.Conn{{pr.client, tc}, {tc, pr.client}} {
		q := make(chan chunk, p.queueLen)
		wg.Add(2)
		go func() { defer wg.Done(); p.read(pr, ends[0], q) }()
		go func() { defer wg.Done(); p.write(pr, i, ends[1], q) }()
	}
	wg.Wait()
	pr.close(false)
}

// chunk is what one read returned, and when.
type chunk struct {
	buf *[]byte // from p.bufs; nil for an end without data
	b   []byte  // the bytes read, in *buf
	at  time.Time
	err error // the read's error: io.EOF for a FIN
}

// read reads src into chunks for the writer until an error or the pair's
// end.
func (p *Proxy) read(pr *pair, src net.Conn, q chan<- chunk) {
	for {
		buf := p.bufs.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n == 0 && err == nil {
			p.bufs.Put(buf)
			continue
		}
		c := chunk{buf: buf, b: (*buf)[:n], at: time.Now(), err: err}
		select {
		case q <- c:
		case <-pr.ctx.Done():
			p.bufs.Put(buf)
			return
		}
		if err != nil {
			return
		}
	}
}

// write forwards the chunks of direction i to dst, applying its faults,
// until the stream ends or the pair does.
func (p *Proxy) write(pr *pair, i int, dst net.Conn, q <-chan chunk) {
	for {
		var c chunk
		select {
		case c = <-q:
		case <-pr.ctx.Done():
			return
		}
		more := p.forward(pr, i, dst, c)
		p.bufs.Put(c.buf)
		if !more {
			return
		}
	}
}

// action is what forward does with a chunk now.
type action uint8

const (
	send action = iota
	drop
	hold // until the faults change, until a deadline, or the pair ends
)

// decide applies direction i's faults to c, under p.mu so that a blackhole
// cannot lift between the decision to drop and marking the pair tainted.
func (p *Proxy) decide(pr *pair, i int, c *chunk) (action, time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.dir[i]
	switch {
	case f.paused:
		return hold, time.Time{}, p.changed
	case pr.tainted[i] && !f.blackhole:
		// Bytes were lost and the blackhole lifted: the pair is being
		// reset; nothing after the gap may pass.
		return hold, time.Time{}, p.changed
	case f.blackhole && len(c.b) > 0:
		pr.tainted[i] = true
		return drop, time.Time{}, nil
	case f.blackhole:
		return hold, time.Time{}, p.changed // an end of stream waits
	case f.delay > 0:
		if due := c.at.Add(f.delay); time.Now().Before(due) {
			return hold, due, p.changed
		}
	}
	return send, time.Time{}, nil
}

// forward delivers c to dst once the faults allow it and reports whether
// the direction carries on.
func (p *Proxy) forward(pr *pair, i int, dst net.Conn, c chunk) bool {
	for {
		act, due, changed := p.decide(pr, i, &c)
		if act == send {
			break
		}
		if act == drop {
			p.dropped[i].Add(uint64(len(c.b)))
			c.b = nil
			if c.err == nil {
				return true
			}
			continue // the end of the stream waits for the blackhole to lift
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if !due.IsZero() {
			timer = time.NewTimer(time.Until(due))
			fire = timer.C
		}
		select {
		case <-changed:
		case <-fire:
		case <-pr.ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if pr.ctx.Err() != nil {
			return false
		}
	}
	if len(c.b) > 0 {
		if _, err := dst.Write(c.b); err != nil {
			pr.close(true)
			return false
		}
		p.forwarded[i].Add(uint64(len(c.b)))
	}
	switch {
	case c.err == nil:
		return true
	case errors.Is(c.err, io.EOF):
		// A FIN: half-close dst; the pair ends when both ways have.
		if cw, ok := dst.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
			pr.close(false)
		} else if pr.ended.Add(1) == 2 {
			pr.close(false)
		}
	default:
		pr.close(true) // a reset (or our own close): pass it on
	}
	return false
}

// pair is one forwarded connection: the accepted client and the dialled
// target.
type pair struct {
	client  net.Conn
	ctx     context.Context // done once the pair is closed (or the proxy)
	cancel  context.CancelFunc
	ended   atomic.Int32 // directions whose stream ended with a FIN
	tainted [2]bool      // guarded by Proxy.mu: a blackhole dropped bytes of that direction

	mu     sync.Mutex
	target net.Conn
	closed bool
}

func newPair(parent context.Context, client net.Conn) *pair {
	ctx, cancel := context.WithCancel(parent)
	return &pair{client: client, ctx: ctx, cancel: cancel}
}

// setTarget records the dialled target; false if the pair is closed.
func (pr *pair) setTarget(c net.Conn) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.closed {
		return false
	}
	pr.target = c
	return true
}

// close closes both connections, with a reset (SO_LINGER 0) if reset. Only
// the first call acts.
func (pr *pair) close(reset bool) {
	pr.mu.Lock()
	if pr.closed {
		pr.mu.Unlock()
		return
	}
	pr.closed = true
	target := pr.target
	pr.mu.Unlock()
	pr.cancel()
	for _, c := range [2]net.Conn{pr.client, target} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}
