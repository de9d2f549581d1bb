package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// raftHost is the engine as a raft node sees it: it records Committed and
// Abandon and runs an optional check on every Committed.
type raftHost struct {
	changes   atomic.Int64
	mu        sync.Mutex
	commits   []uint64
	abandoned []uint64
	onCommit  func(seq uint64)
	gate      func() *repl.Gate
	gates     []repl.Gate // every gate GateChanged applied
	// batch is the engine's batch barrier: a test that executes on the
	// table as a batch would holds it for reading and checks the gate;
	// GateChanged waits for it.
	batch sync.RWMutex
}

func (h *raftHost) GateChanged() {
	h.batch.Lock()
	//lint:ignore SA2001 an empty critical section: waiting for running batches is the point
	h.batch.Unlock()
	h.changes.Add(1)
	if h.gate != nil {
		g := *h.gate()
		h.mu.Lock()
		h.gates = append(h.gates, g)
		h.mu.Unlock()
	}
}

func (h *raftHost) Committed(seq uint64) {
	h.mu.Lock()
	h.commits = append(h.commits, seq)
	f := h.onCommit
	h.mu.Unlock()
	if f != nil {
		f(seq)
	}
}

func (h *raftHost) Abandon(seq uint64) {
	h.mu.Lock()
	h.abandoned = append(h.abandoned, seq)
	h.mu.Unlock()
}

func (h *raftHost) lastCommit() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.commits) == 0 {
		return 0
	}
	return h.commits[len(h.commits)-1]
}

// raftMember is one in-process raft node with its own table and clock.
type raftMember struct {
	n     *node
	table *shard.Table
	host  *raftHost
	clock func() int64
}

// raftCluster is n in-process members on fixed ports and data dirs, so
// that they can be restarted.
type raftCluster struct {
	t     *testing.T
	peers []string
	dirs  []string
	ms    []*raftMember
	T     time.Duration
	tune  func(*raft.Config)
	// cfgs: the configuration of members that are not the --peers ones
	// (membership_test.go: joiners, a forced recovery).
	cfgs map[int]repl.ClusterConfig
	// member, when set, adjusts member i's configuration at each start.
	member func(i int, cfg *repl.ClusterConfig)
	// vfs, when set, is member i's raft-wal file system (durable_test.go).
	vfs func(i int) types.VFS
	// segSize, when set, is the members' raft-wal segment size: small, so
	// that a compaction deletes segments and a follower behind them gets
	// the snapshot (raft-wal keeps serving entries of segments it still has
	// below its first index).
	segSize int
}

const raftTestOffset = 1000

func newRaftCluster(t *testing.T, size int, tune ...func(*raft.Config)) *raftCluster {
	t.Helper()
	c := &raftCluster{t: t, T: 400 * time.Millisecond}
	if len(tune) > 0 {
		c.tune = tune[0]
	}
	return c.startAll(size)
}

// startAll starts size members on free ports (c's fields set).
func (c *raftCluster) startAll(size int) *raftCluster {
	t := c.t
	t.Helper()
	c.peers = repltest.FreeAddrs(t, size, raftTestOffset)
	for range c.peers {
		c.dirs = append(c.dirs, t.TempDir())
	}
	c.ms = make([]*raftMember, size)
	for i := range size {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.ms {
			c.kill(i)
		}
	})
	return c
}

// start (re)starts member i on its data dir.
func (c *raftCluster) start(i int) *raftMember {
	c.t.Helper()
	cfg, ok := c.cfgs[i]
	if !ok {
		cfg = repl.ClusterConfig{Peers: c.peers, Self: i, Listen: c.peers[i], PeerOffset: raftTestOffset,
			FailoverTimeout: c.T, DataDir: c.dirs[i], TokenBlock: 1 << 20}
	}
	if c.member != nil {
		c.member(i, &cfg)
	}
	n, err := newNode(cfg, logStoreWAL)
	if err != nil {
		c.t.Fatal(err)
	}
	n.tune = c.tune
	if c.vfs != nil {
		n.vfs = c.vfs(i)
	}
	n.segSize = c.segSize
	m := &raftMember{n: n, host: &raftHost{gate: n.Gate}, clock: repltest.Clock()}
	m.table, err = n.Open(shard.Config{Shards: 8}, m.clock, testLog())
	if err != nil {
		c.t.Fatal(err)
	}
	if err := n.Start(cfg.Peers[cfg.Self], m.host); err != nil {
		c.t.Fatal(err)
	}
	c.ms[i] = m
	return m
}

// kill closes member i without a handover, as kill -9 leaves it (the log
// is durable as written).
func (c *raftCluster) kill(i int) {
	if m := c.ms[i]; m != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.n.Close(ctx, repl.Discard); err != nil {
			c.t.Logf("close member %d: %v", i, err)
		}
		c.ms[i] = nil
	}
}

func (m *raftMember) serving() bool { return m != nil && m.n.Gate().State == repl.Serve }

// leader waits until exactly one member serves and returns its index.
func (c *raftCluster) leader() int {
	c.t.Helper()
	l := -1
	wait.For(c.t, "one member to serve as the leader", func() bool {
		l = -1
		for i, m := range c.ms {
			if m.serving() {
				if l >= 0 {
					return false
				}
				l = i
			}
		}
		return l >= 0
	})
	return l
}

// settle waits until every live member's table equals the leader's
// committed table (the leader has no record in flight), holder by holder.
func (c *raftCluster) settle(l int) {
	c.t.Helper()
	lm := c.ms[l]
	wait.For(c.t, "every proposed record to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
	want := repltest.Holders(lm.table)
	for i, m := range c.ms {
		if m == nil || i == l {
			continue
		}
		repltest.WaitHolders(c.t, fmt.Sprintf("member %d", i), m.table, want)
	}
}

// lockState is what members must agree on of a held key: its token and
// the identity its grant was made to (PROTOCOL.md §8.3).
type lockState struct {
	token uint64
	ident string
}

func dumpTable(t *shard.Table) map[string]lockState {
	out := map[string]lockState{}
	for i := range t.Shards() {
		t.Dump(i, func(h *shard.HeldLock) { out[string(h.Key)] = lockState{h.Token, string(h.Ident)} })
	}
	return out
}

// testIdents are the identities grant makes its grants to, by the key's
// length ("": none), so every test's grants replicate with identities.
var testIdents = []string{"orders", "", "billing@example.com"}

// identFor is the identity grant gives key.
func identFor(key string) string { return testIdents[len(key)%len(testIdents)] }

func maps2Equal(a, b map[string]lockState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// grant acquires key on the leader's table, made to identFor(key), and
// returns the token.
func (m *raftMember) grant(t *testing.T, key string, lease uint8) uint64 {
	t.Helper()
	var out shard.Out
	st, tok := m.table.AcquireAs(m.clock(), []byte(key), 0, lease, 0, m.table.Ident([]byte(identFor(key))), nil, &out)
	if st != shard.Granted {
		t.Fatalf("acquire %s on the leader: %v", key, st)
	}
	return tok
}

// entryHasRecord reports whether member m's log holds a records entry of
// proposer p covering record number seq.
func entryHasRecord(m *raftMember, p int, seq uint64) bool {
	last, err := m.n.logs.LastIndex()
	if err != nil {
		return false
	}
	first, _ := m.n.logs.FirstIndex()
	var l raft.Log
	var e logEntry
	var buf []byte
	for i := last; i >= first && i+400 > last; i-- {
		if m.n.logs.GetLog(i, &l) != nil || l.Type != raft.LogCommand {
			continue
		}
		if decodeLogEntry(l.Data, &e, &buf) != nil || e.kind != entryRecords || e.proposer != p {
			continue
		}
		if e.first <= seq && seq <= e.last {
			return true
		}
		if e.last < seq {
			return false
		}
	}
	return false
}

// TestRaftReplicates: three members elect a leader; grants, releases,
// renews, expiries and handoffs made on the leader's table reach every
// follower's table in order; the engine hears Committed for every record
// number, in order, ending at Barrier, and each only once a majority's log
// holds the entry that carries it.
func TestRaftReplicates(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	var early atomic.Int64
	var checked atomic.Int64
	lm.host.mu.Lock()
	lm.host.onCommit = func(seq uint64) {
		have := 0
		for _, m := range c.ms {
			if m != nil && entryHasRecord(m, l, seq) {
				have++
			}
		}
		checked.Add(1)
		if have < 2 {
			early.Add(1)
		}
	}
	lm.host.mu.Unlock()
	var out shard.Out
	tokens := map[string]uint64{}
	for i := range 300 {
		key := fmt.Sprintf("k%d", i)
		tokens[key] = lm.grant(t, key, 30)
	}
	for i := range 100 {
		key := fmt.Sprintf("k%d", i)
		if !lm.table.Release(lm.clock(), []byte(key), tokens[key], &out) {
			t.Fatalf("release %s", key)
		}
	}
	lm.table.Renew(lm.clock(), []byte("k200"), 60, tokens["k200"], &out)
	// A short lease that the leader's ticks expire, and a handoff.
	lm.grant(t, "short", 1)
	if st, _ := lm.table.Acquire(lm.clock(), []byte("k150"), 5, 30, 7, nil, &out); st != shard.Queued {
		t.Fatalf("queue on k150: %v", st)
	}
	lm.table.Release(lm.clock(), []byte("k150"), tokens["k150"], &out)
	if len(out.Effects) != 1 || out.Effects[0].Kind != shard.EffectGrant {
		t.Fatalf("handoff effects: %+v", out.Effects)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lm.table.Lookup([]byte("short")).Held && time.Now().Before(deadline) {
		lm.table.Tick(lm.clock(), &out)
		time.Sleep(10 * time.Millisecond)
	}
	c.settle(l)
	for i, m := range c.ms {
		if info := m.table.Lookup([]byte("k150")); !info.Held || info.Token != out.Effects[0].Token {
			t.Fatalf("member %d: the handoff of k150: %+v, want token %d", i, info, out.Effects[0].Token)
		}
		if m.table.Lookup([]byte("short")).Held {
			t.Fatalf("member %d still holds the expired key", i)
		}
		if i != l {
			left := time.Duration(m.table.Lookup([]byte("k200")).Deadline - m.clock())
			if left < 50*time.Second {
				t.Fatalf("member %d: the renew did not arrive: %v left", i, left)
			}
		}
	}
	lm.host.mu.Lock()
	commits := slices.Clone(lm.host.commits)
	lm.host.mu.Unlock()
	if !slices.IsSorted(commits) || commits[len(commits)-1] != lm.n.Barrier() {
		t.Fatalf("Committed calls not in order or not ending at Barrier %d: %v", lm.n.Barrier(), commits)
	}
	if early.Load() > 0 {
		t.Fatalf("%d of %d Committed calls came before a majority's log held the record", early.Load(), checked.Load())
	}
	st := lm.n.Status()
	if st.Role != "leader" || st.Raft.Entries == 0 || st.Raft.EntryRecords < lm.n.Barrier() || st.Raft.CommitP50 <= 0 {
		t.Fatalf("leader status: %+v", st)
	}
	t.Logf("%d records in %d entries, commit p50 %.2f ms p99 %.2f ms", st.Raft.EntryRecords, st.Raft.Entries, st.Raft.CommitP50*1e3, st.Raft.CommitP99*1e3)
	for i, m := range c.ms {
		if i != l {
			if g := m.n.Gate(); g.State != repl.Redirect || g.Addr != c.peers[l] {
				t.Fatalf("follower %d's gate: %+v, want M naming %s", i, g, c.peers[l])
			}
		}
	}
}

// TestRaftIsolatedLeader: a leader cut off from the others keeps granting
// on its table for a moment, but nothing of it commits: it steps down,
// tells the engine that every record after the last committed one is
// abandoned, and rebuilds its table to the committed state (its
// speculative grants are gone). The others elect a new leader that applies
// the lease rule (no deadline earlier than stored, every one at least its
// election time + T) and hands out tokens above every token in the log,
// the abandoned ones included. Healed, the old leader follows and
// converges.
func TestRaftIsolatedLeader(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	tokens := map[string]uint64{}
	for i := range 50 {
		key := fmt.Sprintf("c%d", i)
		tokens[key] = lm.grant(t, key, 20)
	}
	c.settle(l)
	committed := lm.n.Barrier()
	stored := map[string]int64{} // a follower's deadlines before the election
	f := (l + 1) % 3
	for key := range tokens {
		stored[key] = c.ms[f].table.Lookup([]byte(key)).Deadline
	}

	lm.n.stream.setCut(true)
	var maxTok uint64
	spec := 0
	for i := range 200 {
		// As the engine does: execute only in a batch that saw the gate
		// serve; a gate change waits for the batch.
		lm.host.batch.RLock()
		if lm.n.Gate().State != repl.Serve {
			lm.host.batch.RUnlock()
			break // the leader stepped down
		}
		var out shard.Out
		st, tok := lm.table.Acquire(lm.clock(), []byte(fmt.Sprintf("s%d", i)), 0, 30, 0, nil, &out)
		lm.host.batch.RUnlock()
		if st != shard.Granted {
			t.Fatalf("speculative acquire s%d: %v", i, st)
		}
		spec++
		maxTok = max(maxTok, tok)
	}
	t.Logf("%d speculative grants on the isolated leader", spec)
	wait.For(t, "the isolated leader to step down", func() bool { return lm.n.Gate().State == repl.Redirect && lm.n.leadTerm.Load() == 0 })
	lm.host.mu.Lock()
	abandoned := slices.Clone(lm.host.abandoned)
	lm.host.mu.Unlock()
	if spec > 0 && (len(abandoned) == 0 || abandoned[len(abandoned)-1] != committed) {
		t.Fatalf("%d speculative grants: Abandon calls %v, want one at %d (barrier %d)", spec, abandoned, committed, lm.n.Barrier())
	}
	if lm.host.lastCommit() != committed {
		t.Fatalf("Committed reached %d, beyond the last committed record %d", lm.host.lastCommit(), committed)
	}
	for i := range 200 {
		if lm.table.Lookup([]byte(fmt.Sprintf("s%d", i))).Held {
			t.Fatalf("s%d: a speculative grant survived the rebuild", i)
		}
	}
	for key, tok := range tokens {
		if info := lm.table.Lookup([]byte(key)); !info.Held || info.Token != tok {
			t.Fatalf("%s after the rebuild: %+v, want token %d", key, info, tok)
		}
	}
	// A new leader among the others.
	var nl int
	wait.For(t, "a new leader among the others", func() bool {
		for i, m := range c.ms {
			if i != l && m.serving() {
				nl = i
				return true
			}
		}
		return false
	})
	nm := c.ms[nl]
	elected := nm.clock() // at most a step after it began serving
	for key, tok := range tokens {
		info := nm.table.Lookup([]byte(key))
		if !info.Held || info.Token != tok {
			t.Fatalf("%s on the new leader: %+v, want token %d", key, info, tok)
		}
		if nl == f && info.Deadline < stored[key] {
			t.Fatalf("%s: the new leader's deadline %d is earlier than the stored %d", key, info.Deadline, stored[key])
		}
		if info.Deadline < elected-int64(time.Second)+int64(c.T) {
			t.Fatalf("%s: deadline %v from now, below the election + T", key, time.Duration(info.Deadline-elected))
		}
	}
	tok := nm.grant(t, "after", 30)
	for _, v := range tokens {
		maxTok = max(maxTok, v)
	}
	if tok <= maxTok {
		t.Fatalf("first token of the new leader %d, not above %d (the log's and the abandoned ones)", tok, maxTok)
	}
	tokens["after"] = tok
	lm.n.stream.setCut(false)
	c.settle(nl)
	if got := dumpTable(lm.table); !maps2Equal(got, dumpTable(nm.table)) {
		t.Fatalf("the old leader did not converge: %d keys, want %d", len(got), len(tokens))
	}
}

// TestRaftRestartAll: the leader is killed (Close without Stop) after a
// snapshot and more changes, then the other two; all three restart on
// their data dirs: every committed lock is held with its token (from the
// snapshot and the log after it) and new tokens are larger.
func TestRaftRestartAll(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	var out shard.Out
	tokens := map[string]uint64{}
	for i := range 400 {
		key := fmt.Sprintf("r%d", i)
		tokens[key] = lm.grant(t, key, 60)
	}
	for i := range 100 {
		key := fmt.Sprintf("r%d", i)
		lm.table.Release(lm.clock(), []byte(key), tokens[key], &out)
		delete(tokens, key)
	}
	c.settle(l)
	for _, m := range c.ms {
		if err := m.n.r.Snapshot().Error(); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
	}
	for i := 400; i < 500; i++ {
		key := fmt.Sprintf("r%d", i)
		tokens[key] = lm.grant(t, key, 60)
	}
	lm.table.Release(lm.clock(), []byte("r100"), tokens["r100"], &out)
	delete(tokens, "r100")
	c.settle(l)
	var maxTok uint64
	for _, v := range tokens {
		maxTok = max(maxTok, v)
	}
	c.kill(l)
	for i := range c.ms {
		c.kill(i)
	}
	for i := range c.ms {
		c.start(i)
	}
	nl := c.leader()
	nm := c.ms[nl]
	for key, tok := range tokens {
		if info := nm.table.Lookup([]byte(key)); !info.Held || info.Token != tok || info.Ident != identFor(key) {
			t.Fatalf("%s after the restart: %+v, want token %d, identity %q", key, info, tok, identFor(key))
		}
	}
	if nm.table.Stats().Keys != len(tokens) {
		t.Fatalf("after the restart the leader holds %d keys, want %d", nm.table.Stats().Keys, len(tokens))
	}
	if tok := nm.grant(t, "new", 30); tok <= maxTok {
		t.Fatalf("first token after the restart %d, not above %d", tok, maxTok)
	}
	if st := nm.n.Status(); st.Raft.Snapshots != 0 {
		t.Logf("leader status after restart: %+v", st)
	}
}

// TestRaftStopTransfers: Stop on the leader holds requests, waits for its
// records to commit, transfers the leadership and returns the new
// leader's address; the old leader's gate names it; the new leader serves
// with every lock. The old leader does not rebuild its table on the way
// out: with millions of locks that took seconds, and held the shutdown
// past its deadline (the chaos suite's large state, seed 20261203).
func TestRaftStopTransfers(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	tokens := map[string]uint64{}
	for i := range 100 {
		key := fmt.Sprintf("h%d", i)
		tokens[key] = lm.grant(t, key, 30)
	}
	var rebuilds atomic.Int32
	lm.n.actMu.Lock()
	lm.n.replayHook = func() { rebuilds.Add(1) }
	lm.n.actMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lm.host.mu.Lock()
	before := len(lm.host.gates)
	lm.host.mu.Unlock()
	began := time.Now()
	succ := lm.n.Stop(ctx)
	took := time.Since(began)
	si := slices.Index(c.peers, succ)
	if si < 0 || si == l {
		t.Fatalf("Stop returned %q, want another member's address", succ)
	}
	if g := lm.n.Gate(); g.State != repl.Redirect || g.Addr != succ {
		t.Fatalf("old leader's gate after Stop: %+v", g)
	}
	lm.host.mu.Lock()
	gates := slices.Clone(lm.host.gates[before:])
	lm.host.mu.Unlock()
	for _, g := range gates {
		if g.State == repl.Serve || (g.State == repl.Redirect && g.Addr != succ) {
			t.Fatalf("gates the old leader applied during Stop: %+v (want Hold, then M naming %s)", gates, succ)
		}
	}
	if lm.host.lastCommit() != lm.n.Barrier() {
		t.Fatalf("Stop returned with records not committed: %d of %d", lm.host.lastCommit(), lm.n.Barrier())
	}
	lm.n.actMu.Lock() // the actor's steps after Stop too
	lm.n.stepLocked()
	lm.n.actMu.Unlock()
	if n := rebuilds.Load(); n != 0 {
		t.Fatalf("the old leader rebuilt its table %d times while stopping", n)
	}
	if err := lm.n.Health(); err == nil {
		t.Fatal("Health is fine on a stopped leader whose table was left as it was")
	}
	wait.For(t, "the successor to serve", c.ms[si].serving)
	for key, tok := range tokens {
		if info := c.ms[si].table.Lookup([]byte(key)); !info.Held || info.Token != tok {
			t.Fatalf("%s on the successor: %+v, want token %d", key, info, tok)
		}
	}
	t.Logf("handover took %v", took)
}

// TestRaftFollowerCatchesUpBySnapshot: a follower that was down while the
// leader's log was compacted past what it has receives the leader's
// snapshot (built from the previous snapshot and the log) and the entries
// after it, and ends with the leader's locks. Its own log still holds the
// entries before it went down: raft must empty it (raft-wal takes no
// gap), or every append after the snapshot fails and the leader sends the
// snapshot again, forever. The segments are small, so that the leader's
// compaction deletes some and it has to send the snapshot (raft-wal still
// serves entries below its first index from a segment it keeps).
func TestRaftFollowerCatchesUpBySnapshot(t *testing.T) {
	c := &raftCluster{t: t, T: 400 * time.Millisecond, segSize: 4 << 10,
		tune: func(rc *raft.Config) { rc.TrailingLogs = 4; rc.SnapshotThreshold = 1 << 20 }}
	c.startAll(3)
	l := c.leader()
	f := (l + 1) % 3
	c.settle(l)
	fLast, _ := c.ms[f].n.logs.LastIndex()
	c.kill(f)
	lm := c.ms[l]
	var out shard.Out
	tokens := map[string]uint64{}
	for round := range 20 {
		for i := range 50 {
			key := fmt.Sprintf("p%d", round*50+i)
			tokens[key] = lm.grant(t, key, 60)
		}
		for i := 0; i < 50; i += 5 {
			key := fmt.Sprintf("p%d", round*50+i)
			lm.table.Release(lm.clock(), []byte(key), tokens[key], &out)
			delete(tokens, key)
		}
		wait.For(t, "the round to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
	}
	if err := lm.n.r.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on the leader: %v", err)
	}
	first, _ := lm.n.logs.FirstIndex()
	// More entries after the snapshot, which the follower gets as entries.
	for i := range 30 {
		key := fmt.Sprintf("q%d", i)
		tokens[key] = lm.grant(t, key, 60)
	}
	var lg raft.Log
	if err := lm.n.logs.GetLog(fLast+1, &lg); err == nil {
		fi, _ := lm.n.logs.FirstIndex()
		la, _ := lm.n.logs.LastIndex()
		t.Fatalf("the leader still has entry %d (log %d..%d), the follower's next: it need not send the snapshot", fLast+1, fi, la)
	}
	fm := c.start(f)
	c.settle(l)
	if got := dumpTable(fm.table); !maps2Equal(got, dumpTable(lm.table)) || len(got) != len(tokens) {
		t.Fatalf("the follower holds %d keys, the leader %d, want %d", len(got), lm.table.Stats().Keys, len(tokens))
	}
	if metas, err := fm.n.snaps.List(); err != nil || len(metas) == 0 {
		t.Fatalf("the follower caught up without the snapshot (%v): this test no longer checks it", err)
	}
	if st := lm.n.Status(); st.Raft.Snapshots == 0 || st.Raft.SnapshotBytes == 0 || first <= fLast+1 {
		t.Fatalf("no snapshot written or the log not compacted past the follower's %d: first index %d, %+v", fLast, first, st)
	}
	t.Logf("the follower had up to %d, the leader's log starts at %d; snapshot %d bytes", fLast, first, lm.n.Status().Raft.SnapshotBytes)
}

var testLogOverride *slog.Logger

func testLog() *slog.Logger {
	if testLogOverride != nil {
		return testLogOverride
	}
	if os.Getenv("RAFT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return repltest.Quiet()
}

// TestRaftTakeoverKeepsIdentities: the grants of a leader reach every
// follower with their identities (log entries), and the member elected
// after the leader dies holds every one with its identity: a release from
// another identity is refused there and the owner's works.
func TestRaftTakeoverKeepsIdentities(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	for i := range 200 {
		lm.grant(t, fmt.Sprintf("id%d", i), 60)
	}
	c.settle(l)
	want := dumpTable(lm.table)
	named := 0
	for _, v := range want {
		if v.ident != "" {
			named++
		}
	}
	if named == 0 {
		t.Fatal("no grant has an identity: the test checks nothing")
	}
	c.kill(l)
	nl := c.leader()
	nm := c.ms[nl]
	if got := dumpTable(nm.table); !maps2Equal(got, want) {
		t.Fatalf("the new leader holds %d keys (identities included, equal: false), the old one %d", len(got), len(want))
	}
	var out shard.Out
	key := "id0" // identFor: "orders"
	owner, other := nm.table.Ident([]byte(identFor(key))), nm.table.Ident([]byte("billing@example.com"))
	if r, _ := nm.table.ReleaseAs(nm.clock(), []byte(key), want[key].token, shard.Who{Ident: other}, &out); r != shard.ResultRefused {
		t.Fatalf("another identity's release on the new leader: %v", r)
	}
	if r, _ := nm.table.ReleaseAs(nm.clock(), []byte(key), want[key].token, shard.Who{Ident: owner}, &out); r != shard.ResultOK {
		t.Fatalf("the owner's release on the new leader: %v", r)
	}
}
