package raftnode

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
)

// TestRaftRebuildRacesCompaction: a snapshot that a
// follower was persisting finishes while the follower rebuilds its table
// from the previous snapshot and the log; raft compacts the log past that
// snapshot once the new one is visible. The rebuild must still end with
// the committed state: the new snapshot waits until it is done.
func TestRaftRebuildRacesCompaction(t *testing.T) {
	c := newRaftCluster(t, 3, func(rc *raft.Config) {
		rc.TrailingLogs = 4
		rc.SnapshotThreshold = 1 << 20
		rc.SnapshotInterval = time.Hour
	})
	l := c.leader()
	lm := c.ms[l]
	f := (l + 1) % 3
	fm := c.ms[f]
	rounds := func(prefix string, n int) {
		for i := range n {
			lm.grant(t, fmt.Sprintf("%s%d", prefix, i), 60)
			wait.For(t, "the grant to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
		}
		c.settle(l)
	}
	rounds("a", 10)
	if err := fm.n.r.Snapshot().Error(); err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	metas, err := fm.n.snaps.List()
	if err != nil || len(metas) == 0 {
		t.Fatalf("snapshots: %v %v", metas, err)
	}
	first := metas[0].Index
	rounds("b", 20)

	persisting, resume := make(chan struct{}), make(chan struct{})
	fm.n.persistHook = func() {
		close(persisting)
		<-resume
	}
	snapped := make(chan error, 1)
	go func() { snapped <- fm.n.r.Snapshot().Error() }()
	<-persisting
	// In the rebuild, after the first snapshot was read: let the second
	// become visible, and give raft the time to compact past the first.
	var raced bool
	fm.n.actMu.Lock()
	fm.n.replayHook = func() {
		close(resume)
		select {
		case err := <-snapped:
			snapped <- err
			raced = true
		case <-time.After(time.Second):
		}
	}
	err = fm.n.rebuild("test: racing a snapshot")
	fm.n.replayHook = nil
	fm.n.actMu.Unlock()
	if err != nil {
		t.Fatalf("the rebuild failed (the snapshot finished during it: %v): %v", raced, err)
	}
	if got, want := dumpTable(fm.table), dumpTable(lm.table); !maps2Equal(got, want) {
		t.Fatalf("after the rebuild the follower holds %d keys, the leader %d (the snapshot finished during it: %v)", len(got), len(want), raced)
	}
	if err := <-snapped; err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	if raced {
		t.Fatal("the second snapshot became visible during the rebuild")
	}
	if idx, _ := fm.n.logs.FirstIndex(); idx <= first+1 {
		t.Fatalf("the log starts at %d: not compacted past the first snapshot's %d", idx, first)
	}
	if fm.n.stale.Load() || fm.n.Health() != nil {
		t.Fatalf("after a good rebuild: stale %v, health %v", fm.n.stale.Load(), fm.n.Health())
	}
}

// TestRaftStaleTableDoesNotServe: a rebuild that cannot
// complete (the log after the snapshot is gone) leaves the member stale:
// it reports unhealthy, and when it is elected it does not serve but hands
// the leadership on; another member serves every lock.
func TestRaftStaleTableDoesNotServe(t *testing.T) {
	c := newRaftCluster(t, 3, func(rc *raft.Config) {
		rc.TrailingLogs = 1 << 20
		rc.SnapshotThreshold = 1 << 20
		rc.SnapshotInterval = time.Hour
	})
	l := c.leader()
	lm := c.ms[l]
	f := (l + 1) % 3
	fm := c.ms[f]
	tokens := map[string]uint64{}
	for i := range 10 {
		key := fmt.Sprintf("s%d", i)
		tokens[key] = lm.grant(t, key, 60)
		wait.For(t, "the grant to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
	}
	c.settle(l)
	fm.n.actMu.Lock()
	fm.n.replayHook = func() {
		// Lose the head of the log: no snapshot covers it.
		last, _ := fm.n.logs.LastIndex()
		if err := fm.n.logs.DeleteRange(1, last-2); err != nil {
			t.Errorf("deleting the log's head: %v", err)
		}
	}
	err := fm.n.rebuild("test: a log it cannot read")
	fm.n.replayHook = nil
	fm.n.actMu.Unlock()
	if err == nil || !fm.n.stale.Load() || fm.n.Health() == nil {
		t.Fatalf("rebuild over a lost log: err %v, stale %v, health %v", err, fm.n.stale.Load(), fm.n.Health())
	}
	// Elect the stale member.
	id := raft.ServerID(strconv.Itoa(f))
	if err := lm.n.r.LeadershipTransferToServer(id, raft.ServerAddress(fm.n.cfg.MemberAddr(f))).Error(); err != nil {
		t.Fatalf("leadership transfer to the stale member: %v", err)
	}
	var served bool
	deadline := time.Now().Add(3 * time.Second)
	sawLeader := false
	for time.Now().Before(deadline) {
		if fm.n.Gate().State == repl.Serve {
			served = true
			break
		}
		sawLeader = sawLeader || fm.n.r.State() == raft.Leader
		time.Sleep(2 * time.Millisecond)
	}
	if served {
		t.Fatal("a member whose table could not be rebuilt served")
	}
	if !sawLeader {
		t.Log("the stale member never held raft's leadership in the window (it handed it on at once)")
	}
	nl := -1
	wait.For(t, "another member to serve", func() bool {
		for i, m := range c.ms {
			if i != f && m.serving() {
				nl = i
				return true
			}
		}
		return false
	})
	for key, tok := range tokens {
		if info := c.ms[nl].table.Lookup([]byte(key)); !info.Held || info.Token != tok {
			t.Fatalf("%s on the new leader: %+v, want token %d", key, info, tok)
		}
	}
}

// TestRaftElectedWhileRebuilding: a member that lost the leadership
// rebuilds its table from the log (seconds, for a large table), and raft
// may elect it again meanwhile. Until the rebuild is done it reports
// itself leader (Status), but its gate does not serve and it is not
// healthy (/readyz): only a member that serves may be read as the
// committed state (the chaos large-state phase once read such a table
// and reported committed locks lost). Once rebuilt, it serves every lock.
func TestRaftElectedWhileRebuilding(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	tokens := map[string]uint64{}
	for i := range 10 {
		key := fmt.Sprintf("r%d", i)
		tokens[key] = lm.grant(t, key, 60)
	}
	c.settle(l)

	inRebuild, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	lm.n.actMu.Lock()
	lm.n.replayHook = func() {
		once.Do(func() { close(inRebuild) })
		<-release
	}
	lm.n.actMu.Unlock()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	if err := lm.n.r.LeadershipTransfer().Error(); err != nil {
		t.Fatalf("leadership transfer away from member %d: %v", l, err)
	}
	select {
	case <-inRebuild:
	case <-time.After(10 * time.Second):
		t.Fatal("the deposed leader did not rebuild its table")
	}
	// Elect it again while its table is empty, the log not replayed yet.
	id := raft.ServerID(strconv.Itoa(l))
	addr := raft.ServerAddress(lm.n.cfg.MemberAddr(l))
	wait.For(t, "raft to elect the rebuilding member again", func() bool {
		if lm.n.r.State() == raft.Leader {
			return true
		}
		for i, m := range c.ms {
			if i != l && m.n.r.State() == raft.Leader {
				_ = m.n.r.LeadershipTransferToServer(id, addr).Error()
			}
		}
		return lm.n.r.State() == raft.Leader
	})
	if role := lm.n.Status().Role; role != api.RoleLeader {
		t.Fatalf("the member raft elected reports %q, want %q", role, api.RoleLeader)
	}
	if got := len(dumpTable(lm.table)); got == len(tokens) {
		t.Fatalf("the rebuild in progress holds all %d locks already: the test did not catch it mid-way", got)
	}
	for range 20 {
		if g := lm.n.Gate(); g.State == repl.Serve {
			t.Fatal("a leader whose table is being rebuilt serves")
		}
		if err := lm.n.Health(); err == nil {
			t.Fatal("a leader whose table is being rebuilt reports itself healthy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wait.For(t, "the rebuilt leader to serve", func() bool { return lm.serving() && lm.n.Health() == nil })
	for key, tok := range tokens {
		if info := lm.table.Lookup([]byte(key)); !info.Held || info.Token != tok {
			t.Fatalf("%s on the rebuilt leader: %+v, want token %d", key, info, tok)
		}
	}
}
