// Package priority is a member of a priority cluster (--cluster priority,
// PROTOCOL.md §6.3): the highest-priority live member is the active and
// streams every change of its table, compressed, to the standbys; a
// standby takes over when the active has been silent for the failover
// timeout; SIGTERM hands over to a successor with nothing lost; two
// actives resolve by what each would lose (PROTOCOL.md §6.3); a returning member of higher priority takes
// over by a planned handover. New returns it as a repl.Node.
//
// Every decision is its machine's (package machine: a pure state machine
// with Step and Tick, tested by transcripts); this package drives it and
// does the I/O.
//
// Files, each calling only the ones below it:
//
//	priority.go  the driver: lifecycle, run (one goroutine feeds the
//	             machine its ticks and messages and carries out its
//	             actions), the gate, Stop, Close, Status, Health
//	receive.go   what arrives on the member link, decoded and routed: to
//	             the machine, the stream or the standby side; the
//	             standby side's view of the machine
//	reserve.go   the executor: the machine's reservations (barrier,
//	             epoch, durable mark, the standbys' acks), off run
//	stream.go    the outbound stream (active → standbys): the Sink's
//	             buffers, batches, snapshots, each standby's acks and lag
//	standby.go   the inbound side (standby): applies batches, snapshots
//	             and reservations, and answers
//	link.go      the member link, transport only: dials, queues, writes,
//	             accepts and reads frames
//	auth.go      the link through repl/memberauth (PROTOCOL.md §8.4)
//	peers.go     member lists that differ (a rolling change of --peers):
//	             who a connecting member is, what its indexes mean here
//	messages.go  the member link's messages (MEMBER-LINK.md)
//	frame.go     the member link's framing
//
// (link.go calls peers.go.) The lower files reach the node only through
// what it hands them: the link's linkEvents callbacks, the standby's
// follower interface and the stream's epoch and reservation-mark
// functions.
//
// # Concurrency contract
//
// The seam's contract (repl.Node) holds. Goroutines: run, which alone
// owns the machine (a tick every tenth of the failover timeout, the
// messages the readers hand it through its inbox, the allocator's
// requests, Stop); the executor, which carries out reservations and
// hands their results to run; the member listener and one reader per
// inbound connection; one writer per outbound link; the flusher; a
// goroutine per shard dump of a snapshot, beside the link's writer. run
// publishes the machine's View after every input and before carrying out
// its actions; the standby side reads it under applyMu, which a promotion
// takes (as a barrier) before it serves. Lock order: node applyMu → a
// standby's target mu → its peer's mu; the table's shard lock is held by
// the Sink, which takes no lock of its own. run waits for no other
// goroutine but the engine's GateChanged barrier; the executor and the
// readers wait for run's inbox. All goroutines end by Close.
//
// # What it must not import
//
// priority may import lockd/api, lockd/repl, lockd/repl/priority/machine,
// lockd/repl/records, lockd/repl/memberauth, lockd/shard and the standard
// library. It must not import lockd/repl/raftnode or
// github.com/hashicorp/... (the two modes share only repl's kernel and the
// records format), lockd/engine, lockd/proto or
// github.com/panjf2000/gnet/v2 (internal/layers).
package priority
