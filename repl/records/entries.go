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
//
// Version 3 (AppendSnapEntryVersion, SnapReader.ResetVersion with 3) adds
// the key's limit (PROTOCOL.md §9.2; 0: exclusive, 1..65535: shared), one
// entry per holder, each with the key and the limit:
//
//	keylen uvarint | key | token u64 | left_ns uvarint | lease u8 | identlen u8 | ident | limit u16

// SnapEntry is one holder of a held key in a snapshot (an exclusive key has
// one, a shared key one per holder).
type SnapEntry struct {
	Key   []byte
	Token uint64
	// Left is the lease time left when the dump was cut (0: ended). A
	// negative Left is sent as 0.
	Left  time.Duration
	Lease uint8 // lease seconds (0 for a lock restored from disk)
	// Ident is the identity the grant was made to (nil: none); versions 2
	// and 3.
	Ident []byte
	// Limit is the key's limit if it is shared (1..65535), 0 if exclusive;
	// version 3 only.
	Limit uint16
}

// AppendSnapEntry appends e in the snapshot entry format version 1 to
// dst. An entry the format cannot carry (ErrBadEntry, which includes an
// entry with an Ident or a Limit; ErrBadKey) leaves dst as it was.
func AppendSnapEntry(dst []byte, e *SnapEntry) ([]byte, error) {
	return AppendSnapEntryVersion(dst, e, 1)
}

// AppendSnapEntryIdent appends e in the snapshot entry format version 2
// (with its identity) to dst. An entry the format cannot carry
// (ErrBadEntry: token 0, an identity over 255 bytes, a Limit; ErrBadKey)
// leaves dst as it was.
func AppendSnapEntryIdent(dst []byte, e *SnapEntry) ([]byte, error) {
	return AppendSnapEntryVersion(dst, e, 2)
}

// AppendSnapEntryVersion appends e in the snapshot entry format version v
// (1, 2 or 3; Version is the newest) to dst. An entry the format cannot
// carry (ErrBadEntry: token 0, an identity in version 1 or over 255 bytes,
// a Limit before version 3; ErrBadKey; ErrVersion for another v) leaves dst
// as it was.
func AppendSnapEntryVersion(dst []byte, e *SnapEntry, v int) ([]byte, error) {
	switch {
	case v < 1 || v > Version:
		return dst, ErrVersion
	case v == 1 && len(e.Ident) > 0, len(e.Ident) > maxIdent, v < 3 && e.Limit != 0:
		return dst, ErrBadEntry
	}
	out, err := appendEntry(dst, e)
	if err != nil {
		return dst, err
	}
	if v >= 2 {
		out = append(out, byte(len(e.Ident)))
		out = append(out, e.Ident...)
	}
	if v >= 3 {
		out = binary.BigEndian.AppendUint16(out, e.Limit)
	}
	return out, nil
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
	cur     itemCursor
	version int
}

// Reset starts reading the raw entries in raw, in the format version 1.
func (sr *SnapReader) Reset(raw []byte) { *sr = SnapReader{cur: itemCursor{p: raw}, version: 1} }

// ResetIdent starts reading the raw entries in raw, in the format version
// 2 (with identities).
func (sr *SnapReader) ResetIdent(raw []byte) { *sr = SnapReader{cur: itemCursor{p: raw}, version: 2} }

// ResetVersion starts reading the raw entries in raw, in the format version
// v (1, 2 or 3). Another v reads nothing: Next returns false at once and
// Err is ErrVersion.
func (sr *SnapReader) ResetVersion(raw []byte, v int) {
	*sr = SnapReader{cur: itemCursor{p: raw}, version: v}
	if v < 1 || v > Version {
		sr.cur = itemCursor{err: ErrVersion}
	}
}

// Next decodes the next entry into e. It returns false at the end of the
// data or on a malformed entry (Err says which).
func (sr *SnapReader) Next(e *SnapEntry) bool {
	if !sr.cur.more() {
		return false
	}
	n, err := decodeEntry(sr.cur.p, e)
	if err == nil && sr.version >= 2 {
		e.Ident, n, err = readIdent(sr.cur.p, n)
	}
	if err == nil && sr.version >= 3 {
		switch p := sr.cur.p; {
		case len(p) < n+2:
			err = ErrTruncated
		default:
			e.Limit = binary.BigEndian.Uint16(p[n:])
			n += 2
		}
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
