// Package priority is a member of a priority cluster (--cluster priority,
// PROTOCOL.md §6.3): the highest-priority live member is the active and
// streams every change of its table, compressed, to the standbys; a
// standby takes over when the active has been silent for the failover
// timeout; SIGTERM hands over to a successor with nothing lost; two
// actives resolve by epoch; a returning member of higher priority takes
// over by a planned handover. New returns it as a repl.Node.
//
// Files, each calling only the ones below it:
//
//	priority.go  the node: lifecycle, gates, heartbeats, role changes,
//	             promotion, reservations, handover; routes what arrives
//	stream.go    the outbound stream (active → standbys): the Sink's
//	             buffers, batches, snapshots, each standby's acks and lag
//	standby.go   the inbound side (standby): applies batches, snapshots
//	             and reservations, and answers
//	link.go      the member link, transport only: dials, queues, writes,
//	             accepts and reads frames
//	roles.go     the role machine: pure, driven by a clock and heartbeats
//	peers.go     member lists that differ (a rolling change of --peers):
//	             who a connecting member is, what its indexes mean here
//	wire.go      the member link's frames and messages (MEMBER-LINK.md)
//
// (link.go calls peers.go.) The lower files reach the node only through
// what it hands them: the link's linkEvents callbacks, the standby's
// follower interface and the stream's epoch and reservation-mark
// functions.
//
// # Concurrency contract
//
// The seam's contract (repl.Node) holds. Goroutines: the member listener
// and one reader per inbound connection, one writer per outbound link, the
// ticker, the actor (role changes, in order: a handover waits for an
// answer a reader delivers, so readers never carry them out), the flusher,
// the token reserver; a goroutine per shard dump of a snapshot, beside
// the link's writer. Lock order: node applyMu → node mu → a standby's
// target mu → its peer's mu; the table's shard lock is held by the Sink,
// which takes no lock of its own. applyMu is held while a frame of the
// followed active is applied, and taken (as a barrier) by every role
// change away from following it. All goroutines end by Close.
//
// # What it must not import
//
// priority may import lockd/repl, lockd/repl/records, lockd/shard,
// lockd/store and the standard library. It must not import
// lockd/repl/raftnode or hashicorp's libraries (the two modes share only
// repl's kernel and the records format), lockd/engine, lockd/proto or
// gnet (internal/layers).
package priority
