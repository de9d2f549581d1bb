package records

import (
	"encoding/binary"
	"math"
	"time"
)

// The snapshot entry format: entries one after the other until the end (a
// SnapShard frame's data on the member link, a shard of a raft snapshot):
//
//	keylen uvarint | key | token u64 | left_ns uvarint | lease u8

// SnapEntry is one held key of a snapshot.
type SnapEntry struct {
	Key   []byte
	Token uint64
	// Left is the lease time left when the dump was cut (0: ended). A
	// negative Left is sent as 0.
	Left  time.Duration
	Lease uint8 // lease seconds (0 for a lock restored from disk)
}

// AppendSnapEntry appends e in the snapshot entry format to dst. An entry
// the format cannot carry (ErrBadEntry, ErrBadKey) leaves dst as it was.
func AppendSnapEntry(dst []byte, e *SnapEntry) ([]byte, error) {
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
// allocating, as RecordReader does over records. An entry's Key points
// into the raw data.
type SnapReader struct{ cur itemCursor }

// Reset starts reading the raw entries in raw.
func (sr *SnapReader) Reset(raw []byte) { sr.cur = itemCursor{p: raw} }

// Next decodes the next entry into e. It returns false at the end of the
// data or on a malformed entry (Err says which).
func (sr *SnapReader) Next(e *SnapEntry) bool {
	if !sr.cur.more() {
		return false
	}
	n, err := decodeEntry(sr.cur.p, e)
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
