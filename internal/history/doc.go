// Package history records what the clients of a lock service did and saw —
// every acquire (exclusive, or a permit of a shared key), release, renew,
// fenced write and leave of a counted resource, with its invocation and
// completion times, its inputs and its outcome (an indeterminate outcome
// included) — and checks the record, in the manner of Jepsen's checkers.
//
// # What it owns
//
//   - The record: Op (one client operation), Fault (one fault a nemesis
//     injected), History (both), Recorder (safe for concurrent use, times
//     taken on the monotonic clock relative to the run's start), and the
//     history's JSON form (WriteJSON, ReadJSON).
//   - The checkers, each a function of a History that returns a Result:
//     CheckFenced (the fenced resource never accepted a smaller token than
//     one it had accepted, nor writes from two holders of one token),
//     CheckTokens (tokens unique, and increasing in real-time order, except
//     between grants made inside windows the caller excuses: the split
//     brain of a priority cluster), CheckLinearizable (a lock model
//     partitioned by key, checked with github.com/anishathalye/porcupine,
//     a failing key's history visualized to an HTML file), and
//     CheckOverlap over Overlaps (how often and how long two clients
//     believed they held one key at once, and how many grants were lost),
//     asserted or only measured; for the keys taken as shared (semaphores,
//     PROTOCOL.md §9.2), CheckCountedFenced (a counted resource's every
//     decision follows CountedRule — at most N tokens admitted at once,
//     the newest kept — and, asserted for a consensus service, no holder
//     on time turned away) and CheckCountedOverlap (more holders than the
//     limit at once, and lost grants). SharedKeys and History.Select split
//     a history into the exclusive keys' and the shared keys'.
//   - Crashes (crash.go): the overlap and counted checkers take the spans
//     in which a service that keeps no held lock across a crash (one
//     lockd node's kill -9, PROTOCOL.md §4) lost what it held; a grant
//     such a crash may have lost counts as held until the crash began,
//     and its N, its eviction from a counted resource and its writes
//     turned away are excused. Everything else stays asserted.
//   - LockModel: the porcupine model itself, for tests that record their
//     own operations.
//
// The checkers are sound with respect to the protocol (docs/PROTOCOL.md):
// a history a correct lock service can produce passes. An operation whose
// outcome is unknown is allowed both ways; a lease is taken to last at
// least its length from the invocation of the request that granted or
// renewed it (the server counts from its receipt, later), and is allowed
// to last longer (an expiry is processed late, a new raft leader extends
// leases).
//
// # Concurrency
//
// A Recorder is safe for concurrent use. Histories are values; the
// checkers do not modify them and may run concurrently.
//
// # What it must not import
//
// history may import github.com/anishathalye/porcupine and the standard
// library. It must not import lockd/...: it knows nothing of the wire, the
// client library or the server (internal/layers enforces both), so the
// end-to-end tests and the chaos command can both feed it.
package history
