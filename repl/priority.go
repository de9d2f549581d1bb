package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/shard"
	"github.com/lockd-dev/lockd/store"
)

// Priority is a member of a priority cluster (PROTOCOL.md §6.3): the
// highest-priority live member is the active and streams every change of
// its table, compressed, to the standbys; a standby takes over when the
// active has been silent for the failover timeout; SIGTERM hands over to a
// successor with nothing lost; two actives resolve by epoch; a returning
// member of higher priority takes over by a planned handover.
//
// Goroutines: the member listener and one reader per inbound link; one
// writer and one reader per outbound link (re-dialled with back-off); the
// ticker (heartbeats, role decisions, gate); the flusher (cuts batches);
// the token reserver. All end by Close.
type Priority struct {
	cfg   ClusterConfig
	log   *slog.Logger
	clock func() int64
	dir   *store.Dir
	table *shard.Table
	host  Host
	self  string // this member's client address (its --peers entry)

	gate atomic.Pointer[Gate]

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

	peers []*peer // by index; nil at Self
	out   *outStream

	echoMu sync.Mutex
	echoes []uint64 // the highest heartbeat probe received from each member

	res     Reserver
	resID   atomic.Uint64
	created bool

	ln       net.Listener
	actions  chan action // role changes, carried out in order by the actor goroutine
	quit     chan struct{}
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool
	restored int

	stats clusterStats

	// noWallFloor leaves the wall-clock floor out of a promotion's first
	// token, so tests see the reservation rule alone.
	noWallFloor bool
}

// clusterStats are the counters /metrics shows.
type clusterStats struct {
	failovers, handovers, demotions, snapshotsSent, snapshotsReceived atomic.Uint64
	batches, records, rawBytes, wireBytes, cancelled                  atomic.Uint64
	lagNs                                                             atomic.Int64 // standby: its lag as its active last measured it
}

// NewPriority returns a priority-mode member.
func NewPriority(cfg ClusterConfig) (*Priority, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Priority{cfg: cfg, self: cfg.Peers[cfg.Self], quit: make(chan struct{}), actions: make(chan action, 64),
		peers: make([]*peer, len(cfg.Peers)), echoes: make([]uint64, len(cfg.Peers))}
	p.gate.Store(&Gate{State: Hold})
	return p, nil
}

func (p *Priority) timeout() int64 { return int64(p.cfg.FailoverTimeout) }

// Open takes the data directory and builds the table. Tokens start above
// the reserved mark and the wall clock; a snapshot left by a shutdown as
// the last live member is reloaded (it is kept only if this member ends up
// the active: a standby discards it for the active's state).
func (p *Priority) Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error) {
	p.log, p.clock = log.With("member", p.cfg.Self), clock
	if _, err := os.Stat(p.cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		p.created = true
	}
	dir, err := store.Open(p.cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", p.cfg.DataDir, err)
	}
	p.dir = dir
	fail := func(err error) (*shard.Table, error) {
		dir.Close()
		if p.created {
			os.RemoveAll(p.cfg.DataDir)
		}
		return nil, err
	}
	mark, err := dir.Mark()
	if err != nil {
		return fail(err)
	}
	epoch, err := dir.Epoch()
	if err != nil {
		return fail(err)
	}
	snap, ok, err := dir.ReadSnapshot()
	if errors.Is(err, store.ErrCorrupt) {
		p.log.Error("snapshot corrupt: moved aside, its locks are lost (tokens are not)", "err", err)
	} else if err != nil {
		return fail(err)
	}
	start := max(mark, WallFloor())
	if ok {
		start = max(start, snap.Mark)
	}
	cfg.Sink = p.sink
	// No token may be handed out before this member is the active and has
	// made a reservation of its own (limit = start).
	p.table, err = shard.New(cfg, shard.NewTokens(start, start))
	if err != nil {
		return fail(err)
	}
	if ok {
		if p.restored, err = RestoreLocks(p.table, snap.Locks, clock()); err != nil {
			return fail(fmt.Errorf("restoring snapshot: %w", err))
		}
		if err := dir.RemoveSnapshot(); err != nil {
			return fail(err)
		}
		p.log.Info("snapshot reloaded", "locks", p.restored)
	}
	p.roles = newRoles(p.cfg.Self, len(p.cfg.Peers), p.timeout(), epoch, clock())
	p.out = newOutStream(p)
	p.res.Start(p.table.Tokens(), p.cfg.TokenBlock, p.reserve, p.log)
	return p.table, nil
}

// Start listens for members, dials them and starts the ticker. The member
// starts as a standby that knows no active (its gate answers M with no
// address) and listens for a failover timeout before it may promote.
func (p *Priority) Start(addr string, host Host) error {
	p.host = host
	la, err := p.cfg.MemberListen()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", la)
	if err != nil {
		return fmt.Errorf("member port %s (--listen port + --peer-offset): %w", la, err)
	}
	p.ln = ln
	p.log.Info("member link listening", "addr", ln.Addr().String(), "peers", p.cfg.Peers, "self", p.self)
	p.publish(&Gate{State: Redirect})
	for i := range p.cfg.Peers {
		if i != p.cfg.Self {
			p.peers[i] = newPeer(p, i)
		}
	}
	for _, pe := range p.peers {
		if pe != nil {
			p.wg.Add(1)
			go pe.run()
		}
	}
	p.wg.Add(4)
	go p.accept()
	go p.ticker()
	go p.actor()
	go p.out.flusher()
	return nil
}

// Gate is the current gate.
func (p *Priority) Gate() *Gate { return p.gate.Load() }

// publish installs g and tells the engine when what it applies changes.
func (p *Priority) publish(g *Gate) {
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
func (p *Priority) gateFor(now int64) *Gate {
	r := p.roles
	switch {
	case r.serving() && p.ready:
		// Until counts from the ticker's last tick, never from now: only
		// the ticker notices a freeze, so nothing else (a heartbeat read
		// first after a SIGCONT) may extend it.
		return &Gate{State: Serve, Until: r.lastTick + p.timeout()/2}
	case r.role == RoleActive || r.role == RoleHandover:
		return &Gate{State: Hold}
	case r.active >= 0 && r.active != p.cfg.Self:
		return &Gate{State: Redirect, Addr: p.cfg.Peers[r.active]}
	}
	return &Gate{State: Redirect}
}

// ticker runs the role machine every tenth of the failover timeout and
// sends heartbeats.
func (p *Priority) ticker() {
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
		for _, pe := range p.peers {
			if pe != nil {
				pe.sendHeartbeat(hb)
			}
		}
	}
}

// heartbeat is what this member says now (p.mu held).
func (p *Priority) heartbeat() Heartbeat {
	r := p.roles
	active := uint8(255)
	if r.active >= 0 {
		active = uint8(r.active)
	}
	role := r.role
	if p.stopping && role == RoleStandby {
		role = RoleLeaving
	}
	hb := Heartbeat{Epoch: r.epoch, Role: role, Active: active, InSync: r.inSync,
		Probe: r.nextProbe(), TokenLast: p.table.Tokens().Last(), Reserved: max(p.table.Tokens().Limit(), p.reservedSeen),
		StoredEpoch: r.peers[p.cfg.Self].storedEpoch}
	return hb
}

// heardHeartbeat feeds a member's heartbeat to the role machine.
func (p *Priority) heardHeartbeat(from int, hb *Heartbeat) {
	now := p.clock()
	ps := peerState{epoch: hb.Epoch, role: hb.Role, follows: int(hb.Active), inSync: hb.InSync,
		echo: hb.Echo, storedEpoch: hb.StoredEpoch, token: hb.TokenLast, reserved: hb.Reserved}
	if hb.Active == 255 {
		ps.follows = -1
	}
	p.mu.Lock()
	if hb.Role == RoleActive && p.roles.role == RoleStandby && p.roles.active == from {
		p.stats.lagNs.Store(int64(hb.LagNS))
	}
	c := p.roles.heard(now, from, ps)
	if p.roles.role == RoleActive && hb.Role == RoleActive {
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
	resync := p.roles.role == RoleActive && ps.follows == p.cfg.Self && hb.Role == RoleStandby
	g := p.gateFor(now)
	p.mu.Unlock()
	if pe := p.peers[from]; resync && pe != nil {
		pe.resyncIfStale(hb.InSync, 2*p.cfg.FailoverTimeout)
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
func (p *Priority) act(c change, why string) {
	if !c.promote && !c.demote && c.follow < 0 && c.handover < 0 && !c.resume {
		return
	}
	select {
	case p.actions <- action{c, why}:
	case <-p.quit:
	}
}

// actor carries out role changes in order.
func (p *Priority) actor() {
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
func (p *Priority) carryOut(c change, why string) {
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
func (p *Priority) becomeActive(handoffToken uint64, why string) {
	p.mu.Lock()
	r := p.roles
	epoch := r.epoch
	tokens := p.table.Tokens()
	start := max(tokens.Last(), tokens.Limit(), p.reservedSeen, handoffToken)
	if handoffToken == 0 && !p.noWallFloor {
		start = max(start, WallFloor()+uint64(p.timeout()))
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
	p.ready = p.roles.role == RoleActive
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
func (p *Priority) resumeServing() {
	tokens := p.table.Tokens()
	if !p.noWallFloor {
		tokens.Observe(WallFloor() + uint64(p.timeout()))
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
func (p *Priority) reserveUpTo(limit uint64, what string) {
	if err := p.reserve(limit); err != nil {
		p.log.Error(what+" failed: acquires get B until it succeeds", "err", err)
		return
	}
	p.table.Tokens().Extend(limit)
}

// follow discards this member's state and follows active a: the gate
// answers M naming it, and the active sends a snapshot.
func (p *Priority) follow(a int) {
	p.out.setActive(false)
	p.mu.Lock()
	p.ready = false
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g) // moves queued acquires to the active (M)
	var fx shard.Out
	p.table.Reset(&fx)
	if pe := p.peers[a]; pe != nil {
		pe.send(appendNeedSnapshot(nil, SnapStart))
	}
}

// reserve makes tokens up to limit safe: durable in this member's data
// dir, then, on an active, acknowledged by every live in-sync standby
// (PROTOCOL.md §6.2: a promoted standby starts above every reservation it
// acknowledged). A standby that does not acknowledge within the failover
// timeout is sent a new snapshot: until then it is not in sync.
func (p *Priority) reserve(limit uint64) error {
	if err := p.dir.Reserve(limit); err != nil {
		return err
	}
	p.mu.Lock()
	active := p.roles.role == RoleActive || p.roles.role == RoleHandover
	p.mu.Unlock()
	if !active {
		return nil
	}
	id := p.resID.Add(1)
	var waits []*peer
	for _, pe := range p.peers {
		if pe != nil && pe.streaming() {
			pe.send(appendReserve(nil, id, limit))
			waits = append(waits, pe)
		}
	}
	deadline := time.Now().Add(p.cfg.FailoverTimeout)
	for _, pe := range waits {
		if !pe.waitReserveAck(id, deadline) {
			p.log.Warn("a standby did not acknowledge a token reservation: resyncing it", "member", p.cfg.Peers[pe.i])
			pe.resync()
		}
	}
	return nil
}

// Stop hands over to the best live in-sync standby when this member is
// the active (PROTOCOL.md §6.2 planned handover) and returns its address;
// a standby tells the others it is leaving and returns the active's
// address (its clients are sent there); the last live member returns ""
// and shuts down as a single node.
func (p *Priority) Stop(ctx context.Context) string {
	p.mu.Lock()
	p.stopping = true
	r := p.roles
	now := p.clock()
	role, active := r.role, r.active
	succ := -1
	if role == RoleActive {
		succ = r.successor(now)
	}
	p.mu.Unlock()
	switch {
	case role == RoleActive && succ >= 0:
		if p.handover(ctx, succ, true) {
			return p.cfg.Peers[succ]
		}
		return ""
	case role == RoleActive:
		p.log.Info("no live in-sync standby: shutting down as a single node")
		return ""
	}
	// A standby: say so at once, so the active need not wait for silence.
	p.mu.Lock()
	hb := p.heartbeat()
	p.mu.Unlock()
	for _, pe := range p.peers {
		if pe != nil {
			pe.sendHeartbeat(hb)
		}
	}
	if active >= 0 && active != p.cfg.Self {
		return p.cfg.Peers[active]
	}
	return ""
}

// handover runs a planned handover to member s: stop executing, send
// everything, have s take over, then answer M naming it. It reports
// whether s confirmed; if not, this member serves again.
func (p *Priority) handover(ctx context.Context, s int, shutdown bool) bool {
	began := time.Now()
	p.mu.Lock()
	if p.roles.role != RoleActive {
		p.mu.Unlock()
		return false
	}
	epoch := p.roles.startHandover(s)
	done := make(chan uint64, 1)
	p.handoverDone = done
	p.mu.Unlock()
	p.publish(&Gate{State: Hold}) // waits for running batches; nothing executes from here
	pe := p.peers[s]
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
		pe.send(appendNeedSnapshot(nil, SnapStart))
	}
	return true
}

// takeOver is a standby's side of a planned handover: everything the old
// active sent before the Handoff has been applied (one ordered link), so
// this member promotes at the epoch it was given and confirms.
func (p *Priority) takeOver(from int, h *Handoff) {
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
	p.peers[from].send(appendAck(nil, AckHandoff, h.Epoch))
}

// Close stops the member: its goroutines end; after a shutdown or a crash
// of the engine, a member that was the active writes the snapshot (the
// last live member's locks survive a full restart); a standby's table is
// a copy and is not written.
func (p *Priority) Close(ctx context.Context, why CloseReason) error {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		return nil
	}
	p.closed = true
	p.closeMu.Unlock()
	close(p.quit)
	if p.ln != nil {
		p.ln.Close()
	}
	for _, pe := range p.peers {
		if pe != nil {
			pe.close()
		}
	}
	p.out.close()
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
	wasActive := p.roles.role == RoleActive
	p.mu.Unlock()
	var err error
	switch {
	case why == FailedStart:
		err = p.dir.Close()
		if p.created {
			os.RemoveAll(p.cfg.DataDir)
		}
		return err
	case why == Discard || !wasActive:
		return p.dir.Close()
	}
	snap := TableSnapshot(p.table, p.clock())
	err = RunWithin(ctx, func() error { return p.dir.WriteSnapshot(snap) })
	if err != nil {
		p.log.Error("snapshot not written: held locks are lost (tokens are not)", "locks_lost", len(snap.Locks), "err", err)
	} else {
		p.log.Info("snapshot written", "locks", len(snap.Locks), "mark", snap.Mark, "after", why.String())
	}
	return errors.Join(err, p.dir.Close())
}

// Status reports this member and what it knows of the others.
func (p *Priority) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.roles
	now := p.clock()
	role := r.role
	if r.checking() && role == RoleActive {
		role = RoleHandover
	}
	st := Status{Mode: "priority", Role: role.String(), Self: p.self, Epoch: r.epoch, InSync: r.inSync}
	if r.role == RoleActive && r.checking() {
		st.Role = "active-checking"
	}
	if r.active >= 0 {
		st.Active = p.cfg.Peers[r.active]
	}
	st.Failovers = p.stats.failovers.Load()
	st.Handovers = p.stats.handovers.Load()
	st.Demotions = p.stats.demotions.Load()
	st.SnapshotsSent = p.stats.snapshotsSent.Load()
	st.SnapshotsReceived = p.stats.snapshotsReceived.Load()
	st.Batches, st.Records, st.Cancelled = p.stats.batches.Load(), p.stats.records.Load(), p.stats.cancelled.Load()
	st.RawBytes, st.WireBytes = p.stats.rawBytes.Load(), p.stats.wireBytes.Load()
	if r.role == RoleStandby {
		st.LagSeconds = float64(p.stats.lagNs.Load()) / 1e9
	}
	for i := range p.cfg.Peers {
		if i == p.cfg.Self {
			continue
		}
		ps := &r.peers[i]
		m := Member{Addr: p.cfg.Peers[i], Live: r.live(i, now), InSync: ps.inSync}
		if ps.known {
			m.Role = ps.role.String()
		}
		if pe := p.peers[i]; pe != nil {
			pe.status(&m)
		}
		st.Members = append(st.Members, m)
	}
	p.res.Status(&st)
	return st
}

// Health is nil while this member is the serving active or a standby that
// knows its active; an error otherwise.
func (p *Priority) Health() error {
	if err := p.res.Health(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.roles.serving() && p.ready:
		return nil
	case p.roles.role == RoleStandby && p.roles.active >= 0:
		return nil
	}
	return errors.New("repl: no active known")
}
