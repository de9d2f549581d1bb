// Package ratelog decides which of a flood of like events gets a log line:
// one per interval, the next line carrying how many were held back
// meanwhile. lockd's refusals (of member links, admin requests, failed TLS
// handshakes) and hashicorp/raft's complaints about a peer that is down
// can come thousands of times a second; a line each would bury the log
// and cost more than the refusal.
//
// # What it owns
//
//   - Limiter: one line per Every (a second by default) on a clock the
//     caller passes in; not safe for concurrent use, so a single
//     goroutine or a pure state machine keeps one as a plain field.
//   - Shared: a Limiter behind a mutex, for events from any goroutine.
//   - Atomic: the same without a lock (two atomics), for callers that
//     must not wait, such as the engine's event loops; Flush lets the
//     held-back count of a flood that stopped out without a new event.
//   - Keyed: a Limiter per key (a message and the peer it names, say), a
//     bounded number of them, safe for concurrent use.
//
// Time is an input (nanoseconds on any clock that does not go back: the
// wall clock's UnixNano, a table clock), so the tests drive it by hand
// and a state machine that may not read the clock can use it.
//
// # What it may import
//
// ratelog may import only the standard library (sync, sync/atomic, math
// and time; no I/O, no clock read). It must not import io, log, log/slog,
// os or lockd/...: internal/layers enforces both.
package ratelog
