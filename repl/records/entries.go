package records

import (
	"encoding/binary"
	"math"
	"time"
)

// The snapshot entry formats: entries one after the other until the end (a
// SnapShard frame's data on the member link, a shard of a raft snapshot).
// Version 1, before identities (raft snapshots written by earlier
// versions):
//
//	keylen uvarint | key | token u64 | left_ns uvarint | lease u8
//
// Version 2 (AppendSnapEntryIdent, SnapReader.ResetIdent) adds the
// identity the grant was made to (PROTOCOL.md §8.3; identlen 0: none):
//
//	keylen uvarint | key | token u64 | left_ns uvarint | lease u8 | identlen u8 | ident

// SnapEntry is one held key of a snapshot.
type SnapEntry struct {
	Key   []byte
	Token uint64
	// Left is the lease time left when the dump was cut (0: ended). A
	// negative Left is sent as 0.
	Left  time.Duration
	Lease uint8 // lease seconds (0 for a lock restored from disk)
	// Ident is the identity the grant was made to (nil: none); version 2
	// only.
	Ident []byte
}

// AppendSnapEntry appends e in the snapshot entry format version 1 to
// dst. An entry the format cannot carry (ErrBadEntry, which includes an
// entry with an Ident; ErrBadKey) leaves dst as it was.
func AppendSnapEntry(dst []byte, e *SnapEntry) ([]byte, error) {
	if len(e.Ident) > 0 {
		return dst, ErrBadEntry
	}
	return appendEntry(dst, e)
}

// AppendSnapEntryIdent appends e in the snapshot entry format version 2
// (with its identity) to dst. An entry the format cannot carry
// (ErrBadEntry: token 0, an identity over 255 bytes; ErrBadKey) leaves dst
// as it was.
func AppendSnapEntryIdent(dst []byte, e *SnapEntry) ([]byte, error) {
	if len(e.Ident) > maxIdent {
		return dst, ErrBadEntry
	}
	out, err := appendEntry(dst, e)
	if err != nil {
		return dst, err
	}
	out = append(out, byte(len(e.Ident)))
	return append(out, e.Ident...), nil
}

func appendEntry(dst []byte, e *SnapEntry) ([]byte, error) {
	if e.Token == 0 {
		return dst, ErrBadEntry
	}
	if len(e.Key) == 0 || len(e.Key) > maxKey {
		return dst, ErrBadKey
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
	dst = append(dst, e.Key...)
	dst = binary.BigEndian.AppendUint64(dst, e.Token)
	dst = binary.AppendUvarint(dst, uint64(max(e.Left, 0)))
	return append(dst, e.Lease), nil
}

// SnapReader iterates over raw snapshot entries without
// allocating, as RecordReader does over records. An entry's Key (and
// Ident) points into the raw data.
type SnapReader struct {
	cur   itemCursor
	ident bool // version 2
}

// Reset starts reading the raw entries in raw, in the format version 1.
func (sr *SnapReader) Reset(raw []byte) { *sr = SnapReader{cur: itemCursor{p: raw}} }

// ResetIdent starts reading the raw entries in raw, in the format version
// 2 (with identities).
func (sr *SnapReader) ResetIdent(raw []byte) { *sr = SnapReader{cur: itemCursor{p: raw}, ident: true} }

// Next decodes the next entry into e. It returns false at the end of the
// data or on a malformed entry (Err says which).
func (sr *SnapReader) Next(e *SnapEntry) bool {
	if !sr.cur.more() {
		return false
	}
	n, err := decodeEntry(sr.cur.p, e)
	if err == nil && sr.ident {
		e.Ident, n, err = readIdent(sr.cur.p, n)
	}
	return sr.cur.step(n, err)
}

// Err returns the error that stopped Next, nil at the clean end of data.
func (sr *SnapReader) Err() error { return sr.cur.err }

func decodeEntry(p []byte, e *SnapEntry) (int, error) {
	key, i, err := readKey(p, 0)
	if err != nil {
		return 0, err
	}
	if len(p) < i+8 {
		return 0, ErrTruncated
	}
	token := binary.BigEndian.Uint64(p[i:])
	left, i, err := Uvarint(p, i+8)
	if err != nil {
		return 0, err
	}
	if len(p) < i+1 {
		return 0, ErrTruncated
	}
	if token == 0 || left > math.MaxInt64 {
		return 0, ErrBadEntry
	}
	*e = SnapEntry{Key: key, Token: token, Left: time.Duration(left), Lease: p[i]}
	return i + 1, nil
}
