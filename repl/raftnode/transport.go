package raftnode

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// errLinkCut: the member link is cut (tests: an isolated member).
var errLinkCut = errors.New("raftnode: member link cut")

// raftStream is raft's TCP stream layer on the member port: a listener
// that advertises this member's address as the others dial it, and plain
// TCP dials. It keeps its connections so that cut can sever them all and
// refuse new ones (an isolated member, for tests), and heal undo it.
type raftStream struct {
	ln        net.Listener
	advertise net.Addr
	until     time.Time     // accept nothing before (hold)
	done      chan struct{} // closed by Close

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
}

// newRaftStream serves raft on ln, advertising advertise; it accepts no
// connection for hold after it is made (lease.go: a member that restarts
// must not vote while a lease it granted before may still run).
func newRaftStream(ln net.Listener, advertise net.Addr, hold time.Duration) *raftStream {
	return &raftStream{ln: ln, advertise: advertise, until: time.Now().Add(hold),
		done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
}

// Accept returns the next member connection (one that arrives while the
// link is cut is closed at once). Until the hold is over, connections wait
// in the listener's backlog.
func (s *raftStream) Accept() (net.Conn, error) {
	if d := time.Until(s.until); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return nil, err
		}
		if tc, ok := s.track(c); ok {
			return tc, nil
		}
	}
}

// Dial connects to a member.
func (s *raftStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	s.mu.Lock()
	cut := s.cut
	s.mu.Unlock()
	if cut {
		return nil, errLinkCut
	}
	c, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	tc, ok := s.track(c)
	if !ok {
		return nil, errLinkCut
	}
	return tc, nil
}

// track registers c, or closes it if the link is cut.
func (s *raftStream) track(c net.Conn) (net.Conn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		c.Close()
		return nil, false
	}
	s.conns[c] = struct{}{}
	return &trackedConn{Conn: c, s: s}, true
}

// setCut severs every member connection and refuses new ones (true), or
// allows them again (false).
func (s *raftStream) setCut(cut bool) {
	s.mu.Lock()
	s.cut = cut
	var list []net.Conn
	if cut {
		for c := range s.conns {
			list = append(list, c)
		}
		clear(s.conns)
	}
	s.mu.Unlock()
	for _, c := range list {
		c.Close()
	}
}

// Close closes the listener and every member connection (the transport
// leaves the inbound ones to their peers, whose reads would outlive it).
func (s *raftStream) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.setCut(true)
	return err
}

// Addr is the address the other members dial.
func (s *raftStream) Addr() net.Addr { return s.advertise }

// trackedConn forgets itself when closed.
type trackedConn struct {
	net.Conn
	s *raftStream
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c.Conn)
	c.s.mu.Unlock()
	return c.Conn.Close()
}
