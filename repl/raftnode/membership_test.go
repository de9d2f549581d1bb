package raftnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// joiner starts a member that joins the cluster (Join) on a fresh address
// and data dir and returns its index in c.ms.
func (c *raftCluster) joiner() int {
	c.t.Helper()
	addr := repltest.FreeAddrs(c.t, 1, raftTestOffset)[0]
	i := len(c.ms)
	c.dirs = append(c.dirs, c.t.TempDir())
	c.ms = append(c.ms, nil)
	if c.cfgs == nil {
		c.cfgs = map[int]repl.ClusterConfig{}
	}
	c.cfgs[i] = repl.ClusterConfig{Peers: []string{addr}, Self: 0, Listen: addr, PeerOffset: raftTestOffset,
		FailoverTimeout: c.T, DataDir: c.dirs[i], TokenBlock: 1 << 20, Join: true}
	c.start(i)
	return i
}

// addr is member i's client address.
func (c *raftCluster) addr(i int) string {
	if cfg, ok := c.cfgs[i]; ok {
		return cfg.Peers[cfg.Self]
	}
	return c.peers[i]
}

// members returns the IDs of member i's configuration, and the voters'.
func (c *raftCluster) members(i int) (all, voters []string) {
	c.t.Helper()
	ms, err := c.ms[i].n.Members()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, m := range ms.Members {
		all = append(all, m.ID)
		if m.Voter {
			voters = append(voters, m.ID)
		}
	}
	return all, voters
}

func ctx10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestRaftReplaceMember: a follower dies (kill, as kill -9 leaves it), it
// is removed and a fresh member on a new address and data dir joins: it
// catches up with every lock, with its token, votes, and with it the
// cluster keeps a majority after losing one more of the original members;
// the lease counts over the new voters; tokens keep increasing; M and
// /status name members by the configuration.
func TestRaftReplaceMember(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	held := map[string]uint64{}
	var last uint64
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		held[key] = lm.grant(t, key, 120)
		last = max(last, held[key])
	}
	c.settle(l)
	dead := (l + 1) % 3
	c.kill(dead)
	wait.For(t, "the leader to see the dead member down", func() bool {
		for _, m := range lm.n.Status().Members {
			if m.Addr == c.peers[dead] {
				return !m.Live
			}
		}
		return false
	})
	// Removing a live member now would leave the dead one and the leader:
	// refused, the cluster would stop.
	other := (l + 2) % 3
	if _, err := lm.n.RemoveMember(ctx10s(t), c.peers[other]); !errors.Is(err, repl.ErrQuorumAtRisk) {
		t.Fatalf("removing a live member while another is down: %v, want ErrQuorumAtRisk", err)
	}
	ch, err := lm.n.RemoveMember(ctx10s(t), fmt.Sprint(dead))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Member.ID != fmt.Sprint(dead) || len(ch.Members.Members) != 2 {
		t.Fatalf("removed %+v, configuration after %+v", ch.Member, ch.Members)
	}
	j := c.joiner()
	if g := c.ms[j].n.Gate(); g.State != repl.Redirect || g.Addr != "" {
		t.Fatalf("a joiner not added yet: gate %+v, want M with no address", g)
	}
	ch, err = lm.n.AddMember(ctx10s(t), c.addr(j), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Member.ID != c.addr(j) || !ch.Member.Voter || ch.Member.Addr != c.addr(j) {
		t.Fatalf("added %+v", ch.Member)
	}
	if _, err := lm.n.AddMember(ctx10s(t), c.addr(j), time.Second); !errors.Is(err, repl.ErrMemberExists) {
		t.Fatalf("adding it again: %v, want ErrMemberExists", err)
	}
	c.settle(l)
	got := dumpTable(c.ms[j].table)
	for key, tok := range held {
		if got[key].token != tok {
			t.Fatalf("the new member holds %s with token %d, want %d", key, got[key].token, tok)
		}
	}
	// A member learns the promotion to voter from the leader's log a round
	// trip after the leader answered it.
	wait.For(t, "the new member to see three voters", func() bool {
		all, voters := c.members(j)
		return len(all) == 3 && len(voters) == 3
	})
	wait.For(t, "the new member to name the leader", func() bool {
		g := c.ms[j].n.Gate()
		return g.State == repl.Redirect && g.Addr == c.peers[l]
	})
	st := lm.n.Status()
	if len(st.Raft.Configuration) != 3 || len(st.Members) != 2 {
		t.Fatalf("leader's status: configuration %+v, members %+v", st.Raft.Configuration, st.Members)
	}
	for _, m := range st.Members {
		if !m.Live {
			t.Fatalf("leader's status: member %s not live", m.Addr)
		}
	}
	// The leader and the new member are a majority without the last of the
	// others: the cluster commits.
	c.kill(other)
	tok := lm.grant(t, "after", 30)
	wait.For(t, "a grant to commit with the new member's vote", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
	if tok <= last {
		t.Fatalf("token after the change %d, not above %d", tok, last)
	}
	if lm.n.Gate().Effective(lm.clock()) != repl.Serve {
		t.Fatalf("the leader's lease lapsed with the new member's acknowledgements")
	}
}

// TestRaftRemoveLeaderHandsOver: asked to remove itself, the leader hands
// the leadership over (nothing lost, the successor serves) and names the
// successor, which removes it; the removed member stays out.
func TestRaftRemoveLeaderHandsOver(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	tok := lm.grant(t, "held", 120)
	c.settle(l)
	_, err := lm.n.RemoveMember(ctx10s(t), c.peers[l])
	var nl *repl.NotLeaderError
	if !errors.As(err, &nl) || nl.Leader == "" || nl.Leader == c.peers[l] {
		t.Fatalf("removing the leader: %v, want a NotLeaderError naming the successor", err)
	}
	nlIdx := -1
	for i, p := range c.peers {
		if p == nl.Leader {
			nlIdx = i
		}
	}
	wait.For(t, "the successor to serve", func() bool { return c.ms[nlIdx].serving() })
	if got := dumpTable(c.ms[nlIdx].table)["held"].token; got != tok {
		t.Fatalf("the successor holds the lock with token %d, want %d", got, tok)
	}
	if _, err := c.ms[nlIdx].n.RemoveMember(ctx10s(t), c.peers[l]); err != nil {
		t.Fatal(err)
	}
	all, _ := c.members(nlIdx)
	if len(all) != 2 || strings.Contains(strings.Join(all, ","), fmt.Sprint(l)) {
		t.Fatalf("configuration after removing %d: %v", l, all)
	}
}

// TestRaftMembershipRefusals: what a change refuses, and where.
func TestRaftMembershipRefusals(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	f := c.ms[(l+1)%3]
	ctx := ctx10s(t)
	var nl *repl.NotLeaderError
	if _, err := f.n.AddMember(ctx, "127.0.0.1:9", time.Second); !errors.As(err, &nl) || nl.Leader != c.peers[l] {
		t.Fatalf("add on a follower: %v, want NotLeaderError naming %s", err, c.peers[l])
	}
	if _, err := f.n.RemoveMember(ctx, "0"); !errors.As(err, &nl) || nl.Leader != c.peers[l] {
		t.Fatalf("remove on a follower: %v, want NotLeaderError naming %s", err, c.peers[l])
	}
	for _, bad := range []string{"", "nohost", ":7070", "127.0.0.1:0", "127.0.0.1:65000", "127.0.0.1:x"} {
		if _, err := lm.n.AddMember(ctx, bad, time.Second); !errors.Is(err, repl.ErrBadMember) {
			t.Fatalf("add %q: %v, want ErrBadMember", bad, err)
		}
	}
	if _, err := lm.n.AddMember(ctx, c.peers[(l+1)%3], time.Second); !errors.Is(err, repl.ErrMemberExists) {
		t.Fatalf("add an existing member's address: %v, want ErrMemberExists", err)
	}
	if _, err := lm.n.RemoveMember(ctx, "nobody"); !errors.Is(err, repl.ErrNoMember) {
		t.Fatalf("remove nobody: %v, want ErrNoMember", err)
	}
	// A member that never starts stays a non-voter: the voters and the
	// lease are unchanged, and removing it undoes the add.
	ghost := repltest.FreeAddrs(t, 1, raftTestOffset)[0]
	if _, err := lm.n.AddMember(ctx, ghost, 300*time.Millisecond); !errors.Is(err, repl.ErrNotCaughtUp) {
		t.Fatalf("add a member that does not run: %v, want ErrNotCaughtUp", err)
	}
	all, voters := c.members(l)
	if len(all) != 4 || len(voters) != 3 {
		t.Fatalf("after a failed add: configuration %v, voters %v", all, voters)
	}
	if lm.n.Gate().Effective(lm.clock()) != repl.Serve {
		t.Fatal("a non-voter that never answers stopped the leader's lease")
	}
	tok := lm.grant(t, "k", 30)
	wait.For(t, "a grant to commit beside a silent non-voter", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
	if _, err := lm.n.RemoveMember(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	if all, _ := c.members(l); len(all) != 3 {
		t.Fatalf("after removing the non-voter: %v", all)
	}
	_ = tok
}

// TestRaftForceNewCluster: two of three members are lost for good; the
// third restarts with ForceNewCluster: alone, it leads with every lock it
// had, with its token; its first token is above every earlier token and
// above the forced floor; fresh members join and get every lock; a later
// start with the flag is refused once the cluster moved on, and the
// members left behind cannot talk to it.
func TestRaftForceNewCluster(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	held := map[string]uint64{}
	var last uint64
	for i := range 40 {
		key := fmt.Sprintf("k%d", i)
		held[key] = lm.grant(t, key, 120)
		last = max(last, held[key])
	}
	c.settle(l)
	s := (l + 1) % 3
	lost := []int{l, (l + 2) % 3}
	for i := range c.ms {
		c.kill(i)
	}
	if c.cfgs == nil {
		c.cfgs = map[int]repl.ClusterConfig{}
	}
	cfg := repl.ClusterConfig{Peers: c.peers, Self: s, Listen: c.peers[s], PeerOffset: raftTestOffset,
		FailoverTimeout: c.T, DataDir: c.dirs[s], TokenBlock: 1 << 20, ForceNewCluster: true}
	c.cfgs[s] = cfg
	before := repl.WallFloor()
	sm := c.start(s)
	wait.For(t, "the recovered member to serve alone", sm.serving)
	got := dumpTable(sm.table)
	for key, tok := range held {
		if got[key].token != tok {
			t.Fatalf("recovered member holds %s with token %d, want %d", key, got[key].token, tok)
		}
	}
	tok := sm.grant(t, "after", 30)
	floor := before + uint64(c.T) + forcedFloorBlocks*cfg.TokenBlock
	if tok <= last || tok < floor {
		t.Fatalf("first token after the recovery %d: want above %d and at least the floor %d", tok, last, floor)
	}
	if _, voters := c.members(s); len(voters) != 1 {
		t.Fatalf("voters after the recovery: %v", voters)
	}
	// Fresh members join and get every lock.
	for range 2 {
		j := c.joiner()
		if _, err := sm.n.AddMember(ctx10s(t), c.addr(j), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.settle(s)
	for i, m := range c.ms {
		if m == nil {
			continue
		}
		if got := dumpTable(m.table); got["after"].token != tok || got["k0"].token != held["k0"] {
			t.Fatalf("member %d after the recovery: after=%d k0=%d", i, got["after"].token, got["k0"].token)
		}
	}
	// A left-behind member's requests are refused: its data dir holds the
	// old configuration and term.
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(fmt.Sprint(lost[0])), Addr: []byte(c.peers[lost[0]])}
	resp := make(chan raft.RPCResponse, 1)
	rpc := raft.RPC{Command: &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 1 << 40}, RespChan: resp}
	if sm.n.mt.admit(rpc) {
		t.Fatal("a request of a member left behind was admitted")
	}
	if r := <-resp; !errors.Is(r.Error, errGoneMember) {
		t.Fatalf("answered %v, want errGoneMember", r.Error)
	}
	// Restarting with the flag still on, now that members were added, is
	// refused (it would drop them).
	c.kill(s)
	n, err := newNode(cfg, logStoreWAL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.Open(tcfg(), repltest.Clock(), testLog())
	var fe *repl.FieldError
	if !errors.As(err, &fe) || fe.Field != "ForceNewCluster" || !strings.Contains(err.Error(), "remove the flag") {
		t.Fatalf("second start with the flag: %v, want a ForceNewCluster field error", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "raft", recoveredFile)); err != nil {
		t.Fatal(err)
	}
	// Without it, it rejoins its new cluster.
	cfg.ForceNewCluster = false
	c.cfgs[s] = cfg
	c.start(s)
	nl := c.leader()
	if _, voters := c.members(nl); len(voters) != 3 {
		t.Fatalf("voters after the restart: %v", voters)
	}
}

// TestRaftForceNewClusterNeedsState: the flag on an empty data dir is a
// field error, and nothing is bootstrapped.
func TestRaftForceNewClusterNeedsState(t *testing.T) {
	peers := repltest.FreeAddrs(t, 3, raftTestOffset)
	dir := t.TempDir()
	n, err := newNode(repl.ClusterConfig{Peers: peers, Self: 0, Listen: peers[0], PeerOffset: raftTestOffset,
		FailoverTimeout: time.Second, DataDir: dir, ForceNewCluster: true}, logStoreWAL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.Open(tcfg(), repltest.Clock(), testLog())
	var fe *repl.FieldError
	if !errors.As(err, &fe) || fe.Field != "ForceNewCluster" {
		t.Fatalf("Open: %v, want a ForceNewCluster field error", err)
	}
}

func tcfg() shard.Config { return shard.Config{Shards: 8} }

// configEntry reads the configuration entry at index in member m's log.
func configEntry(t *testing.T, m *raftMember, index uint64) (raft.Configuration, bool) {
	t.Helper()
	var e raft.Log
	if err := m.n.logs.GetLog(index, &e); err != nil || e.Type != raft.LogConfiguration {
		return raft.Configuration{}, false
	}
	return raft.DecodeConfiguration(e.Data), true
}

// TestRaftConfigurationIndex: Members reports the raft log index of the
// configuration it shows (hashicorp/raft's GetConfiguration leaves it 0):
// the bootstrap's entry, then the entry of each change, on the leader and
// on the followers; after a snapshot compacted the entry away, the
// snapshot's configuration index.
func TestRaftConfigurationIndex(t *testing.T) {
	t.Run("log", func(t *testing.T) {
		c := newRaftCluster(t, 3)
		l := c.leader()
		lm := c.ms[l]
		ms, err := lm.n.Members()
		if err != nil {
			t.Fatal(err)
		}
		if cfg, ok := configEntry(t, lm, ms.Index); ms.Index == 0 || !ok || len(cfg.Servers) != 3 {
			t.Fatalf("configuration index %d: not the index of a 3-member configuration entry", ms.Index)
		}
		before := ms.Index
		dead := (l + 1) % 3
		c.kill(dead)
		// The leader refuses the removal while it has not heard from the
		// third member within half a failover timeout (the two left would
		// not be a live majority): on a loaded machine, right after the
		// cluster formed, it may not have yet. The refusal changes nothing,
		// so the test asks again.
		var ch api.MemberChange
		wait.For(t, "the leader to remove the dead member", func() bool {
			var err error
			ch, err = lm.n.RemoveMember(ctx10s(t), fmt.Sprint(dead))
			if err != nil && !errors.Is(err, repl.ErrQuorumAtRisk) {
				t.Fatal(err)
			}
			return err == nil
		})
		after := ch.Members.Index
		if cfg, ok := configEntry(t, lm, after); after <= before || !ok || len(cfg.Servers) != 2 {
			t.Fatalf("after the removal: index %d (before %d), want the removal's configuration entry", after, before)
		}
		other := (l + 2) % 3
		wait.For(t, "the follower to report the new configuration's index", func() bool {
			ms, err := c.ms[other].n.Members()
			return err == nil && ms.Index == after && len(ms.Members) == 2
		})
	})
	t.Run("snapshot", func(t *testing.T) {
		c := newRaftCluster(t, 3, func(cfg *raft.Config) { cfg.TrailingLogs = 1 })
		l := c.leader()
		lm := c.ms[l]
		ms, err := lm.n.Members()
		if err != nil {
			t.Fatal(err)
		}
		want := ms.Index
		for i := range 20 {
			lm.grant(t, fmt.Sprint("k", i), 120)
		}
		if err := lm.n.r.Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
		if first, _ := lm.n.logs.FirstIndex(); first <= want {
			t.Fatalf("the log still starts at %d, at or before the configuration entry %d: nothing to prove", first, want)
		}
		c.kill(l)
		lm = c.start(l)
		ms, err = lm.n.Members()
		if err != nil {
			t.Fatal(err)
		}
		if ms.Index != want {
			t.Fatalf("configuration index %d after a snapshot and a restart, want %d", ms.Index, want)
		}
	})
}
