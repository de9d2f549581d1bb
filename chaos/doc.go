// Command chaos runs a Jepsen-style test against a lockd cluster: real
// lockd processes (3 members, --cluster priority or raft, on loopback,
// with fault proxies on the member links; or, -mode single, one node
// without cluster flags), client workers that take locks
// on a few contended keys with the bundled client and write to a fenced
// resource while they hold them, and a nemesis that hurts the cluster at
// random times, in random order, for a bounded time. Every operation is
// recorded; at the end everything is healed, every member restarted,
// every lock released, and the history is checked (package
// internal/history).
//
//	go run ./chaos -mode priority -duration 10m -seed 42
//	go run ./chaos -mode raft -duration 30s -json
//	go run ./chaos -mode single -duration 1m
//
// # What it owns
//
//   - The workload (workload.go): W workers, each with its own client
//     given every member's address, acquiring keys from a small
//     set with waits of 0–2 s and short leases, writing under the token
//     to an in-process store guarded by fence.Checker (Checker.Do: the
//     check and the write in one step), renewing, sometimes holding past
//     the lease on purpose and writing late (a paused holder), and
//     releasing; every call recorded with its outcome, indeterminate ones
//     included.
//   - The semaphore workload (semaphore.go): -sem-workers more workers
//     (default 4) beside those, taking permits of -sem-keys keys, each a
//     semaphore of -sem-limit permits (AcquireShared), and holding them as
//     the others hold their locks, but writing through a counted fence
//     (at most N tokens of a key admitted at once, the newest kept; see
//     history.CountedRule), and telling it when they are done, before
//     the release. Its checkers: semaphore-fenced and semaphore-exclusion
//     (raft, single) or semaphore-overlap (priority, measured).
//   - Single mode: one node, the workers in the same three locations
//     (0 beside it, 1 and 2 across a network), redialling every 250 ms.
//     The nemesis's kinds apply to the one node; a partition cuts
//     locations 1 and 2 (or one of them) off, or drops only the node's
//     answers to them; after a process fault the node runs 2 s before
//     the next (singleUp). A kill -9 loses held locks by design
//     (PROTOCOL.md §4): its span is a crash window (crashWindows), and
//     the checkers excuse what it may have lost and nothing else; no
//     large-state phase.
//   - Client locations: worker i sits beside member i mod 3 and reaches
//     every member through a fault proxy of its location, so that a
//     partition cuts clients off from the members of the other side, as
//     between machines (Jepsen's clients live on the nodes), and client
//     connections can be dropped.
//   - The nemesis (nemesis.go): kill -9 and restart of a member, SIGSTOP
//     and SIGCONT (a freeze longer than the failover timeout; half of them
//     with the member's network quiet while it is stopped), partitions
//     (one member alone — the active/leader most of the time — or every
//     member alone: member links and client paths between the sides; or a
//     one-way cut of one member link), a planned handover (SIGTERM, then
//     restart; half of them with every member link slowed to 1.5 × the
//     failover timeout), and client connection drops; kinds drawn from a shuffled
//     bag (every kind within any 10 faults), at most -max-active at once,
//     at most one member down or frozen at a time; every fault reverted at
//     its end.
//   - Raw clients across faults (rawcheck.go): connections kept to a
//     member while it is frozen and across its SIGTERM, whose every answer
//     is checked (frozen-answers: M once superseded; handover-answers: no
//     E 4 while a live in-sync successor exists).
//   - The large-state phase (bigstate.go): before the workload, a cluster
//     of its own with a short failover timeout filled with -big-locks held
//     locks, a standby restarted and the active terminated and restarted,
//     checked for changes of active no step asked for (one a stall of
//     some member explains is counted, not asserted: PROTOCOL.md §6.3
//     allows it), a client of the active answered throughout, and every
//     lock kept with its token, whatever changed the active
//     (judged on a settled reading of a member's table: serving, or
//     following in sync, throughout the read — never a table being rebuilt
//     or restored; a lock whose lease may have ended by then is not
//     required). A failing phase keeps its members' whole logs in -out
//     (bigstate-members.log).
//   - The run (run.go): start, the large-state phase, the final heal (every fault lifted, every
//     member running), the liveness check (one active/leader agreed by
//     every member within 3 s, then a fresh acquire, write and release on
//     every key, and no lock left held), the members check (no unexpected
//     exit, clean SIGTERM exits, no race or panic in a member's log), and
//     the checkers over the history. The history and the report go to
//     -out; the members' logs (members.log) too when the run fails, or
//     whenever -out was given, so that the lost grants a passing run
//     measures can be read against them.
//   - The report (report.go): text, or JSON with -json; a failing run
//     prints its seed and the command that reruns it, and keeps its
//     history, the members' logs and any porcupine visualization in -out.
//
// -secure runs the members with PROTOCOL.md §8 on — TLS on the client
// port and the admin endpoint, mutual TLS on the member link, a cluster
// secret (clustertest's Secure) — and the workload's clients over TLS.
//
// -recheck FILE runs the history checkers again on a history.json a run
// kept (with that run's -mode and -failover-timeout), starting nothing: a
// verdict can be reproduced exactly, and a changed checker tried on old
// runs.
//
// The seed fixes every random choice (fault kinds, targets, durations,
// pauses; the workers' keys, waits and hold times) but not the timing of
// the processes, so a rerun follows the same schedule, not the same
// interleaving.
//
// Exit status: 0 when every checker passed, 1 when one failed or the run
// could not be completed, 2 for a bad flag or a mode this lockd binary
// does not have.
//
// # What it must not import
//
// chaos may import lockd/client, lockd/proto (raw frames of the wire
// protocol), lockd/fence, lockd/api (the admin endpoint's names),
// lockd/internal/clustertest, lockd/internal/faultproxy,
// lockd/internal/history and the standard library: it drives the lockd
// binary from outside as users do. It must not import lockd/engine,
// lockd/shard, lockd/store, lockd/repl, lockd/admin (the server's
// packages) or lockd/cmd/... (internal/layers enforces both).
package main
