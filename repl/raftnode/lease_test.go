package raftnode

import (
	"errors"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
)

// TestLeaseUntil: the lease ends dur after the newest instant by which a
// quorum (this member included) had acknowledged requests sent then, in
// the same term; a committed entry counts as a quorum at its proposal.
func TestLeaseUntil(t *testing.T) {
	type ack struct {
		member int
		term   uint64
		sent   int64
	}
	tests := []struct {
		name    string
		members int
		acks    []ack
		commit  *ack // member ignored
		term    uint64
		want    int64
	}{
		{"alone: never ends", 1, nil, nil, 3, 0},
		{"nothing yet: over", 3, nil, nil, 3, 1},
		{"one of two others", 3, []ack{{1, 3, 100}}, nil, 3, 100 + 50},
		{"the newer of two", 3, []ack{{1, 3, 100}, {2, 3, 170}}, nil, 3, 170 + 50},
		{"an older term counts nothing", 3, []ack{{1, 2, 500}, {2, 3, 100}}, nil, 3, 100 + 50},
		{"only older terms", 3, []ack{{1, 2, 500}, {2, 2, 600}}, nil, 3, 1},
		{"five: the second newest", 5, []ack{{1, 3, 100}, {2, 3, 400}, {3, 3, 300}}, nil, 3, 300 + 50},
		{"five: one is not a quorum", 5, []ack{{1, 3, 400}}, nil, 3, 1},
		{"own acks ignored", 3, []ack{{0, 3, 900}}, nil, 3, 1},
		{"a commit is a quorum", 5, []ack{{1, 3, 400}}, &ack{0, 3, 200}, 3, 200 + 50},
		{"a later ack beats a commit", 3, []ack{{2, 3, 400}}, &ack{0, 3, 200}, 3, 400 + 50},
		{"a commit of another term", 3, nil, &ack{0, 2, 200}, 3, 1},
		{"an older ack does not move it back", 3, []ack{{1, 3, 400}, {1, 3, 300}}, nil, 3, 400 + 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLease(ids(tc.members), "0", 50)
			for _, a := range tc.acks {
				l.acked(raft.ServerID(strconv.Itoa(a.member)), a.term, a.sent)
			}
			if tc.commit != nil {
				l.committed(tc.commit.term, tc.commit.sent)
			}
			if got := l.until(tc.term); got != tc.want {
				t.Fatalf("until(%d) = %d, want %d", tc.term, got, tc.want)
			}
		})
	}
}

// ids are the raft IDs of n members bootstrapped from --peers.
func ids(n int) []raft.ServerID {
	var out []raft.ServerID
	for i := range n {
		out = append(out, raft.ServerID(strconv.Itoa(i)))
	}
	return out
}

// TestLeaseFollowsTheConfiguration: the lease counts over the voters it
// was last given (a membership change): acknowledgements of a member that
// no longer votes count nothing, a new voter's do, and the quorum is a
// majority of the new voters; a member alone is its own quorum until a
// second voter comes, and a leader that does not vote (it is being
// removed) needs a majority of the others.
func TestLeaseFollowsTheConfiguration(t *testing.T) {
	l := newLease(ids(3), "0", 50)
	l.acked("1", 3, 100)
	l.acked("2", 3, 200)
	if got := l.until(3); got != 200+50 {
		t.Fatalf("3 voters: until %d, want %d", got, 250)
	}
	// Member 2 is removed, a new member joins: 2's acknowledgement counts
	// nothing, the newcomer's does, and three of four are needed.
	l.setVoters([]raft.ServerID{"0", "1", "127.0.0.1:7100"})
	if got := l.until(3); got != 100+50 {
		t.Fatalf("after removing 2: until %d, want %d (only 1's ack counts)", got, 150)
	}
	l.acked("2", 3, 900) // not a voter: ignored
	if got := l.until(3); got != 150 {
		t.Fatalf("an ack of a removed member moved the lease to %d", got)
	}
	l.setVoters([]raft.ServerID{"0", "1", "127.0.0.1:7100", "127.0.0.1:7200"})
	l.acked("127.0.0.1:7100", 3, 300)
	if got := l.until(3); got != 100+50 {
		t.Fatalf("4 voters, 2 others acked: until %d, want %d (two others needed: the older)", got, 150)
	}
	l.acked("127.0.0.1:7200", 3, 400)
	if got := l.until(3); got != 300+50 {
		t.Fatalf("4 voters, 3 others acked: until %d, want %d (the second newest)", got, 350)
	}
	// Alone (a forced recovery): never ends; then a second voter: its
	// acknowledgement is needed.
	a := newLease([]raft.ServerID{"0"}, "0", 50)
	if got := a.until(7); got != 0 {
		t.Fatalf("alone: until %d, want 0 (never ends)", got)
	}
	a.setVoters([]raft.ServerID{"0", "127.0.0.1:7100"})
	if got := a.until(7); got != 1 {
		t.Fatalf("two voters, no ack: until %d, want 1 (over)", got)
	}
	a.acked("127.0.0.1:7100", 7, 60)
	if got := a.until(7); got != 110 {
		t.Fatalf("two voters, the other acked: until %d, want 110", got)
	}
	// A leader that is no voter counts only the others.
	b := newLease([]raft.ServerID{"1", "2"}, "0", 50)
	b.acked("1", 4, 10)
	if got := b.until(4); got != 1 {
		t.Fatalf("non-voting leader, 1 of 2 acked: until %d, want 1", got)
	}
	b.acked("2", 4, 20)
	if got := b.until(4); got != 10+50 {
		t.Fatalf("non-voting leader, 2 of 2 acked: until %d, want 60", got)
	}
}

// TestRaftLeaseKeepsTheGate: an idle leader's gate carries an end that its
// heartbeats' acknowledgements keep moving; when they renew nothing, the
// gate lapses (the engine holds: nothing executes) within the lease while
// raft still leads, and it opens again, with the engine told, as soon as
// acknowledgements count again.
func TestRaftLeaseKeepsTheGate(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	dur := lm.n.lease.dur
	g := lm.n.Gate()
	now := lm.clock()
	if g.Until <= now || g.Until > now+dur+lm.n.leaseStep {
		t.Fatalf("leader's gate ends %v from now, want within (0, %v]", time.Duration(g.Until-now), time.Duration(dur+lm.n.leaseStep))
	}
	first := g.Until
	wait.For(t, "heartbeats to renew the idle leader's lease", func() bool { return lm.n.Gate().Until > first+dur })

	lm.n.lease.deaf.Store(true)
	deaf := lm.clock()
	wait.For(t, "the lease to lapse", func() bool { return lm.n.Gate().Effective(lm.clock()) == repl.Hold })
	lapsed := lm.clock()
	// Nothing credited after deaf was set: the gate ends at most a lease
	// after it.
	if end := lm.n.Gate().Until; end > deaf+dur {
		t.Fatalf("the gate ran until %v after acknowledgements stopped counting, the lease is %v", time.Duration(end-deaf), time.Duration(dur))
	}
	if st := lm.n.r.State(); st != raft.Leader || lm.n.Gate().State != repl.Serve {
		t.Fatalf("raft %v, gate %v: the lease should lapse before raft gives up", st, lm.n.Gate().State)
	}
	before := lm.host.changes.Load()
	lm.n.lease.deaf.Store(false)
	wait.For(t, "the gate to open again", func() bool {
		return lm.n.Gate().Effective(lm.clock()) == repl.Serve && lm.host.changes.Load() > before
	})
	t.Logf("lease %v; seen lapsed %v after acknowledgements stopped counting", time.Duration(dur), time.Duration(lapsed-deaf))
}

// TestRaftRefusesHugeTerms: a member's request carrying a term
// above 2^63 — a heartbeat, entries, a vote request — is refused and the
// term does not change, so raft's term + 1 cannot wrap to 0; the cluster
// goes on.
func TestRaftRefusesHugeTerms(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	f := (l + 1) % 3
	fm := c.ms[f]
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("9"), Addr: []byte(tr.LocalAddr())}
	target := raft.ServerAddress(fm.n.cfg.MemberAddr(f))
	tests := []struct {
		name string
		send func(term uint64) error
	}{
		{"heartbeat", func(term uint64) error {
			var resp raft.AppendEntriesResponse
			return tr.AppendEntries("9", target, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: term}, &resp)
		}},
		{"entries", func(term uint64) error {
			var resp raft.AppendEntriesResponse
			return tr.AppendEntries("9", target, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: term,
				LeaderCommitIndex: 1, Entries: []*raft.Log{{Index: math.MaxUint32, Term: term, Type: raft.LogNoop}}}, &resp)
		}},
		{"vote", func(term uint64) error {
			var resp raft.RequestVoteResponse
			return tr.RequestVote("9", target, &raft.RequestVoteRequest{RPCHeader: hdr, Term: term, LastLogIndex: math.MaxUint32, LastLogTerm: term}, &resp)
		}},
		{"pre-vote", func(term uint64) error {
			var resp raft.RequestPreVoteResponse
			return tr.RequestPreVote("9", target, &raft.RequestPreVoteRequest{RPCHeader: hdr, Term: term, LastLogIndex: math.MaxUint32, LastLogTerm: term}, &resp)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := fm.n.r.CurrentTerm()
			err := tc.send(math.MaxUint64)
			if got := fm.n.r.CurrentTerm(); got > termLimit || got < before {
				t.Fatalf("the follower's term went from %d to %d (answer: %v)", before, got, err)
			}
			if err == nil || !strings.Contains(err.Error(), "above 2^63") {
				t.Fatalf("a request with term 2^64-1: %v, want it refused", err)
			}
		})
	}
	if got := fm.n.termSeen.Load(); got != math.MaxUint64 {
		t.Fatalf("refused term recorded as %d", got)
	}
	nl := c.leader()
	c.ms[nl].grant(t, "after", 30)
	c.settle(nl)
}

// TestRaftStreamHoldsAccepts: a member's stream accepts no member
// connection for its hold after it starts (a restarted member must not
// vote while a lease it granted before may still run), and Close ends a
// hold at once.
func TestRaftStreamHoldsAccepts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close bool
	}{{"accepts after the hold", false}, {"close ends the hold", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			const hold = 300 * time.Millisecond
			began := time.Now()
			s := newRaftStream(ln, ln.Addr(), hold, newMemberAuth(repl.ClusterConfig{Peers: []string{"127.0.0.1:1"}}, testLog()))
			type accepted struct {
				c   net.Conn
				err error
				at  time.Duration
			}
			got := make(chan accepted, 1)
			go func() {
				c, err := s.Accept()
				got <- accepted{c, err, time.Since(began)}
			}()
			dc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer dc.Close()
			if tc.close {
				time.Sleep(50 * time.Millisecond)
				s.Close()
				a := <-got
				if !errors.Is(a.err, net.ErrClosed) || a.at >= hold {
					t.Fatalf("Accept after Close: %v after %v, want net.ErrClosed at once", a.err, a.at)
				}
				return
			}
			a := <-got
			if a.err != nil {
				t.Fatal(a.err)
			}
			a.c.Close()
			s.Close()
			if a.at < hold {
				t.Fatalf("a member connection accepted %v after start, within the %v hold", a.at, hold)
			}
		})
	}
}
