// Command lockctl is lockd's command-line client: take, release and renew
// locks, ping a server, show what a server is doing, and run a command under
// a lock.
//
//	lockctl acquire KEY [--wait 10s] [--lease 30s]     prints the token
//	lockctl release KEY TOKEN
//	lockctl renew KEY TOKEN [--lease 30s]
//	lockctl ping
//	lockctl status [KEY]
//	lockctl run KEY [--wait 10s] [--lease 30s] [--margin 2s] [--grace 5s] -- CMD ARGS...
//
// Every command takes --addr (repeatable, or LOCKD_ADDRS, comma-separated;
// default 127.0.0.1:7070) and --timeout. Exit codes are listed by
// `lockctl --help`.
//
// It owns the command line, the exit codes and the supervision of the
// command under a lock (process group, renewals, kill before the lease can
// end). It talks to lockd only through lockd/client and the admin
// endpoint's JSON, decoded into lockd/api's types (it prints every field
// of them that helps an operator); it must not import engine, shard,
// store, repl or gnet.
package main
