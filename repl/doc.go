// Package repl is where lockd's state goes beyond the event loops: the seam
// between the engine and persistence/membership (Node, Host, Gate,
// Committer, Status) and what every node shares, with the single node,
// Local, durable through its data directory. The cluster modes are nodes
// in packages of their own: repl/priority (a priority cluster) and
// repl/raftnode (a raft cluster on hashicorp/raft); both replicate the
// format of repl/records. cmd/lockd picks the node: NewLocal (or none:
// the engine's default), priority.New or raftnode.New.
//
// Files: seam.go (the interfaces and the Status a node reports),
// local.go (Local), and the kernel the modes share: cluster.go (the
// cluster configuration, member addresses, FieldError), datadir.go (the
// one data-directory opener: token mark, shutdown snapshot, wall-clock
// floor, cleanup after a failed start), reserve.go (the token reserver),
// members.go (Membership: what a node whose members change while it runs
// — raft's — offers the admin endpoint).
//
// # What it owns
//
//   - The token reservation policy: tokens are made safe (written to the
//     data directory, replicated, committed) before the allocator hands
//     them out, in a goroutine of the node's own, never on the request path.
//   - What survives a process: the shutdown snapshot and its wall-clock
//     deadlines (the table's clock is this process's monotonic clock; wall
//     time is how deadlines leave it).
//   - Whether this process executes requests (Gate).
//
// # Concurrency contract
//
// Node documents who calls each method on which goroutine. A node's own
// goroutines end by Close. The table's Sink, which a node may set, runs
// under a shard lock and must not block. Reserver's Health and Status are
// safe from any goroutine; a DataDir is its node's alone.
//
// # What it must not import
//
// repl may import lockd/api, lockd/shard, lockd/store,
// lockd/internal/ratelog and the standard library. It must not import
// lockd/repl/... (its subpackages: they import it),
// github.com/hashicorp/..., lockd/engine, lockd/proto, lockd/client,
// github.com/panjf2000/gnet/v2 or lockd/cmd/...: the engine depends on repl,
// not the other way round (internal/layers).
// No message of its names a daemon flag: configuration errors are
// FieldErrors, which cmd/lockd words with the flag.
package repl
