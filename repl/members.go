package repl

import (
	"context"
	"errors"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// Membership is implemented by a node whose cluster can change its
// members while it runs (raft mode: repl/raftnode). The admin endpoint
// reaches it through engine.Config.Node; a node that is not a Membership
// (a single node, a priority member: its members are --peers, changed by
// a rolling restart) has no such calls.
//
// Every method is safe from any goroutine. Members answers from this
// member's own view (any member); AddMember and RemoveMember change the
// configuration and run on the leader only: elsewhere they return a
// *NotLeaderError naming the leader. Changes are made one at a time (a
// second waits for the first).
type Membership interface {
	// Members is the cluster's configuration as this member knows it.
	Members() (api.Members, error)
	// AddMember adds the member whose client address is addr (as it
	// writes its own --self) and which was started to join (--join): first
	// as a non-voter, which receives the leader's snapshot and log; once
	// it has caught up (waiting at most wait), as a voter. It returns the
	// configuration after the change.
	AddMember(ctx context.Context, addr string, wait time.Duration) (api.MemberChange, error)
	// RemoveMember removes the member whose raft ID or client address is
	// member. Removing the leader hands the leadership over first (planned,
	// nothing is lost) and returns a *NotLeaderError naming the successor,
	// which then removes it.
	RemoveMember(ctx context.Context, member string) (api.MemberChange, error)
}

// NotLeaderError is a change asked of a member that does not lead the
// cluster. Leader is the leader's client address, "" while none is known.
type NotLeaderError struct {
	Leader string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "repl: this member is not the leader, and no leader is known yet"
	}
	return "repl: this member is not the leader; the leader is " + e.Leader
}

// Membership errors.
var (
	// ErrBadMember: the address is not host:port, or its member port
	// (port + --peer-offset) is above 65535.
	ErrBadMember = errors.New("repl: bad member address")
	// ErrMemberExists: the member is a voter already, or another member
	// has its address.
	ErrMemberExists = errors.New("repl: already a member")
	// ErrNoMember: no member has that ID or address.
	ErrNoMember = errors.New("repl: no such member")
	// ErrMembersFull: the cluster has 7 voters (PROTOCOL.md §6.1).
	ErrMembersFull = errors.New("repl: the cluster has 7 voters already")
	// ErrQuorumAtRisk: after the change, the live voters would not be a
	// majority of the new configuration, so the change could never commit
	// and the cluster would stop.
	ErrQuorumAtRisk = errors.New("repl: the change would leave no live majority")
	// ErrNotCaughtUp: the new member was added as a non-voter but did not
	// catch up with the leader within the wait (is it running with --join?).
	ErrNotCaughtUp = errors.New("repl: the new member has not caught up")
)
