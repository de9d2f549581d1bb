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
	auth      *memberAuth

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// newRaftStream serves raft on ln through auth, advertising advertise.
func newRaftStream(ln net.Listener, advertise net.Addr, auth *memberAuth) *raftStream {
	return &raftStream{ln: auth.listen(ln), advertise: advertise, auth: auth, conns: map[net.Conn]struct{}{}}
}

// Accept returns the next member connection (one that arrives while the
// link is cut is closed at once).
func (s *raftStream) Accept() (net.Conn, error) {
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
	s.auth.cancel()
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
