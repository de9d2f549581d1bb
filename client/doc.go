// Package client is the Go client library of lockd: take a named lock with
// a bounded wait and a lease, get its fencing token, keep the lease alive
// while you work, release it.
//
// # Quick start
//
// Create one Client per process and share it between goroutines:
//
//	cl, err := client.New(client.Config{Addrs: []string{"127.0.0.1:7070"}})
//	if err != nil {
//		return err
//	}
//	defer cl.Close()
//
// WithLock takes the lock, runs fn while renewing the lease, and releases
// it; fn passes the fencing token to the resource it protects (see package
// fence) and stops when its context ends:
//
//	err = cl.WithLock(ctx, "reports/nightly", client.AcquireOptions{Wait: 10 * time.Second, Lease: 30 * time.Second},
//		func(ctx context.Context, l client.Lock) error {
//			return store.Write(ctx, l.Token, report)
//		})
//	switch {
//	case err == nil:
//		// done, lock released
//	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrBusy):
//		// lockd answered: the lock is held elsewhere (or lockd is full); skip this run
//	case errors.Is(err, client.ErrNoConnection):
//		// lockd is unreachable: an outage, not a busy lock; alert or retry later
//	case errors.Is(err, client.ErrIndeterminate):
//		// the lock may or may not have been granted: fn did not run; its lease frees it
//	case errors.Is(err, client.ErrLockLost):
//		// fn was cut short: the lock could no longer be shown to be held
//		// (whatever fn returned from its ended context)
//	default:
//		// fn's own error, a *ServerError, ctx.Err()
//	}
//
// For explicit control: Acquire, then KeepAlive while working, then
// Release (see the examples). AcquireAsync and ReleaseAsync keep many
// requests in flight from one goroutine; Ping measures a round trip.
//
// # More than one holder, and asking lockd
//
// A Semaphore hands out up to N permits of a key at once, fleet-wide; an
// RWMutex any number of read locks or one write lock. Both are shaped
// like the standard library's and hand out a Held, kept until its
// Release (renewed and watched, as below):
//
//	sem := cl.Semaphore("exports/slots", 4, client.HoldOptions{Lease: 30 * time.Second})
//	permit, err := sem.Acquire(ctx) // waits until ctx is done
//	if err != nil {
//		return err
//	}
//	defer permit.Release()
//	return export(permit.Context(), permit.Token()) // Context ends if the permit is lost
//
// They are built on AcquireShared (PROTOCOL.md §9.2: S, up to limit
// holders, each with its own token and lease; FIFO, so a writer waiting
// at the head holds back later readers). Validate asks whether a token
// is a current holder and how much lease it has left (§9.3; what
// fence.Validating uses), Inspect how many hold and wait for a key
// (§9.5), and Watch follows one grant until lockd reports its end
// (§9.4). A lockd older than §9 answers these requests E 1 and closes
// the connection: the client says ErrUnsupported, not executed, sends
// again elsewhere what the server did not read after it, and sends that
// server no §9 request again until its connection ends for another
// reason.
//
// # Outcomes
//
// Every error of Acquire except ErrIndeterminate (and errors matching it)
// means that nothing was granted to the caller. ErrTimeout and ErrBusy
// mean that lockd was reachable and the lock is held elsewhere (or lockd
// is full); ErrNoConnection means no server could be reached before the
// call's deadline, and carries the reason: the dial error; ErrRejected for
// a server that accepted and closed at once, as lockd does at
// --max-conns; a TLS failure, named as such and matching ErrTLS (a failed
// handshake, a client certificate refused or missing, or a plaintext
// client on a TLS port, which lockd answers with one plaintext E 1 saying
// so). An invalid key's error says what is wrong with it (ErrInvalidKey). A command-line
// tool sets Config.FailFast to fail at once when no server can be reached
// at all.
//
// The caller's wait is honoured to the millisecond: an acquire whose wait
// ends before the server answered returns ErrTimeout then, keeps its
// connection, and a grant that arrives later for it is released at once
// (a compensating release of that exact token). A cancelled ctx ends the
// call the same way, with ctx's error. ErrIndeterminate is for a
// connection lost, or a wait-0 acquire's transport deadline passing, with
// the request possibly sent.
//
// # TLS and identities
//
// Config.TLS makes every connection TLS (LoadTLS reads the CA bundle,
// client certificate and key, and server name from PEM files); the
// handshake is part of the dial. Config.Identity and Config.Secret
// (LoadSecret reads a secret file) authenticate the client to a server
// started with --acl (docs/PROTOCOL.md §8 in the repository):
//
//	tlsCfg, err := client.LoadTLS(client.TLSFiles{CA: "ca.pem"})
//	secret, err := client.LoadSecret("/etc/orders/lockd-secret")
//	cl, err := client.New(client.Config{Addrs: addrs, TLS: tlsCfg, Identity: "orders", Secret: secret})
//
// With an identity, a hello (H) is the first frame of every connection
// the client opens, written before the connection takes any request;
// requests are pipelined behind it at once, without waiting for the
// welcome, since the server judges them by the hello's outcome, in
// order. A server without --acl answers every hello and checks nothing.
// The secret is sent in the hello and nowhere else: a Secret prints as
// "[redacted]", and no error carries it.
//
// Outcomes, all definitive — the request was not executed, and it is not
// sent again on another connection, where the same credentials would fail
// the same way:
//
//   - ErrUnauthenticated (E 5): the server refused the hello (unknown
//     identity or wrong secret), or the request came on a connection that
//     has no identity. The server then closes the connection. Every request
//     pipelined behind a refused hello fails with ErrUnauthenticated too,
//     not ErrIndeterminate: the hello was the connection's first frame, so
//     nothing on it ran. The same holds for an E 5 on a connection that
//     sent no hello and offered no client certificate. (An E 5 to a request
//     on a connection whose hello had been welcomed — a reload of the ACL
//     file removed the identity — fails that request; the others on the
//     connection are judged by the usual rules: a lost connection.) Until
//     a hello is welcomed again, a call that finds no live connection fails
//     at once with ErrUnauthenticated; connections are redialled in the
//     background as usual, so a fixed ACL file is picked up.
//   - ErrPermissionDenied (E 6): the identity may not lock that key (outside
//     its prefixes, or a monitor identity). The connection stays open.
//     A KeepAlive whose renewal is refused (E 5, E 6) reports the lock lost
//     at once.
//
// A TLS server that refuses the client's certificate after the client's
// side of the handshake is done (TLS 1.3 does it with the first read)
// read none of the requests sent: they count as definitely unsent, and,
// as with a failed handshake, the call ends with ErrNoConnection and the
// reason — at once when no other connection is up, until a connection
// reads an answer again. So does a connection whose first frame from the
// server is an E 1: lockd's TLS port answers a plaintext client that way
// ("this port speaks TLS only"), having executed nothing it sent.
//
// # Clusters
//
// Give Config.Addrs every member's address. A member that is not the
// active answers M, naming the active: the request, not executed there, is
// sent to that address with the same owner and deadline, and the client
// sends everything there until it answers M itself or dies. An M without
// an address (no active known yet) makes the client pause
// Config.RetryPause and try another member, within the call's deadline.
// An M may name an address not in Config.Addrs; at most MaxRedirectAddrs
// of those keep connections, the least recently named dropped first.
//
// The client keeps every obligation that lockd's protocol puts on clients
// (docs/PROTOCOL.md §7 in the repository); the rest of this comment says
// how.
//
// # What it owns
//
// Connections: one persistent TCP (or TLS) connection per address, two when a single
// address is given (Config.ConnsPerAddr overrides). A connection that drops
// is excluded at once and dialled again in the background every
// Config.ReconnectInterval (3 s). Requests are pipelined: a request is
// queued on a connection and the goroutine that finds no write in progress
// flushes the queue — its own request and every request queued meanwhile —
// with one Write per batch (there is no writer goroutine, so no hand-off per
// request); each request's frame is encoded just before its batch is
// written. One reader goroutine per connection parses answers with
// proto.ParseResponse and hands each to its request: acquires, shared
// or not, by owner; releases, renews, validates and watches by (op,
// token); pings and inspects by nonce; M and E by (op, id); a pushed L
// to the watch its token registered on that connection. Requests with
// equal keys are answered in send order. Connections are
// chosen round-robin by batch: the requests queued while a batch forms go
// to one connection, and once it is taken for writing the next requests go
// to the next live connection (per-request round-robin would cut every
// batch into as many pieces as there are connections; the benchmark shows
// the cost). An M answer makes the address it names preferred.
//
// Acquire semantics:
//
//   - Each call has one fresh random owner and one monotonic deadline:
//     the end of the caller's wait, now + Wait. Wait is 0..255 s; a longer
//     one is rejected with ErrInvalidWait (there is no infinite wait on the
//     wire; loop to wait longer). The wire wait is recomputed by the writer
//     just before the send: the remaining time rounded up to whole seconds,
//     capped at 255. A request still unsent at the deadline is never sent:
//     ErrTimeout if it was queued on a live connection, ErrNoConnection
//     (with the last dial error, or ErrRejected) if no connection was
//     available — never ErrTimeout, since no holder was the reason.
//   - The deadline decides: when it passes before the answer (a T may come
//     up to a second later, the wire wait being rounded up), the call
//     returns ErrTimeout at that moment, definitive for the caller, and the
//     connection stays. A stand-in takes the request's place in the pending
//     table and takes its answer when it comes: a T or B is dropped, an A
//     is released at once (Release's retries, exact token). If no answer
//     has come by the send plus the wire wait plus Config.AnswerAllowance
//     (1 s), the server is not answering: the connection is closed. A
//     cancelled ctx ends the call the same way, with ctx's error.
//   - A request is sent again, on another connection with the same owner
//     and deadline, only while it is definitely unsent (no connection, or
//     its connection died before the writer took it, or the server refused
//     the connection before answering anything on it: it closed it within
//     a second of the dial without a byte, or said E 1 or a TLS alert
//     first). Once it may have been sent it is never resent: a lost
//     connection gives ErrIndeterminate.
//   - The delivery gate: an A that the caller takes after the call's
//     deadline (the end of its wait; for wait 0 the transport deadline), or
//     after ctx ended, is released again in the background (Release's
//     retries, exact token), and the call ends as the deadline or ctx
//     decides: ErrTimeout, ctx's error, or for wait 0 ErrIndeterminate. T
//     and B are always definitive.
//   - Wait 0 is a single server attempt with one 5 s transport deadline
//     (Config.TransportTimeout) for the whole call: to find a connection,
//     send and be answered. When it passes with the request possibly sent,
//     the connection is closed and the result is ErrIndeterminate. No
//     connection in time: ErrNoConnection.
//   - M (not executed): the client connects to the address given, prefers
//     it from then on, and sends the request there again, same owner and
//     deadline. An M without an address (that node knows no active either)
//     drops the preference for it; after Config.RetryPause (100 ms) the
//     request goes to another node if one is up, until the deadline. So
//     does an M naming a node that is down (its last dial failed or its
//     connection ended): the member that answered may not know yet. An
//     address not in Config.Addrs gets Config.ConnsPerAddr connections of
//     its own; beyond MaxRedirectAddrs such addresses, the one least
//     recently named by an M is dropped: no new request goes there, and
//     its connections close once nothing sent on them awaits an answer.
//     E 4 (server shutting down, not executed) also pauses and sends
//     again. E 5 and E 6 are ErrUnauthenticated and ErrPermissionDenied
//     (above). Other E codes are returned as *ServerError.
//   - Lock.Expires is the send instant of the granting request plus the
//     lease: conservative, since the server's lease starts later.
//
// Release (and ReleaseAsync, which sends at once and waits in Wait)
// retries for Config.ReleaseRetry (5 s) at
// Config.ReleaseRetryInterval (200 ms) across connections, following M as
// acquires do; Renew retries until Config.TransportTimeout. Both act on
// the exact token only, which makes a resend harmless to the lock table.
// One reading changes: when a Release had to be resent because its
// connection was lost after it was sent, its ErrNotHeld may mean that the
// first attempt released the lock and only its answer was lost — the lock
// is free either way, but the error no longer proves that the lease had
// ended before the release (the chaos checkers read it so, docs/RELIABILITY.md).
//
// KeepAlive renews in the background every third of the lease and reports
// the lock lost (Lost, Err, a cancelled Context) on an N, on Close, or
// when StopBy — Lock.Expires less KeepAliveOptions.Margin — passes without
// a renewal. It also watches the lock (one W, PROTOCOL.md §9.4, on a
// connection to the member that serves): lockd pushes the grant's end —
// released from elsewhere, expired, forced by an operator — and the lock
// is lost at once (a *GrantEndedError), not at the next renewal. When
// that member can no longer tell (an L with reason 4: it is stopping or
// stepping down) or the connection is lost, the keep-alive renews at once
// and watches again where the cluster serves now. A server's bound on
// watches per connection (E 8) sends the watch to another connection, or,
// with every connection full, leaves the lock to its renewals and tries
// the watch again a renewal interval later. A bare Acquire's Lock is not
// watched: it has no signal to give (Watch follows any grant on request),
// and the pipelined path of AcquireAsync and ReleaseAsync sends nothing
// more than it did. Each renewal has a window of half the interval (at least
// 250 ms, at most Config.TransportTimeout), not the transport timeout: a
// renewal unanswered in it closes its connection, and the next goes to
// another connection, so a frozen member of a cluster costs a fraction of
// the lease, and the renewal reaches the member that took over in time.
// WithLock is Acquire, KeepAlive, fn, Release; a lost lock is ErrLockLost
// as soon as fn returns.
//
// A release, renew or ping left without an answer when its call's window
// ends, after half a Config.TransportTimeout or more, closes its connection
// (it is taken to be broken), and so does a write blocked a whole one. A
// request given up on with its answer outstanding leaves a stand-in in the
// pending table that takes that answer when it comes, so that it is never
// matched to a later request with the same id (a renew's late K to the
// next renew of that token); a stand-in acquire releases a grant it gets.
// The goroutine that flushes a batch may thus spend up to that long in
// Write on behalf of others. A write that fails (blocked that long, or
// the server reset the connection) does not fail the connection at once:
// the reader first takes, for up to 100 ms, the answers that had already
// arrived — a grant, or the E 5 of a server that refused the connection
// and closed it — so they decide their requests instead of a blanket
// ErrIndeterminate; then the connection fails with the write's error. No
// new batch is written on it meanwhile.
//
// Close ends every goroutine the client started and fails every pending
// call with ErrClosed (a call that may have been executed — an acquire,
// release or renew possibly sent — fails with an error matching both
// ErrClosed and ErrIndeterminate). A grant taken at Wait after Close is
// not handed out either: the lease ends it.
//
// # Concurrency
//
// A Client is safe for concurrent use by any number of goroutines. A
// Ticket (from AcquireAsync) or Releasing (from ReleaseAsync) belongs to
// the goroutine that calls its Wait, exactly once.
//
// # Cost of a call
//
// A blocking call parks its goroutine until the reader wakes it: on one
// channel receive (no select, no timer operation) when ctx is
// context.Background. Deadlines are kept by one AfterFunc timer per
// recycled Ticket, left armed across calls when it would only ring early;
// an early ring re-arms it. Wake-ups are hints: a waiter always decides by
// its request's state under the connection's mutex. No lock is held
// across a network write or a channel send that can block; each connection's mutex guards its queue, its pending
// requests and the result fields of the requests attached to it.
//
// # What it must not import
//
// client may import lockd/proto and the standard library (crypto/tls for
// TLS). It must not import github.com/panjf2000/gnet/v2 or lockd/engine.
// The client is a module of its own
// (client/go.mod requires only lockd's proto and fence modules), and its
// tests import nothing else either: a test's import is recorded in go.mod
// and reaches every program that imports the client. For a real server
// they run the lockd binary.
package client
