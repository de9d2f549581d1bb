package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/memberauth"
)

// foreignStream is a stranger's stream layer for hashicorp's transport:
// plain TCP dials, or the exchange with the impostor's material.
type foreignStream struct {
	net.Listener
	dial func(address string, timeout time.Duration) (net.Conn, error)
}

func (s *foreignStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dial(string(address), timeout)
}

// raftState is what a foreign AppendEntries must not change.
type raftState struct {
	leader    int
	terms     []uint64
	roles     []string
	elections []uint64
	tokenLast uint64
	locks     map[string]lockState
}

func (c *raftCluster) state(l int) raftState {
	s := raftState{leader: l, tokenLast: c.ms[l].table.Tokens().Last(), locks: dumpTable(c.ms[l].table)}
	for _, m := range c.ms {
		st := m.n.Status()
		s.terms = append(s.terms, st.Raft.Term)
		s.roles = append(s.roles, st.Role)
		s.elections = append(s.elections, st.Raft.Elections)
	}
	return s
}

func (s raftState) String() string {
	return fmt.Sprintf("leader %d, terms %v, roles %v, elections %v, token counter %d, %d locks", s.leader, s.terms, s.roles, s.elections, s.tokenLast, len(s.locks))
}

func (s raftState) equal(o raftState) bool {
	return s.leader == o.leader && slices.Equal(s.terms, o.terms) && slices.Equal(s.roles, o.roles) &&
		slices.Equal(s.elections, o.elections) && s.tokenLast == o.tokenLast && maps2Equal(s.locks, o.locks)
}

// TestForeignAppendEntries: a stranger on the leader's member port sends
// an AppendEntries with a term 100 above the cluster's, as hashicorp's
// NetworkTransport encodes it, claiming to be member 2 (over plain TCP,
// or after running the exchange with a certificate of another CA, or of
// the right CA naming another host). Without §8.4 the leader steps down
// and the forged term becomes the cluster's; with a secret, TLS or both
// the RPC fails, and the leader, every term, role and election count,
// every lock with its token and the token counter are as they were.
func TestForeignAppendEntries(t *testing.T) {
	mats, cases := repltest.ForgeryCases(t, 9)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			c := &raftCluster{t: t, T: 400 * time.Millisecond, member: func(i int, cfg *repl.ClusterConfig) {
				cfg.Secret = tc.Secret
				if tc.TLS {
					cfg.MemberTLS = mats[i]
				}
			}}
			c.startAll(3)
			l := c.leader()
			lm := c.ms[l]
			for i := range 20 {
				lm.grant(t, fmt.Sprintf("held/%d", i), 60)
			}
			c.settle(l)
			before := c.state(l)
			forger := (l + 1) % 3
			if forger == l {
				forger = (l + 2) % 3
			}
			cfg := lm.n.cfg
			dial := func(address string, timeout time.Duration) (net.Conn, error) {
				return net.DialTimeout("tcp", address, timeout)
			}
			if tc.Impostor != nil {
				cfg.Self, cfg.MemberTLS = forger, tc.Impostor
				a := memberauth.New(cfg, memberauth.Options{Mode: memberauth.ModeRaft}, repltest.Quiet())
				dial = func(address string, timeout time.Duration) (net.Conn, error) {
					return a.Dial(context.Background(), l, address, timeout)
				}
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			trans := raft.NewNetworkTransport(&foreignStream{Listener: ln, dial: dial}, 1, time.Second, io.Discard)
			defer trans.Close()
			forged := before.terms[l] + 100
			req := &raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
					ID: []byte(fmt.Sprint(forger)), Addr: []byte(lm.n.cfg.MemberAddr(forger))},
				Term: forged,
			}
			var resp raft.AppendEntriesResponse
			rpcErr := trans.AppendEntries(raft.ServerID(fmt.Sprint(l)), raft.ServerAddress(lm.n.cfg.MemberAddr(l)), req, &resp)
			if tc.Name == "off" {
				if rpcErr != nil {
					t.Fatalf("the foreign AppendEntries failed without §8.4: %v", rpcErr)
				}
				wait.For(t, "the forged term to depose the leader", func() bool { return lm.n.Status().Raft.Term >= forged })
				t.Logf("without §8.4: %v (before: %v)", c.state(l), before)
				return
			}
			if rpcErr == nil {
				t.Fatalf("the foreign AppendEntries was answered: %+v", resp)
			}
			time.Sleep(3 * c.T) // what the RPC did would show by now
			after := c.state(l)
			if !after.equal(before) {
				t.Fatalf("the foreign AppendEntries changed the cluster:\nbefore %v\nafter  %v", before, after)
			}
			lm.grant(t, "after", 60) // still serving
			var n uint64
			for _, r := range lm.n.Status().MemberRefused {
				n += r.N
			}
			if n == 0 {
				t.Errorf("the leader counted no refusal: %v", lm.n.Status().MemberRefused)
			}
		})
	}
}

// TestFloodedMemberPort: a flood of connections that never authenticate
// on a follower's member port; the follower's links are cut and healed,
// so the leader dials it again into the flood: it gets through, the
// leader's grants commit and reach the follower, and the exchange held at
// most its limit of the flood's connections.
func TestFloodedMemberPort(t *testing.T) {
	sec := repltest.Secret(5)
	c := &raftCluster{t: t, T: 400 * time.Millisecond, member: func(_ int, cfg *repl.ClusterConfig) { cfg.Secret = sec }}
	c.startAll(3)
	l := c.leader()
	f := (l + 1) % 3
	fm := c.ms[f]
	stop := repltest.Flood(fm.n.cfg.MemberAddr(f), 200)
	defer stop()
	refused := func(reason string) uint64 {
		for _, r := range fm.n.Status().MemberRefused {
			if r.Reason == reason {
				return r.N
			}
		}
		return 0
	}
	wait.For(t, "the flood to fill the exchange", func() bool { return refused("limit") > 50 })
	fm.n.stream.setCut(true)
	time.Sleep(c.T / 4)
	fm.n.stream.setCut(false)
	tok := c.ms[l].grant(t, "during-the-flood", 60)
	wait.For(t, "the follower to apply the grant made during the flood", func() bool {
		return fm.table.Lookup([]byte("during-the-flood")).Token == tok
	})
	n := stop()
	t.Logf("%d connections flooded; the follower refused %v", n, fm.n.Status().MemberRefused)
	if got := c.leader(); got != l {
		t.Fatalf("leader %d after the flood, was %d", got, l)
	}
}

// TestSecureAddOutsidePeers: with member authentication on, a member can
// only be added at an address of --peers (the exchange names members by
// their index there): another address is refused with ErrBadMember
// before the configuration changes.
func TestSecureAddOutsidePeers(t *testing.T) {
	sec := repltest.Secret(7)
	c := &raftCluster{t: t, T: 400 * time.Millisecond, member: func(_ int, cfg *repl.ClusterConfig) { cfg.Secret = sec }}
	c.startAll(3)
	l := c.leader()
	outside := repltest.FreeAddrs(t, 1, raftTestOffset)[0]
	_, err := c.ms[l].n.AddMember(ctx10s(t), outside, time.Second)
	if !errors.Is(err, repl.ErrBadMember) || !strings.Contains(err.Error(), "--peers") {
		t.Fatalf("add %s with a cluster secret: %v, want ErrBadMember naming --peers", outside, err)
	}
	if all, _ := c.members(l); len(all) != 3 {
		t.Fatalf("configuration after the refused add: %v", all)
	}
}
