// Package admin is lockd's operator endpoint: an HTTP handler serving
// /metrics (Prometheus text format), /healthz, /status (JSON), /keys/{key}
// (JSON) and /debug/pprof/.
//
// It reads the engine only through engine.Server's snapshot methods
// (Metrics, Table().Lookup, Config): a scrape never touches a connection
// and costs the hot path nothing but the atomic loads it reads. The
// per-loop counters are aggregated at scrape time.
//
// admin may import lockd/engine, lockd/repl (the node's Status), net/http
// and prometheus/client_golang. It must not import lockd/client or gnet,
// and nothing in lockd except cmd/ imports it (internal/layers).
package admin
