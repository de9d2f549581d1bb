// Package records is the format of what both cluster modes replicate: the
// table's state changes (shard.Record, a grant with the name of the
// identity it was made to) in the batch format, with the skip
// records that stand for changes which cancelled out within a batch
// (Canceller), the snapshot entry formats of a held key (version 2 with
// the grant's identity; version 1, before identities, still read), and their
// compression (s2 block, Compress). A priority member's stream and a raft
// member's log entries and snapshots carry them alike (docs/MEMBER-LINK.md
// has the byte layouts).
//
// # Concurrency contract
//
// Writers, readers and the Canceller are plain values owned by one
// goroutine at a time; none takes a lock or starts a goroutine. Readers
// never allocate, and writers reuse their buffers after Reset.
//
// # What it must not import
//
// records imports lockd/shard, github.com/klauspost/compress and the
// standard library, nothing else: no I/O, no net, no other lockd package
// (internal/layers).
package records
