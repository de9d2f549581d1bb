package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// Client is a connection pool to lockd servers and the entry point of every
// lock operation. It is safe for concurrent use by any number of
// goroutines; create one per process and share it.
type Client struct {
	cfg     Config
	certCN  string // the client certificate's Common Name, for errors
	dialer  net.Dialer
	tickets sync.Pool

	slots       atomic.Pointer[[]*slot] // copy on write, under mu
	preferred   atomic.Pointer[string]  // address an M pointed to
	rr          atomic.Uint32
	established atomic.Bool // a server's answer has been read on some connection
	// refused is the E 5 of the last refused hello, until a hello is
	// welcomed: a call that finds no live connection fails with it at once.
	refused atomic.Pointer[authError]
	// refused is the last refusal of a connection before any answer (a
	// client certificate the server rejects, a plaintext client on a TLS
	// port), until an answer is read: a call that finds no live
	// connection fails at once with ErrNoConnection and it, instead of
	// waiting for a redial that would be refused the same way.
	refusedConn atomic.Pointer[refusedError]
	// no9 maps the address of a server that answered a §9 request E 1
	// (it does not speak §9) to that *unsupportedError: §9 requests for
	// it fail at once, until a connection to it ends for another reason
	// (a restart, perhaps an upgrade).
	no9 sync.Map

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when a connection comes up or goes down
	closed  bool
	connErr error // why the last dial failed or the last connection ended

	closing  chan struct{} // closed by Close
	bg       context.Context
	cancelBg context.CancelFunc
	wg       sync.WaitGroup // every goroutine the client starts
}

// slot is one persistent connection's place: its address and current conn
// (nil while down). A goroutine per slot dials, watches and redials it.
type slot struct {
	addr string
	cur  atomic.Pointer[conn]
	down atomic.Bool // its last dial failed or its connection ended, and it is not up again
	// redial (capacity 1) cuts the pause before the next dial short: an M
	// named this address (a member that restarted and took over).
	redial chan struct{}

	// Slots opened for an address an M named that is not in Config.Addrs.
	redirect bool
	named    atomic.Int64  // instant of the latest M naming addr: the least recent is evicted first
	retired  chan struct{} // closed when evicted (nil for Config.Addrs)
}

// MaxRedirectAddrs bounds the addresses beyond Config.Addrs that a Client
// keeps connections to because an M answer named them. When an M names
// one more, the address least recently named is dropped: no new request
// goes there, and its connections close once nothing sent on them awaits
// an answer.
const MaxRedirectAddrs = 8

// retirePoll is how often an evicted slot's connection is checked for
// requests still awaiting an answer.
const retirePoll = 50 * time.Millisecond

// New validates cfg and starts the client's connections in the background.
// It does not wait for them: calls made before a connection is up wait for
// one within their deadline.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cl := &Client{
		cfg:     cfg,
		certCN:  certCN(cfg.TLS),
		dialer:  net.Dialer{Timeout: cfg.DialTimeout},
		changed: make(chan struct{}),
		closing: make(chan struct{}),
	}
	cl.tickets.New = func() any { return newTicket() }
	cl.bg, cl.cancelBg = context.WithCancel(context.Background())
	slots := make([]*slot, 0, len(cfg.Addrs)*cfg.ConnsPerAddr)
	for i := 0; i < cfg.ConnsPerAddr; i++ {
		for _, a := range cfg.Addrs {
			slots = append(slots, &slot{addr: a, redial: make(chan struct{}, 1)})
		}
	}
	cl.slots.Store(&slots)
	for _, s := range slots {
		cl.wg.Add(1)
		go cl.runSlot(s)
	}
	return cl, nil
}

// Close closes every connection, fails every pending call with ErrClosed
// (or, for a call that may have been executed — an acquire, release or
// renew possibly sent — an error matching both ErrClosed and
// ErrIndeterminate), and returns once every goroutine the client started
// has ended. Calls after Close fail with ErrClosed.
func (cl *Client) Close() error {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		cl.wg.Wait()
		return nil
	}
	cl.closed = true
	close(cl.closing)
	cl.mu.Unlock()
	cl.cancelBg()
	cl.wg.Wait()
	return nil
}

// certCN is the Common Name of c's first client certificate, "" if it has
// none (or one only a callback knows).
func certCN(c *tls.Config) string {
	if c == nil || len(c.Certificates) == 0 || len(c.Certificates[0].Certificate) == 0 {
		return ""
	}
	leaf := c.Certificates[0].Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificates[0].Certificate[0]); err != nil {
			return ""
		}
	}
	return leaf.Subject.CommonName
}

func (cl *Client) isClosed() bool {
	select {
	case <-cl.closing:
		return true
	default:
		return false
	}
}

// runSlot keeps one persistent connection: dial, serve until it dies, wait
// ReconnectInterval, dial again. Each failure is recorded as the reason
// given with ErrNoConnection.
func (cl *Client) runSlot(s *slot) {
	defer cl.wg.Done()
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	for {
		var c *conn
		nc, err := cl.dial(s.addr)
		if err == nil {
			// The hello leaves before the connection is published, so
			// it is the first frame; requests follow without waiting for
			// its answer.
			c = newConn(cl, s.addr, nc)
			if err = c.hello(); err != nil {
				_ = nc.Close()
				err = &addrError{s.addr, err}
			}
		}
		if err == nil {
			cl.wg.Add(1)
			go c.readLoop()
			s.cur.Store(c)
			s.down.Store(false)
			cl.signalChanged()
			select {
			case <-c.gone:
			case <-cl.closing:
				c.fail(ErrClosed)
			case <-s.retired:
				cl.drainRetired(c)
			}
			s.cur.Store(nil)
			err = c.endCause()
			if _, ok := c.cause.(*unsupportedError); !ok {
				cl.no9.Delete(s.addr)
			}
		}
		if cl.isClosed() || s.isRetired() {
			return
		}
		cl.mu.Lock()
		cl.connErr = err
		cl.mu.Unlock()
		s.down.Store(true)
		cl.signalChanged()
		pause.Reset(cl.cfg.ReconnectInterval)
		select {
		case <-pause.C:
		case <-s.redial:
			pause.Stop()
		case <-cl.closing:
			pause.Stop()
			return
		case <-s.retired:
			pause.Stop()
			return
		}
	}
}

// dial connects to addr: TCP, then the TLS handshake when Config.TLS is
// set, both within Config.DialTimeout.
func (cl *Client) dial(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(cl.bg, cl.cfg.DialTimeout)
	defer cancel()
	nc, err := cl.dialer.DialContext(ctx, "tcp", addr)
	if err != nil || cl.cfg.TLS == nil {
		return nc, err
	}
	cfg := cl.cfg.TLS
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, &handshakeError{addr, err}
	}
	return tc, nil
}

// hello writes the hello (Config.Identity, Config.Secret) to a new
// connection before anything else is sent on it, when an identity is
// configured; the reader takes its answer (see readLoop). The buffer that
// held the secret is cleared.
func (c *conn) hello() error {
	cfg := &c.cl.cfg
	c.mayAuth = cfg.clientCert()
	if cfg.Identity == "" {
		return nil
	}
	c.helloNonce = rand.Uint64()
	c.helloSent = true
	c.mayAuth = true
	buf := proto.AppendHello(nil, c.helloNonce, cfg.Identity, string(cfg.Secret))
	_ = c.nc.SetWriteDeadline(time.Now().Add(cfg.TransportTimeout))
	_, err := c.nc.Write(buf)
	clear(buf)
	return err
}

func (s *slot) isRetired() bool {
	select {
	case <-s.retired:
		return true
	default:
		return false
	}
}

// drainRetired closes c, the connection of an evicted slot, once nothing
// is queued on it or awaits an answer there (or when it dies, or the
// client closes). Requests already on it finish there.
func (cl *Client) drainRetired(c *conn) {
	tm := time.NewTimer(retirePoll)
	defer tm.Stop()
	for !c.closeIfIdle(errRetired) {
		select {
		case <-c.gone:
			return
		case <-cl.closing:
			c.fail(ErrClosed)
			return
		case <-tm.C:
			tm.Reset(retirePoll)
		}
	}
}

func (cl *Client) signalChanged() {
	cl.mu.Lock()
	close(cl.changed)
	cl.changed = make(chan struct{})
	cl.mu.Unlock()
}

// unreachable reports whether no server has been reached yet and every
// slot has failed once (Config.FailFast).
func (cl *Client) unreachable() bool {
	if cl.established.Load() {
		return false
	}
	for _, s := range *cl.slots.Load() {
		if !s.down.Load() {
			return false
		}
	}
	return true
}

// noConnErr is ErrNoConnection with the reason of the last failure, if
// one is known.
func (cl *Client) noConnErr() error {
	cl.mu.Lock()
	cause := cl.connErr
	cl.mu.Unlock()
	if cause == nil {
		return ErrNoConnection
	}
	return &noConnError{cause}
}

func (cl *Client) changedCh() <-chan struct{} {
	cl.mu.Lock()
	ch := cl.changed
	cl.mu.Unlock()
	return ch
}

// pick returns a live connection: one to addr if addr is set (nil if none
// is up), else one to the preferred address if any is up, else the next
// live one in round-robin order, passing over connections to avoid while
// there is another.
func (cl *Client) pick(addr, avoid string) *conn {
	slots := *cl.slots.Load()
	n := uint32(len(slots))
	i0 := cl.rr.Load()
	if addr == "" {
		if p := cl.preferred.Load(); p != nil {
			addr = *p
			if c := pickAddr(slots, n, i0, addr); c != nil {
				return c
			}
			addr = ""
		}
	}
	if addr != "" {
		return pickAddr(slots, n, i0, addr)
	}
	var fallback *conn
	for i := uint32(0); i < n; i++ {
		s := slots[(i0+i)%n]
		if c := s.cur.Load(); c != nil && !c.isDead.Load() {
			if avoid == "" || s.addr != avoid {
				return c
			}
			if fallback == nil {
				fallback = c
			}
		}
	}
	return fallback
}

// pickWatch returns a live connection to c's address that has not
// refused a watch (E 8) since one of its watches last ended, else c (its
// E 8 then says that every connection is full). A watch is bound to the
// member that serves, as every request is: only connections to the
// address that pick chose qualify.
func (cl *Client) pickWatch(c *conn) *conn {
	for _, s := range *cl.slots.Load() {
		if s.addr != c.addr {
			continue
		}
		if o := s.cur.Load(); o != nil && !o.isDead.Load() && !o.watchFull.Load() {
			return o
		}
	}
	return c
}

// lacks9 is the error of the server at addr if it answered a §9 request
// E 1 (see no9), else nil.
func (cl *Client) lacks9(addr string) error {
	if e, ok := cl.no9.Load(addr); ok {
		return e.(*unsupportedError)
	}
	return nil
}

func pickAddr(slots []*slot, n, i0 uint32, addr string) *conn {
	for i := uint32(0); i < n; i++ {
		s := slots[(i0+i)%n]
		if s.addr != addr {
			continue
		}
		if c := s.cur.Load(); c != nil && !c.isDead.Load() {
			return c
		}
	}
	return nil
}

// follow makes addr (named by an M answer) the preferred address. An
// address without a slot gets Config.ConnsPerAddr new ones; if that makes
// more than MaxRedirectAddrs addresses beyond Config.Addrs, the one least
// recently named by an M is evicted.
func (cl *Client) follow(addr string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return
	}
	a := addr
	cl.preferred.Store(&a)
	old := *cl.slots.Load()
	now := int64(monoNow())
	known := false
	for _, s := range old {
		if s.addr == addr {
			known = true
			if s.redirect {
				s.named.Store(now)
			}
		}
	}
	if known {
		return
	}
	redirects := map[string]int64{} // address → latest naming
	for _, s := range old {
		if s.redirect {
			redirects[s.addr] = s.named.Load()
		}
	}
	victim := ""
	if len(redirects) >= MaxRedirectAddrs {
		for a, at := range redirects {
			if victim == "" || at < redirects[victim] {
				victim = a
			}
		}
	}
	slots := make([]*slot, 0, len(old)+cl.cfg.ConnsPerAddr)
	for _, s := range old {
		if s.addr == victim {
			close(s.retired)
			continue
		}
		slots = append(slots, s)
	}
	for i := 0; i < cl.cfg.ConnsPerAddr; i++ {
		s := &slot{addr: addr, redirect: true, retired: make(chan struct{}), redial: make(chan struct{}, 1)}
		s.named.Store(now)
		slots = append(slots, s)
		cl.wg.Add(1)
		go cl.runSlot(s)
	}
	cl.slots.Store(&slots)
}

// unreachableAddr reports whether no request can go to addr now: it has
// no slot (an evicted redirect), or every slot of it is down. Down slots
// of addr are told to dial again at once: an M named it, so it is likely
// up again (a member that restarted and took over by a handover) and the
// background redial may be seconds away.
func (cl *Client) unreachableAddr(addr string) bool {
	reachable := false
	for _, s := range *cl.slots.Load() {
		if s.addr != addr {
			continue
		}
		if !s.down.Load() {
			reachable = true
			continue
		}
		select {
		case s.redial <- struct{}{}:
		default:
		}
	}
	return !reachable
}

// unprefer drops the preferred address if it is addr (its node answered M
// without an address: it does not know the active either).
func (cl *Client) unprefer(addr string) {
	if p := cl.preferred.Load(); p != nil && *p == addr {
		cl.preferred.CompareAndSwap(p, nil)
	}
}

// goBackground runs fn on a goroutine the client waits for at Close, unless
// the client is already closed; it reports whether it started fn.
func (cl *Client) goBackground(fn func()) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return false
	}
	cl.wg.Add(1)
	go func() {
		defer cl.wg.Done()
		fn()
	}()
	return true
}
