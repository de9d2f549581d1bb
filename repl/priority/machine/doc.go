// Package machine is a member of a priority cluster as a pure state
// machine (PROTOCOL.md §6.2–6.3): it owns every decision — roles and
// epochs, liveness and the freeze check, which of two actives stays
// ("Whoever would lose more stays", contest.go), token floors, jumps and
// reservations (tokens.go), the gate and its numbering, planned handovers
// and shutdown (handover.go) — and nothing else.
//
// A Member is fed one input at a time: Tick(now, Local) with what the
// driver measured (the allocator, the data dir's mark, the table's
// position), or Step(now, Msg) with a decoded message of another member
// or the result of something the driver did (a reservation, a snapshot
// applied). Each returns the Actions to carry out, in order: publish a
// gate, send a frame to a member, reserve tokens, observe or extend the
// allocator, follow an active, start or stop the stream, log a line,
// answer Stop. Time is an input (the table's clock; the wall-clock floor
// of a promotion is a Reserve's Floor, which the driver adds to the wall
// clock it reads); member indexes are this member's --peers (the driver
// translates a peer's).
//
// Files: machine.go (Member, Step, Tick, the gate, heartbeats, View),
// decide.go (liveness, the freeze check, following, promotion), contest.go
// (two actives), handover.go (planned handovers, shutdown), tokens.go
// (reservations and floors), msg.go (inputs and actions), role.go (the
// enums). The transcripts under testdata/ drive clusters of machines
// (script_test.go; go test -run TestScripts -rewrite regenerates them).
//
// # Concurrency contract
//
// None inside: a Member is not safe for concurrent use. One goroutine
// owns it (repl/priority's run); View copies what other goroutines may
// read.
//
// # What it must not import
//
// machine may import lockd/api (the role names), lockd/internal/ratelog
// (its log lines' limiter, on the time it is given) and the standard
// library. It must not import net, os, io, sync, lockd/shard, lockd/repl or
// lockd/proto: no I/O, clock or lock, nothing of the table, the wire or the
// seam; no time.Now, no goroutine either (internal/layers checks it).
package machine
