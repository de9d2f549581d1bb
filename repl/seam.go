package repl

import (
	"context"
	"log/slog"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/shard"
)

// Node is what the engine asks of persistence and membership: where the
// lock table's state survives the process (a data directory, standbys, a
// Raft log), how tokens are made safe before they are handed out, and
// whether this process executes requests at all. The engine knows nothing
// of modes; it calls these methods, and the node calls Host back.
//
// Who calls what:
//
//   - Open: engine.New, once, on the caller's goroutine, before anything
//     else. The node builds the table (setting Config.Sink or SinkRef if it streams
//     records) and the token allocator, and restores what it keeps.
//   - Start: the engine's boot (gnet's OnBoot), once, when the client
//     listener is bound and before the first connection is accepted. It
//     must not block for long. From here on the node may call Host from its
//     own goroutines.
//   - Gate: every batch (OnTraffic) and every timer tick, from event loops
//     and the ticker, concurrently: it must be one atomic load.
//   - Records reach the node through Config.Sink, called under a shard lock
//     on whatever goroutine changed the table: the Sink must not block and
//     must not call back into the table. A node may let the table hold
//     exclusive grants back (Config.Defer) and take them when it cuts a
//     batch (Table.LockedTake, or LockedCut to keep the young ones for
//     the next batch); the same rules hold for both.
//   - Stop: the engine's Shutdown, once, on the signal's goroutine, after
//     no batch is running that saw the gate open and before the engine
//     answers anything E 4. A cluster node hands its work to a successor
//     here and returns its address; a single node returns "".
//   - Close: the engine, once, last, after every connection has closed (or
//     after the engine stopped on its own): the node writes what must
//     survive the process and releases its resources. It must return within
//     ctx's deadline whatever the disk does.
//   - Status, Health: the admin endpoint, any goroutine, any time.
//
// The engine never holds a lock of its own while calling a Node method,
// and a Node never holds one of its own while calling Host.
type Node interface {
	// Open builds the lock table from cfg and its token allocator, and
	// restores the state the node keeps. clock is the engine's table clock
	// (monotonic nanoseconds): every deadline in the table is on it.
	Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error)
	// Start begins the node's background work (token reservations, the
	// member link). addr is the client listener's real address.
	Start(addr string, host Host) error
	// Gate says what the engine does with requests now.
	Gate() *Gate
	// Stop is the node's part of a shutdown: it returns the address of the
	// member that took over (the engine then answers M naming it instead of
	// E 4), or "" when the engine must shut down as a single node does.
	Stop(ctx context.Context) (successor string)
	// Close writes what must outlive the process (unless why is
	// FailedStart or Discard) and releases the node's resources (data
	// directory, member link).
	Close(ctx context.Context, why CloseReason) error
	// Status describes the node for /status and /metrics.
	Status() Status
	// Health is nil while the node can serve normally, else why not (a
	// token reservation failing, no active known).
	Health() error
}

// CloseReason says why a node is closed.
type CloseReason uint8

// Close reasons.
const (
	// Shutdown: a graceful shutdown (SIGINT/SIGTERM) after every
	// connection closed.
	Shutdown CloseReason = iota
	// Crashed: the engine stopped on its own; keep what a shutdown keeps.
	Crashed
	// FailedStart: the engine never served; keep what was on disk as it
	// was, and remove a data directory this start created.
	FailedStart
	// Discard: release resources only, as a crash would (tests).
	Discard
)

// String names the reason.
func (r CloseReason) String() string {
	switch r {
	case Shutdown:
		return "shutdown"
	case Crashed:
		return "crashed"
	case FailedStart:
		return "failed start"
	case Discard:
		return "discard"
	}
	return "CloseReason(?)"
}

// Host is the engine as a Node sees it.
type Host interface {
	// GateChanged makes the engine apply the node's current Gate: it waits
	// until no batch is running that read the old one; if the gate no longer
	// serves, every queued acquire is answered M (with the gate's address)
	// or held (Hold); then every connection is woken so requests it left
	// unread are read under the new gate. Safe from any goroutine; it
	// returns once the barrier has passed (the answers may still be on their
	// way).
	//
	// A gate that redirects also ends every watch of the table with an L
	// of reason 4 (PROTOCOL.md §9.4: this member can no longer tell), before
	// GateChanged returns; a gate that holds keeps them (docs/PROTOCOL.md
	// decision 51). So a node that is about to replace its table (a
	// rebuild, Table.Reset, a snapshot from another member) redirects
	// first: the watches are then gone, and the effects of the replacement
	// owe no one an L.
	GateChanged()
	// Committed tells the engine that every record numbered up to seq
	// (see Committer) is committed: answers held for them may leave.
	// Safe from any goroutine; it does not wait for the answers to be
	// written.
	Committed(seq uint64)
	// Abandon tells the engine that records numbered above seq will never
	// commit (a leader lost its leadership with changes in flight): every
	// connection holding answers that wait for them is closed, never
	// answered (the client reports Indeterminate, PROTOCOL.md §6.4); the
	// grants among those answers were never delivered. Safe from any
	// goroutine.
	Abandon(seq uint64)
}

// Committer is implemented by a node whose changes must be committed
// before their answers leave (raft mode, PROTOCOL.md §6.4). The node
// numbers the records its Sink receives 1, 2, 3, … in the order it
// receives them; Barrier returns the number of the last one. After every
// batch (and every timer tick, and every delivery of answers made
// elsewhere) the engine reads Barrier and holds that batch's answers, on
// their connection and in order, until Host.Committed reaches it; a node
// that is not a Committer lets answers leave at once. Barrier is called
// from every event loop and the ticker: it must be one atomic load.
type Committer interface {
	Barrier() uint64
}

// GateState is what the engine does with a well-formed request.
type GateState uint8

// Gate states.
const (
	// Serve: execute requests (the active, the leader, a single node).
	Serve GateState = iota
	// Hold: execute nothing and answer nothing; requests stay unread in
	// their connection's buffer until the gate moves (a planned handoff in
	// progress, a new leader catching up). Timers do not run.
	Hold
	// Redirect: answer every request with M naming Addr (empty: no active
	// known), execute nothing. Timers do not run.
	Redirect
)

// String names the state.
func (g GateState) String() string {
	switch g {
	case Serve:
		return "serve"
	case Hold:
		return "hold"
	case Redirect:
		return "redirect"
	}
	return "GateState(?)"
}

// Gate is a node's instruction to the engine. A node publishes a new *Gate
// (never changes one in place) and then calls Host.GateChanged.
type Gate struct {
	State GateState
	// Addr is the active's or leader's client address for M (Redirect).
	Addr string
	// Until, when not 0, is the instant on the engine's clock after which
	// Serve counts as Hold: the node must publish a new gate before it to
	// keep serving. A node that is frozen (SIGSTOP, a stall) cannot, so a
	// request that queued up meanwhile is not executed from stale state
	// before the node has checked with the other members (PROTOCOL.md
	// §6.2).
	Until int64
}

// Effective is the state the engine applies at now: Hold once Until has
// passed.
func (g *Gate) Effective(now int64) GateState {
	if g.State == Serve && g.Until != 0 && now > g.Until {
		return Hold
	}
	return g.State
}

// Status describes a node: what every mode has, then the part of its mode
// (nil in the others), so that no field means one thing in one mode and
// another in the other.
type Status struct {
	Mode   string // "single", "priority" or "raft"
	Role   string // "active" (single node, priority active), "standby", "leader", "follower", "candidate"
	Self   string // this node's client address
	Active string // the active's or leader's client address, "" if none is known
	// InSync: the member follows a known active or leader closely enough
	// to answer for it (readiness): a priority standby that applied a
	// snapshot and the stream after it, a raft member that knows its
	// leader.
	InSync bool

	TokenReserved uint64 // the reservation mark: no token above it is handed out
	ReserveErrors uint64 // failed reservation attempts since start
	ReserveError  string // the last reservation error while reservations are failing, "" when healthy

	Members []Member // the other members, in --peers order (empty for a single node)

	// MemberRefused counts the member connections refused by the checks of
	// PROTOCOL.md §8.4 and the member port's limits, every reason listed
	// (empty for a single node).
	MemberRefused []Refusal

	Priority *PriorityStatus // a priority member's figures; nil exactly in the other modes
	Raft     *RaftStatus     // a raft member's figures; nil exactly in the other modes
}

// PriorityStatus is a priority member's part of its Status.
type PriorityStatus struct {
	Epoch             uint64  // the epoch of the active this member serves or follows
	LagSeconds        float64 // standby: its lag as its active last measured it (oldest unacknowledged batch)
	Failovers         uint64  // promotions of this member after the active went silent
	Handovers         uint64  // planned handovers this member took part in
	Demotions         uint64  // times this member stepped down for a later active
	SnapshotsSent     uint64
	SnapshotsReceived uint64
	Batches           uint64 // replication batches sent (active) or applied (standby)
	Records           uint64 // the changes in them (a skip record counts as the records it stands for)
	Cancelled         uint64 // of those, the changes that cancelled out in their batch and went as skip records
	RawBytes          uint64 // their size before compression
	WireBytes         uint64 // their size on the member link
}

// RaftStatus is a raft member's part of its Status.
type RaftStatus struct {
	Term          uint64  // raft's current term
	CommitIndex   uint64  // raft's commit index
	AppliedIndex  uint64  // the last index raft handed to the table
	Entries       uint64  // log entries of records this member proposed as leader and saw committed
	EntryRecords  uint64  // the records in them (EntryRecords / Entries: records per entry)
	CommitP50     float64 // seconds from proposing an entry to its commit: median of the last 1024
	CommitP99     float64 // … and their 99th percentile
	Snapshots     uint64  // raft snapshots this member wrote
	SnapshotBytes uint64  // the size of the last one
	Elections     uint64  // times this member became a serving leader
	Rebuilds      uint64  // times its table was rebuilt from the log (leadership lost, a change outside the log)
	// Configuration is the raft configuration as this member knows it
	// (raftnode's membership.go).
	Configuration []api.RaftMember

	// CommitCounts is every commit latency since start by CommitBuckets
	// (not cumulative; the last counts those above every bound), and
	// CommitSum their sum in seconds: a histogram that aggregates.
	CommitCounts [len(CommitBuckets) + 1]uint64
	CommitSum    float64
}

// CommitBuckets are the upper bounds, in seconds, of the raft commit
// latency histogram (Status.CommitCounts): 100 µs to 10 s.
var CommitBuckets = [...]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Member is what a node knows of another member: the admin endpoint's
// type, which /status serves as it is.
type Member = api.Member
