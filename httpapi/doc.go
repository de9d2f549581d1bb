// Package httpapi is lockd's HTTP/JSON API (lockd --http ADDR): the
// requests of the binary protocol as JSON requests under /v1/ — acquire
// (exclusive, or shared with a limit) as a long-poll of up to wait_ms,
// release, renew, validate, inspect, and watch as Server-Sent Events —
// so that any language, or a shell with curl, can lock without a client
// library. openapi.json (served at /v1/openapi.json) is the contract;
// docs/HTTP.md describes it around the routes.
//
// # What it owns
//
//   - The routes, the JSON bodies (tokens as decimal strings, durations in
//     milliseconds), the one error shape and its stable codes, and the map
//     from every answer of PROTOCOL.md §3 and §9 to an HTTP status.
//   - What the wire cannot carry, refused before anything is sent (a key
//     over 1024 bytes or with a newline, a wait or lease over 255 s, a
//     token that is not a decimal u64): ranked as a bad frame is, before
//     authentication; nothing changes.
//   - The deadline of a request: a wait honoured to the millisecond (at
//     its end the answer is 409 timeout and the connection that carried
//     the acquire is closed, which withdraws it and releases a grant not
//     taken), 5 s for anything else.
//   - Delivery: a grant whose HTTP answer cannot be written (the client
//     went away while waiting or before the body was written) is released
//     at once, that token, by the identity that holds it.
//   - Following M: a member that does not serve forwards the request to
//     the serving member's HTTP endpoint (its client address with the port
//     at Config.PortOffset) and relays the answer or the stream; a request
//     authenticated by a client certificate is answered 307 instead.
//   - Its limits (body size and time, long-polls, streams) and its
//     counters (Metrics, exported by the admin endpoint).
//
// # What it does not own
//
// Lock semantics. Every request goes through an in-process connection on
// the engine (engine.Server.OpenLocal): the front encodes frames with
// proto's encoders and reads the answers with proto.ParseResponse, so the
// validation order, the ACL (a hello from the basic authentication, a
// certificate's Common Name as on a TLS connection), identity-bound
// grants, the commit holding of a raft leader, gates and M, watches and L
// are the engine's. Connections are pooled by what authenticated them
// (pool.go); a long-poll or a watch keeps its connection for itself,
// which closing withdraws (PROTOCOL.md §4). docs/DESIGN.md "The HTTP
// front" says why an in-process connection rather than a gateway over the
// bundled client.
//
// # Concurrency
//
// A Front is safe for concurrent use: each HTTP connection has a
// goroutine (the fast lane's, fast.go, or net/http's) that runs its
// requests one at a time, each on a local connection alone; the counters
// are atomics; the pool has a mutex held only to take or give a
// connection. Endpoint serves a Front on a listener: plaintext
// connections start on the fast lane, which hands a connection to
// net/http (Front.Server) at the first request it does not take whole.
//
// # What it may import
//
// httpapi may import lockd/engine (OpenLocal, the ACL in force),
// lockd/proto (the frames), lockd/internal/ratelog (the http.Server's
// error log, a line a second) and the standard library. It must not import
// lockd/client (it is not a gateway over the client), lockd/shard,
// lockd/repl, lockd/store, lockd/admin (admin imports it, for its metrics)
// or lockd/cmd/... (internal/layers).
package httpapi
