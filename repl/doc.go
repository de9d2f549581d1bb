// Package repl is where lockd's state goes beyond the event loops: the seam
// between the engine and persistence/membership (Node, Host, Gate,
// Committer), and its implementations: Local, a single node durable through
// its data directory; Priority, a member of a priority cluster (roles.go,
// link.go, stream.go, the member link of wire.go and records.go); and Raft,
// a member of a raft cluster on hashicorp/raft (raft*.go).
//
// # What it owns
//
//   - The token reservation policy: tokens are made safe (written to the
//     data directory, replicated, committed) before the allocator hands
//     them out, in a goroutine of the node's own, never on the request path.
//   - What survives a process: the shutdown snapshot and its wall-clock
//     deadlines (the table's clock is this process's monotonic clock; wall
//     time is how deadlines leave it).
//   - Whether this process executes requests (Gate) and, for clusters, the
//     member link, roles and epochs.
//
// # Concurrency contract
//
// Node documents who calls each method on which goroutine. A node's own
// goroutines end by Close. The table's Sink, which a node may set, runs
// under a shard lock and must not block.
//
// # What it must not import
//
// repl may import lockd/shard and lockd/store, the standard library and the
// libraries of its transports (compression, Raft). It must not import
// lockd/engine, lockd/proto, lockd/client, gnet or anything under cmd/: the
// engine depends on repl, not the other way round (internal/layers).
package repl
