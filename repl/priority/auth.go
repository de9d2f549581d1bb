package priority

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/memberauth"
	"github.com/lockd-dev/lockd/repl/priority/machine"
)

// Members that prove who they are (PROTOCOL.md §8.4): the link dials and
// accepts through memberauth, which runs the exchange (mutual TLS, the
// cluster secret's challenge and response) before the link reads or
// writes a frame, and bounds the member port. A refused connection never
// reaches the link: nothing it sent is read, no role, lock or token moves.

// connsPerMember is how many authenticated inbound connections each other
// member may hold at once: its link, and a re-dial while the old one
// waits out its read deadline.
const connsPerMember = 4

// newAuth is the exchange of this member's link.
func newAuth(cfg repl.ClusterConfig, log *slog.Logger) *memberauth.Auth {
	return memberauth.New(cfg, memberauth.Options{Mode: memberauth.ModePriority,
		MaxConns: connsPerMember * max(len(cfg.Peers)-1, 1)}, log)
}

// dial connects to member i at addr: TCP, then the exchange when it is on.
// Closing the link cancels it.
func (l *link) dial(i int, addr string) (net.Conn, error) {
	return l.auth.Dial(l.ctx, i, addr, dialTimeout)
}

// listen serves the member port through the exchange.
func (l *link) listen(ln net.Listener) net.Listener { return l.auth.Listen(ln) }

// provedAs checks that a Hello's sender is the member the exchange proved
// on c (when the exchange is on).
func provedAs(c net.Conn, from int) error {
	if m, ok := memberauth.MemberOf(c); ok && m != from {
		return fmt.Errorf("%w: its Hello says member %d, it proved to be member %d", errMismatch, from, m)
	}
	return nil
}

// provenMember is the member the exchange proved on c, None without one.
func (l *link) provenMember(c net.Conn) int {
	if m, ok := memberauth.MemberOf(c); ok {
		return m
	}
	return machine.None
}

// lasting reports whether a failed dial is a refusal that lasts until an
// operator acts: the members disagree on the cluster secret, the
// certificates or the cluster's parameters (or the peer refused this
// member for such a reason). A peer that is slow or frozen (the
// exchange's deadline) or a full member port is no such refusal.
func lasting(err error) bool {
	r, ok := memberauth.ReasonOf(err)
	if !ok {
		return false
	}
	switch r {
	case memberauth.ReasonConfig, memberauth.ReasonTLS, memberauth.ReasonName, memberauth.ReasonSecret, memberauth.ReasonPeer:
		return true
	}
	return false
}

// authContext is the context of the link's dials: cancelled by close.
func authContext() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
