// Package engine is lockd's network reactor: a gnet v2 server that speaks
// PROTOCOL.md over TCP, applies requests to a shard.Table and writes the
// answers.
//
// It owns the connections (sessions), the per-connection mailboxes through
// which answers made elsewhere reach their connection (a handoff caused by
// another connection's release, a timer's T or expiry handoff), the
// delivered-or-not bookkeeping of grants (PROTOCOL.md §4: a grant that never
// reached its socket is released at once), the gate a repl.Node sets
// (serve, hold, or redirect with M), and the shutdown sequence of §4.
// Persistence, token reservations and membership are the node's
// (repl.Node, docs/DESIGN.md "The seam"); the engine knows no cluster mode.
//
// Concurrency: gnet calls OnTraffic, OnOpen and OnClose of one connection on
// that connection's event-loop goroutine; OnTick on its own goroutine. A
// closing connection with more queued acquires than OnClose drops at once
// has the rest dropped on a goroutine of its own (OnShutdown waits for it). A
// session's loop-owned fields are touched only from its loop; its mailbox is
// guarded by a small mutex that is never held across a table call, a Write
// or a Wake. Table calls take only shard locks. No callback does I/O other
// than its own connection's write, and nothing on the request path waits:
// when no token is reserved an acquire is answered B.
//
// engine may import lockd/proto, lockd/shard, lockd/repl, gnet and
// golang.org/x/sys. It must not import lockd/store (the node owns the data
// directory), lockd/client, lockd/admin or anything under cmd/.
package engine
