package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// node is a member of a raft cluster (PROTOCOL.md §6.4): the leader
// executes requests on its table as a single node does, every change that
// comes out of the table's Sink is numbered (Committer) and proposed, many
// at a time, as one raft log entry (group commit); answers leave once the
// entry that carries their changes is committed (Host.Committed). Every
// member applies the committed entries to its table (the state machine);
// the leader skips the entries of its own term, which it executed already.
// A leader that loses its leadership stops (gate Redirect), tells the
// engine which changes will never commit (Host.Abandon), and rebuilds its
// table from the newest snapshot and the log. A new leader holds requests
// until every entry of earlier terms is applied, extends every lease to
// at least its election time plus the failover timeout, starts its tokens
// above every token and reservation of the log and the wall clock, and
// commits a reservation of its own before it serves.
//
// Goroutines: raft's own; the actor (leadership changes, gates, rebuilds);
// the proposer (cuts and proposes entries); the committer (waits for them
// in order); the token reserver. All end by Close.
type node struct {
	cfg        repl.ClusterConfig
	store      logStoreKind
	log        *slog.Logger
	clock      func() int64
	wallAtZero int64 // the wall clock (ns) at table time 0
	tcfg       shard.Config
	table      *shard.Table
	host       repl.Host
	self       string        // this member's client address
	id         raft.ServerID // this member's raft server ID (membership.go)
	ms         memberState   // the configuration and its changes (membership.go)
	dir        *repl.DataDir

	// The gate, and the lease that keeps a leader's open (lease.go):
	// every gate is published under gateMu; serveTerm is the term whose
	// Serve gate is published (0: the gate does not serve).
	gate      atomic.Pointer[repl.Gate]
	gateMu    sync.Mutex
	serveTerm uint64
	lease     *lease
	leaseStep int64        // a renewal publishes a new gate once it moves the end this far
	reopen    atomic.Int64 // a lapsed lease was renewed (how long it had lapsed): the actor wakes the engine
	termLog   atomic.Int64 // when a term above termLimit was last logged (unix ns)
	termSeen  atomic.Uint64

	r        *raft.Raft
	trans    *raft.NetworkTransport
	mt       *memberTransport
	stream   *raftStream
	logs     raft.LogStore // raft-wal (or bolt) itself; raft writes through the log cache and dur
	dur      *durability   // raft-wal's deferred leader fsyncs (durable.go); nil with bolt
	vfs      types.VFS     // tests: raft-wal's file system (nil: the real one)
	segSize  int           // tests: raft-wal's segment size (0: its default, 64 MiB)
	stable   raft.StableStore
	snaps    *raft.FileSnapshotStore
	closers  []io.Closer
	observer *raft.Observer
	events   chan raft.Observation

	// Sink side, under mu: the records of the current entry and their
	// numbers.
	mu        sync.Mutex
	proposing bool   // this member leads (leadTerm) and its records are proposed
	term      uint64 // the term they are proposed in
	buf       records.BatchWriter
	first     uint64   // number of buf's first record
	full      []sealed // entries cut at raftMaxEntry, waiting for a pipeline slot
	num       uint64   // the last number handed out
	dirty     bool     // the table changed outside the log while not proposing

	barrier   atomic.Uint64 // = num (Committer.Barrier)
	committed atomic.Uint64 // the last number whose entry committed
	busy      atomic.Int64  // entries taken by the proposer and not resolved yet
	// The proposer's linger (lingerLocked): when the last entry committed
	// (unix ns); under mu, the buffer's count it waits for after that
	// commit (lingerTo) and, while it waits, the count that ends the wait
	// early (lingerWant), signalled on lingered.
	lastCommit atomic.Int64
	lingerFor  time.Duration // lingerFor (tests change it before Open)
	lingerTo   int
	lingerWant int
	lingered   chan struct{}
	kick       chan struct{} // wakes the proposer
	slots      chan struct{} // pipeline slots
	inflight   chan *proposal

	// FSM side, under fsmMu: held by every apply, snapshot cut and rebuild.
	// snapMu is held by a rebuild throughout and by Persist while it makes
	// a snapshot visible, after which raft compacts the log: no compaction
	// runs during a rebuild. Order: fsmMu, then snapMu.
	fsmMu    sync.Mutex
	snapMu   sync.Mutex
	leading  uint64 // the term whose own entries FSM.Apply skips (0: none)
	applied  uint64 // raft index of the last command applied (or restored)
	fsmState applyState
	reserved atomic.Uint64 // the highest reservation in the applied log

	leadTerm atomic.Uint64 // = leading, for lock-free reads
	actMu    sync.Mutex    // serialises step (actor, Stop)
	// stale: the last rebuild failed; the table is not the committed state
	// and this member does not serve (it retries, with retryAt and
	// retryWait under actMu).
	stale       atomic.Bool
	staleWhy    atomic.Pointer[string] // the last rebuild's error, for Health
	retryAt     time.Time
	retryWait   time.Duration
	replayHook  func() // tests: runs inside a rebuild between the snapshot and the log
	persistHook func() // tests: runs in Persist before the snapshot becomes visible
	actKick     chan struct{}
	stopping    atomic.Bool
	closing     atomic.Bool // mutes the transport's log while it closes
	rlogs       *raftLogs   // shared by raft's loggers (hclog.go)
	quit        chan struct{}
	// committerDone is closed when the committer returns (nil before Start).
	committerDone chan struct{}
	wg            sync.WaitGroup
	closeMu       sync.Mutex
	closed        bool

	tune  func(*raft.Config) // tests: adjusts raft's configuration
	res   repl.Reserver
	stats raftStats
}

// New returns a member of a raft cluster configured by cfg, its log in
// raft-wal. The node is also a repl.Committer: the engine holds every
// answer until the records it depends on are committed.
func New(cfg repl.ClusterConfig) (repl.Node, error) { return newNode(cfg, logStoreWAL) }

// newNode returns a raft-mode member whose log lives in the given store
// (BenchmarkRaftLogStore compares them).
func newNode(cfg repl.ClusterConfig, logStore logStoreKind) (*node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logStore != logStoreWAL && logStore != logStoreBolt {
		return nil, fmt.Errorf("raftnode: unknown raft log store %q", logStore)
	}
	n := &node{cfg: cfg, store: logStore, self: cfg.Peers[cfg.Self],
		kick: make(chan struct{}, 1), actKick: make(chan struct{}, 1), quit: make(chan struct{}), lingered: make(chan struct{}, 1), lingerFor: lingerFor,
		slots: make(chan struct{}, raftPipeline), inflight: make(chan *proposal, raftPipeline+1),
		events: make(chan raft.Observation, 64)}
	n.gate.Store(&repl.Gate{State: repl.Redirect})
	return n, nil
}

// raftConfig maps the failover timeout T onto raft's timeouts: heartbeat
// and election timeouts T/2 (a follower that hears nothing for T/2..T
// starts an election; raft randomises both), a leader that has not heard
// from a majority for T/2 steps down (LeaderLeaseTimeout), heartbeats every
// T/20. So with the default T = 1 s a new leader is elected well within
// 3 s of a leader's death, and a minority leader stops within T.
func (n *node) raftConfig() *raft.Config {
	c := raft.DefaultConfig()
	half := n.cfg.FailoverTimeout / 2
	c.LocalID = n.id
	c.HeartbeatTimeout = half
	c.ElectionTimeout = half
	c.LeaderLeaseTimeout = half
	c.CommitTimeout = min(max(n.cfg.FailoverTimeout/50, time.Millisecond), 20*time.Millisecond)
	c.SnapshotThreshold = 16384
	c.SnapshotInterval = 30 * time.Second
	c.TrailingLogs = 10240
	c.Logger = newHclog(n.log.With("component", "raft"), hclog.Info, n.rlogs)
	c.NoLegacyTelemetry = true
	if n.tune != nil {
		n.tune(c)
	}
	return c
}

// Open takes the data directory, opens the raft log, stable and snapshot
// stores in it (bootstrapping the cluster from --peers on the first start
// of an empty one), binds the member port and starts raft: the newest
// snapshot is restored into the table now; the log after it is applied as
// a leader commits it.
func (n *node) Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error) {
	// Every line names this member by its --self: "member" is the key of
	// the member a line is about (membership.go), never of the writer.
	n.log, n.clock = log.With("self", n.cfg.Peers[n.cfg.Self]), clock
	n.rlogs = newRaftLogs()
	n.wallAtZero = time.Now().UnixNano() - clock()
	dir, err := repl.OpenDataDir(n.cfg.DataDir, n.log)
	if err != nil {
		return nil, err
	}
	n.dir = dir
	fail := func(err error) (*shard.Table, error) {
		n.closeStores()
		dir.Release(repl.FailedStart)
		n.dir = nil
		return nil, err
	}
	// The raft log and snapshots hold the locks; a shutdown snapshot
	// (from another mode) is not read.
	start, _, err := dir.Load(false)
	if err != nil {
		return fail(err)
	}
	if n.cfg.ForceNewCluster {
		// recover.go: above every reservation the lost members may have
		// committed, durably before raft starts.
		floor := n.forcedFloor()
		if err := dir.Reserve(floor); err != nil {
			return fail(err)
		}
		start = max(start, floor)
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	n.tcfg = cfg
	cfg.Sink = n.sink
	// No token before this member leads and has committed a reservation.
	n.table, err = shard.New(cfg, shard.NewTokens(start, start))
	if err != nil {
		return fail(err)
	}
	n.fsmState.table = n.table
	if err := n.openRaft(); err != nil {
		return fail(err)
	}
	n.res.Start(n.table.Tokens(), n.cfg.TokenBlock, n.reserve, n.log)
	return n.table, nil
}

// openRaft opens the stores and the transport and starts raft.
func (n *node) openRaft() error {
	base := filepath.Join(n.cfg.DataDir, "raft")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	if n.store == logStoreWAL {
		n.dur = newDurability(n.logFailed)
	}
	ls, err := n.openLogStore(n.store, base, n.dur, n.vfs, n.segSize)
	if err != nil {
		return fmt.Errorf("raft log in %s: %w", base, err)
	}
	n.logs, n.stable = ls, ls
	n.snaps, err = raft.NewFileSnapshotStoreWithLogger(base, 2, newHclog(n.log.With("component", "raft-snapshot"), hclog.Info, n.rlogs))
	if err != nil {
		return fmt.Errorf("raft snapshots in %s: %w", base, err)
	}
	adv, err := net.ResolveTCPAddr("tcp", n.cfg.MemberAddr(n.cfg.Self))
	if err != nil {
		return fmt.Errorf("member address %s: %w", n.cfg.MemberAddr(n.cfg.Self), err)
	}
	existing, err := raft.HasExistingState(n.logs, n.stable, n.snaps)
	if err != nil {
		return err
	}
	id, bootstrap, err := n.memberID(base, existing)
	if err != nil {
		return err
	}
	n.id = id
	if err := n.loadGone(base); err != nil {
		return err
	}
	ln, err := n.cfg.ListenMembers()
	if err != nil {
		return err
	}
	conf := n.raftConfig()
	dur := int64(float64(conf.HeartbeatTimeout) * leaseFraction)
	n.lease = newLease(nil, n.id, dur) // the voters come with the configuration (refreshView)
	n.leaseStep = max(dur/8, 1)
	n.stream = newRaftStream(ln, adv, conf.HeartbeatTimeout, newMemberAuth(n.cfg, n.log))
	netLog := &hclogAdapter{log: n.log.With("component", "raft-net"), min: hclog.Warn, mute: &n.closing, shared: n.rlogs}
	n.trans = raft.NewNetworkTransportWithLogger(n.stream, 3, 10*time.Second, netLog)
	n.closers = append(n.closers, n.trans)
	n.mt = newMemberTransport(n, n.trans)
	switch {
	case n.cfg.ForceNewCluster && !existing:
		return &repl.FieldError{Field: "ForceNewCluster", Value: true, Want: "the data directory holds no raft state to recover from"}
	case n.cfg.ForceNewCluster:
		if err := n.forceNewCluster(conf, base, raft.ServerAddress(adv.String())); err != nil {
			return err
		}
		if err := n.loadGone(base); err != nil {
			return err
		}
	case n.cfg.Join && existing:
		n.log.Info("joining: the data directory holds raft state already; the membership comes from its log", "id", n.id)
	case n.cfg.Join:
		n.log.Info("waiting to be added to a raft cluster: run member add with this member's address on the cluster's leader",
			"id", n.id, "member_port", n.cfg.MemberAddr(n.cfg.Self))
	}
	if bootstrap {
		var servers []raft.Server
		for i := range n.cfg.Peers {
			servers = append(servers, raft.Server{Suffrage: raft.Voter,
				ID: raft.ServerID(strconv.Itoa(i)), Address: raft.ServerAddress(n.cfg.MemberAddr(i))})
		}
		if err := raft.BootstrapCluster(conf, n.logs, n.stable, n.snaps, n.mt,
			raft.Configuration{Servers: servers}); err != nil {
			return fmt.Errorf("bootstrapping the raft cluster: %w", err)
		}
		n.log.Info("raft cluster bootstrapped", "members", n.cfg.Peers)
	}
	cache, err := raft.NewLogCache(1024, n.logs)
	if err != nil {
		return err
	}
	var logs raft.LogStore = cache
	if n.dur != nil {
		logs = &parallelLog{LogStore: cache, d: n.dur}
	}
	n.r, err = raft.NewRaft(conf, (*raftFSM)(n), logs, n.stable, n.snaps, n.mt)
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	n.rlogs.config.Store(n.r)
	if n.dur != nil {
		n.dur.raft.Store(n.r)
		n.wg.Add(1)
		go n.dur.syncer(n.quit, n.wg.Done)
	}
	if t := n.r.CurrentTerm(); t > termLimit {
		_ = n.r.Shutdown().Error()
		return fmt.Errorf("raftnode: the raft term stored in %s is %d, above 2^63: the data directory is corrupt (each election adds one)", base, t)
	}
	n.wg.Add(1)
	go n.mt.forward()
	n.observer = raft.NewObserver(n.events, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState, raft.PeerObservation:
			return true
		}
		return false
	})
	n.r.RegisterObserver(n.observer)
	v := n.refreshView()
	if s, ok := v.server(n.id); existing && !ok {
		n.log.Warn("this member is not in the raft configuration its log holds: it was removed (stop it), or it was not added yet",
			"id", n.id, "members", len(v.servers))
	} else if ok && string(s.Address) != n.cfg.MemberAddr(n.cfg.Self) {
		n.log.Warn("the raft configuration knows this member at another address than --self's member port: the others dial that one",
			"id", n.id, "configured", s.Address, "member_port", n.cfg.MemberAddr(n.cfg.Self))
	}
	return nil
}

// closeStores closes what openRaft opened (raft itself is shut down
// first by the caller).
func (n *node) closeStores() {
	for _, c := range slices.Backward(n.closers) {
		c.Close()
	}
	n.closers = nil
}

// Start starts the node's goroutines: from here on it follows raft's
// leadership and tells the engine.
func (n *node) Start(addr string, host repl.Host) error {
	n.host = host
	n.log.Info("raft member", "peers", n.cfg.Peers, "member_port", n.cfg.MemberAddr(n.cfg.Self), "log_store", string(n.store))
	n.wg.Add(3)
	n.committerDone = make(chan struct{})
	go n.actor()
	go n.proposer()
	go n.committer()
	n.poke()
	return nil
}

// Gate is the current gate.
func (n *node) Gate() *repl.Gate { return n.gate.Load() }

// Barrier is the number of the last record the Sink received (Committer).
func (n *node) Barrier() uint64 { return n.barrier.Load() }

// publish installs g, a gate that does not serve, and tells the engine
// when it differs.
func (n *node) publish(g *repl.Gate) {
	n.gateMu.Lock()
	n.serveTerm = 0
	old := n.gate.Swap(g)
	n.gateMu.Unlock()
	n.changed(old, g)
}

// serve opens the gate for the leadership of term, until its lease ends
// (lease.go); renew keeps it open.
func (n *node) serve(term uint64) {
	n.gateMu.Lock()
	n.serveTerm = term
	g := &repl.Gate{State: repl.Serve, Until: n.lease.until(term)}
	old := n.gate.Swap(g)
	n.gateMu.Unlock()
	n.changed(old, g)
}

// changed tells the engine about a new gate when what it applies differs.
func (n *node) changed(old, g *repl.Gate) {
	now := n.clock()
	if n.host != nil && (old.State != g.State || old.Addr != g.Addr || old.Effective(now) != g.Effective(now)) {
		n.host.GateChanged()
	}
}

// renew moves the end of the Serve gate of term to where the lease now
// ends, when that is at least leaseStep later (or the gate had lapsed).
// Called by the transport's and the committer's goroutines: it never
// waits for the engine; a lapsed gate that opens again is left to the
// actor to announce (the engine reads nothing while it is lapsed).
func (n *node) renew(term uint64) {
	n.gateMu.Lock()
	if n.serveTerm != term || term == 0 {
		n.gateMu.Unlock()
		return
	}
	old := n.gate.Load()
	until := n.lease.until(term)
	now := n.clock()
	lapsed := old.Until != 0 && now > old.Until
	if until <= old.Until || (!lapsed && until < old.Until+n.leaseStep) {
		n.gateMu.Unlock()
		return
	}
	n.gate.Store(&repl.Gate{State: repl.Serve, Until: until})
	n.gateMu.Unlock()
	if lapsed && now <= until {
		n.reopen.Store(max(now-old.Until, 1))
		n.poke()
	}
}

// refusedTerm logs (at most every 10 s) that a member sent a term above
// termLimit.
func (n *node) refusedTerm(term uint64) {
	n.termSeen.Store(term)
	now := time.Now().UnixNano()
	last := n.termLog.Load()
	if now-last < int64(10*time.Second) || !n.termLog.CompareAndSwap(last, now) {
		return
	}
	n.log.Error("a member sent a raft term above 2^63: refused (each election adds one, so it is corrupt or forged)", "term", term)
}

// actor follows raft's leadership: every observation, every kick and a
// tick of a tenth of the failover timeout run step.
func (n *node) actor() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.FailoverTimeout/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-n.events:
		case <-n.actKick:
		case <-t.C:
		}
		n.step()
	}
}

// step brings the node in line with raft: it gives up a leadership raft
// no longer has, takes up one it has, rebuilds a table changed outside the
// log, and points a follower's gate at the leader.
func (n *node) step() {
	n.actMu.Lock()
	defer n.actMu.Unlock()
	n.stepLocked()
}

// stepLocked is step with actMu held.
func (n *node) stepLocked() {
	select {
	case <-n.quit:
		return
	default:
	}
	if gap := n.reopen.Swap(0); gap != 0 && n.host != nil {
		n.log.Info("leader lease renewed after a lapse: requests were held meanwhile", "lapsed_for", time.Duration(gap))
		n.host.GateChanged()
	}
	n.refreshView() // the configuration may have moved (membership.go)
	state, term := n.r.State(), n.r.CurrentTerm()
	if lt := n.leadTerm.Load(); lt != 0 && (state != raft.Leader || term != lt) {
		n.lose(lt)
	}
	if state == raft.Leader && n.leadTerm.Load() == 0 {
		if n.stopping.Load() {
			n.publish(&repl.Gate{State: repl.Hold})
			return
		}
		n.gain(term)
		return
	}
	if n.leadTerm.Load() != 0 {
		return
	}
	n.mu.Lock()
	dirty := n.dirty
	n.mu.Unlock()
	if dirty && !time.Now().Before(n.retryAt) && !n.stopping.Load() {
		_ = n.rebuild("the table changed outside the log")
	}
	n.publish(&repl.Gate{State: repl.Redirect, Addr: n.otherLeader()})
}

// gain makes this member, raft's leader in term, serve: hold requests,
// apply every entry of earlier terms, then the lease rule, the tokens and
// a committed reservation; then serve. It returns without serving if the
// leadership goes meanwhile (the next step sees it).
func (n *node) gain(term uint64) {
	began := time.Now()
	n.publish(&repl.Gate{State: repl.Hold})
	if err := n.r.Barrier(n.cfg.FailoverTimeout).Error(); err != nil {
		n.log.Warn("elected, but applying the log failed; not serving", "term", term, "err", err)
		return
	}
	for {
		n.mu.Lock()
		dirty := n.dirty
		n.mu.Unlock()
		if !dirty {
			break
		}
		if err := n.rebuild("the table changed outside the log"); err != nil {
			// A table that is not the committed state must not serve: let
			// another member lead (this one retries the rebuild).
			n.log.Error("elected, but the table is not the committed state; not serving: handing the leadership over", "term", term, "err", err)
			n.r.LeadershipTransfer()
			return
		}
	}
	if n.r.State() != raft.Leader || n.r.CurrentTerm() != term {
		return
	}
	n.refreshView() // the lease counts over the configuration the log now holds
	n.fsmMu.Lock()
	n.leading = term
	n.leadTerm.Store(term)
	n.fsmMu.Unlock()

	// §6.4: every deadline is at least the election time + T.
	moved := n.table.ExtendLeases(n.clock() + int64(n.cfg.FailoverTimeout))
	tokens := n.table.Tokens()
	start := max(tokens.Last(), tokens.Limit(), n.reserved.Load(), repl.WallFloor())
	tokens.Observe(start)
	limit := start + n.cfg.TokenBlock
	err := n.applyReserve(term, limit)
	if err != nil {
		n.log.Warn("elected, but the first token reservation did not commit; not serving", "term", term, "err", err)
		n.lose(term) // the next step tries again if raft still has it lead
		return
	}
	if err := n.dir.Reserve(limit); err != nil {
		n.log.Warn("recording the token reservation in the data directory failed (the raft log has it)", "err", err)
	}
	tokens.Extend(limit)
	n.mu.Lock()
	n.proposing, n.term = true, term
	n.first = n.num + 1
	n.mu.Unlock()
	n.stats.elections.Add(1)
	n.log.Info("leader", "term", term, "token_start", start, "leases_extended", moved,
		"locks", n.table.Stats().Keys, "took", time.Since(began))
	n.serve(term)
}

// lose gives up the leadership of term: stop executing, let the changes
// in flight resolve, abandon those that did not commit, and rebuild the
// table from the log.
func (n *node) lose(term uint64) {
	addr := n.otherLeader()
	n.publish(&repl.Gate{State: repl.Redirect, Addr: addr}) // no batch runs from here on
	n.mu.Lock()
	n.proposing = false
	n.buf.Reset()
	n.full = nil
	last := n.num
	n.first = n.num + 1
	n.mu.Unlock()
	// The entries in flight resolve: raft fails them when it steps down.
	deadline := time.Now().Add(2 * n.cfg.FailoverTimeout)
	for n.busy.Load() > 0 && time.Now().Before(deadline) {
		select {
		case <-n.quit:
			return
		case <-time.After(time.Millisecond):
		}
	}
	committed := n.committed.Load()
	if committed < last && n.host != nil {
		n.host.Abandon(committed)
	}
	n.log.Warn("no longer the leader", "term", term, "leader", addr,
		"records_abandoned", last-committed, "state", n.r.State().String())
	if n.stopping.Load() {
		n.leaveTable()
		return
	}
	_ = n.rebuild("leadership lost")
}

// leaveTable ends the leadership without a rebuild, once the member is
// shutting down (Stop has handed the leadership over): the table goes with
// the process, answers are M from here on, and a rebuild of millions of
// locks (seconds) would only hold the shutdown past its deadline. The
// table stays as it is, marked not the committed state (stale: Health
// says so).
func (n *node) leaveTable() {
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	n.mu.Lock()
	n.dirty = true
	n.mu.Unlock()
	n.stale.Store(true)
	n.leading = 0
	n.leadTerm.Store(0)
	n.log.Info("the table is not rebuilt: shutting down")
}

// rebuild replaces the table with the committed state: the newest
// snapshot and the log's commands after it, up to the last one applied
// (actMu held). It holds snapMu throughout, so raft cannot compact the
// log past the snapshot it replays from (Persist). If it fails anyway (a
// log it cannot read), the table is not the committed state: the member
// is stale (Health says so, gain does not serve) and the next step tries
// again, backing off from a tenth of the failover timeout to 10 s.
func (n *node) rebuild(why string) error {
	began := time.Now()
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	n.mu.Lock()
	n.dirty = false
	n.mu.Unlock()
	// The leadership ends (FSM.Apply stops skipping) only with the
	// rebuild done: leadTerm 0 means the table is the committed state.
	defer func() {
		n.leading = 0
		n.leadTerm.Store(0)
	}()
	var fx shard.Out
	n.table.Reset(&fx)
	st, from, err := replayInto(n.table, n.snaps, n.logs, n.applied, n.wallAtZero, n.replayHook)
	n.reserved.Store(max(n.reserved.Load(), st.reserved))
	n.fsmState.reserved = max(n.fsmState.reserved, st.reserved)
	if err == nil && st.errs > 0 {
		err = fmt.Errorf("%d records the table refused, the last: %w", st.errs, st.lastErr)
	}
	n.stats.rebuilds.Add(1)
	if err != nil {
		n.mu.Lock()
		n.dirty = true
		n.mu.Unlock()
		n.stale.Store(true)
		why := err.Error()
		n.staleWhy.Store(&why)
		n.retryWait = min(max(2*n.retryWait, n.cfg.FailoverTimeout/10), 10*time.Second)
		n.retryAt = time.Now().Add(n.retryWait)
		n.log.Error("rebuilding the table from the raft log failed: this member does not serve until a rebuild succeeds",
			"why", why, "snapshot_index", from, "applied_index", n.applied, "err", err, "retry_in", n.retryWait)
		return err
	}
	n.stale.Store(false)
	n.staleWhy.Store(nil)
	n.retryWait, n.retryAt = 0, time.Time{}
	n.log.Info("table rebuilt from the raft log", "why", why, "snapshot_index", from, "applied_index", n.applied,
		"locks", n.table.Stats().Keys, "took", time.Since(began))
	return nil
}

// Stop hands the leadership over when this member leads (PROTOCOL.md §6.2
// planned handoff): hold requests, wait until every change is committed,
// transfer the leadership to an in-sync follower, then answer M naming it.
// A follower returns the leader's address. "" when no other member took
// over (a single-node shutdown).
func (n *node) Stop(ctx context.Context) string {
	n.stopping.Store(true)
	n.actMu.Lock() // a leadership change in progress finishes first
	if n.leadTerm.Load() == 0 {
		n.actMu.Unlock()
		return n.otherLeader()
	}
	began := time.Now()
	succ, err := n.handOverLocked(ctx) // membership.go
	n.actMu.Unlock()
	if err != nil {
		n.log.Warn("leadership transfer failed: shutting down as a single node", "err", err)
		return ""
	}
	n.log.Info("handed the leadership over", "successor", succ, "took", time.Since(began))
	return succ
}

// logFailed is the raft log's answer to a failed fsync (durable.go): the
// member says so and gives the leadership away; its appends fail from
// now on, so it cannot take it back.
func (n *node) logFailed(err error) {
	n.log.Error("the raft log cannot be made durable: this member applies and answers nothing more from it and gives up the leadership; restart it once its disk is repaired",
		"err", err, "data_dir", n.cfg.DataDir)
	if r := n.dur.raft.Load(); r != nil && r.State() == raft.Leader {
		if err := r.LeadershipTransfer().Error(); err != nil {
			n.log.Warn("handing the leadership over after the raft log failed: it did not succeed; the leadership ends with the lease", "err", err)
		}
	}
	n.dur.mute.Store(true)
}

// Close shuts raft down and closes the stores (the log and snapshots are
// durable as they are written: nothing more to write).
func (n *node) Close(ctx context.Context, why repl.CloseReason) error {
	n.closeMu.Lock()
	if n.closed {
		n.closeMu.Unlock()
		return nil
	}
	n.closed = true
	n.closeMu.Unlock()
	close(n.quit)
	n.closing.Store(true)
	if e := n.stats.entries.Load(); e > 0 {
		p50, p99 := n.stats.percentiles()
		r := n.stats.records.Load()
		n.log.Info("raft totals as leader", "entries", e, "records", r, "records_per_entry", float64(r)/float64(e),
			"commit_p50", time.Duration(p50*1e9), "commit_p99", time.Duration(p99*1e9))
	}
	n.res.Stop(ctx)
	if n.committerDone != nil {
		// The committer ends first, while raft still runs: raft drops the
		// committed entries still queued for its FSM when it shuts down,
		// without answering their futures, and the committer waits on
		// the future of the entry it holds. With quit closed, FSM.Apply
		// answers at once and no new entry is proposed.
		select {
		case <-n.committerDone:
		case <-ctx.Done():
		case <-time.After(2 * n.cfg.FailoverTimeout):
			n.log.Warn("closing: an entry in flight did not resolve; raft shuts down under it")
		}
	}
	var err error
	if n.r != nil {
		n.r.DeregisterObserver(n.observer)
		err = repl.RunWithin(ctx, func() error { return n.r.Shutdown().Error() })
	}
	done := make(chan struct{})
	go func() { n.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	n.closeStores()
	if n.dir != nil {
		err = errors.Join(err, n.dir.Release(why))
		n.dir = nil
	}
	return err
}

// Status reports raft's view: role, leader, term, indexes and the group
// commit figures.
func (n *node) Status() repl.Status {
	st := repl.Status{Mode: api.ModeRaft, Self: n.self, Raft: &repl.RaftStatus{}}
	if n.r == nil {
		return st
	}
	switch n.r.State() {
	case raft.Leader:
		st.Role = api.RoleLeader // before it serves, its gate holds requests
	case raft.Candidate:
		st.Role = api.RoleCandidate
	default:
		st.Role = api.RoleFollower
	}
	lid, laddr := n.leaderOf()
	st.Active = laddr
	rs := &repl.RaftStatus{Term: n.r.CurrentTerm(), CommitIndex: n.r.CommitIndex(), AppliedIndex: n.r.AppliedIndex(),
		Entries: n.stats.entries.Load(), EntryRecords: n.stats.records.Load(),
		SnapshotBytes: uint64(max(n.stats.snapshotBytes.Load(), 0)), Snapshots: n.stats.snapshots.Load(),
		Elections: n.stats.elections.Load(), Rebuilds: n.stats.rebuilds.Load(),
		Configuration: n.configuration(n.ms.view.Load())} // membership.go
	rs.CommitP50, rs.CommitP99 = n.stats.percentiles()
	n.stats.histogram(rs)
	st.Raft = rs
	st.MemberRefused = n.stream.auth.Refusals()
	st.InSync = lid != ""
	leading := st.Role == api.RoleLeader
	for _, c := range rs.Configuration {
		if c.Self {
			continue
		}
		m := repl.Member{Addr: c.Addr, Live: c.Live != nil && *c.Live}
		switch {
		case leading:
			m.Role = api.RoleFollower
		case c.Leader:
			m.Role = api.RoleLeader
		default:
			// A follower hears only from its leader: another member of the
			// configuration follows the same leader as far as this one
			// knows, and only the leader sees whether it is live.
			m.Unobserved = true
			if lid != "" && c.Voter {
				m.Role = api.RoleFollower
			}
		}
		st.Members = append(st.Members, m)
	}
	n.res.Status(&st)
	return st
}

// Health is nil while this member serves as the leader or follows a known
// leader.
func (n *node) Health() error {
	if err := n.res.Health(); err != nil {
		return err
	}
	if n.stale.Load() {
		if why := n.staleWhy.Load(); why != nil {
			return errors.New("raftnode: the table could not be rebuilt from the raft log: " + *why)
		}
		return errors.New("raftnode: the table could not be rebuilt from the raft log")
	}
	if n.dur != nil {
		if err := n.dur.err(); err != nil {
			return err
		}
	}
	if n.leadTerm.Load() != 0 && n.Gate().State == repl.Serve {
		return nil
	}
	if n.otherLeader() != "" {
		return nil
	}
	return errors.New("raftnode: no raft leader known")
}
