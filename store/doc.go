// Package store owns lockd's data directory: the token reservation mark that
// keeps fencing tokens increasing across crashes (PROTOCOL.md §5), the
// shutdown snapshot of held locks, with the identity each was granted to
// (§8.3) and, for each holder of a shared key, the key's limit (§9.2), that
// a planned restart reloads (§4 "Shutdown"; snapshots of the formats before
// identities and before shared holders still load), and the lock file that
// keeps two daemons off one directory.
//
// Every write is atomic and durable: a temporary file is written and synced,
// renamed over the old one, and the directory is synced. A reader never sees
// a half-written mark or snapshot.
//
// Concurrency: a Dir is used by one goroutine at a time (the server's token
// reserver, then its shutdown path); its methods are not safe for concurrent
// use.
//
// store may import only the standard library. It must not import net,
// github.com/panjf2000/gnet/v2, lockd/proto or lockd/shard: it speaks keys,
// tokens, identity names and wall-clock times.
package store
