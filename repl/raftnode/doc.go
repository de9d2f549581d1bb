// Package raftnode is a member of a raft cluster (--cluster raft,
// PROTOCOL.md §6.4) on github.com/hashicorp/raft: a repl.Node and a
// repl.Committer. The leader executes requests on its table as a single
// node does; every change that comes out of the table's Sink is numbered
// and proposed, many at a time, as one raft log entry (group commit), and
// answers leave once the entry that carries their changes is committed.
// Every member applies committed entries to its table; a leader that loses
// its leadership abandons what did not commit and rebuilds its table from
// the newest snapshot and the log.
//
// A leader serves only while it holds a lease (lease.go): its gate ends a
// little before the followers that acknowledged it may vote for another,
// counted from when the acknowledged requests were sent, so a leader that
// was frozen executes nothing from its stale state until a majority has
// answered it after resuming (PROTOCOL.md §6.2).
//
// Files: raftnode.go (lifecycle and leadership: gain, lose, rebuild,
// handover, the gate), lease.go (the leader lease, and raft's transport
// with lockd's checks: acknowledgements renew the lease, no term above
// 2^63 enters raft), propose.go (the Sink, the proposer and the committer,
// token reservations), fsm.go (raft's state machine: Apply, Snapshot,
// Restore, and the replay that rebuilds a table), entry.go and snapshot.go
// (the log entry and snapshot formats, records in repl/records' format,
// each with its format version: a member refuses a newer one whole),
// transport.go (raft's TCP stream layer on the member port), logstore.go
// (raft-wal, or raft-boltdb for comparison), durable.go (the leader's log
// fsync in parallel with replication, and what keeps that safe), hclog.go (raft's logger onto
// slog), membership.go (the raft configuration as the membership: member
// IDs, client addresses, repl.Membership's add and remove, the leader's
// handover before its own removal), recover.go (a forced new cluster from
// one member's log: disaster recovery, its token floor, the members left
// behind).
//
// # Concurrency contract
//
// The seam's contract (repl.Node) holds. Goroutines: raft's own; the
// actor (leadership changes, gates, rebuilds, a gate whose lapsed lease
// was renewed); the proposer; the committer; the token reserver; the
// transport's forwarder (requests that pass the term check, to raft); the
// log's syncer (the leader's deferred fsyncs, durable.go: its syncMu, then
// its own mu, taken inside raft-wal's calls and never around one). The
// Sink takes the node's own mutex (mu) under the caller's shard lock;
// FSM.Apply, snapshots and rebuilds take fsmMu, a rebuild then snapMu;
// every gate is published under gateMu (the actor, and the transport's
// and the committer's goroutines renewing the lease). All goroutines end
// by Close.
//
// # What it must not import
//
// raftnode may import lockd/api, lockd/repl, lockd/repl/records,
// lockd/repl/memberauth, lockd/shard, lockd/internal/ratelog,
// github.com/hashicorp/raft, github.com/hashicorp/raft-wal,
// github.com/hashicorp/raft-boltdb/v2, github.com/hashicorp/go-hclog
// (hashicorp's raft libraries) and the standard library. It must not import
// lockd/repl/priority (the two modes share only repl's kernel and the
// records format), lockd/engine, lockd/proto or
// github.com/panjf2000/gnet/v2; it is the only package that imports
// hashicorp's (internal/layers).
package raftnode
