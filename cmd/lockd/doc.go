// Command lockd is the lockd daemon: a lock server speaking the wire
// protocol of docs/PROTOCOL.md on TCP, alone or as a member of a priority
// or raft cluster (--cluster, docs/CLUSTER.md).
//
//	go run ./cmd/lockd --listen 127.0.0.1:7070 --data-dir ./lockd-data
//
// SIGINT or SIGTERM shut it down gracefully (queued acquires are answered
// with E 4, held locks are written to the data directory and reloaded by the
// next start); it then exits 0. A second signal during that shutdown cuts
// the drain short and the locks are still written (exit 0); a third exits
// at once (exit 1) and logs how many held locks that loses. SIGHUP
// re-reads the files that may change under a running daemon (the TLS
// certificate, key and CA bundles and the --acl file: a small registry of
// reload functions, reload.go); a file that no longer loads is logged and
// the one in force stays. Without anything to reload SIGHUP is logged and
// ignored.
//
// It owns the command line (flags validated at start with messages naming
// the flag, exit 2; every flag but --version may come from the
// environment as LOCKD_<FLAG>, env.go, and a bad value there names the
// variable; the ports of a cluster's members are checked for collisions,
// ports.go; the libraries' repl.FieldErrors, engine.ConfigErrors
// and tlsconf.FieldErrors are worded here with the flag), the process's
// logging, signals and exit codes, and the wiring: it picks the node
// (repl.NewLocal through the engine's default, priority.New or
// raftnode.New) and hands it to engine (the server) and admin (the HTTP
// endpoint, HTTPS with --tls-cert), with tlsconf's TLS material; the raft
// membership flags --join and --force-new-cluster are in members.go. With
// --http it serves httpapi's front too (http.go: its flags, its listener
// bounded to --http-max-conns, HTTPS with the admin endpoint's TLS, its
// metrics in the admin endpoint's, and its part of the shutdown).
//
// lockd may import lockd/engine, lockd/admin, lockd/httpapi, lockd/repl,
// lockd/repl/priority, lockd/repl/raftnode, lockd/acl, lockd/api,
// lockd/tlsconf, lockd/internal/ratelog, lockd/internal/version,
// golang.org/x/sys and the standard library. It must not import
// lockd/client: the daemon never talks to another lockd as a client.
package main
