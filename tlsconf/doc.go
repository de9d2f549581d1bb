// Package tlsconf owns lockd's TLS material (PROTOCOL.md §8.1): it reads
// the PEM files of --tls-cert, --tls-key, --tls-client-ca and
// --tls-peer-ca, checks them, builds the crypto/tls configurations of the
// client port, the admin endpoint and the member link from them, and
// re-reads them on demand (SIGHUP) without dropping a connection: a part
// that no longer reads or parses keeps its previous contents.
//
// Every configuration it builds is crypto/tls with MinVersion TLS 1.2 and
// the library's defaults otherwise (cipher suites, curves, session
// tickets), except DynamicRecordSizingDisabled on the client port (see
// Store.ServerConfig: the engine tracks which frames reached the socket
// record by record).
//
// Concurrency: a Store is safe for concurrent use. Reload swaps the whole
// material behind an atomic pointer; a handshake reads it once, so a
// handshake that starts after Reload returned uses the new files.
//
// tlsconf may import only the standard library. It must not import
// lockd/... (nothing of lockd): the engine, the admin endpoint, the member
// link (repl) and cmd/lockd all use it (internal/layers).
package tlsconf
