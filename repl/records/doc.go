// Package records is the format of what both cluster modes replicate: the
// table's state changes (shard.Record: a grant with the name of the
// identity it was made to and, for a shared key, its limit) in the batch
// format, with the skip records that stand for changes which cancelled out
// within a batch (Canceller), the snapshot entry formats of a held key's
// holders (version 3 with each holder's identity and its key's limit,
// AppendSnapEntryVersion and SnapReader.ResetVersion; versions 1 and 2,
// before identities and before shared keys, still read and written), and
// their compression (s2 block, Compress). A priority member's stream and a
// raft member's log entries and snapshots carry them alike
// (docs/MEMBER-LINK.md has the byte layouts).
//
// Version names the formats this package writes; the member link's hello
// and the raft entry header carry it, and Compatible refuses a peer of
// another version with a message that names both. Records and snapshots
// of exclusive keys are the same bytes in versions 2 and 3, so the
// functions that predate version 3 (BatchWriter.Add without a Limit,
// AppendSnapEntryIdent, SnapReader.ResetIdent) behave as they did.
//
// # Concurrency contract
//
// Writers, readers and the Canceller are plain values owned by one
// goroutine at a time; none takes a lock or starts a goroutine. Readers
// never allocate, and writers reuse their buffers after Reset.
//
// # What it must not import
//
// records may import lockd/shard, github.com/klauspost/compress and the
// standard library; no other lockd package. It must not import io, net,
// os or syscall: no I/O (internal/layers).
package records
