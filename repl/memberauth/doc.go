// Package memberauth makes the members of a cluster prove who they are
// (PROTOCOL.md §8.4), for both cluster modes: every member connection,
// before anything else is read from it, runs an exchange in which the
// dialer claims its index in --peers and the member it dialled, and both
// ends prove they know the cluster secret (HMAC-SHA256 over fresh nonces
// from both sides, the claim, the cluster's parameters, direction labels
// and, under TLS, the session's exporter), inside mutual TLS whose
// certificates must verify against the peer CAs and name the host of the
// --peers entry each end is. The exchange is documented byte by byte in
// docs/MEMBER-LINK.md, "Authentication".
//
// It also bounds what the member port costs before a peer has proved
// anything: at most Options.MaxPending connections in the exchange (one
// more closes the oldest), each with a fixed buffer of at most 72 bytes of
// its own (plus crypto/tls's handshake state under TLS) and a deadline,
// and at most Options.MaxConns authenticated connections. The link's big
// buffers are allocated by its user after Accept returns.
//
// What it owns: the exchange (exchange.go: the messages and the MACs),
// its two sides and the refusals' counts and rate-limited log lines
// (auth.go), the member port's listener and its limits (listener.go).
// priority's link and raftnode's stream layer call Dial and Listen; a
// refused connection is closed before either ever sees it.
//
// # Concurrency contract
//
// An Auth and a Listener are safe for concurrent use. Listen starts one
// accept goroutine and one goroutine per connection in the exchange;
// Listener.Close ends them all before it returns. Dial runs on its
// caller's goroutine; its context cancels it.
//
// # What it must not import
//
// memberauth may import lockd/repl (the cluster configuration),
// lockd/internal/ratelog and the standard library. It must not import
// lockd/repl/priority or lockd/repl/raftnode (the modes),
// github.com/hashicorp/..., lockd/engine, lockd/proto,
// github.com/panjf2000/gnet/v2 or lockd/cmd/... (internal/layers).
package memberauth
