package priority

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/priority/machine"
	"github.com/lockd-dev/lockd/shard"
)

// node drives a member of a priority cluster (PROTOCOL.md §6.3): every
// decision is its machine's (package machine: roles and epochs, what each
// member would lose by stepping down, tokens, the gate, handovers and
// shutdown); the node feeds it what arrives and what it measures, and
// carries out what it asks.
//
// Goroutines: run, the one that drives the machine (its ticker, every
// message the readers decoded, the allocator's requests, Stop); the
// executor, which carries out reservations (disk writes and the standbys'
// acknowledgements) and feeds their results back; the member listener and
// one reader per inbound link; one writer per outbound link (re-dialled
// with back-off); the flusher, which cuts batches. All end by Close.
//
// run publishes the machine's View after every input, before it carries
// out the input's actions: the standby side (standby.go) reads from it
// which active it follows, under applyMu, which a promotion takes (as a
// barrier) before it serves, so no late frame of a former active lands in
// the table of a member that promoted or follows another.
type node struct {
	cfg   repl.ClusterConfig
	log   *slog.Logger
	clock func() int64
	dir   *repl.DataDir
	table *shard.Table
	host  repl.Host
	self  string

	m     *machine.Member // run's alone
	gate  atomic.Pointer[gate]
	view  atomic.Pointer[machine.View]
	inbox chan machine.Msg
	stops chan stopRequest
	// stopped is the answer of the shutdown in progress (run's alone).
	stopped chan int
	// reserves is the executor's queue: run never waits for it.
	reserves queue[machine.Reserve]

	// applyMu is held while anything the followed active sent is applied
	// to the table (follower.apply), and taken by a promotion before it
	// serves: a late frame of a former active never lands in the table of
	// a member that promoted.
	applyMu sync.Mutex
	// resMark is the highest token reservation made durable in the data
	// dir as the active (a snapshot's end carries it).
	resMark atomic.Uint64
	// diskMark is the data dir's reservation mark, as this member's and as
	// its actives' (heartbeats carry it).
	diskMark atomic.Uint64
	markMu   sync.Mutex // writeMark: one write of the mark at a time
	// busySince is, for each member, when this member began to process a
	// frame from it (its clock), 0 while none is in hand: a reader held up
	// by this member's own work (a table reset, an fsync, the engine's
	// barrier) does not make that member look silent.
	busySince []atomic.Int64
	// heardAt is, for each member, when its last frame other than a
	// heartbeat was reported to the machine as heard (receive).
	heardAt []atomic.Int64

	link    *link
	out     *outStream // what this member sends as the active
	standby *standby   // what it applies as a standby
	resID   atomic.Uint64

	quit    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool

	// noWallFloor leaves the wall-clock floor out of a promotion's first
	// token, so tests see the reservation rule alone.
	noWallFloor bool
	// version is the member-link version this member's Hello says and
	// accepts: protocolVersion (tests set an older one to play a member of
	// an older lockd beside this one, before Start).
	version uint16
}

// stopRequest is Stop handed to run.
type stopRequest struct {
	deadline int64 // the caller's deadline on the table's clock, 0: none
	answer   chan int
}

// gate is a repl.Gate with the number the machine gave it.
type gate struct {
	repl.Gate
	seq uint64
}

// New returns a member of a priority cluster configured by cfg.
func New(cfg repl.ClusterConfig) (repl.Node, error) { return newNode(cfg) }

// newNode returns a priority-mode member.
func newNode(cfg repl.ClusterConfig) (*node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &node{cfg: cfg, self: cfg.Peers[cfg.Self], quit: make(chan struct{}), inbox: make(chan machine.Msg, 256),
		stops: make(chan stopRequest), busySince: make([]atomic.Int64, len(cfg.Peers)), heardAt: make([]atomic.Int64, len(cfg.Peers)),
		version: protocolVersion}
	p.reserves.init()
	p.gate.Store(&gate{Gate: repl.Gate{State: repl.Hold}})
	return p, nil
}

func (p *node) timeout() int64 { return int64(p.cfg.FailoverTimeout) }

// probeBase is where a member's heartbeat probes start: the wall clock in
// ns, so every life of a member numbers its probes above its earlier
// lives' (ten probes a second never catch up with the clock). The others
// echo the probe they heard last; a member restarted with probes from 1
// would find its freeze check answered at once by echoes of its earlier
// life (chaos, priority, 10 min, seed 20261201: a restarted active frozen
// for 2–4 s ended its check in the tick that began it and answered from
// its stale state).
func probeBase() uint64 { return uint64(time.Now().UnixNano()) }

// Open takes the data directory and builds the table. Tokens start above
// the reserved mark and the wall clock; a snapshot left by a shutdown as
// the last live member is reloaded (it is kept only if this member ends up
// the active: a standby's table is replaced by the active's snapshot).
func (p *node) Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error) {
	p.log, p.clock = log.With("member", p.cfg.Self), clock
	dir, err := repl.OpenDataDir(p.cfg.DataDir, p.log)
	if err != nil {
		return nil, err
	}
	p.dir = dir
	fail := func(err error) (*shard.Table, error) {
		dir.Release(repl.FailedStart)
		p.dir = nil
		return nil, err
	}
	start, snap, err := dir.Load(true)
	if err != nil {
		return fail(err)
	}
	epoch, err := dir.Epoch()
	if err != nil {
		return fail(err)
	}
	p.out = newOutStream(p.cfg.Peers, p.log, p.activeEpoch, p.resMark.Load)
	cfg.SinkRef = p.out.sink
	cfg.Defer = p.out.deferGrant
	// No token may be handed out before this member is the active and has
	// made a reservation of its own (limit = start).
	p.table, err = shard.New(cfg, shard.NewTokens(start, start))
	if err != nil {
		return fail(err)
	}
	p.resMark.Store(start)
	// The mark as written (a shutdown snapshot's mark is below it: tokens
	// are reserved before they are issued); the wall floor in start is no
	// token anyone issued.
	mark, err := dir.Mark()
	if err != nil {
		return fail(err)
	}
	p.diskMark.Store(mark)
	if snap != nil {
		if _, err := dir.Restore(p.table, snap, clock()); err != nil {
			return fail(err)
		}
		if err := dir.RemoveSnapshot(); err != nil {
			return fail(err)
		}
	}
	p.m = machine.New(machine.Config{Self: p.cfg.Self, Peers: p.cfg.Peers, Timeout: p.timeout(), TokenBlock: p.cfg.TokenBlock,
		StoredEpoch: epoch, Probe: probeBase(), Start: p.table.Tokens().Last(), NoWallFloor: p.noWallFloor, Now: clock()})
	v := p.m.View(clock())
	p.view.Store(&v)
	p.link = newLink(p.cfg, p.hello(), p.log, linkEvents{changed: p.linkChanged, accepted: p.accepted, refused: p.refused}, p.quit, &p.wg)
	p.out.attach(p.table, clock, p.link.peers)
	p.standby = &standby{table: p.table, clock: clock, log: p.log, names: p.cfg.Peers, links: p.link.peers, node: p}
	return p.table, nil
}

// Start listens for members, dials them and starts driving the machine.
// The member starts as a standby that knows no active (its gate answers M
// with no address) and listens for a failover timeout before it may
// promote.
func (p *node) Start(addr string, host repl.Host) error {
	p.host = host
	ln, err := p.cfg.ListenMembers()
	if err != nil {
		return err
	}
	p.log.Info("member link listening", "addr", ln.Addr().String(), "peers", p.cfg.Peers, "self", p.self)
	p.link.start(ln)
	p.wg.Add(3)
	go p.run()
	go p.executor()
	go func() {
		defer p.wg.Done()
		p.out.flusher()
	}()
	return nil
}

// run drives the machine until Close: a tick every tenth of the failover
// timeout (at least 10 ms), every message, the allocator's requests and
// Stop, one at a time.
func (p *node) run() {
	defer p.wg.Done()
	every := max(p.cfg.FailoverTimeout/10, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	p.carry(p.m.Tick(p.clock(), p.measure()))
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
			l := p.measure()
			now := p.clock()
			p.carry(p.m.Tick(now, l))
		case msg := <-p.inbox:
			p.carry(p.m.Step(p.clock(), msg))
		case <-p.table.Tokens().Want():
			p.carry(p.m.Step(p.clock(), machine.Msg{Kind: machine.MsgWantTokens}))
		case r := <-p.stops:
			p.stopped = r.answer
			p.carry(p.m.Step(p.clock(), machine.Msg{Kind: machine.MsgStop, Deadline: r.deadline, Set: p.out.snapshotting()}))
		}
	}
}

// measure is what the machine's tick needs to know of this member.
func (p *node) measure() machine.Local {
	tokens := p.table.Tokens()
	l := machine.Local{TokenLast: tokens.Last(), TokenLimit: tokens.Limit(), Mark: p.diskMark.Load(),
		Pos: p.position(), Snapshotting: p.out.snapshotting()}
	now := p.clock()
	for i := range p.busySince {
		if b := p.busySince[i].Load(); b != 0 && now-b < 10*p.timeout() {
			l.Busy |= 1 << i
		}
	}
	return l
}

// position is the table's position: the sum of its shards' record
// sequences (machine.Heartbeat.Pos).
func (p *node) position() uint64 {
	var pos uint64
	for i := range p.table.Shards() {
		pos += p.table.Seq(i)
	}
	return pos
}

// carry publishes the machine's view, then carries out its actions in
// order (run's goroutine).
func (p *node) carry(acts []machine.Action) {
	v := p.m.View(p.clock())
	p.view.Store(&v)
	for i := range acts {
		p.do(&acts[i])
	}
}

// do carries out one action of the machine.
func (p *node) do(a *machine.Action) {
	tokens := p.table.Tokens()
	switch a.Kind {
	case machine.ActGate:
		p.publish(a.Gate)
	case machine.ActHeartbeat:
		if pe := p.link.peers[a.To]; pe != nil {
			hb := wireHeartbeat(&a.HB)
			if a.HB.Role == machine.RoleActive {
				hb.LagNS = uint64(p.out.lag(a.To))
			}
			pe.setHeartbeat(&hb)
		}
	case machine.ActHandoff:
		// Read after the gate's Hold and the last batch: exact.
		last, limit := tokens.Last(), max(tokens.Limit(), a.Limit)
		if a.Reserve.Block > 0 {
			limit = max(limit, max(tokens.Limit(), last)+a.Reserve.Block)
		}
		p.send(a.To, appendHandoff(nil, a.Epoch, last, limit, &a.Lineage, a.Root))
	case machine.ActHandoffAbort:
		p.send(a.To, appendHandoffAbort(nil, a.Epoch))
	case machine.ActAnswer:
		kind := ackRefused
		if a.Taken {
			kind = ackHandoff
		}
		p.send(a.To, appendAck(nil, kind, a.Epoch))
	case machine.ActFollow:
		p.send(a.To, appendNeedSnapshot(nil, snapStart))
	case machine.ActStream:
		p.out.setActive(a.On)
	case machine.ActFlush:
		p.out.flushNow()
	case machine.ActResync:
		if p.link.peers[a.To] == nil {
			return
		}
		if a.Stale {
			p.out.resyncIfStale(a.To, a.InSync, 2*p.cfg.FailoverTimeout)
		} else {
			p.out.resync(a.To)
		}
	case machine.ActObserve:
		tokens.Observe(a.Token)
	case machine.ActExtend:
		tokens.Extend(a.Limit)
	case machine.ActReserve:
		p.reserves.push(a.Reserve)
	case machine.ActLog:
		p.log.Log(context.Background(), a.Log.Level, a.Log.Msg, a.Log.Args...)
	case machine.ActStopped:
		if p.stopped != nil {
			p.stopped <- a.To
			p.stopped = nil
		}
	}
}

// send queues frame for member i.
func (p *node) send(i int, frame []byte) {
	if i >= 0 && i < len(p.link.peers) && p.link.peers[i] != nil {
		p.link.peers[i].send(frame)
	}
}

// wireHeartbeat is h as the member link carries it.
func wireHeartbeat(h *machine.Heartbeat) heartbeat {
	active := uint8(noActive)
	if h.Active >= 0 {
		active = uint8(h.Active)
	}
	return heartbeat{Epoch: h.Epoch, Role: h.Role, Active: active, InSync: h.InSync, Held: h.Held, Serving: h.Serving,
		Probe: h.Probe, Echo: h.Echo, TokenLast: h.TokenLast, Reserved: h.Reserved, StoredEpoch: h.StoredEpoch,
		LagNS: h.LagNS, Mark: h.Mark, Pos: h.Pos, Verdict: h.Verdict, Lineage: wireLineage(&h.Lineage), Root: h.Root}
}

// Gate is the current gate.
func (p *node) Gate() *repl.Gate { return &p.gate.Load().Gate }

// publish installs the machine's gate g unless a later one is installed,
// and tells the engine when what it applies changes.
func (p *node) publish(mg machine.Gate) {
	g := &gate{seq: mg.Seq, Gate: repl.Gate{Until: mg.Until}}
	switch mg.State {
	case machine.Serve:
		g.State = repl.Serve
	case machine.Hold:
		g.State = repl.Hold
	default:
		g.State = repl.Redirect
		if mg.To >= 0 {
			g.Addr = p.cfg.Peers[mg.To]
		}
	}
	old := p.gate.Load()
	if old.seq > g.seq {
		return
	}
	p.gate.Store(g)
	if p.host == nil {
		return
	}
	now := p.clock()
	if old.Effective(now) != g.Effective(now) || old.Addr != g.Addr || (old.Until != 0 && now > old.Until) {
		p.host.GateChanged()
	}
}

// Stop hands over to the best live in-sync standby when this member is
// the active (PROTOCOL.md §6.2 planned handover) and returns its address;
// a standby tells the others it is leaving and returns the active's
// address (its clients are sent there); the last live member returns ""
// and shuts down as a single node.
func (p *node) Stop(ctx context.Context) string {
	r := stopRequest{answer: make(chan int, 1)}
	if dl, ok := ctx.Deadline(); ok {
		r.deadline = p.clock() + int64(time.Until(dl))
	}
	select {
	case p.stops <- r:
	case <-p.quit:
		return ""
	case <-ctx.Done():
		return ""
	}
	select {
	case to := <-r.answer:
		if to >= 0 && to < len(p.cfg.Peers) {
			return p.cfg.Peers[to]
		}
	case <-p.quit:
	case <-ctx.Done():
	}
	return ""
}

// Close stops the member: its goroutines end; after a shutdown or a crash
// of the engine, a member that was the active writes the snapshot (the
// last live member's locks survive a full restart); a standby's table is
// a copy and is not written.
func (p *node) Close(ctx context.Context, why repl.CloseReason) error {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		return nil
	}
	p.closed = true
	p.closeMu.Unlock()
	close(p.quit)
	if p.link != nil {
		p.link.close()
		p.out.close()
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if p.dir == nil {
		return nil
	}
	v := p.view.Load()
	wasActive := v.Role == machine.RoleActive || v.KeepTable
	if why == repl.FailedStart || why == repl.Discard || !wasActive {
		return p.dir.Release(why)
	}
	err := p.dir.Save(ctx, p.table, p.clock(), why)
	return errors.Join(err, p.dir.Release(why))
}

// Status reports this member and what it knows of the others.
func (p *node) Status() repl.Status {
	v := p.view.Load()
	ps := &repl.PriorityStatus{Epoch: v.Epoch, Failovers: v.Failovers, Handovers: v.Handovers, Demotions: v.Demotions}
	st := repl.Status{Mode: api.ModePriority, Role: v.Role.String(), Self: p.self, InSync: v.InSync, Priority: ps}
	if v.Role == machine.RoleActive && v.Checking {
		st.Role = api.RoleActiveChecking
	}
	if v.Active >= 0 {
		st.Active = p.cfg.Peers[v.Active]
	}
	if p.link != nil {
		st.MemberRefused = p.link.auth.Refusals()
	}
	if p.out != nil {
		out, in := &p.out.stats, &p.standby.stats
		ps.SnapshotsSent, ps.SnapshotsReceived = out.snapshots.Load(), in.snapshots.Load()
		ps.Batches = out.batches.Load() + in.batches.Load()
		ps.Records = out.records.Load() + in.records.Load()
		ps.Cancelled = out.cancelled.Load() + in.cancelled.Load()
		ps.RawBytes = out.rawBytes.Load() + in.rawBytes.Load()
		ps.WireBytes = out.wireBytes.Load() + in.wireBytes.Load()
	}
	if v.Role == machine.RoleStandby {
		ps.LagSeconds = float64(v.LagNS) / 1e9
	}
	for i := range p.cfg.Peers {
		if i == p.cfg.Self {
			continue
		}
		pv := v.Peers[i]
		m := repl.Member{Addr: p.cfg.Peers[i], Live: pv.Live, InSync: pv.InSync}
		if pv.Known {
			m.Role = pv.Role.String()
		}
		if p.out != nil {
			p.out.status(i, &m)
		}
		st.Members = append(st.Members, m)
	}
	if p.table != nil {
		st.TokenReserved = p.table.Tokens().Limit()
	}
	st.ReserveErrors, st.ReserveError = v.ReserveErrors, v.ReserveErr
	return st
}

// Health is nil while this member is the serving active or a standby that
// knows its active, and no refused member link cuts it off; an error
// saying why otherwise.
func (p *node) Health() error {
	if why := p.view.Load().Unready; why != "" {
		return errors.New("priority: " + why)
	}
	return nil
}

// hello is what this member says first on every link.
func (p *node) hello() hello {
	return hello{Version: p.version, Mode: modePriority, Members: uint8(len(p.cfg.Peers)), Self: uint8(p.cfg.Self),
		Offset: uint32(p.cfg.PeerOffset), Shards: uint32(p.table.Shards()), FailoverMS: uint32(p.cfg.FailoverTimeout / time.Millisecond),
		Peers: p.cfg.Peers}
}

// activeEpoch is this member's epoch and whether it is the active (handing
// over included): a snapshot is cut and sent only while it is, at the
// epoch it began at.
func (p *node) activeEpoch() (uint64, bool) {
	v := p.view.Load()
	return v.Epoch, v.Role == machine.RoleActive || v.Role == machine.RoleHandover
}

// tell hands msg to run; false once the member is closing.
func (p *node) tell(msg machine.Msg) bool {
	select {
	case p.inbox <- msg:
		return true
	case <-p.quit:
		return false
	}
}

// linkChanged is the link's news of the outbound connection to member i.
func (p *node) linkChanged(i int, up bool) {
	p.out.linkChanged(i, up)
	if up {
		p.tell(machine.Msg{Kind: machine.MsgLinkUp, From: i})
	}
}

// refused is the link's news that a connection with member i (None: one
// that did not say who it is) was refused for a reason that stays: the
// members disagree on the secret, the certificates or the version.
func (p *node) refused(i int) { p.tell(machine.Msg{Kind: machine.MsgRefused, From: i}) }
