// Package acl is lockd's identity file (PROTOCOL.md §8.2): who may connect,
// how each identity proves itself, which keys it reaches and what role it
// has.
//
// # What it owns
//
//   - The parser of the file (Parse, Load): one identity per line, comments,
//     blank lines, runs of spaces or tabs between four fields; a bad line is
//     a *LineError naming the file and the line.
//   - Authentication (ACL.Authenticate, ACL.Hello): SHA-256 of the secret
//     compared with the stored digest in constant time (crypto/subtle); an
//     unknown identity, or one that authenticates only by certificate, costs
//     the same hash and comparison against a decoy digest, so the time of a
//     failed hello does not tell which identities exist.
//   - Authorization (Identity.Allows, Identity.MayLock): byte-prefix key
//     matching and the roles client, monitor and admin (lock requests —
//     A, R, K, S — for client and admin; V, W, I for any role).
//
// The file holds no secret, only digests; neither does anything this
// package returns or prints: an Identity's String and a LineError never
// contain a digest or a secret, and nothing here logs.
//
// # Concurrency
//
// An ACL is immutable once parsed: every method is safe for concurrent use.
// A reload parses a new ACL and swaps it in (the engine keeps the current
// one behind an atomic pointer).
//
// # What it must not import
//
// acl may import only the standard library (crypto included). It must not
// import net or lockd/... (no other lockd package). internal/layers
// enforces both.
package acl
