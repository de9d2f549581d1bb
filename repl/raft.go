// The raft cluster (PROTOCOL.md §6.4) on github.com/hashicorp/raft v1.7.3.
//
// Log store: raft-wal v0.4.2, chosen by BenchmarkRaftLogStore
// (raft_bench_test.go): 3 members in one process on loopback, fsync on
// every append, G goroutines doing acquire+release pairs on the leader's
// table, each waiting for its change to commit (as the engine holds
// answers); group commit forms the entries. Medians of 3 runs (20,000
// pairs; G=1: 2 runs of 1,500), 2 vCPUs, noisy (±30%):
//
//	G    store  entries/s  records/entry  records/s  pairs/s  commit p50  p99
//	1    wal       880        1.0            880        440    0.93 ms    5.6 ms
//	1    bolt      390        1.0            390        195    2.4 ms     8.0 ms
//	16   wal       550        8.0          4,400      2,200    1.30 ms    9.8 ms
//	16   bolt      283        8.0          2,270      1,135    2.2 ms     10.2 ms
//	128  wal       741       63.8         47,300     23,600    0.94 ms    8.1 ms
//	128  bolt      353       63.7         22,500     11,250    2.0 ms     13.8 ms
//	256  wal       389      127           49,500     24,800    1.9 ms     10.6 ms
//	256  bolt      366      127           46,400     23,200    2.6 ms     7.7 ms
//
// raft-wal commits in about half the time of raft-boltdb/v2 (an append is
// one write and fsync of a segment file; bolt rewrites B+tree pages and
// its meta page), so it carries twice the entries a second until the CPU,
// not the disk, is the limit (G=256: three members and 256 clients on two
// cores). Its README still calls it experimental; the log's format is its
// own (LogStoreBolt remains selectable for comparison).
//
// Pipeline: one entry in flight (raftPipeline). Binaries differing only
// in raftPipeline, driven by go run ./bench -targets lockd-raft in
// alternating rounds (BENCHMARKS.md, "Raft cluster: throughput beside
// etcd", 2026-11-30): 50k/63k pairs/s with 1 in flight, 44k/53k with 2,
// 41k/45k with 4; more in flight cut the entries smaller (163 and 118
// records against 255) and raised the commit p50, since raft's leader
// writes and replicates one batch at a time.
//
// End to end (engine holding answers until commit), the figures of the
// interleaved runs are in BENCHMARKS.md ("Results: every target"):
// 45k-61k pairs/s uncontended at about 250 records/entry, commit p50
// 1.7-2.1 ms; the commit's latency (two fsyncs in turn and a round trip)
// and the clients' window bound the throughput, not the CPU.

package repl

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
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
	"github.com/lockd-dev/lockd/store"
)

// Raft tuning.
const (
	// raftMaxEntry is the raw size at which the proposer cuts a log entry
	// (about 30,000 records): a burst larger than that goes out as several
	// entries in the pipeline.
	raftMaxEntry = 1 << 20
	// raftPipeline is how many entries of records may be in flight
	// (proposed, not yet committed) at once.
	raftPipeline = 1
	// raftLatencies is how many commit latencies Status summarises.
	raftLatencies = 1024
)

// ErrClosed: the raft node closed while a token reservation waited for a
// leader.
var ErrClosed = errors.New("repl: raft node closed")

// LogStoreKind names a raft log store.
type LogStoreKind string

// Raft log stores lockd can use.
const (
	// LogStoreWAL is github.com/hashicorp/raft-wal (the default).
	LogStoreWAL LogStoreKind = "wal"
	// LogStoreBolt is github.com/hashicorp/raft-boltdb/v2.
	LogStoreBolt LogStoreKind = "bolt"
)

// Raft is a member of a raft cluster (PROTOCOL.md §6.4): the leader
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
type Raft struct {
	cfg        ClusterConfig
	store      LogStoreKind
	log        *slog.Logger
	clock      func() int64
	wallAtZero int64 // the wall clock (ns) at table time 0
	tcfg       shard.Config
	table      *shard.Table
	host       Host
	self       string // this member's client address
	dir        *store.Dir
	created    bool

	gate atomic.Pointer[Gate]

	r        *raft.Raft
	trans    *raft.NetworkTransport
	stream   *raftStream
	logs     raft.LogStore
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
	kick      chan struct{} // wakes the proposer
	slots     chan struct{} // pipeline slots
	inflight  chan *proposal

	// FSM side, under fsmMu: held by every apply, snapshot cut and rebuild.
	fsmMu    sync.Mutex
	leading  uint64 // the term whose own entries FSM.Apply skips (0: none)
	applied  uint64 // raft index of the last command applied (or restored)
	fsmState applyState
	reserved atomic.Uint64 // the highest reservation in the applied log

	leadTerm atomic.Uint64 // = leading, for lock-free reads
	actMu    sync.Mutex    // serialises step (actor, Stop)
	actKick  chan struct{}
	stopping atomic.Bool
	closing  atomic.Bool // mutes the transport's log while it closes
	quit     chan struct{}
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool

	failing []atomic.Bool      // leader: heartbeats to member i failing
	tune    func(*raft.Config) // tests: adjusts raft's configuration
	res     reserver
	stats   raftStats
}

// raftStats are the counters Status shows.
type raftStats struct {
	entries, records, elections, rebuilds, snapshots atomic.Uint64
	snapshotBytes                                    atomic.Int64
	latMu                                            sync.Mutex
	lat                                              []time.Duration // ring of commit latencies
	latNext                                          int
}

func (s *raftStats) addLatency(d time.Duration) {
	s.latMu.Lock()
	if len(s.lat) < raftLatencies {
		s.lat = append(s.lat, d)
	} else {
		s.lat[s.latNext] = d
		s.latNext = (s.latNext + 1) % raftLatencies
	}
	s.latMu.Unlock()
}

// percentiles returns the p50 and p99 of the latencies kept, in seconds.
func (s *raftStats) percentiles() (p50, p99 float64) {
	s.latMu.Lock()
	l := slices.Clone(s.lat)
	s.latMu.Unlock()
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	at := func(q float64) float64 { return l[min(int(q*float64(len(l))), len(l)-1)].Seconds() }
	return at(0.50), at(0.99)
}

// sealed is an entry's records cut at raftMaxEntry before the proposer
// took them.
type sealed struct {
	w           records.BatchWriter
	first, last uint64
}

// proposal is an entry in flight.
type proposal struct {
	f        raft.ApplyFuture
	last     uint64 // the number of its last record (0: a reservation)
	records  int
	proposed time.Time
}

// NewRaft returns a raft-mode member using the default log store.
func NewRaft(cfg ClusterConfig) (*Raft, error) { return NewRaftWith(cfg, LogStoreWAL) }

// NewRaftWith returns a raft-mode member whose log lives in the given
// store (benchmarks compare them).
func NewRaftWith(cfg ClusterConfig, logStore LogStoreKind) (*Raft, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logStore != LogStoreWAL && logStore != LogStoreBolt {
		return nil, fmt.Errorf("repl: unknown raft log store %q", logStore)
	}
	n := &Raft{cfg: cfg, store: logStore, self: cfg.Peers[cfg.Self],
		kick: make(chan struct{}, 1), actKick: make(chan struct{}, 1), quit: make(chan struct{}),
		slots: make(chan struct{}, raftPipeline), inflight: make(chan *proposal, raftPipeline+1),
		events: make(chan raft.Observation, 64), failing: make([]atomic.Bool, len(cfg.Peers))}
	n.gate.Store(&Gate{State: Redirect})
	return n, nil
}

// raftConfig maps the failover timeout T onto raft's timeouts: heartbeat
// and election timeouts T/2 (a follower that hears nothing for T/2..T
// starts an election; raft randomises both), a leader that has not heard
// from a majority for T/2 steps down (LeaderLeaseTimeout), heartbeats every
// T/20. So with the default T = 1 s a new leader is elected well within
// 3 s of a leader's death, and a minority leader stops within T.
func (n *Raft) raftConfig() *raft.Config {
	c := raft.DefaultConfig()
	half := n.cfg.FailoverTimeout / 2
	c.LocalID = raft.ServerID(strconv.Itoa(n.cfg.Self))
	c.HeartbeatTimeout = half
	c.ElectionTimeout = half
	c.LeaderLeaseTimeout = half
	c.CommitTimeout = min(max(n.cfg.FailoverTimeout/50, time.Millisecond), 20*time.Millisecond)
	c.SnapshotThreshold = 16384
	c.SnapshotInterval = 30 * time.Second
	c.TrailingLogs = 10240
	c.Logger = newHclog(n.log.With("component", "raft"), hclog.Info)
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
func (n *Raft) Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error) {
	n.log, n.clock = log.With("member", n.cfg.Self), clock
	n.wallAtZero = time.Now().UnixNano() - clock()
	if _, err := os.Stat(n.cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		n.created = true
	}
	dir, err := store.Open(n.cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", n.cfg.DataDir, err)
	}
	n.dir = dir
	fail := func(err error) (*shard.Table, error) {
		n.closeStores()
		dir.Close()
		n.dir = nil
		if n.created {
			os.RemoveAll(n.cfg.DataDir)
		}
		return nil, err
	}
	mark, err := dir.Mark()
	if err != nil {
		return fail(err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	n.tcfg = cfg
	cfg.Sink = n.sink
	// No token before this member leads and has committed a reservation.
	start := max(mark, WallFloor())
	n.table, err = shard.New(cfg, shard.NewTokens(start, start))
	if err != nil {
		return fail(err)
	}
	n.fsmState.table = n.table
	if err := n.openRaft(); err != nil {
		return fail(err)
	}
	n.res.start(n.table.Tokens(), n.cfg.TokenBlock, n.reserve, n.log)
	return n.table, nil
}

// openRaft opens the stores and the transport and starts raft.
func (n *Raft) openRaft() error {
	base := filepath.Join(n.cfg.DataDir, "raft")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	ls, err := n.openLogStore(n.store, base)
	if err != nil {
		return fmt.Errorf("raft log in %s: %w", base, err)
	}
	n.logs, n.stable = ls, ls
	n.snaps, err = raft.NewFileSnapshotStoreWithLogger(base, 2, newHclog(n.log.With("component", "raft-snapshot"), hclog.Info))
	if err != nil {
		return fmt.Errorf("raft snapshots in %s: %w", base, err)
	}
	bind, err := n.cfg.memberListen()
	if err != nil {
		return err
	}
	adv, err := net.ResolveTCPAddr("tcp", n.cfg.memberAddr(n.cfg.Self))
	if err != nil {
		return fmt.Errorf("member address %s: %w", n.cfg.memberAddr(n.cfg.Self), err)
	}
	n.stream, err = newRaftStream(bind, adv)
	if err != nil {
		return fmt.Errorf("member port %s (--listen port + --peer-offset): %w", bind, err)
	}
	netLog := &hclogAdapter{log: n.log.With("component", "raft-net"), min: hclog.Warn, mute: &n.closing}
	n.trans = raft.NewNetworkTransportWithLogger(n.stream, 3, 10*time.Second, netLog)
	n.closers = append(n.closers, n.trans)
	conf := n.raftConfig()
	existing, err := raft.HasExistingState(n.logs, n.stable, n.snaps)
	if err != nil {
		return err
	}
	if !existing {
		var servers []raft.Server
		for i := range n.cfg.Peers {
			servers = append(servers, raft.Server{Suffrage: raft.Voter,
				ID: raft.ServerID(strconv.Itoa(i)), Address: raft.ServerAddress(n.cfg.memberAddr(i))})
		}
		if err := raft.BootstrapCluster(conf, n.logs, n.stable, n.snaps, n.trans,
			raft.Configuration{Servers: servers}); err != nil {
			return fmt.Errorf("bootstrapping the raft cluster: %w", err)
		}
		n.log.Info("raft cluster bootstrapped", "members", n.cfg.Peers)
	}
	cache, err := raft.NewLogCache(1024, n.logs)
	if err != nil {
		return err
	}
	n.r, err = raft.NewRaft(conf, (*raftFSM)(n), cache, n.stable, n.snaps, n.trans)
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	n.observer = raft.NewObserver(n.events, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	})
	n.r.RegisterObserver(n.observer)
	return nil
}

// closeStores closes what openRaft opened (raft itself is shut down
// first by the caller).
func (n *Raft) closeStores() {
	for _, c := range slices.Backward(n.closers) {
		c.Close()
	}
	n.closers = nil
}

// Start starts the node's goroutines: from here on it follows raft's
// leadership and tells the engine.
func (n *Raft) Start(addr string, host Host) error {
	n.host = host
	n.log.Info("raft member", "peers", n.cfg.Peers, "self", n.self, "member_port", n.cfg.memberAddr(n.cfg.Self), "log_store", string(n.store))
	n.wg.Add(3)
	go n.actor()
	go n.proposer()
	go n.committer()
	n.poke()
	return nil
}

// Gate is the current gate.
func (n *Raft) Gate() *Gate { return n.gate.Load() }

// Barrier is the number of the last record the Sink received (Committer).
func (n *Raft) Barrier() uint64 { return n.barrier.Load() }

// publish installs g and tells the engine when it differs.
func (n *Raft) publish(g *Gate) {
	old := n.gate.Swap(g)
	if n.host != nil && (old.State != g.State || old.Addr != g.Addr) {
		n.host.GateChanged()
	}
}

// sink receives every change of the table, under its shard lock.
func (n *Raft) sink(r shard.Record) {
	n.mu.Lock()
	if !n.proposing {
		// Only FSM.Apply may change a table that does not lead, and it
		// emits nothing: this change (a closing connection giving back a
		// grant on a deposed leader) is not in the log. Rebuild.
		n.dirty = true
		n.mu.Unlock()
		n.poke()
		return
	}
	if err := n.buf.Add(&r); err != nil {
		n.mu.Unlock()
		n.log.Error("a change of the table cannot go into the raft log; it will be lost at the next leader change", "err", err, "key_len", len(r.Key))
		return
	}
	n.num++
	n.barrier.Store(n.num)
	// The proposer takes everything buffered when it wakes: wake it for
	// the first record after it took the buffer, and for a sealed entry.
	wake := n.buf.Count() == 1
	if n.buf.Len() >= raftMaxEntry {
		n.full = append(n.full, sealed{w: n.buf, first: n.first, last: n.num})
		n.buf = records.BatchWriter{}
		n.first = n.num + 1
		wake = true
	}
	n.mu.Unlock()
	if wake {
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// poke wakes the actor.
func (n *Raft) poke() {
	select {
	case n.actKick <- struct{}{}:
	default:
	}
}

// proposer cuts the records buffered since the last entry into one entry
// and proposes it, while a pipeline slot is free: the records that arrive
// meanwhile go together into the next.
func (n *Raft) proposer() {
	defer n.wg.Done()
	var spare records.BatchWriter
	for {
		select {
		case <-n.quit:
			return
		case <-n.kick:
		}
		for {
			select {
			case n.slots <- struct{}{}:
			case <-n.quit:
				return
			}
			n.mu.Lock()
			if !n.proposing || (n.buf.Count() == 0 && len(n.full) == 0) {
				n.mu.Unlock()
				<-n.slots
				break
			}
			var first, last uint64
			if len(n.full) > 0 {
				spare, first, last = n.full[0].w, n.full[0].first, n.full[0].last
				n.full = slices.Delete(n.full, 0, 1)
			} else {
				n.buf, spare = spare, n.buf
				first, last = n.first, n.num
				n.first = n.num + 1
			}
			term := n.term
			n.busy.Add(1)
			n.mu.Unlock()
			count := spare.Count()
			raw := spare.Bytes()
			data := appendRecordsEntry(make([]byte, 0, entryHeader+32+len(raw)), n.cfg.Self, term,
				time.Now().UnixNano(), first, last, count, raw)
			spare.Reset()
			p := &proposal{last: last, records: count, proposed: time.Now()}
			p.f = n.r.Apply(data, 0)
			n.inflight <- p
		}
	}
}

// committer waits for the entries in flight, in order: a committed entry
// lets its answers leave (Host.Committed); a failed one means the
// leadership is gone (the actor takes it from there).
func (n *Raft) committer() {
	defer n.wg.Done()
	for {
		var p *proposal
		select {
		case <-n.quit:
			return
		case p = <-n.inflight:
		}
		err := p.f.Error()
		if err == nil {
			n.stats.addLatency(time.Since(p.proposed))
			n.stats.entries.Add(1)
			n.stats.records.Add(uint64(p.records))
			n.committed.Store(p.last)
			if n.host != nil {
				n.host.Committed(p.last)
			}
		} else {
			n.log.Debug("a proposed entry failed", "err", err, "last", p.last)
			n.poke()
		}
		n.busy.Add(-1)
		<-n.slots
		// Records that arrived while every slot was taken wait for a kick.
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// reserve makes tokens up to limit safe: a committed reservation entry.
// On a member that does not lead it waits until one does or the node
// closes (a reserver never extends the allocator of a follower).
func (n *Raft) reserve(limit uint64) error {
	for {
		term := n.leadTerm.Load()
		if term != 0 {
			err := n.applyReserve(term, limit)
			if err == nil && n.leadTerm.Load() == term {
				return nil
			}
			if err != nil && !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost) {
				return err
			}
		}
		select {
		case <-n.quit:
			return ErrClosed
		case <-time.After(n.cfg.FailoverTimeout / 10):
		}
	}
}

// applyReserve commits a reservation of tokens up to limit for term.
func (n *Raft) applyReserve(term, limit uint64) error {
	return n.r.Apply(appendReserveEntry(nil, n.cfg.Self, term, limit), n.cfg.FailoverTimeout).Error()
}

// actor follows raft's leadership: every observation, every kick and a
// tick of a tenth of the failover timeout run step.
func (n *Raft) actor() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.FailoverTimeout/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case o := <-n.events:
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				n.markFailing(string(d.PeerID), true)
			case raft.ResumedHeartbeatObservation:
				n.markFailing(string(d.PeerID), false)
			}
		case <-n.actKick:
		case <-t.C:
		}
		n.step()
	}
}

func (n *Raft) markFailing(id string, v bool) {
	if i, err := strconv.Atoi(id); err == nil && i >= 0 && i < len(n.failing) {
		n.failing[i].Store(v)
	}
}

// leader returns the current leader's member index, or -1.
func (n *Raft) leader() int {
	_, id := n.r.LeaderWithID()
	if id == "" {
		return -1
	}
	i, err := strconv.Atoi(string(id))
	if err != nil || i < 0 || i >= len(n.cfg.Peers) {
		return -1
	}
	return i
}

// step brings the node in line with raft: it gives up a leadership raft
// no longer has, takes up one it has, rebuilds a table changed outside the
// log, and points a follower's gate at the leader.
func (n *Raft) step() {
	n.actMu.Lock()
	defer n.actMu.Unlock()
	n.stepLocked()
}

// stepLocked is step with actMu held.
func (n *Raft) stepLocked() {
	select {
	case <-n.quit:
		return
	default:
	}
	state, term := n.r.State(), n.r.CurrentTerm()
	if lt := n.leadTerm.Load(); lt != 0 && (state != raft.Leader || term != lt) {
		n.lose(lt)
	}
	if state == raft.Leader && n.leadTerm.Load() == 0 {
		if n.stopping.Load() {
			n.publish(&Gate{State: Hold})
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
	if dirty {
		n.rebuild("the table changed outside the log")
	}
	if l := n.leader(); l >= 0 && l != n.cfg.Self {
		n.publish(&Gate{State: Redirect, Addr: n.cfg.Peers[l]})
	} else {
		n.publish(&Gate{State: Redirect})
	}
}

// gain makes this member, raft's leader in term, serve: hold requests,
// apply every entry of earlier terms, then the lease rule, the tokens and
// a committed reservation; then serve. It returns without serving if the
// leadership goes meanwhile (the next step sees it).
func (n *Raft) gain(term uint64) {
	began := time.Now()
	n.publish(&Gate{State: Hold})
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
		n.rebuild("the table changed outside the log")
	}
	if n.r.State() != raft.Leader || n.r.CurrentTerm() != term {
		return
	}
	n.fsmMu.Lock()
	n.leading = term
	n.leadTerm.Store(term)
	n.fsmMu.Unlock()

	// §6.4: every deadline is at least the election time + T.
	moved := n.table.ExtendLeases(n.clock() + int64(n.cfg.FailoverTimeout))
	tokens := n.table.Tokens()
	start := max(tokens.Last(), tokens.Limit(), n.reserved.Load(), WallFloor())
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
	n.publish(&Gate{State: Serve})
}

// lose gives up the leadership of term: stop executing, let the changes
// in flight resolve, abandon those that did not commit, and rebuild the
// table from the log.
func (n *Raft) lose(term uint64) {
	addr := ""
	if l := n.leader(); l >= 0 && l != n.cfg.Self {
		addr = n.cfg.Peers[l]
	}
	n.publish(&Gate{State: Redirect, Addr: addr}) // no batch runs from here on
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
	n.rebuild("leadership lost")
}

// rebuild replaces the table with the committed state: the newest
// snapshot and the log's commands after it, up to the last one applied.
func (n *Raft) rebuild(why string) {
	began := time.Now()
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
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
	st, from, err := replayInto(n.table, n.snaps, n.logs, n.applied, n.wallAtZero)
	if err != nil {
		n.log.Error("rebuilding the table from the raft log failed: it may miss committed locks until a snapshot is installed", "err", err)
	}
	n.reserved.Store(max(n.reserved.Load(), st.reserved))
	n.fsmState.reserved = max(n.fsmState.reserved, st.reserved)
	if st.errs > 0 {
		n.log.Error("rebuilding: records the table refused", "count", st.errs, "last_err", st.lastErr)
	}
	n.stats.rebuilds.Add(1)
	n.log.Info("table rebuilt from the raft log", "why", why, "snapshot_index", from, "applied_index", n.applied,
		"locks", n.table.Stats().Keys, "took", time.Since(began))
}

// Stop hands the leadership over when this member leads (PROTOCOL.md §6.2
// planned handoff): hold requests, wait until every change is committed,
// transfer the leadership to an in-sync follower, then answer M naming it.
// A follower returns the leader's address. "" when no other member took
// over (a single-node shutdown).
func (n *Raft) Stop(ctx context.Context) string {
	n.stopping.Store(true)
	n.actMu.Lock() // a leadership change in progress finishes first
	if n.leadTerm.Load() == 0 {
		n.actMu.Unlock()
		if l := n.leader(); l >= 0 && l != n.cfg.Self {
			return n.cfg.Peers[l]
		}
		return ""
	}
	began := time.Now()
	n.publish(&Gate{State: Hold})
	deadline := time.Now().Add(n.cfg.FailoverTimeout)
	for n.committed.Load() < n.barrier.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	err := n.r.LeadershipTransfer().Error()
	if err != nil {
		if n.leadTerm.Load() != 0 && n.r.State() == raft.Leader {
			n.publish(&Gate{State: Serve})
		}
		n.actMu.Unlock()
		n.log.Warn("leadership transfer failed: shutting down as a single node", "err", err)
		return ""
	}
	// Wait for the new leader to be known, then give the leadership up:
	// the queued acquires' M names it.
	for ctx.Err() == nil && time.Now().Before(deadline.Add(n.cfg.FailoverTimeout)) {
		if l := n.leader(); l >= 0 && l != n.cfg.Self {
			break
		}
		time.Sleep(time.Millisecond)
	}
	n.stepLocked()
	n.actMu.Unlock()
	g := n.Gate()
	if g.State != Redirect || g.Addr == "" {
		return ""
	}
	n.log.Info("handed the leadership over", "successor", g.Addr, "took", time.Since(began))
	return g.Addr
}

// Close shuts raft down and closes the stores (the log and snapshots are
// durable as they are written: nothing more to write).
func (n *Raft) Close(ctx context.Context, why CloseReason) error {
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
	n.res.stop(ctx)
	var err error
	if n.r != nil {
		n.r.DeregisterObserver(n.observer)
		err = runWithin(ctx, func() error { return n.r.Shutdown().Error() })
	}
	done := make(chan struct{})
	go func() { n.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	n.closeStores()
	if n.dir != nil {
		err = errors.Join(err, n.dir.Close())
		n.dir = nil
	}
	if why == FailedStart && n.created {
		os.RemoveAll(n.cfg.DataDir)
	}
	return err
}

// Status reports raft's view: role, leader, term, indexes and the group
// commit figures.
func (n *Raft) Status() Status {
	st := Status{Mode: "raft", Self: n.self}
	if n.r == nil {
		return st
	}
	switch n.r.State() {
	case raft.Leader:
		st.Role = "leader" // before it serves, its gate holds requests
	case raft.Candidate:
		st.Role = "candidate"
	default:
		st.Role = "follower"
	}
	l := n.leader()
	if l >= 0 {
		st.Active = n.cfg.Peers[l]
	}
	st.Epoch = n.r.CurrentTerm()
	st.CommitIndex = n.r.CommitIndex()
	st.AppliedIndex = n.r.AppliedIndex()
	st.Entries = n.stats.entries.Load()
	st.EntryRecords = n.stats.records.Load()
	st.CommitP50, st.CommitP99 = n.stats.percentiles()
	st.SnapshotBytes = uint64(max(n.stats.snapshotBytes.Load(), 0))
	st.Snapshots = n.stats.snapshots.Load()
	st.Elections = n.stats.elections.Load()
	st.Rebuilds = n.stats.rebuilds.Load()
	st.InSync = l >= 0
	lastContact := n.r.LastContact()
	leading := st.Role == "leader"
	for i := range n.cfg.Peers {
		if i == n.cfg.Self {
			continue
		}
		m := Member{Addr: n.cfg.Peers[i]}
		switch {
		case leading:
			m.Role, m.Live = "follower", !n.failing[i].Load()
		case i == l:
			m.Role, m.Live = "leader", time.Since(lastContact) < n.cfg.FailoverTimeout
		}
		st.Members = append(st.Members, m)
	}
	n.res.status(&st)
	return st
}

// Health is nil while this member serves as the leader or follows a known
// leader.
func (n *Raft) Health() error {
	if err := n.res.health(); err != nil {
		return err
	}
	if n.leadTerm.Load() != 0 && n.Gate().State == Serve {
		return nil
	}
	if l := n.leader(); l >= 0 && l != n.cfg.Self {
		return nil
	}
	return errors.New("repl: no raft leader known")
}

// raftFSM is the node seen as raft's state machine.
type raftFSM Raft

// Apply applies a committed entry to the table; the leader skips the
// records of the entries of its own term (it executed them).
func (f *raftFSM) Apply(l *raft.Log) any {
	n := (*Raft)(f)
	var e logEntry
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	n.applied = l.Index
	if err := decodeLogEntry(l.Data, &e, &n.fsmState.buf); err != nil {
		n.log.Error("raft log entry lockd cannot read: skipped", "index", l.Index, "err", err)
		return nil
	}
	own := n.leading != 0 && e.term == n.leading && e.proposer == n.cfg.Self && l.Term == n.leading
	errs := n.fsmState.errs
	n.fsmState.applyEntry(&e, n.wallAtZero, own)
	if e.kind == entryReserve {
		n.reserved.Store(n.fsmState.reserved)
	}
	if n.fsmState.errs != errs {
		n.mu.Lock()
		wasDirty := n.dirty
		n.dirty = n.dirty || n.leading == 0
		n.mu.Unlock()
		if !wasDirty && n.leading == 0 {
			n.log.Error("a committed record did not apply to this table: rebuilding it", "index", l.Index, "err", n.fsmState.lastErr)
			n.poke()
		}
	}
	return nil
}

// Snapshot cuts a snapshot at the last applied command: Persist builds it
// from the previous snapshot and the log (never from the live table, which
// on the leader holds changes not committed yet).
func (f *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	n := (*Raft)(f)
	n.fsmMu.Lock()
	upTo := n.applied
	n.fsmMu.Unlock()
	return &raftSnapshot{n: n, upTo: upTo}, nil
}

// Restore replaces the table with a snapshot (at start, or one the leader
// sent).
func (f *raftFSM) Restore(rc io.ReadCloser) error {
	n := (*Raft)(f)
	defer rc.Close()
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	var fx shard.Out
	n.table.Reset(&fx)
	h, err := readSnapshot(rc, n.table, n.wallAtZero)
	if err != nil {
		return err
	}
	n.applied = h.index
	n.fsmState.reserved = max(n.fsmState.reserved, h.reserved)
	n.reserved.Store(n.fsmState.reserved)
	n.log.Info("snapshot restored", "index", h.index, "locks", n.table.Stats().Keys, "last_token", h.last)
	return nil
}

// raftSnapshot is a snapshot being persisted.
type raftSnapshot struct {
	n    *Raft
	upTo uint64
}

// Persist rebuilds the committed state up to the cut in a scratch table
// and writes it.
func (s *raftSnapshot) Persist(sink raft.SnapshotSink) error {
	n := s.n
	cfg := n.tcfg
	cfg.Sink = nil
	t, err := shard.New(cfg, shard.NewTokens(0, 0))
	if err != nil {
		sink.Cancel()
		return err
	}
	st, _, err := replayInto(t, n.snaps, n.logs, s.upTo, n.wallAtZero)
	if err != nil {
		sink.Cancel()
		return err
	}
	size, err := writeSnapshot(sink, t, st.reserved, s.upTo, n.clock(), n.wallAtZero)
	if err != nil {
		sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return err
	}
	n.stats.snapshots.Add(1)
	n.stats.snapshotBytes.Store(size)
	n.log.Info("raft snapshot written", "index", s.upTo, "locks", t.Stats().Keys, "bytes", size)
	return nil
}

// Release does nothing: the snapshot holds no resource.
func (s *raftSnapshot) Release() {}
