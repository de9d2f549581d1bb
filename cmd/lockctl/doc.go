// Command lockctl is lockd's command-line client: take, release and renew
// locks, ping a server, show what a server is doing, run a command under a
// lock (or under one of N shared grants), validate a token, watch a grant,
// inspect a key, and help write the ACL file.
//
//	lockctl acquire KEY [--wait 10s] [--lease 30s]     prints the token
//	lockctl release KEY TOKEN
//	lockctl renew KEY TOKEN [--lease 30s]
//	lockctl run KEY [--shared N] [--wait 10s] [--lease 30s] [--margin 2s] [--grace 5s] -- CMD ARGS...
//	lockctl validate KEY TOKEN                         prints the lease left
//	lockctl watch KEY TOKEN [--wait D]                 prints how the grant ended
//	lockctl inspect KEY [--admin HOST:PORT]            holders and waiters
//	lockctl ping
//	lockctl status [KEY] [--admin HOST:PORT]
//	lockctl member list|add ADDR|remove ID-OR-ADDR      a raft cluster's members
//	lockctl acl hash < secret-file                     prints sha256:<hex>
//	lockctl completion bash|zsh|fish
//	lockctl --version
//
// Every command that talks to lockd takes --addr (repeatable, or
// LOCKD_ADDRS, comma-separated; default 127.0.0.1:7070), --timeout, the
// TLS flags (--tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name)
// and the credentials (--identity or LOCKD_IDENTITY, --secret-file or
// LOCKD_SECRET_FILE; a secret is never read from the command line). Each
// command that prints a result takes -o json. Exit codes are listed by
// `lockctl --help`.
//
// # What it owns
//
// The command line (built on spf13/cobra: per-command help with examples
// and only that command's flags, shell completion, --version from
// internal/version), the exit codes, the JSON output documents, and the
// supervision of the command under a lock (process group, renewals, kill
// before the lease can end). It talks to lockd only through lockd/client
// and the admin endpoint's JSON, decoded into lockd/api's types (it prints
// every field of them that helps an operator).
//
// # Adding a command
//
// A command is a func (a *app) xxxCmd() *cobra.Command whose RunE is
// wrapped by a.wrap (so its errors are mapped by report); it registers its
// own flags, then a.outputFlag if it prints a result, then connFlags if it
// talks to lockd, and adminFlag if it reads the admin endpoint (admin's
// getJSON does HTTPS and basic authentication as PROTOCOL.md §8.5 wants).
// A family of subcommands (acl; member list|add|remove) is an
// a.group whose children do the work: the group alone, or with an unknown
// subcommand, is exit 2.
//
// # What it must not import
//
// lockctl may import lockd/client, lockd/api, lockd/proto,
// lockd/internal/version, github.com/spf13/cobra and the standard library.
// It must not import lockd/engine, lockd/shard, lockd/store, lockd/repl,
// lockd/admin or github.com/panjf2000/gnet/v2 (internal/layers enforces
// both).
package main
