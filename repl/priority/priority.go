package priority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

	gate atomic.Pointer[gate]

	mu    sync.Mutex // guards roles, the peers' link state and the fields below
	roles *roles
	// gateSeq numbers the gates computed (gateFor): a gate is published
	// only if no later one was, so a gate computed before a handover's
	// hold or a demotion cannot replace it.
	gateSeq      uint64
	reservedSeen uint64 // the highest reservation seen from an active (standby)
	// jump: a token this active's counter must pass before it serves
	// again: the counter of a member back from a later epoch (a split
	// active that stopped before the heal).
	jump     uint64
	stopping bool
	// keepTable: this member shuts down as a single node (no successor
	// took over) and writes its table at Close like the active it was.
	keepTable bool
	// ready: this member, the active, has made its first reservation and
	// may open its gate (a promotion happens in the role machine first).
	ready bool
	// epochLogged: when the role machine's refusal to promote without an
	// epoch left was last logged (0: never).
	epochLogged int64

	// reserving: a reservation past a jump of the counter is queued for
	// the actor (reserveSoon).
	reserving atomic.Bool

	// handWake is kicked whenever a handover in progress may have ended
	// (an answer or a heartbeat of the successor arrived).
	handWake chan struct{}

	// applyMu is held while anything the followed active sent is applied to
	// the table (follower.apply), and taken by every change of role away
	// from following it before the change touches the table or opens the
	// gate: a late frame of a former active never lands in the table of a
	// member that promoted or follows another.
	applyMu sync.Mutex
	// loaded is the active and epoch whose snapshot last began to replace
	// the table (under applyMu): following them again needs no reset.
	loaded struct {
		from  int
		epoch uint64
	}
	// resMark is the highest token reservation made durable in the data
	// dir as the active (a snapshot's end carries it).
	resMark atomic.Uint64
	// diskMark is the data dir's reservation mark, as this member's and as
	// its actives' (heartbeats carry it: an active raises its counter above
	// every member's, so a member that granted on its own — a split brain's
	// other side — and restarted cannot be undercut).
	diskMark atomic.Uint64
	markMu   sync.Mutex // writeMark: one write of the mark at a time
	// busySince is, for each member, when this member began to process a
	// frame from it (its clock), 0 while none is in hand: a reader held up
	// by this member's own work (a table reset, an fsync, the engine's
	// barrier) does not make that member look silent.
	busySince []atomic.Int64

	link    *link
	out     *outStream // what this member sends as the active
	standby *standby   // what it applies as a standby

	echoMu sync.Mutex
	echoes []uint64 // the heartbeat probe received last from each member

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
		echoes: make([]uint64, len(cfg.Peers)), handWake: make(chan struct{}, 1), busySince: make([]atomic.Int64, len(cfg.Peers))}
	p.gate.Store(&gate{Gate: repl.Gate{State: repl.Hold}})
	p.loaded.from = -1
	return p, nil
}

// writeMark makes limit durable as the data dir's reservation mark. The
// reserver, the actor (a promotion, the end of a freeze check, a jump)
// and a standby's reader all reserve: one write at a time, and never one
// below the mark already written (a lower limit is durable already).
func (p *node) writeMark(limit uint64) error {
	p.markMu.Lock()
	defer p.markMu.Unlock()
	if limit <= p.diskMark.Load() {
		return nil
	}
	if err := p.dir.Reserve(limit); err != nil {
		return err
	}
	p.diskMark.Store(limit)
	return nil
}

// raise makes v at least x.
func raise(v *atomic.Uint64, x uint64) {
	for m := v.Load(); m < x && !v.CompareAndSwap(m, x); m = v.Load() {
	}
}

// gate is a repl.Gate with the number of its computation (gateSeq).
type gate struct {
	repl.Gate
	seq uint64
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
	p.out = newOutStream(p.cfg.Peers, p.log, p.activeEpoch, p.resMark.Load)
	cfg.Sink = p.out.sink
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
	p.roles = newRoles(p.cfg.Self, len(p.cfg.Peers), p.timeout(), epoch, clock())
	p.roles.probe = probeBase()
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
	p.mu.Lock()
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g)
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
func (p *node) Gate() *repl.Gate { return &p.gate.Load().Gate }

// publish installs g unless a gate computed after it is already installed,
// and tells the engine when what it applies changes. Gates are computed
// under p.mu (gateFor) and published after it is released, so two
// publishers can cross: the number decides, and the later computation
// wins whatever the order of the publications.
func (p *node) publish(g *gate) {
	var old *gate
	for {
		old = p.gate.Load()
		if old.seq > g.seq {
			return
		}
		if p.gate.CompareAndSwap(old, g) {
			break
		}
	}
	if p.host == nil {
		return
	}
	now := p.clock()
	if old.Effective(now) != g.Effective(now) || old.Addr != g.Addr || (old.Until != 0 && now > old.Until) {
		p.host.GateChanged()
	}
}

// gateFor is the gate of the current roles, numbered (p.mu held).
func (p *node) gateFor(now int64) *gate {
	r := p.roles
	p.gateSeq++
	g := &gate{seq: p.gateSeq}
	switch {
	case r.serving() && p.ready:
		// Until counts from the ticker's last tick, never from now: only
		// the ticker notices a freeze, so nothing else (a heartbeat read
		// first after a SIGCONT) may extend it.
		g.Gate = repl.Gate{State: repl.Serve, Until: r.lastTick + p.timeout()/2}
	case r.role == roleActive || r.role == roleHandover:
		g.Gate = repl.Gate{State: repl.Hold}
	case r.active >= 0 && r.active != p.cfg.Self:
		g.Gate = repl.Gate{State: repl.Redirect, Addr: p.cfg.Peers[r.active]}
	default:
		g.Gate = repl.Gate{State: repl.Redirect}
	}
	return g
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
		p.busyHeard(now)
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

// busyHeard counts, for every member a frame of which this member is
// processing now, as hearing from it (p.mu held): the frame came; what
// holds it up is here. Bounded at ten failover timeouts, so a reader stuck
// for good cannot keep a dead member live.
func (p *node) busyHeard(now int64) {
	for i := range p.busySince {
		if b := p.busySince[i].Load(); b != 0 && now-b < 10*p.timeout() {
			p.roles.heardFrom(now, i)
		}
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
		StoredEpoch: r.peers[p.cfg.Self].storedEpoch, Mark: p.diskMark.Load()}
	return hb
}

// heardHeartbeat feeds a member's heartbeat to the role machine; the
// active it follows is read through pm (its index in the sender's
// --peers).
func (p *node) heardHeartbeat(from int, hb *heartbeat, pm *peerMap) {
	now := p.clock()
	ps := peerState{epoch: hb.Epoch, role: hb.Role, follows: pm.index(hb.Active), inSync: hb.InSync,
		echo: hb.Echo, storedEpoch: hb.StoredEpoch, token: hb.TokenLast, reserved: hb.Reserved, mark: hb.Mark}
	p.mu.Lock()
	if hb.Role == roleActive && p.roles.role == roleStandby && p.roles.active == from {
		p.stats.lagNs.Store(int64(hb.LagNS))
	}
	p.busyHeard(now)
	wasChecking, lastTick := p.roles.checking(), p.roles.lastTick
	c := p.roles.heard(now, from, ps)
	if !wasChecking && p.roles.checking() {
		// The stall was noticed here, before the ticker ran.
		p.ready = false
		p.log.Warn("this member was frozen or stalled: executing nothing until the others answer", "gap", time.Duration(now-lastTick))
	}
	if r := p.roles.role; r == roleActive || r == roleHandover {
		// Whatever the member is now, its data dir's mark is above every
		// token it ever issued. A mark above this active's own (written
		// before any standby is sent the reservation) is one the member
		// made on its own — it served on the other side of a split, say,
		// and restarted before the two met as actives — and its tokens
		// must not be undercut: the counter jumps above it (acquires get B
		// until a reservation has made that safe). A standby's mark is a
		// reservation of this active's (or of an earlier active's, below
		// this one's): nothing moves.
		if hb.Mark > p.diskMark.Load() {
			p.table.Tokens().Observe(hb.Mark)
		}
	}
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
	jump := false
	if p.roles.role == roleActive && hb.Role != roleActive && hb.StoredEpoch > p.roles.epoch &&
		hb.TokenLast > max(p.table.Tokens().Last(), p.jump) && hb.TokenLast < math.MaxUint64/2 {
		// A member whose data dir holds an epoch above this active's: it
		// promoted on the other side of a partition and stopped before the
		// heal, so the two never saw each other as actives. It restarted
		// with its counter above its reservation mark, which every token
		// it issued stayed below: tokens go on above it. The gate holds
		// requests (rather than answering B) until the jump is reserved.
		// (Not its Reserved: as a standby of this active it echoes this
		// active's own reservations. A counter past 2^63 is no real
		// member's — tokens start near the wall clock in ns, 2^60 — and
		// the reservation above it would wrap: it is ignored.)
		// A promotion or freeze check in progress ends before the
		// actor gets to it (resumeServing serves only a serving role).
		p.jump = hb.TokenLast
		jump, p.ready = true, false
	}
	// A jump above the reserved range: every grant gets B until a
	// reservation covers it; ask for one now.
	tokens := p.table.Tokens()
	jumped := (p.roles.role == roleActive || p.roles.role == roleHandover) && tokens.Last() >= tokens.Limit()
	// A standby that follows this active but is not in the stream (its
	// request for a snapshot was lost), or that has said it is out of sync
	// for a long while, gets a snapshot.
	resync := p.roles.role == roleActive && ps.follows == p.cfg.Self && hb.Role == roleStandby
	handing := p.roles.role == roleHandover || p.roles.handOutcome == handOffered
	g := p.gateFor(now)
	p.mu.Unlock()
	if handing {
		p.kickHandover()
	}
	if resync && p.link.peers[from] != nil {
		p.out.resyncIfStale(from, hb.InSync, 2*p.cfg.FailoverTimeout)
	}
	if jumped {
		p.reserveSoon("reservation above another member's tokens")
	}
	p.act(c, "heartbeat")
	if jump {
		rc := noChange()
		rc.resume = true
		p.act(rc, "a member back from a later epoch")
	}
	p.publish(g)
}

// action is a role change to carry out.
type action struct {
	c     change
	why   string
	token uint64 // took: the tokens the old active handed out and reserved
	// reserve: the counter jumped above the reservation (another member's
	// tokens): reserve past it now rather than at the next grant's B.
	reserve bool
}

// act hands a change of the role machine to the actor goroutine: the
// readers and the ticker never wait for a handover or a reservation (a
// handover waits for an answer that a reader must deliver).
func (p *node) act(c change, why string) { p.actWith(c, why, 0) }

// reserveSoon asks the actor for a reservation past the counter: it jumped
// above the reserved range (another member's tokens), and every grant gets
// B until one is made. One request is queued at a time.
func (p *node) reserveSoon(why string) {
	if !p.reserving.CompareAndSwap(false, true) {
		return
	}
	select {
	case p.actions <- action{why: why, reserve: true}:
	case <-p.quit:
	}
}

// actWith is act with the tokens a planned handover hands over.
func (p *node) actWith(c change, why string, token uint64) {
	if !c.promote && !c.demote && c.follow < 0 && c.handover < 0 && !c.resume && !c.took {
		return
	}
	select {
	case p.actions <- action{c: c, why: why, token: token}:
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
			p.carryOut(a)
		}
	}
}

// carryOut does what a change of the role machine asks.
func (p *node) carryOut(a action) {
	c, why := a.c, a.why
	if a.reserve {
		p.reserving.Store(false)
		tokens := p.table.Tokens()
		p.reserveUpTo(max(tokens.Limit(), tokens.Last())+p.cfg.TokenBlock, why)
		return
	}
	switch {
	case c.took:
		p.becomeActive(a.token, why)
	case c.resume:
		p.resumeServing(why)
	case c.promote:
		p.stats.failovers.Add(1)
		p.becomeActive(0, why)
	case c.demote || c.follow >= 0:
		// Carried out after the role machine decided it: meanwhile this
		// member may have taken a handover (it is the active again, its
		// table the snapshot of the member it followed) — a step-down
		// carried out now would discard that table and reopen the stream.
		// It follows whom the role machine follows now.
		p.mu.Lock()
		role, a := p.roles.role, p.roles.active
		p.mu.Unlock()
		// With no active known (it went silent since), the table stays: it
		// is what a failover promotes with.
		if role != roleStandby || a == p.cfg.Self || a < 0 {
			p.log.Info("a step-down or change of active the role machine has moved past: not carried out", "role", role.String(), "active", a, "why", why)
			return
		}
		name := p.cfg.Peers[a]
		if c.demote {
			p.stats.demotions.Add(1)
			p.log.Warn("stepping down: another member became active later; discarding this state and following it",
				"active", name, "why", why)
		} else {
			p.log.Info("following the active", "active", name)
		}
		p.follow(a)
	case c.handover >= 0:
		p.mu.Lock()
		active := p.roles.role == roleActive
		p.mu.Unlock()
		if !active {
			return // a repeat of a handover already carried out (decide asks at every step until it is)
		}
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
	p.applyBarrier() // nothing from the former active lands in the table from here on
	p.mu.Lock()
	r := p.roles
	epoch := r.epoch
	tokens := p.table.Tokens()
	start := max(tokens.Last(), tokens.Limit(), p.reservedSeen, handoffToken)
	if handoffToken == 0 && !p.noWallFloor {
		start = max(start, repl.WallFloor()+uint64(p.timeout()))
	}
	for i := range r.peers {
		start = max(start, r.peers[i].token, r.peers[i].reserved, r.peers[i].mark)
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
//
// A member back from a later epoch (heardHeartbeat) resumes it the same
// way: its tokens jump above that member's too (p.jump).
func (p *node) resumeServing(why string) {
	// The gate holds while the counter jumps: a freeze check that ended
	// after an earlier one's resumeServing opened the gate (two stalls in
	// a row) must not leave it serving with no token reserved (B).
	p.mu.Lock()
	p.ready = false
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g)
	tokens := p.table.Tokens()
	if !p.noWallFloor {
		tokens.Observe(repl.WallFloor() + uint64(p.timeout()))
	}
	p.mu.Lock()
	tokens.Observe(p.jump)
	p.mu.Unlock()
	p.reserveUpTo(max(tokens.Limit(), tokens.Last())+p.cfg.TokenBlock, "reservation after the freeze check or a token jump")
	p.mu.Lock()
	p.ready = p.roles.serving()
	g = p.gateFor(p.clock())
	p.mu.Unlock()
	p.log.Info("serving again", "why", why, "next_token", tokens.Last()+1)
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
// answers M naming it, and the active sends a snapshot. A snapshot of a at
// the epoch followed that already began to replace the table is kept.
func (p *node) follow(a int) {
	p.out.setActive(false)
	p.mu.Lock()
	p.ready = false
	epoch := p.roles.epoch
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g) // moves queued acquires to the active (M)
	p.applyMu.Lock()
	if p.loaded.from != a || p.loaded.epoch != epoch {
		var fx shard.Out
		p.table.Reset(&fx)
		p.loaded.from, p.loaded.epoch = -1, 0
	}
	p.applyMu.Unlock()
	if pe := p.link.peers[a]; pe != nil {
		pe.send(appendNeedSnapshot(nil, snapStart))
	}
}

// applyBarrier waits until no frame of an active is being applied (apply):
// a role change away from following it calls it after the role machine
// changed the role, so every later apply sees the change and refuses.
func (p *node) applyBarrier() {
	p.applyMu.Lock()
	//lint:ignore SA2001 a barrier: what it orders is the role change made before it
	p.applyMu.Unlock()
}

// reserve makes tokens up to limit safe: durable in this member's data
// dir, then, on an active, acknowledged by every live in-sync standby
// (PROTOCOL.md §6.2: a promoted standby starts above every reservation it
// acknowledged). A standby that does not acknowledge within the failover
// timeout is sent a new snapshot: until then it is not in sync.
func (p *node) reserve(limit uint64) error {
	if err := p.writeMark(limit); err != nil {
		return err
	}
	p.mu.Lock()
	active := p.roles.role == roleActive || p.roles.role == roleHandover
	p.mu.Unlock()
	if !active {
		return nil
	}
	// From here a snapshot that ends carries limit (its SnapEnd reads the
	// mark after this): a standby in a snapshot is not waited for.
	raise(&p.resMark, limit)
	id := p.resID.Add(1)
	var waits []int
	for i, pe := range p.link.peers {
		if pe != nil && p.out.streaming(i) && !p.out.inSnapshot(i) {
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
	p.roles.leaving = true
	role, active := p.roles.role, p.roles.active
	p.mu.Unlock()
	if role == roleActive || role == roleHandover {
		return p.stopActive(ctx)
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

// stopActive is Stop on the active: a planned handover to each live,
// in-sync standby in priority order until one takes it (one that refuses
// leaves this member the active, so the next is tried). It returns the
// address requests are sent to from then on, or "" when none is left and
// this member shuts down as a single node.
func (p *node) stopActive(ctx context.Context) string {
	// A member that refused is offered once more, above every epoch it
	// said it refuses: the epoch first offered may be one it refused
	// before, offered by another member this one never heard of. A member
	// that refused twice is not asked again.
	var once, refused uint64
	for range 2 * len(p.cfg.Peers) {
		// A handover begun before the signal (to a member of higher
		// priority) ends first; this member executes nothing meanwhile.
		if p.waitHandover(ctx) {
			break
		}
		syncing := p.out.snapshotting()
		p.mu.Lock()
		role, active, succ := p.roles.role, p.roles.active, -1
		if role == roleActive {
			succ = p.roles.successor(p.clock(), refused|syncing)
		}
		p.mu.Unlock()
		switch {
		case role == roleStandby && active >= 0:
			return p.cfg.Peers[active] // superseded, or handed over, meanwhile
		case role != roleActive || succ < 0:
			return p.lastMember()
		}
		o, to := p.handover(ctx, succ, true)
		switch o {
		case handTaken, handSuperseded, handUndecided:
			return p.cfg.Peers[to]
		case handLost:
			// The successor went silent before it decided. Another live,
			// in-sync standby promotes by failover once this member is gone
			// (its heartbeats say it is leaving): requests go there.
			syncing := p.out.snapshotting()
			p.mu.Lock()
			next := p.roles.successor(p.clock(), refused|syncing|1<<succ)
			p.mu.Unlock()
			if next >= 0 {
				p.log.Info("the successor went silent before deciding the handover: another in-sync standby takes over once this member has left",
					"standby", p.cfg.Peers[next])
				return p.cfg.Peers[next]
			}
			return p.lastMember()
		}
		// Refused: serving again; this successor once more, then the next.
		if once&(1<<succ) == 0 {
			once |= 1 << succ
			p.log.Info("the successor refused the handover: offering it once more, above the epochs it refuses", "standby", p.cfg.Peers[succ])
			continue
		}
		refused |= 1 << succ
	}
	return p.lastMember()
}

// lastMember makes this member shut down as a single node: no successor
// takes over, so its table is written at Close as the active's would be.
func (p *node) lastMember() string {
	syncing := p.out.snapshotting()
	p.mu.Lock()
	p.keepTable = true
	views := p.roles.successorViews(p.clock())
	p.mu.Unlock()
	p.log.Info("no live in-sync standby: shutting down as a single node", "members", views, "being_sent_a_snapshot", syncing)
	return ""
}

// waitHandover waits while a handover is in progress (begun by the actor),
// and reports whether ctx ended first.
func (p *node) waitHandover(ctx context.Context) bool {
	for {
		p.mu.Lock()
		handing := p.roles.role == roleHandover
		p.mu.Unlock()
		if !handing {
			return false
		}
		select {
		case <-ctx.Done():
			return true
		case <-p.quit:
			return true
		case <-p.handWake:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// kickHandover wakes a handover waiting for its verdict.
func (p *node) kickHandover() {
	select {
	case p.handWake <- struct{}{}:
	default:
	}
}

// handover runs a planned handover to member s (MEMBER-LINK.md, "Planned
// handover"): stop executing, send everything, offer s the next epoch, and
// wait for the verdict — s's answer, or what the members say
// (roles.decideHandover) — executing nothing meanwhile. From one failover
// timeout on, s is asked every half timeout to decide (HandoffAbort): it
// answers taken or refused, and decides once. It returns the outcome and
// the member it ended with, after carrying it out: M naming that member
// (taken, superseded, undecided), serving again (refused) or serving
// nothing (lost: s went silent first). A shutdown waits at most half of
// what is left of ctx, a rejoin ten failover timeouts; then, with s still
// live, the handover is left undecided and requests go to s.
func (p *node) handover(ctx context.Context, s int, shutdown bool) (handState, int) {
	began := time.Now()
	p.mu.Lock()
	if p.roles.role != roleActive || p.roles.checking() {
		p.mu.Unlock()
		return handNone, -1
	}
	epoch, ok := p.roles.offer(s, p.clock())
	if !ok {
		p.mu.Unlock()
		return handNone, -1 // no epoch left to offer (nextEpoch): this member stays the active
	}
	g := p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g) // Hold: waits for running batches; nothing executes from here
	p.out.flushNow()
	tokens := p.table.Tokens()
	pe := p.link.peers[s]
	pe.send(appendHandoff(nil, epoch, tokens.Last(), max(tokens.Limit(), p.reservedSeen)))
	giveUp := began.Add(10 * p.cfg.FailoverTimeout)
	if dl, ok := ctx.Deadline(); ok && shutdown {
		giveUp = began.Add(time.Until(dl) / 2)
	}
	tick := time.NewTicker(max(p.cfg.FailoverTimeout/20, 5*time.Millisecond))
	defer tick.Stop()
	var o handState
	var to int
	for {
		p.mu.Lock()
		now := p.clock()
		o, to = p.roles.handover()
		ask := o == handOffered && p.roles.askDue(now)
		if o == handOffered && time.Now().After(giveUp) {
			p.roles.leaveUndecided()
			o, to = p.roles.handover()
		}
		p.mu.Unlock()
		if o != handOffered {
			break
		}
		if ask {
			p.log.Warn("handover not confirmed yet: asking the successor to decide", "successor", p.cfg.Peers[s], "epoch", epoch, "waited", time.Since(began))
			pe.send(appendHandoffAbort(nil, epoch))
		}
		select {
		case <-p.handWake:
		case <-tick.C:
		case <-p.quit:
			return handNone, -1
		}
	}
	switch o {
	case handRefused:
		p.mu.Lock()
		g := p.gateFor(p.clock())
		p.mu.Unlock()
		p.log.Warn("handover refused by the successor: serving again", "successor", p.cfg.Peers[s], "epoch", epoch, "waited", time.Since(began))
		p.publish(g)
		return o, to
	case handLost:
		p.out.setActive(false)
		p.mu.Lock()
		p.ready = false
		g := p.gateFor(p.clock())
		p.mu.Unlock()
		p.publish(g) // M with no address: queued acquires included
		p.log.Warn("the successor went silent before deciding the handover: serving nothing; the failover rules decide",
			"successor", p.cfg.Peers[s], "epoch", epoch, "waited", time.Since(began))
		return o, to
	}
	if o == handTaken {
		p.stats.handovers.Add(1)
	}
	p.out.setActive(false)
	p.mu.Lock()
	p.ready = false
	g = p.gateFor(p.clock())
	p.mu.Unlock()
	p.publish(g) // M naming the member that took over, queued acquires included
	p.log.Info("handed over", "to", p.cfg.Peers[to], "outcome", o.String(), "epoch", epoch, "took", time.Since(began), "shutdown", shutdown)
	if !shutdown {
		p.follow(to)
	}
	return o, to
}

// takeOver is a standby's side of a planned handover: everything the old
// active sent before the Handoff has been applied (one ordered link), so
// this member decides — takes the epoch it was given, or refuses it for
// good — and says so at once: the old active executes nothing until it
// knows. A member that took it then promotes (its epoch stored, a
// reservation of its own) on the actor, as a failover does.
func (p *node) takeOver(from int, h *handoff) {
	p.mu.Lock()
	taken, fresh := p.roles.takeHandoff(from, h.Epoch, !p.stopping)
	if fresh {
		p.reservedSeen = max(p.reservedSeen, h.Reserved)
	}
	upTo := p.roles.refusedUpTo()
	p.mu.Unlock()
	pe := p.link.peers[from]
	if !taken {
		p.log.Warn("handover refused: not a willing standby in sync with that active, or an epoch refused before", "from", p.cfg.Peers[from], "epoch", h.Epoch, "refused_up_to", upTo)
		pe.send(appendAck(nil, ackRefused, upTo))
		return
	}
	pe.send(appendAck(nil, ackHandoff, h.Epoch))
	if fresh {
		p.stats.handovers.Add(1)
		c := noChange()
		c.took = true
		p.actWith(c, "planned handover", max(h.TokenLast, h.Reserved))
	}
}

// abortAsked is a standby's answer to an old active's HandoffAbort: the
// handoff at that epoch was taken, or is now refused for good.
func (p *node) abortAsked(from int, h *handoffAbort) {
	p.mu.Lock()
	taken := p.roles.abortHandoff(from, h.Epoch)
	kind, v := ackRefused, p.roles.refusedUpTo()
	p.mu.Unlock()
	if taken {
		kind, v = ackHandoff, h.Epoch
	}
	p.log.Info("the old active asked to decide its handover", "from", p.cfg.Peers[from], "epoch", h.Epoch, "taken", taken)
	p.link.peers[from].send(appendAck(nil, kind, v))
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
	wasActive := p.roles.role == roleActive || p.keepTable
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
	if p.link != nil {
		st.MemberRefused = p.link.auth.Refusals()
	}
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

// activeEpoch is this member's epoch and whether it is the active (handing
// over included): a snapshot is cut and sent only while it is, at the
// epoch it began at.
func (p *node) activeEpoch() (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.roles
	return r.epoch, r.role == roleActive || r.role == roleHandover
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
	p.busySince[from].Store(p.clock())
	defer p.busySince[from].Store(0)
	if t != msgHeartbeat {
		// Any frame shows the sender is live (PROTOCOL.md §6.1: heard from
		// within the failover timeout), whatever is queued before its next
		// heartbeat: a snapshot's size must not decide liveness.
		p.mu.Lock()
		p.roles.heardFrom(p.clock(), from)
		p.mu.Unlock()
	}
	switch t {
	case msgHeartbeat:
		var hb heartbeat
		if err := hb.Decode(payload); err != nil {
			return err
		}
		p.echoMu.Lock()
		// The probe it sent last, not the highest ever: a member that
		// restarted numbers its probes afresh (above its earlier lives',
		// probeBase), and an echo kept from an earlier life must never
		// answer its freeze check.
		p.echoes[from] = hb.Probe
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
		case ackSnapshot:
			// The standby applied the snapshot: in sync from now, before
			// its next heartbeat says so (a SIGTERM meanwhile hands over
			// to it rather than shutting down as a single node).
			if e, ok := p.out.snapshotEnded(from, a.Value); ok {
				p.mu.Lock()
				p.roles.snapshotApplied(from, e)
				p.mu.Unlock()
			}
		case ackHandoff, ackRefused:
			p.mu.Lock()
			p.roles.handoffAnswer(from, a.Value, a.Kind == ackHandoff)
			p.mu.Unlock()
			p.kickHandover()
		}
	case msgSnapAck:
		var a snapAck
		if err := a.Decode(payload); err != nil {
			return err
		}
		p.out.snapAcked(from, a.ID, a.Frames)
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
	case msgHandoffAbort:
		var h handoffAbort
		if err := h.Decode(payload); err != nil {
			return err
		}
		p.abortAsked(from, &h)
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
	if err := p.writeMark(limit); err != nil {
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

// synced marks this member in sync while it follows member from at epoch
// (follower).
func (p *node) synced(from int, epoch uint64) {
	p.mu.Lock()
	if p.roles.role == roleStandby && p.roles.active == from && p.roles.epoch == epoch {
		p.roles.inSync = true
	}
	p.mu.Unlock()
}

// apply runs fn under the apply lock while this member is a standby that
// follows member from at epoch (follower).
func (p *node) apply(from int, epoch uint64, fn func() error) (bool, error) {
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	p.mu.Lock()
	ok := p.roles.role == roleStandby && p.roles.active == from && p.roles.epoch == epoch
	p.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, fn()
}

// loading notes the snapshot that replaces the table (follower; applyMu
// held, inside apply).
func (p *node) loading(from int, epoch uint64) {
	p.loaded.from, p.loaded.epoch = from, epoch
}
