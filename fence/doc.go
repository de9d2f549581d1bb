// Package fence is the resource side of fencing tokens: what a protected
// resource (a store, a file, an account) checks before it acts for a lock
// holder. It offers two rules.
//
// # Largest token seen (Checker)
//
// A Checker remembers, per resource name, the largest token it has seen
// and rejects any smaller one. Because lockd's tokens only grow, a holder
// whose lease ended while it was paused, and which acts late, is turned
// away once its successor has acted: it carries an older token. The
// resource alone decides, without asking lockd, so it keeps working when
// lockd cannot be reached, and it stays safe even when a lockd failover
// breaks mutual exclusion for a moment (the newer token wins).
//
// The check and the write it guards must be one atomic step (Checker.Do):
// a check followed by a separate write leaves a window in which a stale
// holder that passed its check writes after its successor.
//
// # Ask the lock service (Validating)
//
// A Validating asks lockd, through a Validator (lockd's Go client
// satisfies it: client.Client.Validate sends a V, PROTOCOL.md §9.3),
// whether the token is a current grant before each action, and how long
// its lease has left. It turns away a holder whose grant ended (released,
// expired, forced) even when no successor has acted yet, which the
// largest-token rule cannot know; and it accepts every current holder of
// a shared key — a semaphore's permits, a read lock's readers — whose
// tokens the largest-token rule would play off against each other (an
// older reader's token is smaller than a newer reader's, and both are
// valid). It costs one round trip to lockd per action, makes lockd a
// dependency of the resource (no answer, no action), and is not atomic
// with lockd: the lease keeps running between the answer and the action,
// so Do bounds the action by the lease left and MinRemaining refuses
// tokens too close to their end.
//
// # Which to use
//
//   - Exclusive locks, a resource that can keep a number beside its data:
//     Checker (or the same comparison inside the resource's own
//     conditional write). It needs no network and survives lockd being
//     down.
//   - Shared locks and semaphores, or a resource that keeps no state, or
//     one that must not act for a holder whose lease has ended even if no
//     one has taken the lock since: Validating.
//   - Both, for an exclusive lock whose resource wants both guarantees:
//     Validating.Do, and Checker.Do inside it (the example shows it). The
//     largest-token rule then still holds if lockd's answer was stale
//     (a failover within the replication lag).
//
// # Concurrency
//
// A Checker is safe for concurrent use; its zero value is ready. A
// Validating is safe for concurrent use once its fields are set.
//
// # What it must not import
//
// fence may import only the standard library. It must not import
// lockd/proto or lockd/client: it knows nothing of the wire or the client
// (the client's module requires this one, so the Validator interface is
// defined here and the client satisfies it).
package fence
