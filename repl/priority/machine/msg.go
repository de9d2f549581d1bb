package machine

import "log/slog"

// None is the member index that names nobody (no active known, no base).
const None = -1

// Heartbeat is what a member says of itself to another every tenth of the
// failover timeout (docs/MEMBER-LINK.md). Member indexes are the
// receiver's: the driver translates the sender's on the connection that
// carries them.
type Heartbeat struct {
	Epoch  uint64 // the sender's epoch as the active, or the epoch of the active it follows
	Role   Role
	Active int  // the active the sender follows (or is), None
	InSync bool // a standby in sync with the active it follows
	// Held: the sender, an active, has executed nothing since before it
	// read Pos, and will not before its next heartbeat: Pos is final for
	// the comparison of "Whoever would lose more stays".
	Held bool
	// Serving: the sender's gate serves (an active that promoted, took a
	// handover or resumed has made its first reservation).
	Serving     bool
	Probe       uint64 // the sender's heartbeat number
	Echo        uint64 // the probe the sender received last from the receiver
	TokenLast   uint64 // the highest token the sender issued or saw
	Reserved    uint64 // the highest reservation it made or saw
	StoredEpoch uint64 // the epoch in its data directory
	LagNS       uint64 // an active to a standby in its stream: that standby's lag (the driver fills it)
	// Mark is the reservation mark in the sender's data directory: above
	// every token it ever issued, also before a restart.
	Mark uint64
	// Pos is the sender's position: every change its table made or
	// applied, counted per shard from the table's start (the sum of the
	// shards' record sequences). Positions of one active's table and of
	// its standbys' copies count alike.
	Pos uint64
	// Verdict, to an active that became active earlier than the sender,
	// is that active's epoch when the sender found that it would lose
	// less by stepping down than the sender: it steps down (0: none).
	Verdict uint64
	// Lineage is the sender's, when it is an active or hands over
	// (otherwise every entry names None), and Root its root (Member.ownRoot).
	Lineage Lineage
	Root    uint64
}

// Base is the table a member became active with: the active it had
// followed and at which epoch, when the member held that active's whole
// table (a complete snapshot and the stream after it; From is None
// otherwise), and the member's position at that moment.
type Base struct {
	From  int
	Epoch uint64
	Pos   uint64
}

// LineageLen is how many earlier actives' tables a lineage names.
const LineageLen = 4

// Lineage is what an active's table holds of earlier actives' tables,
// nearest first: its base, then its base's active's base, and so on —
// each the whole table of member From while it was active at Epoch, as it
// was at position Pos. A standby that promotes with its active's whole
// table holds all of that active's lineage too, so a frozen ex-active met
// later is judged by what the chain applied from it (contest.go). Entries
// whose From is None name nothing (the first may still carry the base's
// Pos); past LineageLen tables, the oldest are forgotten, and an
// ex-active met after that many promotions counts all of its position.
type Lineage [LineageLen]Base

// MsgKind says what a Msg carries.
type MsgKind uint8

// Kinds of Msg.
const (
	// MsgHeartbeat: From's heartbeat (HB).
	MsgHeartbeat MsgKind = iota + 1
	// MsgHeard: any other frame from From arrived: it is live.
	MsgHeard
	// MsgJoined: From connected; Name is its own --peers entry, Differs
	// whether its --peers differs from this member's.
	MsgJoined
	// MsgRefused: a link with From was refused (the exchange of
	// PROTOCOL.md §8.4 or a Hello that differs), in either direction;
	// MsgLinkUp: one was established. They decide readiness.
	MsgRefused
	MsgLinkUp
	// MsgHandoff: From offers this member a planned handover at Epoch,
	// above Token (its last) and Limit (its reservation); Lineage and
	// Root are From's, which the successor takes as its own.
	MsgHandoff
	// MsgHandoffAbort: From asks this member to decide the handover at
	// Epoch.
	MsgHandoffAbort
	// MsgAnswer: From's verdict on this member's handover: Taken at
	// Epoch, or refused for every epoch up to Epoch.
	MsgAnswer
	// MsgSnapshotAcked: From applied this member's snapshot, sent at
	// Epoch (the stream resolved its Ack(snapshot)).
	MsgSnapshotAcked
	// MsgNeedSnapshot: From asks this member for a snapshot.
	MsgNeedSnapshot
	// MsgSynced: this member applied a whole snapshot of From sent at
	// Epoch (the standby side).
	MsgSynced
	// MsgDesynced: this member's copy is out of sync (a snapshot began,
	// a batch was malformed); Limit is a reservation it carried (0: none).
	MsgDesynced
	// MsgReservedSeen: the active's reservation up to Limit is durable
	// here.
	MsgReservedSeen
	// MsgReserved: reservation Op is done: tokens up to Limit are safe
	// (Err empty), Token is the counter then, Pos this member's position
	// after the reservation's barrier.
	MsgReserved
	// MsgWantTokens: the allocator wants a reservation.
	MsgWantTokens
	// MsgReserving: reservation Op is about to make tokens up to Limit
	// durable here and on the standbys (sent before anything is written,
	// so before any standby can report Limit back as its mark).
	MsgReserving
	// MsgStop: shut down (PROTOCOL.md §6.2); Deadline is when a handover
	// in progress is given up (the caller's context), Set the members
	// being sent a snapshot now.
	MsgStop
)

var msgNames = [...]string{MsgHeartbeat: "heartbeat", MsgHeard: "heard", MsgJoined: "joined", MsgRefused: "refused",
	MsgLinkUp: "link-up", MsgHandoff: "handoff", MsgHandoffAbort: "handoff-abort", MsgAnswer: "answer",
	MsgSnapshotAcked: "snapshot-acked", MsgNeedSnapshot: "need-snapshot", MsgSynced: "synced", MsgDesynced: "desynced",
	MsgReservedSeen: "reserved-seen", MsgReserved: "reserved", MsgWantTokens: "want-tokens", MsgStop: "stop", MsgReserving: "reserving"}

// String names the kind.
func (k MsgKind) String() string { return NameOf(msgNames[:], uint8(k), "MsgKind") }

// Msg is one input of Step: a decoded message of another member, or the
// news of something the driver did or measured. Which fields count
// depends on Kind.
type Msg struct {
	Kind     MsgKind
	From     int
	HB       Heartbeat
	Epoch    uint64
	Token    uint64
	Limit    uint64
	Op       uint64
	Pos      uint64
	Taken    bool
	Differs  bool
	Err      string
	Name     string
	Deadline int64
	Set      uint64
	Lineage  Lineage
	Root     uint64
}

// Local is what the driver measures of this member before each Tick.
type Local struct {
	TokenLast  uint64 // the allocator's last token
	TokenLimit uint64 // … and its reserved limit
	Mark       uint64 // the data directory's reservation mark
	Pos        uint64 // the table's position (Heartbeat.Pos)
	// Busy: the members (a bit each) a frame of which a reader is
	// processing now, for less than ten failover timeouts: heard.
	Busy uint64
	// Snapshotting: the members being sent a snapshot (queued or begun):
	// their tables are being replaced, none is a successor.
	Snapshotting uint64
}

// ActionKind says what an Action asks.
type ActionKind uint8

// Kinds of Action. The driver carries them out in order.
const (
	// ActGate: publish Gate (then tell the engine, which waits for the
	// batches that saw the old one).
	ActGate ActionKind = iota + 1
	// ActHeartbeat: send HB to member To (the driver fills LagNS).
	ActHeartbeat
	// ActHandoff: offer member To the handover at Epoch, with this
	// member's last token and max(reservation, Limit) read now — plus
	// Reserve.Block past max(reservation, last token) when a reservation
	// asked for may still be made (the standbys record it, and the
	// successor must start above every mark they can report), and this
	// member's Lineage and Root.
	ActHandoff
	// ActHandoffAbort: ask member To to decide the handover at Epoch.
	ActHandoffAbort
	// ActAnswer: answer member To's handover: Taken at Epoch, or refused
	// up to Epoch.
	ActAnswer
	// ActFollow: this member follows member To: the stream stops and To
	// is asked for a snapshot.
	ActFollow
	// ActStream: the outbound stream collects records (On) or stops.
	ActStream
	// ActFlush: cut and queue a batch of everything buffered now.
	ActFlush
	// ActResync: send member To a new snapshot (Stale: only if it is not
	// in the stream, or it has been out of sync — InSync false — for two
	// failover timeouts since the last one began).
	ActResync
	// ActObserve: the allocator's counter goes to at least Token.
	ActObserve
	// ActExtend: the allocator may hand out tokens up to Limit.
	ActExtend
	// ActReserve: carry out Reserve; its MsgReserved follows.
	ActReserve
	// ActLog: log Log.
	ActLog
	// ActStopped: Stop's answer: member To took over (None: shut down as
	// the last member).
	ActStopped
)

var actNames = [...]string{ActGate: "gate", ActHeartbeat: "heartbeat", ActHandoff: "handoff", ActHandoffAbort: "handoff-abort",
	ActAnswer: "answer", ActFollow: "follow", ActStream: "stream", ActFlush: "flush", ActResync: "resync",
	ActObserve: "observe", ActExtend: "extend", ActReserve: "reserve", ActLog: "log", ActStopped: "stopped"}

// String names the kind.
func (k ActionKind) String() string { return NameOf(actNames[:], uint8(k), "ActionKind") }

// Action is one thing the machine asks the driver to do.
type Action struct {
	Kind    ActionKind
	To      int
	On      bool // ActStream
	Taken   bool // ActAnswer
	Stale   bool // ActResync
	InSync  bool // ActResync
	Epoch   uint64
	Token   uint64
	Limit   uint64
	Gate    Gate
	HB      Heartbeat
	Reserve Reserve
	Log     Log
	Lineage Lineage // ActHandoff
	Root    uint64  // ActHandoff
}

// Gate is the engine's instruction: Serve (until Until on the table's
// clock, after which it counts as Hold: only a ticking member keeps
// serving), Hold, or Redirect to member To (None: no active known). Seq
// numbers the gates this member computed.
type Gate struct {
	State GateState
	To    int
	Until int64
	Seq   uint64
}

// Reserve is a token reservation for the driver to carry out, off its
// own goroutine (a disk write, and the standbys' acknowledgements).
type Reserve struct {
	Op uint64
	// Epoch: store this epoch in the data directory first (0: none).
	Epoch uint64
	// Barrier: first wait until no frame of an active this member
	// followed is being applied (a promotion: nothing of the former
	// active lands in the table from here on).
	Barrier bool
	// Floor: the counter goes above the wall clock plus Floor
	// nanoseconds (0: no wall-clock floor).
	Floor int64
	// Start: the counter goes above Start.
	Start uint64
	// Block: reserve up to max(limit, counter) + Block.
	Block uint64
	// Replicate: every standby in the stream records the reservation
	// durably and acknowledges it (or is resynced) before it counts.
	Replicate bool
}

// Log is a line to log.
type Log struct {
	Level slog.Level
	Msg   string
	Args  []any
}
