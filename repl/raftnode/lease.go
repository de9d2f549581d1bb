package raftnode

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// The leader lease (PROTOCOL.md §6.2: a member frozen longer
// than the failover timeout executes nothing from its stale state, answers
// that change nothing included).
//
// A leader's gate serves only until its lease ends (repl.Gate.Until); past
// it the engine holds requests unread and runs no timer. The lease is
// renewed by acknowledgements, counted from the instant the acknowledged
// request was *sent*: a follower that answered an AppendEntries (a
// heartbeat, or entries) of this term with success received it after that
// instant, and raft's follower neither votes for another candidate nor
// stands itself until it has heard nothing from its leader for a heartbeat
// timeout (hashicorp/raft's runFollower and requestVote: a known leader
// refuses every vote but a transfer's, and the leader is forgotten only
// once LastContact is that old). So once a quorum (this member included)
// has acknowledged requests sent at or after t, no other leader can exist
// before t + the heartbeat timeout, measured on the followers' clocks:
// this member's table is the committed state plus its own changes until
// then, and it serves until t + leaseFraction of it. A committed entry is
// the same fact for the instant it was proposed (a quorum stored it, which
// it was sent after).
//
// Why send times: after a SIGSTOP, answers that sat in socket buffers are
// read first, and hashicorp's own LastContact (and so VerifyLeader's votes
// and the leader lease check) counts them as fresh. An acknowledgement of
// a request sent before the pause renews nothing past the pause, so after
// a freeze longer than the lease the gate holds until a quorum has
// answered a request sent after resuming: either nothing happened
// meanwhile (the quorum says so, and serving is correct) or a newer term
// exists, whose members answer without success, and raft steps down
// (the gate then redirects, and what queued up is answered M).
//
// A member that restarts has forgotten whom it followed and would vote at
// once: it accepts no member connection for a heartbeat timeout after it
// starts (raftStream.hold), so it cannot help elect a leader while a lease
// it granted before it went down may still run.
//
// The lease does not depend on wall clocks, only on clocks that run at
// about the same rate (leaseFraction leaves a quarter of the timeout for
// that and for scheduling).

// leaseFraction is the part of raft's heartbeat timeout that an
// acknowledgement keeps the lease for.
const leaseFraction = 0.75

// leaseAck is the newest request a member acknowledged: the term it was
// sent in and when (the table's clock).
type leaseAck struct {
	term uint64
	sent int64
}

// later reports whether a is newer than b.
func (a leaseAck) later(b leaseAck) bool {
	return a.term > b.term || (a.term == b.term && a.sent > b.sent)
}

// lease is a leader's lease: the acknowledgements it is made of, counted
// over the voters of the current raft configuration (setVoters: the node
// calls it whenever the configuration changes, membership.go). Its
// methods are safe from any goroutine.
type lease struct {
	self raft.ServerID
	dur  int64 // how long an acknowledgement keeps the lease (ns)

	mu     sync.Mutex
	voters []raft.ServerID // the configuration's voters, this member included if it votes
	quorum int             // votes a leader needs: a majority of voters
	acks   map[raft.ServerID]leaseAck
	commit leaseAck // the newest committed entry: when it was proposed

	deaf atomic.Bool // tests: acknowledgements renew nothing
}

func newLease(voters []raft.ServerID, self raft.ServerID, dur int64) *lease {
	l := &lease{self: self, dur: dur, acks: map[raft.ServerID]leaseAck{}}
	l.setVoters(voters)
	return l
}

// setVoters makes the lease count over voters from now on (a change of
// the raft configuration): acknowledgements of members that no longer vote
// count nothing, and a majority of the new voters is needed.
//
// Why that is safe across a change: hashicorp/raft changes one server at a
// time and appends a change only once the previous one has committed, so a
// candidate uses either the configuration this lease counts over or one
// that differs from it by one server, and a majority of either meets a
// majority of the other: the voters that acknowledged refuse it. The node
// recomputes and republishes the gate as soon as the configuration moves
// (membership.go: release), so a published end never counts over a
// configuration two changes old.
func (l *lease) setVoters(voters []raft.ServerID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.voters = slices.Clone(voters)
	l.quorum = len(voters)/2 + 1
	for id := range l.acks {
		if !slices.Contains(voters, id) {
			delete(l.acks, id)
		}
	}
}

// acked records that member id acknowledged a request of term sent at
// sent.
func (l *lease) acked(id raft.ServerID, term uint64, sent int64) {
	if id == l.self || l.deaf.Load() {
		return
	}
	a := leaseAck{term, sent}
	l.mu.Lock()
	if slices.Contains(l.voters, id) && a.later(l.acks[id]) {
		l.acks[id] = a
	}
	l.mu.Unlock()
}

// committed records that an entry of term proposed at sent committed.
func (l *lease) committed(term uint64, sent int64) {
	if l.deaf.Load() {
		return
	}
	a := leaseAck{term, sent}
	l.mu.Lock()
	if a.later(l.commit) {
		l.commit = a
	}
	l.mu.Unlock()
}

// until is the end of the lease of term on the table's clock: 0 when it
// never ends (a member alone is its own quorum), 1 when nothing renewed it
// yet (over at once).
func (l *lease) until(term uint64) int64 {
	var buf [maxMembers + 1]int64
	sent := buf[:0]
	l.mu.Lock()
	need := l.quorum // acknowledgements besides this member's own
	if slices.Contains(l.voters, l.self) {
		need--
	}
	if need <= 0 {
		l.mu.Unlock()
		return 0
	}
	for _, id := range l.voters {
		if a, ok := l.acks[id]; ok && id != l.self && a.term == term {
			sent = append(sent, a.sent)
		}
	}
	base := int64(-1)
	if l.commit.term == term {
		base = l.commit.sent
	}
	l.mu.Unlock()
	if n := len(sent); n >= need {
		slices.Sort(sent)
		base = max(base, sent[n-need]) // the need-th newest
	}
	if base < 0 {
		return 1
	}
	return max(base+l.dur, 1)
}

// maxMembers bounds the voters (repl.ClusterConfig.Validate, AddMember).
const maxMembers = 7

// termLimit is the highest raft term this member accepts from another or
// takes at start. Each election adds one, so a term this high comes only
// from corrupt or forged state; refusing it keeps hashicorp/raft's
// term + 1 from ever wrapping to 0 (a forged or corrupt term could): from termLimit, another
// 2^63 elections would be needed.
const termLimit = 1 << 63

// errTermTooHigh answers a member's request whose term is above termLimit.
var errTermTooHigh = errors.New("raftnode: raft term above 2^63 refused (corrupt or forged)")

// memberTransport is raft's network transport with lockd's checks on the
// way: acknowledgements of AppendEntries renew the lease (with the instant
// the request was sent), and no term above termLimit enters raft, neither
// in a request another member sent nor in an answer to a vote.
type memberTransport struct {
	*raft.NetworkTransport
	n   *node
	rpc chan raft.RPC // what raft consumes: the transport's, checked
}

func newMemberTransport(n *node, t *raft.NetworkTransport) *memberTransport {
	return &memberTransport{NetworkTransport: t, n: n, rpc: make(chan raft.RPC)}
}

// Consumer is the channel raft reads requests from: those of the
// transport that pass the term check (forward, on a goroutine of its own).
func (t *memberTransport) Consumer() <-chan raft.RPC { return t.rpc }

// forward hands raft the requests that pass the term check until the node
// closes.
func (t *memberTransport) forward() {
	defer t.n.wg.Done()
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case <-t.n.quit:
			return
		case rpc := <-in:
			if !t.admit(rpc) {
				continue
			}
			select {
			case t.rpc <- rpc:
			case <-t.n.quit:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		}
	}
}

// SetHeartbeatHandler installs raft's heartbeat fast path behind the term
// check.
func (t *memberTransport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	if cb == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if t.admit(rpc) {
			cb(rpc)
		}
	})
}

// admit reports whether rpc's term is acceptable; if not, it answers it
// with errTermTooHigh and logs. A request of a member that a forced
// recovery left behind is refused too (recover.go).
func (t *memberTransport) admit(rpc raft.RPC) bool {
	if t.n.fromGone(rpc) {
		t.n.refusedGone(rpc)
		rpc.Respond(nil, errGoneMember)
		return false
	}
	var term uint64
	switch c := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		term = c.Term
	case *raft.RequestVoteRequest:
		term = c.Term
	case *raft.RequestPreVoteRequest:
		term = c.Term
	case *raft.InstallSnapshotRequest:
		term = c.Term
	}
	if term <= termLimit {
		return true
	}
	t.n.refusedTerm(term)
	rpc.Respond(nil, errTermTooHigh)
	return false
}

// AppendEntries sends a heartbeat or entries; a success in the same term
// renews the lease from the instant it was sent. The commit index it
// carries is at most this member's durable index (clampCommit).
func (t *memberTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if err := t.n.clampCommit(args); err != nil {
		return err
	}
	sent := t.n.clock()
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if err == nil && resp.Term == args.Term {
		t.n.heardFrom(id, resp.LastLog, sent) // membership.go
		if resp.Success {
			t.n.lease.acked(id, args.Term, sent)
			t.n.renew(args.Term)
		}
	}
	return err
}

// AppendEntriesPipeline is the transport's pipeline, its requests' commit
// index clamped as AppendEntries's.
func (t *memberTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return &clampedPipeline{AppendPipeline: p, n: t.n}, nil
}

// clampedPipeline is an AppendPipeline whose requests carry a commit index
// no higher than the leader's durable index.
type clampedPipeline struct {
	raft.AppendPipeline
	n *node
}

// AppendEntries sends args down the pipeline.
func (p *clampedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	if err := p.n.clampCommit(args); err != nil {
		return nil, err
	}
	return p.AppendPipeline.AppendEntries(args, resp)
}

// clampCommit lowers the commit index a leader sends to the last index of
// its log that is durable (durable.go): raft counts the leader's copy of an
// entry as soon as it is written, and a follower must not apply an entry
// before that copy is durable. A member whose log failed sends nothing
// (errLogNotDurable): no acknowledgement renews its lease, and raft steps
// down.
func (n *node) clampCommit(args *raft.AppendEntriesRequest) error {
	if n.dur == nil {
		return nil
	}
	if n.dur.mute.Load() {
		return errLogNotDurable
	}
	if d := n.dur.durable.Load(); args.LeaderCommitIndex > d {
		args.LeaderCommitIndex = d
	}
	return nil
}

// RequestVote asks for a vote; an answer carrying a term above termLimit
// counts as a failed request.
func (t *memberTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := t.NetworkTransport.RequestVote(id, target, args, resp); err != nil {
		return err
	}
	if resp.Term > termLimit {
		t.n.refusedTerm(resp.Term)
		return errTermTooHigh
	}
	return nil
}

// RequestPreVote is RequestVote's pre-vote.
func (t *memberTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if err := t.NetworkTransport.RequestPreVote(id, target, args, resp); err != nil {
		return err
	}
	if resp.Term > termLimit {
		t.n.refusedTerm(resp.Term)
		return errTermTooHigh
	}
	return nil
}
