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
// that advertises this member's address as the others dial it, and TCP
// dials, both through the exchange of §8.4 when it is on (auth.go). It keeps its connections so that cut can sever them all and
// refuse new ones (an isolated member, for tests), and heal undo it.
type raftStream struct {
	ln        net.Listener
	advertise net.Addr
	until     time.Time     // accept nothing before (hold)
	done      chan struct{} // closed by Close
	auth      *memberAuth

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
	// authLn serves ln through the exchange; the first Accept after the
	// hold makes it, so that until then connections wait unread in the
	// backlog, exchange included.
	authLn net.Listener
}

// newRaftStream serves raft on ln through auth, advertising advertise; it
// accepts no connection for hold after it is made (lease.go: a member
// that restarts must not vote while a lease it granted before may still
// run).
func newRaftStream(ln net.Listener, advertise net.Addr, hold time.Duration, auth *memberAuth) *raftStream {
	return &raftStream{ln: ln, advertise: advertise, until: time.Now().Add(hold),
		done: make(chan struct{}), auth: auth, conns: map[net.Conn]struct{}{}}
}

// listener is the member port through the exchange, made on first use.
func (s *raftStream) listener() (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, net.ErrClosed
	}
	if s.authLn == nil {
		s.authLn = s.auth.listen(s.ln)
	}
	return s.authLn, nil
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
	ln, err := s.listener()
	if err != nil {
		return nil, err
	}
	for {
		c, err := ln.Accept()
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
	c, err := s.auth.dial(string(address), timeout)
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
	ln := s.ln
	if s.authLn != nil {
		ln = s.authLn // closes s.ln and ends the exchanges in progress
	}
	s.mu.Unlock()
	s.auth.cancel()
	err := ln.Close()
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
