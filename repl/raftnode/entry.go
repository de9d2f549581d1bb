package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lockd-dev/lockd/repl/records"
)

// The raft log's entries (raft.Log.Data of LogCommand entries):
//
//	records: 1 | vp u8 | term u64 | stamp i64 | first uvarint | last uvarint |
//	         count uvarint | codec u8 | rawlen uvarint | data
//	reserve: 2 | vp u8 | term u64 | limit u64
//
// vp is the entry's format version (high 4 bits) and the member index of
// the leader that proposed it (low 4 bits; --peers has at most 7
// entries), and term is that leader's term then; stamp is its wall clock
// (ns since the epoch) when it cut the entry: every member's lease of a
// Grant or Renew in it counts from that instant, moved onto its own table
// clock, so applying reads no clock. first..last are the proposer's own
// record numbers (Committer), for diagnosis only. data holds count
// records in the batch format (BatchWriter), raw or one s2 block
// (Compress). A reserve entry says that tokens up to limit may be handed
// out by the leader that proposed it.
//
// The format version is the version of repl/records' formats the entry's
// records are in (entryFormat, 3: shared grants, PROTOCOL.md §9.2). Entries
// written before the version existed have 0 there (their proposer byte:
// records of the formats 1 and 2, which version 3 reads). A member reads
// versions up to its own and refuses a newer one whole (errEntryVersion,
// naming both versions): it applies none of its records, counts it as a
// record its table refused (its table is then not the committed state:
// it rebuilds, and while that fails it is stale, does not serve, and
// hands a leadership over), and cuts no snapshot over it. The version
// sits in the byte that a member of the version before (2) reads as the
// proposer only to tell its own entries, so such a member reads a
// version-3 entry as another leader's and applies it: its records of
// exclusive keys are the same bytes as in version 2, and at a shared
// grant it stops with a malformed record and goes stale the same way —
// it never applies part of a shared grant, nor skips one and serves.
const (
	entryRecords = 1
	entryReserve = 2

	entryHeader = 1 + 1 + 8 + 8 // kind, vp, term, stamp

	// entryFormat is the format version this member writes in every entry
	// and the newest it reads: repl/records' Version
	// (TestEntryFormatFollowsRecords).
	entryFormat = 3
)

// errBadLogEntry: a raft log entry or snapshot lockd cannot read (a
// damaged disk, or not lockd's).
var errBadLogEntry = errors.New("raftnode: malformed raft log entry or snapshot")

// errEntryVersion: a raft log entry or snapshot in a format version newer
// than this member reads (a member of a newer lockd wrote it).
var errEntryVersion = errors.New("raftnode: format version too new")

// versionError is errEntryVersion for format version v.
func versionError(what string, v int) error {
	return fmt.Errorf("%w: %s in format version %d, this member reads versions up to %d: every member must run the same lockd (upgrade this one)",
		errEntryVersion, what, v, entryFormat)
}

// vp packs the format version and the proposer into an entry's second
// byte.
func vp(proposer int) byte { return byte(entryFormat<<4 | proposer&0x0f) }

// logEntry is a decoded entry; raw points into the entry's data or into a
// decompression buffer.
type logEntry struct {
	kind     byte
	proposer int
	term     uint64
	stamp    int64
	first    uint64
	last     uint64
	count    int
	raw      []byte
	limit    uint64
}

// appendRecordsEntry appends a records entry carrying the raw records
// (count of them) to dst.
func appendRecordsEntry(dst []byte, proposer int, term uint64, stamp int64, first, last uint64, count int, raw []byte) []byte {
	dst = append(dst, entryRecords, vp(proposer))
	dst = binary.BigEndian.AppendUint64(dst, term)
	dst = binary.BigEndian.AppendUint64(dst, uint64(stamp))
	dst = binary.AppendUvarint(dst, first)
	dst = binary.AppendUvarint(dst, last)
	dst = binary.AppendUvarint(dst, uint64(count))
	at := len(dst)
	dst = append(dst, 0)
	dst = binary.AppendUvarint(dst, uint64(len(raw)))
	codec, out := records.Compress(dst, raw)
	out[at] = byte(codec)
	return out
}

// appendReserveEntry appends a reserve entry to dst.
func appendReserveEntry(dst []byte, proposer int, term, limit uint64) []byte {
	dst = append(dst, entryReserve, vp(proposer))
	dst = binary.BigEndian.AppendUint64(dst, term)
	dst = binary.BigEndian.AppendUint64(dst, 0)
	return binary.BigEndian.AppendUint64(dst, limit)
}

// decodeLogEntry decodes p into e; records are decompressed into *buf's
// memory when they are compressed.
func decodeLogEntry(p []byte, e *logEntry, buf *[]byte) error {
	if len(p) < entryHeader {
		return errBadLogEntry
	}
	if v := int(p[1] >> 4); v > entryFormat {
		return versionError("raft log entry", v)
	}
	*e = logEntry{kind: p[0], proposer: int(p[1] & 0x0f), term: binary.BigEndian.Uint64(p[2:]),
		stamp: int64(binary.BigEndian.Uint64(p[10:]))}
	switch e.kind {
	case entryReserve:
		if len(p) != entryHeader+8 {
			return errBadLogEntry
		}
		e.limit = binary.BigEndian.Uint64(p[entryHeader:])
		return nil
	case entryRecords:
	default:
		return errBadLogEntry
	}
	var vals [4]uint64
	i := entryHeader
	for k := range 3 {
		v, next, err := records.Uvarint(p, i)
		if err != nil {
			return errBadLogEntry
		}
		vals[k], i = v, next
	}
	if i >= len(p) {
		return errBadLogEntry
	}
	codec := records.Codec(p[i])
	rawLen, i, err := records.Uvarint(p, i+1)
	if err != nil || rawLen > records.MaxRaw || vals[2] > rawLen {
		return errBadLogEntry
	}
	raw, err := records.Decompress(*buf, codec, p[i:], int(rawLen))
	if err != nil {
		return errBadLogEntry
	}
	if codec == records.CodecS2 {
		*buf = raw[:0]
	}
	e.first, e.last, e.count, e.raw = vals[0], vals[1], int(vals[2]), raw
	return nil
}
