// Package fence is the resource side of fencing tokens: a Checker that a
// protected resource (a store, a file, an account) consults before acting
// for a lock holder, rejecting any token smaller than the largest it has
// seen for the same resource. Because lockd's tokens only grow, a holder
// whose lease ended while it was paused, and which acts late, is turned
// away: it always carries a token older than its successor's.
//
// The check and the write it guards must be one atomic step (Checker.Do):
// a check followed by a separate write leaves a window in which a stale
// holder that passed its check writes after its successor.
//
// # Concurrency
//
// A Checker is safe for concurrent use; its zero value is ready.
//
// # What it must not import
//
// The standard library only: it knows nothing of the wire or the client.
package fence
