// Package engine is lockd's network reactor: a gnet v2 server that speaks
// PROTOCOL.md over TCP, applies requests to a shard.Table and writes the
// answers.
//
// It owns the connections (sessions), the per-connection mailboxes through
// which answers made elsewhere reach their connection (a handoff caused by
// another connection's release, a timer's T or expiry handoff), the
// delivered-or-not bookkeeping of grants (PROTOCOL.md §4: a grant that never
// reached its socket is released at once), the token reserver goroutine, and
// the shutdown sequence of §4.
//
// Concurrency: gnet calls OnTraffic, OnOpen and OnClose of one connection on
// that connection's event-loop goroutine; OnTick on its own goroutine. A
// closing connection with more queued acquires than OnClose drops at once
// has the rest dropped on a goroutine of its own (OnShutdown waits for it). A
// session's loop-owned fields are touched only from its loop; its mailbox is
// guarded by a small mutex that is never held across a table call, a Write
// or a Wake. Table calls take only shard locks. No callback does I/O other
// than its own connection's write; the one wait is shard.Tokens.Next if the
// token reserver's disk falls a whole half-block behind the grants.
//
// engine may import lockd/proto, lockd/shard, lockd/store and gnet. It must
// not import lockd/client or anything under cmd/.
package engine
