// Package engine is lockd's network reactor: gnet v2 event loops that speak
// PROTOCOL.md over TCP, apply requests to a shard.Table and write the
// answers. Connections are accepted by the engine's own goroutine on a
// net.Listener and enrolled in the loops (gnet's acceptor would end the
// whole engine on an accept error; docs/DESIGN.md "Accepting
// connections"). With Config.TLS the port speaks TLS (PROTOCOL.md §8.1):
// gnet has none, so each TLS connection runs on a reader goroutine of its
// own that feeds the same batches (handler.traffic) through the same
// session type, whose wire is then a *tlsConn instead of a gnet.Conn
// (tlsconn.go, the reader; tlssink.go, the writes; docs/DESIGN.md
// "TLS"). A third wire is in-process: Server.OpenLocal gives a LocalConn,
// through which a program in the same process (the HTTP front, package
// httpapi) sends frames and takes the
// answers, on a session like any other (local.go, docs/DESIGN.md "The
// HTTP front"); an answer is delivered once the front has taken it.
//
// It owns the connections (sessions), the per-connection mailboxes through
// which answers made elsewhere reach their connection (a handoff caused by
// another connection's release, a timer's T or expiry handoff, a watch's
// pushed L), the delivered-or-not bookkeeping of grants (PROTOCOL.md §4: a
// grant that never reached its socket is released at once, a shared
// holder's as an exclusive one's), the gate a repl.Node sets (serve, hold,
// or redirect with M; a redirect ends every watch with L 4), the answers
// held until a committing node's changes commit (commit.go), and the
// shutdown sequence of §4 and §9.6. The requests of §9 — S, V, W, I —
// take the same path as A, R and K (shared.go).
// Persistence, token reservations and membership are the node's
// (repl.Node, docs/DESIGN.md "The seam"); the engine knows no cluster mode.
//
// With an ACL (Config.ACL, package acl) it also owns each connection's
// identity and the checks of PROTOCOL.md §8.3 (auth.go): the hello, E 5
// and E 6 in the validation order, grants made to the identity and
// released or renewed only by it or an admin, the reload of the file
// (SetACL), and the admin endpoint's release (AdminRelease).
//
// Concurrency: gnet calls OnTraffic, OnOpen and OnClose of one connection on
// that connection's event-loop goroutine; OnTick on its own goroutine; the
// accept goroutine only enrolls, starts (TLS) or closes new connections. A
// TLS connection's reader goroutine plays its event loop: it runs the
// handshake, every batch and the close; its flusher goroutine, started
// only while the kernel does not take its records, touches nothing but
// the sink's buffers (under the sink's mutex, a leaf lock). A local
// connection's batches run on the goroutine that Sends (inline) or on its
// driver goroutine (mail, commits, gate changes), one at a time under its
// run mutex, which plays the event loop; its close runs there too. Every batch and
// tick holds the batch barrier's read lock from the gate it reads to the
// write of its answers; the node's gate changes take its write lock. A
// closing connection with more queued acquires than OnClose drops at once
// has the rest dropped on a goroutine of its own (OnShutdown waits for it). A
// session's loop-owned fields are touched only from its loop; its mailbox is
// guarded by a small mutex that is never held across a table call, a Write
// or a Wake. Table calls take only shard locks. No callback does I/O other
// than its own connection's write, and nothing on the request path waits:
// when no token is reserved an acquire is answered B.
//
// engine may import lockd/proto, lockd/shard, lockd/repl, lockd/acl,
// lockd/internal/ratelog (its log lines of refusals, one a second),
// github.com/panjf2000/gnet/v2, golang.org/x/sys and the standard library
// (crypto/tls included). It must not import lockd/store (the node owns the
// data directory), lockd/client, lockd/admin, lockd/cmd/... or
// lockd/tlsconf (it takes a *tls.Config).
package engine
