// Package admin is lockd's operator endpoint: an HTTP handler serving
// /metrics (Prometheus text format), the health probes /healthz, /livez
// (the loops run) and /readyz (serving, or a standby or follower in sync),
// /status (JSON), /keys/{key} (JSON: every holder and waiter of the key;
// DELETE releases its grant, or every holder of a shared key),
// /members (JSON: a raft cluster's configuration; POST adds a member,
// DELETE /members/{id} removes one: members.go), /debug/locks and
// /debug/pprof/. docs/ADMIN.md lists every path and metric.
//
// With an ACL (PROTOCOL.md §8.5, auth.go) every path but OpenPaths (the
// health probes) needs HTTP basic authentication of a monitor or admin
// identity, checked against the ACL in force at each request (a reload
// applies to the next one): 401 with a Basic challenge without valid
// credentials, 403 for a client identity, and 403 for a change (any method
// but GET, HEAD, OPTIONS) by anyone but an admin.
//
// It reads the engine only through engine.Server's snapshot methods
// (Metrics, NodeStatus, KeyDetail, Locks, Config): a scrape never touches a
// connection and costs the hot path nothing but the atomic loads it reads.
// The per-loop counters are aggregated at scrape time. The JSON documents
// are package api's types: admin maps engine.Metrics and repl.Status onto
// them, and defines none of its own, so the server and every consumer
// decode one definition.
//
// admin may import lockd/api, lockd/engine, lockd/repl (the node's
// Status), lockd/acl (the basic authentication), lockd/httpapi (the HTTP
// API's metrics, WithHTTP), lockd/internal/ratelog,
// github.com/prometheus/client_golang and the standard library (net/http).
// It must not import lockd/client or github.com/panjf2000/gnet/v2; nothing
// in lockd except cmd/ imports it (internal/layers).
package admin
