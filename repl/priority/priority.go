package priority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// node is a member of a priority cluster (PROTOCOL.md §6.3): the
// highest-priority live member is the active and streams every change of
// its table, compressed, to the standbys; a standby takes over when the
// active has been silent for the failover timeout; SIGTERM hands over to a
// successor with nothing lost; two actives resolve by epoch; a returning
// member of higher priority takes over by a planned handover.
//
// Goroutines: the member listener and one reader per inbound link; one
// writer per outbound link (re-dialled with back-off); the ticker
// (heartbeats, role decisions, gate); the actor (role changes); the
// flusher (cuts batches); the token reserver. All end by Close.
//
// The node is the top of the package: it carries out what the role
// machine (roles.go) decides, and routes what arrives on the member link
// (link.go) to the outbound stream (stream.go), the standby side
// (standby.go) or itself. None of those calls back into it but through
// linkEvents, the follower interface and the stream's epoch function.
type node struct {
	cfg   repl.ClusterConfig
	log   *slog.Logger
	clock func() int64
	dir   *repl.DataDir
	table *shard.Table
	host  repl.Host
	self  string // this member's client address (its --peers entry)

	gate atomic.Pointer[repl.Gate]

	mu    sync.Mutex // guards roles, the peers' link state and the fields below
	roles *roles
	// handover in progress (this member is handing over): the successor's
	// confirmation arrives here.
	handoverDone chan uint64
	reservedSeen uint64 // the highest reservation seen from an active (standby)
	stopping     bool
	// ready: this member, the active, has made its first reservation and
	// may open its gate (a promotion happens in the role machine first).
	ready bool
	// epochLogged: when the role machine's refusal to promote without an
	// epoch left was last logged (0: never).
	epochLogged int64

	link    *link
	out     *outStream // what this member sends as the active
	standby *standby   // what it applies as a standby

	echoMu sync.Mutex
	echoes []uint64 // the highest heartbeat probe received from each member

	res   repl.Reserver
	resID atomic.Uint64

	actions chan action // role changes, carried out in order by the actor goroutine
	quit    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool

	stats clusterStats

	// noWallFloor leaves the wall-clock floor out of a promotion's first
	// token, so tests see the reservation rule alone.
	noWallFloor bool
}

// clusterStats are the counters of role changes /metrics shows (the
// stream's are the flows of out and standby).
type clusterStats struct {
	failovers, handovers, demotions atomic.Uint64
	lagNs                           atomic.Int64 // standby: its lag as its active last measured it
}

// New returns a member of a priority cluster configured by cfg.
func New(cfg repl.ClusterConfig) (repl.Node, error) { return newNode(cfg) }

// newNode returns a priority-mode member.
func newNode(cfg repl.ClusterConfig) (*node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &node{cfg: cfg, self: cfg.Peers[cfg.Self], quit: make(chan struct{}), actions: make(chan action, 64),
		echoes: make([]uint64, len(cfg.Peers))}
	p.gate.Store(&repl.Gate{State: repl.Hold})
	return p, nil
}

func (p *node) timeout() int64 { return int64(p.cfg.FailoverTimeout) }

// Open takes the data directory and builds the table. Tokens start above
// the reserved mark and the wall clock; a snapshot left by a shutdown as
// the last live member is reloaded (it is kept only if this member ends up
// the active: a standby discards it for the active's state).
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
	p.out = newOutStream(p.cfg.Peers, p.log, p.epoch)
	cfg.Sink = p.out.sink
	// No token may be handed out before this member is the active and has
	// made a reservation of its own (limit = start).
	p.table, err = shard.New(cfg, shard.NewTokens(start, start))
	if err != nil {
		return fail(err)
	}
	if snap != nil {
		if _, err := dir.Restore(p.table, snap, clock()); err != nil {
			return fail(err)
		}
		if err := dir.RemoveSnapshot(); err != nil {
			return fail(err)
		}
	}
	p.roles = newRoles(p.cfg.Self, len(p.cfg.Peers), p.timeout(), epoch, clock())
	p.roles.setSelfName(p.cfg.Peers[p.cfg.Self])
	p.link = newLink(p.cfg, p.hello(), p.log, linkEvents{changed: p.out.linkChanged, accepted: p.accepted}, p.quit, &p.wg)
	p.out.attach(p.table, clock, p.link.peers)
	p.standby = &standby{table: p.table, clock: clock, log: p.log, names: p.cfg.Peers, links: p.link.peers, node: p}
	p.res.Start(p.table.Tokens(), p.cfg.TokenBlock, p.reserve, p.log)
	return p.table, nil
}

// Start listens for members, dials them and starts the ticker. The member
// starts as a standby that knows no active (its gate answers M with no
// address) and listens for a failover timeout before it may promote.
func (p *node) Start(addr string, host repl.Host) error {
	p.host = host
	ln, err := p.cfg.ListenMembers()
	if err != nil {
		return err
	}
	p.log.Info("member link listening", "addr", ln.Addr().String(), "peers", p.cfg.Peers, "self", p.self)
	p.publish(&repl.Gate{State: repl.Redirect})
	p.link.start(ln)
	p.wg.Add(3)
	go p.ticker()
	go p.actor()
	go func() {
		defer p.wg.Done()
		p.out.flusher()
	}()
	return nil
}

// Gate is the current gate.
func (p *node) Gate() *repl.Gate { return p.gate.Load() }

// publish installs g and tells the engine when what it applies changes.
func (p *node) publish(g *repl.Gate) {
	old := p.gate.Swap(g)
	if p.host == nil {
		return
	}
	now := p.clock()
	if old.Effective(now) != g.Effective(now) || old.Addr != g.Addr || (old.Until != 0 && now > old.Until) {
		p.host.GateChanged()
	}
}

// gateFor is the gate of the current roles (p.mu held).
func (p *node) gateFor(now int64) *repl.Gate {
	r := p.roles
	switch {
	case r.serving() && p.ready:
		// Until counts from the ticker's last tick, never from now: only
		// the ticker notices a freeze, so nothing else (a heartbeat read
		// first after a SIGCONT) may extend it.
		return &repl.Gate{State: repl.Serve, Until: r.lastTick + p.timeout()/2}
	case r.role == roleActive || r.role == roleHandover:
		return &repl.Gate{State: repl.Hold}
	case r.active >= 0 && r.active != p.cfg.Self:
		return &repl.Gate{State: repl.Redirect, Addr: p.cfg.Peers[r.active]}
	}
	return &repl.Gate{State: repl.Redirect}
}

// ticker runs the role machine every tenth of the failover timeout and
// sends heartbeats.
func (p *node) ticker() {
	defer p.wg.Done()
	every := max(p.cfg.FailoverTimeout/10, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
		now := p.clock()
		p.mu.Lock()
		wasChecking, lastTick := p.roles.checking(), p.roles.lastTick
		c := p.roles.tick(now)
		if p.roles.epochSpent && (p.epochLogged == 0 || now-p.epochLogged >= int64(10*time.Second)) {
			p.epochLogged = now
			p.log.Error("no epoch left above the highest seen (2^64-1: a corrupt data dir or a forged message): this member does not promote or hand over",
				"max_epoch", p.roles.maxEpoch)
		}
		if !wasChecking && p.roles.checking() {
			// Serve again only through resumeServing (the check's end).
			p.ready = false
			p.log.Warn("this member was frozen or stalled: executing nothing until the others answer", "gap", time.Duration(now-lastTick))
		}
		p.mu.Unlock()
		p.act(c, "tick")
		p.mu.Lock()
		hb := p.heartbeat()
		g := p.gateFor(now)
		p.mu.Unlock()
		p.publish(g)
		p.sendHeartbeats(hb)
	}
}

// sendHeartbeats makes hb the next heartbeat to every member, with the
// highest probe this member received from it; an active's heartbeat to a
// standby in its stream carries the lag it measures for that standby (the
// age of the oldest batch not acknowledged), which the standby reports as
// its own.
func (p *node) sendHeartbeats(hb heartbeat) {
	for i, pe := range p.link.peers {
		if pe == nil {
			continue
		}
		hb.Echo = p.echoFor(i)
		if hb.Role == roleActive {
			hb.LagNS = uint64(p.out.lag(i))
		}
		pe.setHeartbeat(&hb)
	}
}

// heartbeat is what this member says now (p.mu held).
func (p *node) heartbeat() heartbeat {
	r := p.roles
	active := uint8(noActive)
	if r.active >= 0 {
		active = uint8(r.active)
	}
	role := r.role
	if p.stopping && role == roleStandby {
		role = roleLeaving
	}
	hb := heartbeat{Epoch: r.epoch, Role: role, Active: active, InSync: r.inSync,
		Probe: r.nextProbe(), TokenLast: p.table.Tokens().Last(), Reserved: max(p.table.Tokens().Limit(), p.reservedSeen),
		StoredEpoch: r.peers[p.cfg.Self].storedEpoch}
	return hb
}

// heardHeartbeat feeds a member's heartbeat to the role machine; the
// active it follows is read through pm (its index in the sender's
// --peers).
func (p *node) heardHeartbeat(from int, hb *heartbeat, pm *peerMap) {
	now := p.clock()
	ps := peerState{epoch: hb.Epoch, role: hb.Role, follows: pm.index(hb.Active), inSync: hb.InSync,
		echo: hb.Echo, storedEpoch: hb.StoredEpoch, token: hb.TokenLast, reserved: hb.Reserved}
	p.mu.Lock()
	if hb.Role == roleActive && p.roles.role == roleStandby && p.roles.active == from {
		p.stats.lagNs.Store(int64(hb.LagNS))
	}
	c := p.roles.heard(now, from, ps)
	if p.roles.role == roleActive && hb.Role == roleActive {
		// Another active (a healed partition, a frozen member): whichever
		// stays, tokens must go on above everything the other issued. Its
		// heartbeat is already a little old: since it, the other may have
		// granted up to its reservation and extended that once more (an
		// extension reserves two blocks past its last token, and a second
		// one needs a block of grants, far more than a heartbeat interval
		// allows). So this member's next token is above all of that; until
		// its reserver has made the jump safe, acquires get B.
		floor := max(hb.TokenLast, hb.Reserved) + 2*p.cfg.TokenBlock
		p.table.Tokens().Observe(floor)
		p.reservedSeen = max(p.reservedSeen, hb.Reserved)
	}
	// A standby that follows this active but is not in the stream (its
	// request for a snapshot was lost), or that has said it is out of sync
	// for a long while, gets a snapshot.
	resync := p.roles.role == roleActive && ps.follows == p.cfg.Self && hb.Role == roleStandby
	g := p.gateFor(now)
	p.mu.Unlock()
	if resync && p.link.peers[from] != nil {
		p.out.resyncIfStale(from, hb.InSync, 2*p.cfg.FailoverTimeout)
	}
	p.act(c, "heartbeat")
	p.publish(g)
}

// action is a role change to carry out.
type action struct {
	c   change
	why string
}

// act hands a change of the role machine to the actor goroutine: the
// readers and the ticker never wait for a handover or a reservation (a
// handover waits for an answer that a reader must deliver).
func (p *node) act(c change, why string) {
	if !c.promote && !c.demote && c.follow < 0 && c.handover < 0 && !c.resume {
		return
	}
	select {
	case p.actions <- action{c, why}:
	case <-p.quit:
	}
}

// actor carries out role changes in order.
func (p *node) actor() {
	defer p.wg.Done()
	for {
		select {
		case <-p.quit:
			return
		case a := <-p.actions:
			p.carryOut(a.c, a.why)
		}
	}
}

// carryOut does what a change of the role machine asks.
func (p *node) carryOut(c change, why string) {
	switch {
	case c.resume:
		p.resumeServing()
	case c.promote:
		p.stats.failovers.Add(1)
		p.becomeActive(0, why)
	case c.demote:
		p.stats.demotions.Add(1)
		p.mu.Lock()
		a := p.roles.active
		p.mu.Unlock()
		p.log.Warn("stepping down: another member became active later; discarding this state and following it",
			"active", p.cfg.Peers[a], "why", why)
		p.follow(a)
	case c.follow >= 0:
		p.log.Info("following the active", "active", p.cfg.Peers[c.follow])
		p.follow(c.follow)
	case c.handover >= 0:
		p.log.Info("handing over to a member of higher priority", "successor", p.cfg.Peers[c.handover])
		p.handover(context.Background(), c.handover, false)
	}
}

// becomeActive makes this member serve: tokens start above every token and
// reservation it has seen and, for a failover (epoch 0: the role machine
// chose it), above the wall clock plus the failover timeout, so they exceed
// whatever the old active issued even if replication lost it (clocks
// agreeing within the timeout); then a reservation of its own, made
// durable and replicated, before the gate opens.
func (p *node) becomeActive(handoffToken uint64, why string) {
	p.mu.Lock()
	r := p.roles
	epoch := r.epoch
	tokens := p.table.Tokens()
	start := max(tokens.Last(), tokens.Limit(), p.reservedSeen, handoffToken)
	if handoffToken == 0 && !p.noWallFloor {
		start = max(start, repl.WallFloor()+uint64(p.timeout()))
	}
	for i := range r.peers {
		start = max(start, r.peers[i].token, r.peers[i].reserved)
	}
	p.mu.Unlock()
	if err := p.dir.SetEpoch(epoch); err != nil {
		p.log.Error("recording the epoch failed", "err", err)
	}
	tokens.Observe(start)
	p.reserveUpTo(start+p.cfg.TokenBlock, "first reservation as active")
	p.out.setActive(true)
	p.log.Info("active", "epoch", epoch, "why", why, "token_start", start)
	p.mu.Lock()
	p.ready = p.roles.role == roleActive
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g)
}

// resumeServing is an active's return to service after its freeze check:
// before its gate opens, its tokens jump above the wall clock plus the
// failover timeout, as a promotion's do, and the jump is reserved. A
// member it did not hear from after resuming — one it did not know as
// live before the freeze, or one that stayed silent for the whole check —
// may have been promoted meanwhile; its tokens are below that floor
// (clocks agreeing within the timeout; docs/DESIGN.md "Tokens across a
// failover").
func (p *node) resumeServing() {
	tokens := p.table.Tokens()
	if !p.noWallFloor {
		tokens.Observe(repl.WallFloor() + uint64(p.timeout()))
	}
	p.reserveUpTo(max(tokens.Limit(), tokens.Last())+p.cfg.TokenBlock, "reservation after the freeze check")
	p.mu.Lock()
	p.ready = p.roles.serving()
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.log.Info("serving again after the freeze check", "next_token", tokens.Last()+1)
	p.publish(g)
}

// reserveUpTo reserves tokens up to limit (the standbys acknowledge it
// first) and lets the allocator hand them out; when that fails, acquires
// that need a token get B until the reserver's retries succeed.
func (p *node) reserveUpTo(limit uint64, what string) {
	if err := p.reserve(limit); err != nil {
		p.log.Error(what+" failed: acquires get B until it succeeds", "err", err)
		return
	}
	p.table.Tokens().Extend(limit)
}

// follow discards this member's state and follows active a: the gate
// answers M naming it, and the active sends a snapshot.
func (p *node) follow(a int) {
	p.out.setActive(false)
	p.mu.Lock()
	p.ready = false
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g) // moves queued acquires to the active (M)
	var fx shard.Out
	p.table.Reset(&fx)
	if pe := p.link.peers[a]; pe != nil {
		pe.send(appendNeedSnapshot(nil, snapStart))
	}
}

// reserve makes tokens up to limit safe: durable in this member's data
// dir, then, on an active, acknowledged by every live in-sync standby
// (PROTOCOL.md §6.2: a promoted standby starts above every reservation it
// acknowledged). A standby that does not acknowledge within the failover
// timeout is sent a new snapshot: until then it is not in sync.
func (p *node) reserve(limit uint64) error {
	if err := p.dir.Reserve(limit); err != nil {
		return err
	}
	p.mu.Lock()
	active := p.roles.role == roleActive || p.roles.role == roleHandover
	p.mu.Unlock()
	if !active {
		return nil
	}
	id := p.resID.Add(1)
	var waits []int
	for i, pe := range p.link.peers {
		if pe != nil && p.out.streaming(i) {
			pe.send(appendReserve(nil, id, limit))
			waits = append(waits, i)
		}
	}
	deadline := time.Now().Add(p.cfg.FailoverTimeout)
	for _, i := range waits {
		if !p.out.waitReserveAck(i, id, deadline) {
			p.log.Warn("a standby did not acknowledge a token reservation: resyncing it", "member", p.cfg.Peers[i])
			p.out.resync(i)
		}
	}
	return nil
}

// Stop hands over to the best live in-sync standby when this member is
// the active (PROTOCOL.md §6.2 planned handover) and returns its address;
// a standby tells the others it is leaving and returns the active's
// address (its clients are sent there); the last live member returns ""
// and shuts down as a single node.
func (p *node) Stop(ctx context.Context) string {
	p.mu.Lock()
	p.stopping = true
	r := p.roles
	now := p.clock()
	role, active := r.role, r.active
	succ := -1
	if role == roleActive {
		succ = r.successor(now)
	}
	p.mu.Unlock()
	switch {
	case role == roleActive && succ >= 0:
		if p.handover(ctx, succ, true) {
			return p.cfg.Peers[succ]
		}
		return ""
	case role == roleActive:
		p.log.Info("no live in-sync standby: shutting down as a single node")
		return ""
	}
	// A standby: say so at once, so the active need not wait for silence.
	p.mu.Lock()
	hb := p.heartbeat()
	p.mu.Unlock()
	p.sendHeartbeats(hb)
	if active >= 0 && active != p.cfg.Self {
		return p.cfg.Peers[active]
	}
	return ""
}

// handover runs a planned handover to member s: stop executing, send
// everything, have s take over, then answer M naming it. It reports
// whether s confirmed; if not, this member serves again.
func (p *node) handover(ctx context.Context, s int, shutdown bool) bool {
	began := time.Now()
	p.mu.Lock()
	if p.roles.role != roleActive {
		p.mu.Unlock()
		return false
	}
	epoch, ok := p.roles.startHandover(s)
	if !ok {
		p.mu.Unlock()
		return false
	}
	done := make(chan uint64, 1)
	p.handoverDone = done
	p.mu.Unlock()
	p.publish(&repl.Gate{State: repl.Hold}) // waits for running batches; nothing executes from here
	pe := p.link.peers[s]
	p.out.flushNow()
	tokens := p.table.Tokens()
	pe.send(appendHandoff(nil, epoch, tokens.Last(), max(tokens.Limit(), p.reservedSeen)))
	wait := p.cfg.FailoverTimeout
	var confirmed bool
	select {
	case e := <-done:
		confirmed = e == epoch
	case <-time.After(wait):
	case <-ctx.Done():
	}
	p.mu.Lock()
	p.handoverDone = nil
	if !confirmed {
		p.roles.abortHandover()
		g := p.gateFor(p.clock())
		p.mu.Unlock()
		p.log.Warn("handover not confirmed: serving again", "successor", p.cfg.Peers[s], "waited", time.Since(began))
		p.publish(g)
		return false
	}
	p.roles.handedOver(s, epoch)
	p.ready = false
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.stats.handovers.Add(1)
	p.out.setActive(false)
	p.publish(g) // M naming the successor, queued acquires included
	p.log.Info("handed over", "successor", p.cfg.Peers[s], "epoch", epoch, "took", time.Since(began), "shutdown", shutdown)
	if !shutdown {
		var fx shard.Out
		p.table.Reset(&fx)
		pe.send(appendNeedSnapshot(nil, snapStart))
	}
	return true
}

// takeOver is a standby's side of a planned handover: everything the old
// active sent before the Handoff has been applied (one ordered link), so
// this member promotes at the epoch it was given and confirms.
func (p *node) takeOver(from int, h *handoff) {
	p.mu.Lock()
	if p.roles.active != from || !p.roles.inSync {
		p.mu.Unlock()
		p.log.Warn("handover refused: not in sync with that active", "from", p.cfg.Peers[from])
		return
	}
	p.roles.promoteAt(h.Epoch)
	p.reservedSeen = max(p.reservedSeen, h.Reserved)
	p.mu.Unlock()
	p.stats.handovers.Add(1)
	p.becomeActive(max(h.TokenLast, h.Reserved), "planned handover")
	p.link.peers[from].send(appendAck(nil, ackHandoff, h.Epoch))
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
	p.res.Stop(ctx)
	if p.dir == nil {
		return nil
	}
	p.mu.Lock()
	wasActive := p.roles.role == roleActive
	p.mu.Unlock()
	if why == repl.FailedStart || why == repl.Discard || !wasActive {
		return p.dir.Release(why)
	}
	err := p.dir.Save(ctx, p.table, p.clock(), why)
	return errors.Join(err, p.dir.Release(why))
}

// Status reports this member and what it knows of the others.
func (p *node) Status() repl.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.roles
	now := p.clock()
	role := r.role
	if r.checking() && role == roleActive {
		role = roleHandover
	}
	st := repl.Status{Mode: api.ModePriority, Role: role.String(), Self: p.self, Epoch: r.epoch, InSync: r.inSync}
	if r.role == roleActive && r.checking() {
		st.Role = api.RoleActiveChecking
	}
	if r.active >= 0 {
		st.Active = p.cfg.Peers[r.active]
	}
	st.Failovers = p.stats.failovers.Load()
	st.Handovers = p.stats.handovers.Load()
	st.Demotions = p.stats.demotions.Load()
	out, in := &p.out.stats, &p.standby.stats
	st.SnapshotsSent, st.SnapshotsReceived = out.snapshots.Load(), in.snapshots.Load()
	st.Batches = out.batches.Load() + in.batches.Load()
	st.Records = out.records.Load() + in.records.Load()
	st.Cancelled = out.cancelled.Load() + in.cancelled.Load()
	st.RawBytes = out.rawBytes.Load() + in.rawBytes.Load()
	st.WireBytes = out.wireBytes.Load() + in.wireBytes.Load()
	if r.role == roleStandby {
		st.LagSeconds = float64(p.stats.lagNs.Load()) / 1e9
	}
	for i := range p.cfg.Peers {
		if i == p.cfg.Self {
			continue
		}
		ps := &r.peers[i]
		m := repl.Member{Addr: p.cfg.Peers[i], Live: r.live(i, now), InSync: ps.inSync}
		if ps.known {
			m.Role = ps.role.String()
		}
		p.out.status(i, &m)
		st.Members = append(st.Members, m)
	}
	p.res.Status(&st)
	return st
}

// Health is nil while this member is the serving active or a standby that
// knows its active; an error otherwise.
func (p *node) Health() error {
	if err := p.res.Health(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.roles.serving() && p.ready:
		return nil
	case p.roles.role == roleStandby && p.roles.active >= 0:
		return nil
	}
	return errors.New("priority: no active known")
}

// hello is what this member says first on every link.
func (p *node) hello() hello {
	return hello{Version: protocolVersion, Mode: modePriority, Members: uint8(len(p.cfg.Peers)), Self: uint8(p.cfg.Self),
		Offset: uint32(p.cfg.PeerOffset), Shards: uint32(p.table.Shards()), FailoverMS: uint32(p.cfg.FailoverTimeout / time.Millisecond),
		Peers: p.cfg.Peers}
}

// echoFor is the highest heartbeat probe this member has received from
// member i (it echoes it back for the freeze rule).
func (p *node) echoFor(i int) uint64 {
	p.echoMu.Lock()
	defer p.echoMu.Unlock()
	return p.echoes[i]
}

// epoch is the epoch of the active this member is or follows.
func (p *node) epoch() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roles.epoch
}

// accepted is the handler of a connection from member from (linkEvents):
// every message it carries goes to the part of this member it is for. The
// role machine learns the member's own entry and whether its --peers
// differs from this member's (peers.go).
func (p *node) accepted(from int, pm peerMap) func(t msgType, payload []byte) error {
	p.mu.Lock()
	p.roles.setPeer(from, pm.name, pm.differs)
	p.mu.Unlock()
	in := p.standby.from(from)
	return func(t msgType, payload []byte) error { return p.receive(in, from, &pm, t, payload) }
}

// receive processes one message from member from, on its connection's
// reader goroutine: what the standby side applies (batches, snapshots,
// reservations) goes to in; what answers this member as the active (acks,
// snapshot requests) to its stream; heartbeats and handoffs to the node.
func (p *node) receive(in *replica, from int, pm *peerMap, t msgType, payload []byte) error {
	switch t {
	case msgHeartbeat:
		var hb heartbeat
		if err := hb.Decode(payload); err != nil {
			return err
		}
		p.echoMu.Lock()
		p.echoes[from] = max(p.echoes[from], hb.Probe)
		p.echoMu.Unlock()
		p.heardHeartbeat(from, &hb, pm)
	case msgBatch:
		return in.batch(payload)
	case msgReserve:
		return in.reserve(payload)
	case msgSnapBegin:
		return in.snapBegin(payload)
	case msgSnapShard:
		return in.snapShard(payload)
	case msgSnapEnd:
		return in.snapEnd(payload)
	case msgAck:
		var a ack
		if err := a.Decode(payload); err != nil {
			return err
		}
		switch a.Kind {
		case ackBatch:
			p.out.acked(from, a.Value)
		case ackReserve:
			p.out.reserveAcked(from, a.Value)
		case ackHandoff:
			p.mu.Lock()
			if p.handoverDone != nil {
				select {
				case p.handoverDone <- a.Value:
				default:
				}
			}
			p.mu.Unlock()
		}
	case msgNeedSnapshot:
		p.mu.Lock()
		ok := p.roles.role == roleActive
		p.mu.Unlock()
		if ok {
			p.out.resync(from)
		}
	case msgHandoff:
		var h handoff
		if err := h.Decode(payload); err != nil {
			return err
		}
		p.takeOver(from, &h)
	default:
		return fmt.Errorf("priority: unexpected %s", t)
	}
	return nil
}

// follows is true while this member is a standby of member from
// (follower).
func (p *node) follows(from int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roles.role == roleStandby && p.roles.active == from
}

// recordReserved makes the active's reservation durable here, then notes
// it (follower).
func (p *node) recordReserved(limit uint64) error {
	if err := p.dir.Reserve(limit); err != nil {
		return err
	}
	p.mu.Lock()
	p.reservedSeen = max(p.reservedSeen, limit)
	p.mu.Unlock()
	return nil
}

// desync marks this member out of sync and notes reserved (follower).
func (p *node) desync(reserved uint64) {
	p.mu.Lock()
	p.roles.inSync = false
	p.reservedSeen = max(p.reservedSeen, reserved)
	p.mu.Unlock()
}

// synced marks this member in sync while it follows member from
// (follower).
func (p *node) synced(from int) {
	p.mu.Lock()
	if p.roles.role == roleStandby && p.roles.active == from {
		p.roles.inSync = true
	}
	p.mu.Unlock()
}
