package machine

import (
	"log/slog"
	"math/bits"
	"time"

	"github.com/lockd-dev/lockd/internal/ratelog"
)

// Config is what a Member is made from.
type Config struct {
	Self  int      // this member's index in Peers
	Peers []string // every member's --peers entry, for the logs
	// Timeout is the failover timeout in nanoseconds.
	Timeout int64
	// TokenBlock is how many tokens a reservation covers beyond the
	// counter.
	TokenBlock uint64
	// StoredEpoch is the epoch in this member's data directory.
	StoredEpoch uint64
	// Probe is where this life's heartbeat probes start (the first is
	// Probe+1): above every probe of the member's earlier lives, which
	// the others may still echo.
	Probe uint64
	// Start is the allocator's counter and limit at start: every token
	// the data directory knows of is below it.
	Start uint64
	// NoWallFloor leaves the wall-clock floor out of a promotion's first
	// token and a resume's, so tests see the reservation rules alone.
	NoWallFloor bool
	// Now is the clock at start (the listening period counts from it).
	Now int64
}

// peer is what this member knows of another: what it said in its last
// heartbeat, and when.
type peer struct {
	known       bool  // heard from since this member started (or resumed)
	heard       int64 // when
	epoch       uint64
	role        Role
	follows     int  // the active it follows, None
	inSync      bool // a standby in sync with the active it follows
	echo        uint64
	storedEpoch uint64
	token       uint64 // the highest token it issued or saw
	reserved    uint64 // the highest reservation it made or saw
	mark        uint64 // the reservation mark in its data dir
	lastKnown   bool   // live when this member noticed it had been frozen
	held        bool   // an active whose position is final (Heartbeat.Held)
	serving     bool   // its gate serves
	pos         uint64 // its position
	verdict     uint64 // its verdict on this member's epoch (Heartbeat.Verdict)
	lineage     Lineage
	root        uint64
}

// handover is the old active's side of a planned handover.
type handover struct {
	to       int       // the successor (None: none offered)
	epoch    uint64    // the epoch offered
	since    int64     // when
	asked    int64     // when the successor was last asked to decide (HandoffAbort), 0 never
	giveUp   int64     // when it is left undecided while the successor is live
	outcome  HandState // how the last handover ended (HandOffered while it runs)
	result   int       // the member it ended with
	shutdown bool      // part of a shutdown
}

// stopping is where a shutdown stands.
type stopping struct {
	running  bool
	deadline int64  // the caller's: a handover begun before the signal is waited for until then
	offered  bool   // a handover of the shutdown runs, to succ
	succ     int    // …
	once     uint64 // successors that refused once (a bit each): offered once more
	refused  uint64 // … twice: not asked again
	tries    int
}

// owed is an answer this member, a successor, owes an old active: its
// Ack(handoff) says "serving", so it leaves once the gate serves.
type owed struct {
	to    int
	epoch uint64
}

// Member is a member of a priority cluster as a pure state machine
// (PROTOCOL.md §6.2–6.3). Step feeds it one message, Tick the passing of
// time with what the driver measured; both return the actions to carry
// out, in order, valid until the next call. It reads no clock, takes no
// lock and starts no goroutine: one goroutine drives it.
type Member struct {
	cfg     Config
	self, n int
	timeout int64
	out     []Action
	local   Local

	// Roles (decide.go).
	role     Role
	epoch    uint64 // the followed active's epoch; this member's when active
	maxEpoch uint64 // the highest epoch seen, the stored one included
	active   int    // the active this member follows or is, None
	inSync   bool   // standby: applied a snapshot of active and the stream since
	peers    []peer
	names    []string // each member's own --peers entry, from its Hello
	differs  []bool   // a member whose --peers differs from this one's
	probe    uint64   // the number of the last heartbeat round this member sent
	probeIn  []uint64 // the probe received last from each member: echoed to it
	started  int64
	lastTick int64

	resumeProbe uint64 // the freeze check runs while > 0: the first probe sent after resuming
	resumeAt    int64

	epochSpent  bool  // no epoch left above the highest seen (nextEpoch)
	epochLogged int64 // when that was last logged
	leaving     bool  // shutting down: never promotes
	// heardLater is when this standby, with no live active to follow,
	// began to hear a live member follow an active at a later epoch than
	// its own (its active handed over to a member it does not hear yet):
	// it waits a failover timeout from then for that active (0: not now).
	heardLater int64

	// Planned handovers (handover.go).
	hand      handover
	tookFrom  int    // the handoff this member took: from whom
	tookEpoch uint64 // … at which epoch
	refused   uint64 // the highest epoch it refused (it never takes one at or below it)
	owed      []owed

	// Tokens (tokens.go).
	limit        uint64 // the allocator's limit, as this machine extended it
	floor        uint64 // the highest counter this machine made the allocator observe
	reservedSeen uint64 // the highest reservation seen from an active
	reserving    uint64 // the highest limit a reservation of this member's own began to write (MsgReserving)
	jump         uint64 // a counter of a member back from a later epoch, to serve above
	ready        bool   // the active has made its first reservation (since its promotion or resume)
	jumped       bool   // another active's tokens raised the counter past the reservation: held until one covers it
	op           uint64 // the last reservation's number
	promoteOp    uint64 // the reservation a promotion waits for (0: none)
	promoteWhy   string
	resumeOp     uint64 // the reservation a resume waits for (0: none)
	resumeWhy    string
	steadyOp     uint64 // a reservation for the allocator in flight (0: none)
	wantMore     bool   // the allocator asked again meanwhile
	resErrs      uint64
	resErr       string
	resRetry     int64 // when to retry a failed reservation (0: none)
	resBackoff   int64
	resLog       ratelog.Limiter // failed reservations: a line per 10 s

	// Whoever would lose more stays (contest.go).
	base       Base     // the table this member became active with
	baseKnown  bool     // base.Pos is measured (the promotion's reservation is done)
	baseHanded bool     // base came with a Handoff, its position measured by the old active
	ancestors  Lineage  // base's own lineage (the last entry always None): tables this one holds too
	root       uint64   // a whole base's root, as its active said it (rootOfBase: not known; ownRoot)
	contest    int      // an active later than this one whose verdict it waits for, None
	verdict    []uint64 // by member: its epoch at which this member found it would lose less
	unresolved []int64  // by member: since when it is an earlier active that does not hold (0: not)
	deciding   bool     // an earlier active is heard that does not hold yet, for less than a timeout: hold

	// Readiness.
	refusedBy uint64 // members whose link was refused (a bit each) since the last that came up

	// The gate.
	gateSeq   uint64
	lastGate  Gate
	published bool
	held      bool // the gate published before this input did not serve

	stop      stopping
	stopping  bool // Stop began
	keepTable bool // shut down as the last member: the table is written at Close

	failovers, handovers, demotions uint64
	lagNS                           int64
}

// New returns a member that starts as a standby knowing no active: its
// gate redirects with no address, and it listens for a failover timeout
// before it may promote.
func New(cfg Config) *Member {
	n := len(cfg.Peers)
	m := &Member{cfg: cfg, self: cfg.Self, n: n, timeout: cfg.Timeout,
		role: RoleStandby, active: None, maxEpoch: cfg.StoredEpoch,
		peers: make([]peer, n), names: make([]string, n), differs: make([]bool, n), probeIn: make([]uint64, n),
		verdict: make([]uint64, n), unresolved: make([]int64, n),
		started: cfg.Now, lastTick: cfg.Now, probe: cfg.Probe,
		tookFrom: None, contest: None, limit: cfg.Start, floor: cfg.Start,
		hand: handover{to: None, result: None}, resLog: ratelog.Limiter{Every: 10 * time.Second}}
	for i := range m.peers {
		m.peers[i].follows = None
	}
	m.peers[m.self].storedEpoch = cfg.StoredEpoch
	m.names[m.self] = cfg.Peers[m.self]
	m.base.From = None
	m.ancestors = noLineage()
	return m
}

// Tick advances the clock to now with what the driver measured: freeze
// detection, liveness, promotion, the handover's asks and deadlines,
// heartbeats to every member and the gate (whose Until moves with every
// tick).
func (m *Member) Tick(now int64, l Local) []Action {
	m.begin()
	m.local = l
	for b := l.Busy; b != 0; b &= b - 1 {
		m.heardFrom(now, bits.TrailingZeros64(b))
	}
	m.noticeFreeze(now)
	m.lastTick = now
	if m.epochSpent && (m.epochLogged == 0 || now-m.epochLogged >= 10e9) {
		m.epochLogged = now
		m.logf(slog.LevelError, "no epoch left above the highest seen (2^64-1: a corrupt data dir or a forged message): this member does not promote or hand over",
			"max_epoch", m.maxEpoch)
	}
	m.decide(now)
	m.tickHandover(now)
	m.tickReserve(now)
	m.stopStep(now)
	m.heartbeats()
	m.publish(true)
	return m.out
}

// Step feeds the machine one message at now.
func (m *Member) Step(now int64, msg Msg) []Action {
	m.begin()
	from := msg.From
	valid := from >= 0 && from < m.n && from != m.self
	switch msg.Kind {
	case MsgHeartbeat:
		if valid {
			m.heartbeat(now, from, &msg.HB)
		}
	case MsgHeard:
		m.heardFrom(now, from)
	case MsgJoined:
		if valid {
			m.names[from], m.differs[from] = msg.Name, msg.Differs
			m.refusedBy &^= 1 << from
		}
	case MsgRefused:
		if valid {
			m.refusedBy |= 1 << from
		}
	case MsgLinkUp:
		if valid {
			m.refusedBy &^= 1 << from
		}
	case MsgHandoff:
		if valid {
			m.takeOver(now, from, msg.Epoch, msg.Token, msg.Limit, m.known(msg.Lineage), msg.Root)
		}
	case MsgHandoffAbort:
		if valid {
			m.abortAsked(from, msg.Epoch)
		}
	case MsgAnswer:
		m.handoffAnswer(now, from, msg.Epoch, msg.Taken)
	case MsgSnapshotAcked:
		m.snapshotApplied(from, msg.Epoch)
	case MsgNeedSnapshot:
		if valid && m.role == RoleActive {
			m.emit(Action{Kind: ActResync, To: from})
		}
	case MsgSynced:
		if m.role == RoleStandby && m.active == from && m.epoch == msg.Epoch {
			m.inSync = true
		}
	case MsgDesynced:
		m.inSync = false
		m.reservedSeen = max(m.reservedSeen, msg.Limit)
	case MsgReservedSeen:
		m.reservedSeen = max(m.reservedSeen, msg.Limit)
	case MsgReserved:
		m.reserved(now, &msg)
	case MsgWantTokens:
		m.reserveSoon()
	case MsgReserving:
		m.reserving = max(m.reserving, msg.Limit)
	case MsgStop:
		m.stopBegin(now, msg.Deadline, msg.Set)
	}
	m.stopStep(now)
	m.publish(false)
	return m.out
}

// begin starts a call: no actions yet; whether the gate published before
// it serves is what makes this member's position final (held).
func (m *Member) begin() {
	m.out = m.out[:0]
	m.held = m.published && m.lastGate.State != Serve
}

func (m *Member) emit(a Action) { m.out = append(m.out, a) }

func (m *Member) logf(level slog.Level, msg string, args ...any) {
	m.emit(Action{Kind: ActLog, Log: Log{Level: level, Msg: msg, Args: args}})
}

// name is member i's --peers entry, for the logs.
func (m *Member) name(i int) string {
	if i < 0 || i >= m.n {
		return ""
	}
	return m.cfg.Peers[i]
}

// gate is what the engine does now.
func (m *Member) gate() Gate {
	switch {
	case m.role == RoleActive && m.contest != None:
		// An active that became active later is heard: its clients go
		// there while it decides which of the two steps down; this one
		// executes nothing meanwhile, so its position is final.
		return Gate{State: Redirect, To: m.contest}
	case m.serving() && m.ready && !m.jumped && !m.deciding:
		// Until counts from the last tick, never from now: only the tick
		// notices a freeze, so nothing else (a heartbeat read first after
		// a SIGCONT) may extend it.
		return Gate{State: Serve, To: None, Until: m.lastTick + m.timeout/2}
	case m.role == RoleActive || m.role == RoleHandover:
		return Gate{State: Hold, To: None}
	case m.active >= 0 && m.active != m.self:
		return Gate{State: Redirect, To: m.active}
	}
	return Gate{State: Redirect, To: None}
}

// publish emits the gate when it changed (force: always, a tick moves
// Until), numbered: the driver installs a gate only if no later one is.
func (m *Member) publish(force bool) {
	g := m.gate()
	if !force && m.published && g.State == m.lastGate.State && g.To == m.lastGate.To && g.Until == m.lastGate.Until {
		return
	}
	m.gateSeq++
	g.Seq = m.gateSeq
	m.lastGate, m.published = g, true
	m.emit(Action{Kind: ActGate, Gate: g})
}

// servingNow reports whether the gate serves (Heartbeat.Serving).
func (m *Member) servingNow() bool { return m.gate().State == Serve }

// heartbeats sends this member's heartbeat to every other member, each
// with the probe received last from it and this member's verdict on it.
func (m *Member) heartbeats() {
	role := m.role
	if m.stopping && role == RoleStandby {
		role = RoleLeaving
	}
	hb := Heartbeat{Epoch: m.epoch, Role: role, Active: m.active, InSync: m.inSync,
		Held:  (m.role == RoleActive || m.role == RoleHandover) && m.held,
		Probe: m.nextProbe(), Serving: m.servingNow(),
		TokenLast: m.local.TokenLast, Reserved: max(m.local.TokenLimit, m.limit, m.reservedSeen),
		StoredEpoch: m.peers[m.self].storedEpoch, Mark: m.local.Mark, Pos: m.local.Pos, Lineage: noLineage()}
	if m.role == RoleActive || m.role == RoleHandover {
		hb.Lineage, hb.Root = m.ownLineage(), m.ownRoot()
	}
	for j := range m.n {
		if j == m.self {
			continue
		}
		hb.Echo, hb.Verdict = m.probeIn[j], m.verdict[j]
		m.emit(Action{Kind: ActHeartbeat, To: j, HB: hb})
	}
}

// PeerView is what View says of another member.
type PeerView struct {
	Known, Live, InSync bool
	Role                Role
}

// View is the member as the driver shows it (/status, readiness) and as
// the standby side reads it (which active it follows, at which epoch).
type View struct {
	Role      Role
	Checking  bool // the freeze check, or a contest with a later active, runs
	Serving   bool // the gate serves
	Epoch     uint64
	Active    int
	InSync    bool
	Peers     []PeerView
	Failovers uint64
	Handovers uint64
	Demotions uint64
	LagNS     int64 // standby: its lag as its active last measured it
	// KeepTable: the member shut down as the last one: its table is
	// written at Close like an active's.
	KeepTable bool
	// ReserveErrors counts failed reservations; ReserveErr is the last
	// while they fail.
	ReserveErrors uint64
	ReserveErr    string
	// Unready says why the member is not ready ("" when it is).
	Unready string
}

// View is the member's view at now.
func (m *Member) View(now int64) View {
	v := View{Role: m.role, Checking: m.checking() || m.contest != None, Serving: m.servingNow(), Epoch: m.epoch,
		Active: m.active, InSync: m.inSync, Failovers: m.failovers, Handovers: m.handovers, Demotions: m.demotions,
		LagNS: m.lagNS, KeepTable: m.keepTable, ReserveErrors: m.resErrs, ReserveErr: m.resErr,
		Unready: m.unready(now), Peers: make([]PeerView, m.n)}
	for i := range m.peers {
		if i == m.self {
			continue
		}
		p := &m.peers[i]
		v.Peers[i] = PeerView{Known: p.known, Live: m.live(i, now), InSync: p.inSync, Role: p.role}
	}
	return v
}

// unready says why this member should get no traffic now, "" when it may:
// it serves, or it is a standby that knows its active; and neither is it
// cut off by members that refuse its link (or whose link it refuses: a
// --cluster-secret or certificate that differs, another version), nor
// serving beside an earlier active it cannot resolve.
func (m *Member) unready(now int64) string {
	if m.resErr != "" {
		return "token reservation failing: " + m.resErr
	}
	if m.refusedBy != 0 && !m.anyLive(now) {
		return "no member is live and the member link with " + m.list(m.refusedBy) +
			" is refused (a --cluster-secret, certificate or version that differs): this member cannot learn the others' roles or tokens"
	}
	switch {
	case m.role == RoleActive && m.servingNow():
		for i, since := range m.unresolved {
			if since != 0 && now-since >= 2*m.timeout && m.live(i, now) {
				return "another active, " + m.name(i) + ", became active earlier and does not answer as the rules require: this member cannot resolve the two"
			}
		}
		return ""
	case m.role == RoleStandby && m.active >= 0:
		return ""
	}
	return "no active known"
}

// anyLive reports whether some other member is live at now.
func (m *Member) anyLive(now int64) bool {
	for i := range m.peers {
		if i != m.self && m.live(i, now) {
			return true
		}
	}
	return false
}

// list names the members of a set, for the logs.
func (m *Member) list(set uint64) string {
	s := ""
	for b := set; b != 0; b &= b - 1 {
		if s != "" {
			s += ", "
		}
		s += m.name(bits.TrailingZeros64(b))
	}
	return s
}
