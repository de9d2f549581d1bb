package memberauth

import (
	"errors"
	"net"
	"slices"
	"sync"
	"time"
)

// Conn is a member connection that Listen accepted: after the exchange
// when it is on, as it arrived otherwise. Its Close releases its place in
// Options.MaxConns.
type Conn struct {
	net.Conn
	member int
	once   sync.Once
	l      *Listener
}

// Member is the index in --peers of the member that proved who it is on
// this connection, or -1 when the exchange is off.
func (c *Conn) Member() int { return c.member }

// Close closes the connection (once; later calls return net.ErrClosed).
func (c *Conn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.Conn.Close()
		c.l.release()
	})
	return err
}

// MemberOf returns the member that proved who it is on c, a connection
// Listen accepted, or false when c is another connection or the exchange
// is off.
func MemberOf(c net.Conn) (int, bool) {
	mc, ok := c.(*Conn)
	if !ok || mc.member < 0 {
		return -1, false
	}
	return mc.member, true
}

// Listener serves a member port: each connection goes through the
// exchange on a goroutine of its own, with a small fixed buffer and
// Options.HandshakeTimeout, at most Options.MaxPending at once (one more
// closes the oldest); Accept returns only connections that completed it,
// at most Options.MaxConns open at once. With the exchange off, Accept
// returns what arrives, within MaxConns. Safe for concurrent use.
type Listener struct {
	a    *Auth
	ln   net.Listener
	out  chan *Conn
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu      sync.Mutex
	pending []*pendingConn // oldest first
	conns   int            // accepted and not closed
}

// pendingConn is a connection in the exchange.
type pendingConn struct {
	raw     net.Conn
	evicted bool // closed to make room: counted already
}

// Listen serves ln (the member port) with a's exchange; closing the
// Listener closes ln.
func (a *Auth) Listen(ln net.Listener) *Listener {
	l := &Listener{a: a, ln: ln, out: make(chan *Conn), done: make(chan struct{})}
	if a.On() {
		l.wg.Add(1)
		go l.acceptLoop()
	}
	return l
}

// Addr is the member port's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Accept returns the next member connection (a *Conn). After Close it
// returns an error matching net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	if !l.a.On() {
		return l.acceptPlain()
	}
	select {
	case c := <-l.out:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// acceptPlain accepts without the exchange, within MaxConns.
func (l *Listener) acceptPlain() (net.Conn, error) {
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			return nil, err
		}
		if !l.take() {
			raw.Close()
			l.a.note(sideAccept, raw.RemoteAddr(), -1, refusef(ReasonLimit, "more than %d member connections", l.a.opt.MaxConns))
			continue
		}
		return &Conn{Conn: raw, member: -1, l: l}, nil
	}
}

// take reserves a place among the open connections.
func (l *Listener) take() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns >= l.a.opt.MaxConns {
		return false
	}
	l.conns++
	return true
}

func (l *Listener) release() {
	l.mu.Lock()
	l.conns--
	l.mu.Unlock()
}

// Close closes the member port and every connection still in the
// exchange, and waits for their goroutines. Accepted connections are
// their owners' to close.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.once.Do(func() { close(l.done) })
	l.mu.Lock()
	for _, p := range l.pending {
		p.raw.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// acceptLoop takes connections off the port and starts their exchange.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-l.done:
				return
			case <-time.After(10 * time.Millisecond): // EMFILE and the like
			}
			continue
		}
		p := &pendingConn{raw: raw}
		var evict *pendingConn
		l.mu.Lock()
		select {
		case <-l.done:
			l.mu.Unlock()
			raw.Close()
			return
		default:
		}
		if len(l.pending) >= l.a.opt.MaxPending {
			evict = l.pending[0]
			evict.evicted = true
			l.pending = l.pending[1:]
		}
		l.pending = append(l.pending, p)
		l.wg.Add(1)
		l.mu.Unlock()
		if evict != nil {
			evict.raw.Close()
			l.a.note(sideAccept, evict.raw.RemoteAddr(), -1,
				refusef(ReasonLimit, "more than %d connections in the exchange: the oldest closed", l.a.opt.MaxPending))
		}
		go l.exchange(p)
	}
}

// exchange runs the acceptor's side for p and hands the connection to
// Accept, or refuses it.
func (l *Listener) exchange(p *pendingConn) {
	defer l.wg.Done()
	_ = p.raw.SetDeadline(time.Now().Add(l.a.opt.HandshakeTimeout))
	c, from, err := l.a.acceptExchange(p.raw)
	l.mu.Lock()
	evicted := p.evicted
	if i := slices.Index(l.pending, p); i >= 0 {
		l.pending = slices.Delete(l.pending, i, i+1)
	}
	if err == nil && !evicted {
		if l.conns >= l.a.opt.MaxConns {
			err = refusef(ReasonLimit, "more than %d member connections", l.a.opt.MaxConns)
		} else {
			l.conns++
		}
	}
	l.mu.Unlock()
	if evicted {
		p.raw.Close() // counted when it was evicted
		return
	}
	if err != nil {
		p.raw.Close()
		select {
		case <-l.done: // closing: not a refusal
		default:
			l.a.note(sideAccept, p.raw.RemoteAddr(), from, err)
		}
		return
	}
	_ = p.raw.SetDeadline(time.Time{})
	mc := &Conn{Conn: c, member: from, l: l}
	select {
	case l.out <- mc:
	case <-l.done:
		mc.Close()
	}
}
