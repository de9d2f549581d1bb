// Package shard is lockd's lock table: a pure state machine that turns
// requests and the passing of time into answers and effects.
//
// # What it owns
//
//   - The lock tables: keys spread over a power-of-two number of shards by
//     xxhash.Sum64(key); each shard indexes its held keys in its own
//     open-addressing table on the same hash. A key is free (no entry) or
//     held (token, lease deadline, lease seconds, FIFO wait queue). A
//     shard's entries live in a slab of pointer-free 48-byte entries named
//     by 32-bit refs, with short keys inline and wait queues only for keys
//     that have waiters, compacted as it empties (slab.go).
//   - The FIFO wait queues of held keys, with the per-key and table-wide
//     capacity limits of PROTOCOL.md §4.
//   - Shared keys (PROTOCOL.md §9.2, holders.go): AcquireShared grants up to
//     a key's limit of holders, each with its own token, lease (in the
//     timer wheel) and identity; the queue is FIFO without overtaking (an
//     exclusive acquire at the head holds up later shared ones), and every
//     end of a holder — release, expiry, forced release — serves the queue
//     from its head for as long as the head fits, in the same step. A
//     shared key is its entry (one of its holders) plus a 48-byte holder
//     entry per further holder, found by token through a per-shard holder
//     index; the exclusive paths see only an entry with a queue. R, K, V
//     and W act on the one holder whose token they carry. Validate,
//     Inspect and Detail (every holder and waiter, for the admin endpoint)
//     change nothing.
//   - Watches (PROTOCOL.md §9.4, watch.go): Watch registers a Conn's
//     interest in one grant; every way the grant ends gives each watch
//     exactly one EffectLost with its Reason (released, expired, forced,
//     or ReasonCannotTell from EndWatches, Reset, or a replicated or
//     restored grant that replaces it), through the same Out as every
//     other effect. Watches are bounded per Conn (Config.MaxWatchesPerConn)
//     and leave with DropConn; a table without watches pays one count check
//     per ended grant.
//   - Capacity: every holder and every waiter counts toward a bound that
//     answers Busy: Config.MaxKeys (an exclusive holder, or a shared key's
//     first), Config.MaxHolders (a shared key's further holders),
//     Config.MaxWaitersPerKey, Config.MaxWaiters, Config.MaxWaitersPerConn;
//     a key's holders are bounded by its limit.
//   - One hashed timer wheel per shard for lease and wait deadlines
//     (Config.Tick resolution, intrusive lists, O(1) add/remove/renew; no
//     goroutine, no time.Timer per lock).
//   - The fencing-token allocator (Tokens, PROTOCOL.md §5).
//   - The state-change records (Record) streamed to Config.Sink for
//     replication and persistence (an exclusive grant held back for the
//     Sink's owner to take later instead, Config.Defer, LockedTake and
//     LockedCut), and
//     the effects (Effect) owed to queued acquires.
//   - The identity of every grant (PROTOCOL.md §8.3): a 2-byte handle
//     (Ident) per entry into the table's registry of names, so a held lock
//     costs no string. AcquireAs grants to an identity; ReleaseAs and
//     RenewAs refuse a current token from another identity (answered N, as
//     a stale token) unless the requester is an admin (forced), and count
//     both. A grant or a requester of no identity (NoIdent: no ACL) is
//     judged by the token alone. Records, dumps (Dump) and restores
//     (RestoreAs, RestoreHolder) carry the identity's name, which means the
//     same on another process.
//   - Replication at the table level: a shared grant's Record carries the
//     key's limit; Apply replays shared keys holder by holder; Dump reports
//     every holder with its key's limit and RestoreHolder rebuilds them, so
//     a standby, a follower or a restarted node holds exactly what was
//     replicated or saved.
//
// # Concurrency contract
//
// Every Table method is safe for concurrent use. Each shard is guarded by
// its own mutex, held only for the state change; Acquire, AcquireShared,
// Release, Renew, Validate, Watch, Inspect, Tick, EndWatches, Apply and the
// other calls that take an Out append their effects to it and the caller
// delivers them after the call has returned, when no table lock is held. Sink (or
// SinkRef), with Defer and the functions given to LockedTake, LockedCut and Locked, are the
// callbacks made under a shard lock: they must not block and must not call back
// into the Table. A Conn has a small mutex of its own for its list of
// queued waiters; the lock order is shard → Conn, and DropConn never holds a
// Conn lock while taking a shard lock. No call waits: Tokens.Next at the
// reserved limit returns 0 and signals Want (the table answers Busy) until
// the node's reserver calls Extend.
//
// Time is an input: every call that needs it takes now, in nanoseconds on a
// monotonic clock chosen by the caller. Deadlines fire when deadline ≤ now,
// never earlier, and within one Config.Tick if Tick is called that often.
//
// # What it must not import
//
// shard may import github.com/cespare/xxhash/v2 and the standard library
// (its data-structure packages). It must not import net, os, io, syscall,
// lockd/proto or github.com/panjf2000/gnet/v2 (no I/O: files, sockets);
// no time.Now or time.Sleep either. It speaks keys, tokens, owners and
// opaque Conn handles; the engine maps them onto the wire. internal/layers
// enforces this.
package shard
