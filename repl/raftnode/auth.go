package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/memberauth"
)

// Members that prove who they are (PROTOCOL.md §8.4): raft's stream layer
// dials and accepts through memberauth, which runs the exchange (mutual
// TLS, the cluster secret's challenge and response) before hashicorp's
// transport reads or writes a byte, each accepted connection's exchange
// on a goroutine of its own (the transport's accept loop never waits for
// a slow peer), and bounds the member port. A refused connection never
// reaches raft: no term, vote, entry or snapshot from it is read.

// connsPerMember is how many authenticated inbound connections each other
// member may hold at once: hashicorp's transport pools 3 per peer and
// opens more for concurrent RPCs (heartbeats, the pipeline, a snapshot,
// a vote).
const connsPerMember = 16

// memberAuth is the stream layer's side of the exchange.
type memberAuth struct {
	auth   *memberauth.Auth
	index  map[string]int // member address (as raft dials it) → member index
	ctx    context.Context
	cancel context.CancelFunc
}

// newMemberAuth is the exchange of member cfg.Self.
func newMemberAuth(cfg repl.ClusterConfig, log *slog.Logger) *memberAuth {
	a := &memberAuth{index: map[string]int{},
		auth: memberauth.New(cfg, memberauth.Options{Mode: memberauth.ModeRaft,
			MaxConns: connsPerMember * max(len(cfg.Peers)-1, 1)}, log)}
	for i := range cfg.Peers {
		a.index[cfg.MemberAddr(i)] = i
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a
}

// listen serves the member port through the exchange.
func (a *memberAuth) listen(ln net.Listener) net.Listener { return a.auth.Listen(ln) }

// dial connects to the member raft knows by address.
func (a *memberAuth) dial(address string, timeout time.Duration) (net.Conn, error) {
	i, ok := a.index[address]
	switch {
	case ok:
		return a.auth.Dial(a.ctx, i, address, timeout)
	case a.auth.On():
		// The exchange names members by their index in --peers: a member
		// added through the membership API at an address outside it
		// cannot prove who it is (docs/CLUSTER.md, "Changing members").
		return nil, fmt.Errorf("raftnode: %s is not in --peers, and member authentication names members by their --peers entry", address)
	default:
		// A member added later (membership.go) at an address of its own.
		d := net.Dialer{Timeout: timeout}
		return d.DialContext(a.ctx, "tcp", address)
	}
}

// Refusals counts the refused member connections by reason.
func (a *memberAuth) Refusals() []repl.Refusal { return a.auth.Refusals() }

// names reports whether addr (a member port) can be a member's address
// under the exchange: always when it is off; when on, only the member
// ports of --peers entries.
func (a *memberAuth) names(addr string) bool {
	_, ok := a.index[addr]
	return ok || !a.auth.On()
}
