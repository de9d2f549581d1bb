package records

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/lockd-dev/lockd/shard"
)

// maxKey is the longest key a record or snapshot entry may carry (the
// client protocol's limit).
const maxKey = 1024

// maxIdent is the longest identity name a grant record or snapshot entry
// may carry (a u8 length; an ACL identity is at most 64 bytes).
const maxIdent = 255

// kindIdent is the bit of a record's kind byte that says an identity
// follows its key: only a grant carries one (0x81), PROTOCOL.md §8.3.
const kindIdent = 0x80

// kindLimit is the bit of a record's kind byte that says a shared grant's
// limit (u16, 1..65535) follows its lease: only a grant carries one (0x41,
// 0xC1 with an identity), PROTOCOL.md §9.2.
const kindLimit = 0x40

// Version is the version of the replicated formats this package writes:
// the member link's hello and the raft entry header carry it, so that a
// member never reads another's records or snapshots in a format it does
// not know (a mixed-version cluster is refused, Compatible).
//
//   - 1: records of kinds 1–5; snapshot entries version 1.
//   - 2: a grant made to an identity (kind 0x81); snapshot entries version
//     2 (with the identity).
//   - 3: a shared grant with its limit (kinds 0x41, 0xC1); snapshot entries
//     version 3 (with the identity and the key's limit), one per holder.
//
// Data without shared grants is the same in versions 2 and 3.
const Version = 3

// ErrVersion: a peer, an entry or a snapshot in a format version this
// package does not read.
var ErrVersion = errors.New("records: unknown format version")

// Compatible reports whether a member whose replicated formats are peer's
// version can replicate with this one: only the same version can (an
// older member would refuse or misread a newer one's shared grants, a
// newer one cannot tell an older one's data from its own). The error says
// both versions.
func Compatible(peer uint32) error {
	if peer == Version {
		return nil
	}
	return fmt.Errorf("%w: the peer writes replication format version %d, this member version %d; every member must run the same lockd version",
		ErrVersion, peer, Version)
}

// Errors of records and snapshot entries.
var (
	// ErrBadRecord: a record of an unknown kind, shard above 65535, Seq 0,
	// token 0, a lease on a release or expiry, or a grant's limit bit with
	// limit 0.
	ErrBadRecord = errors.New("records: malformed record")
	// ErrBadEntry: a snapshot entry with token 0 or a time left beyond
	// int64 nanoseconds.
	ErrBadEntry = errors.New("records: malformed snapshot entry")
	// ErrBadKey: a key length outside 1..1024.
	ErrBadKey = errors.New("records: key length outside 1..1024")
	// ErrTruncated: data ends inside a record or entry (or its varint).
	ErrTruncated = errors.New("records: truncated record or entry")
	// ErrBadVarint: a varint longer than needed or above 64 bits.
	ErrBadVarint = errors.New("records: malformed varint")
)

// The batch format: records one after the other until the end (a Batch
// frame's data on the member link, a raft log entry's records):
//
//	kind u8 | shard u16 | seq uvarint | token u64 | lease u8 | keylen uvarint | key
//
// kind is shard.RecordKind (1 grant, 2 release, 3 expire, 4 renew); lease
// is 0 for release and expire. A grant made to an identity (Record.Ident,
// PROTOCOL.md §8.3) has kind 0x81 (the grant with the identity bit) and its
// identity after the key:
//
//	0x81 u8 | shard u16 | seq uvarint | token u64 | lease u8 | keylen uvarint | key | identlen u8 (1..255) | ident
//
// so data written before identities (kind 1 only) reads as it did. A
// shared grant (PROTOCOL.md §9.2, Record.Limit ≥ 1) has the limit bit too
// (0x41, or 0xC1 with an identity) and its limit after its lease:
//
//	0x41 | shard u16 | seq uvarint | token u64 | lease u8 | limit u16 | keylen uvarint | key [| identlen u8 | ident]
//
// (format version 3, Version; a shared key's holders each have their own
// grant, release or expiry, renew, all naming the holder by token). A skip
// (kind 5) stands for records of its shard that cancelled out before the
// batch was cut (a grant and its end, with any renewal between):
//
//	5 u8 | shard u16 | seq uvarint | count uvarint
//
// the records seq-count+1 … seq (count ≥ 1).

// BatchWriter accumulates records in the batch format in a buffer it
// reuses after Reset. Not safe for concurrent use.
type BatchWriter struct {
	buf []byte
	n   int
}

// Add appends r (its Kind, Shard, Seq, Token, Lease, Key and, on a grant,
// Ident and Limit; Deadline is not sent). A record the format cannot carry
// (ErrBadRecord: an Ident or a Limit on another kind, an Ident over 255
// bytes; ErrBadKey) is not added.
func (w *BatchWriter) Add(r *shard.Record) error {
	if r.Kind < shard.RecordGrant || r.Kind > shard.RecordRenew || r.Shard > math.MaxUint16 ||
		r.Seq == 0 || r.Token == 0 || (r.Lease != 0 && !hasLease(r.Kind)) ||
		(len(r.Ident) > 0 || r.Limit != 0) && r.Kind != shard.RecordGrant || len(r.Ident) > maxIdent {
		return ErrBadRecord
	}
	if len(r.Key) == 0 || len(r.Key) > maxKey {
		return ErrBadKey
	}
	kind := byte(r.Kind)
	if len(r.Ident) > 0 {
		kind |= kindIdent
	}
	if r.Limit != 0 {
		kind |= kindLimit
	}
	b := append(w.buf, kind)
	b = binary.BigEndian.AppendUint16(b, uint16(r.Shard))
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, r.Token)
	b = append(b, r.Lease)
	if r.Limit != 0 {
		b = binary.BigEndian.AppendUint16(b, r.Limit)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Key)))
	b = append(b, r.Key...)
	if len(r.Ident) > 0 {
		b = append(b, byte(len(r.Ident)))
		b = append(b, r.Ident...)
	}
	w.buf = b
	w.n++
	return nil
}

// AddSkip appends a skip record standing for shard's records from…to.
func (w *BatchWriter) AddSkip(shardID uint32, from, to uint64) error {
	if shardID > math.MaxUint16 || from == 0 || from > to {
		return ErrBadRecord
	}
	b := append(w.buf, byte(shard.RecordSkip))
	b = binary.BigEndian.AppendUint16(b, uint16(shardID))
	b = binary.AppendUvarint(b, to)
	w.buf = binary.AppendUvarint(b, to-from+1)
	w.n++
	return nil
}

// addEncoded appends n records already in the batch format.
func (w *BatchWriter) addEncoded(raw []byte, n int) {
	w.buf = append(w.buf, raw...)
	w.n += n
}

func hasLease(k shard.RecordKind) bool { return k == shard.RecordGrant || k == shard.RecordRenew }

// Len returns the raw size of the records added since Reset, in bytes.
func (w *BatchWriter) Len() int { return len(w.buf) }

// Count returns the number of records added since Reset.
func (w *BatchWriter) Count() int { return w.n }

// Bytes returns the raw records, valid until the next
// Add or Reset.
func (w *BatchWriter) Bytes() []byte { return w.buf }

// Reset empties w, keeping its buffer.
func (w *BatchWriter) Reset() { w.buf, w.n = w.buf[:0], 0 }

// RecordReader iterates over the records of a raw batch without
// allocating:
//
//	rr.Reset(raw)
//	for rr.Next(&rec) { … }
//	if err := rr.Err(); err != nil { … }
//
// A record's Key points into raw; Deadline is 0. Reading stops at the
// first malformed record, so a caller that must not apply part of a bad
// batch checks it whole first (CheckRecords).
type RecordReader struct{ cur itemCursor }

// Reset starts reading the raw records in raw.
func (rr *RecordReader) Reset(raw []byte) { rr.cur = itemCursor{p: raw} }

// Next decodes the next record into r. It returns false at the end of the
// data or on a malformed record (Err says which).
func (rr *RecordReader) Next(r *shard.Record) bool {
	if !rr.cur.more() {
		return false
	}
	n, err := decodeRecord(rr.cur.p, r)
	return rr.cur.step(n, err)
}

// Err returns the error that stopped Next, nil at the clean end of data.
func (rr *RecordReader) Err() error { return rr.cur.err }

// CheckRecords validates a whole raw batch and counts its records.
func CheckRecords(raw []byte) (int, error) {
	var rr RecordReader
	var r shard.Record
	rr.Reset(raw)
	n := 0
	for rr.Next(&r) {
		n++
	}
	return n, rr.Err()
}

func decodeRecord(p []byte, r *shard.Record) (int, error) {
	if len(p) < 3 {
		return 0, ErrTruncated
	}
	kind, ident, limited := shard.RecordKind(p[0]), false, false
	if kind&^(kindIdent|kindLimit) == shard.RecordGrant {
		kind, ident, limited = shard.RecordGrant, kind&kindIdent != 0, kind&kindLimit != 0
	}
	if kind < shard.RecordGrant || kind > shard.RecordSkip {
		return 0, ErrBadRecord
	}
	seq, i, err := Uvarint(p, 3)
	if err != nil {
		return 0, err
	}
	if kind == shard.RecordSkip {
		count, j, err := Uvarint(p, i)
		if err != nil {
			return 0, err
		}
		if seq == 0 || count == 0 || count > seq {
			return 0, ErrBadRecord
		}
		*r = shard.Record{Kind: kind, Shard: uint32(binary.BigEndian.Uint16(p[1:])), Seq: seq, From: seq - count + 1}
		return j, nil
	}
	if len(p) < i+9 {
		return 0, ErrTruncated
	}
	token, lease := binary.BigEndian.Uint64(p[i:]), p[i+8]
	if seq == 0 || token == 0 || (lease != 0 && !hasLease(kind)) {
		return 0, ErrBadRecord
	}
	i += 9
	var limit uint16
	if limited {
		if len(p) < i+2 {
			return 0, ErrTruncated
		}
		if limit = binary.BigEndian.Uint16(p[i:]); limit == 0 {
			return 0, ErrBadRecord // a limit is 1..65535: the bit is not set for none
		}
		i += 2
	}
	key, i, err := readKey(p, i)
	if err != nil {
		return 0, err
	}
	var id []byte
	if ident {
		if id, i, err = readIdent(p, i); err != nil {
			return 0, err
		}
		if len(id) == 0 {
			return 0, ErrBadRecord
		}
	}
	*r = shard.Record{
		Kind:  kind,
		Shard: uint32(binary.BigEndian.Uint16(p[1:])),
		Seq:   seq,
		Key:   key,
		Token: token,
		Lease: lease,
		Ident: id,
		Limit: limit,
	}
	return i, nil
}

// readIdent reads identlen u8 | ident at p[i:]; ident points into p (nil
// when empty).
func readIdent(p []byte, i int) (ident []byte, next int, err error) {
	if len(p) < i+1 {
		return nil, 0, ErrTruncated
	}
	n := int(p[i])
	i++
	if len(p)-i < n {
		return nil, 0, ErrTruncated
	}
	if n == 0 {
		return nil, i, nil
	}
	return p[i : i+n : i+n], i + n, nil
}

// itemCursor is the position of a RecordReader or SnapReader.
type itemCursor struct {
	p   []byte // what is left to read
	err error
}

func (c *itemCursor) more() bool { return c.err == nil && len(c.p) > 0 }

// step advances past an item of n bytes, or stops at err.
func (c *itemCursor) step(n int, err error) bool {
	if err != nil {
		c.p, c.err = nil, err
		return false
	}
	c.p = c.p[n:]
	return true
}

// readKey reads keylen uvarint | key at p[i:]; key points into p.
func readKey(p []byte, i int) (key []byte, next int, err error) {
	n, i, err := Uvarint(p, i)
	switch {
	case err != nil:
		return nil, 0, err
	case n == 0 || n > maxKey:
		return nil, 0, ErrBadKey
	case uint64(len(p)-i) < n:
		return nil, 0, ErrTruncated
	}
	next = i + int(n)
	return p[i:next:next], next, nil
}

// Uvarint reads a canonical uvarint at p[i:] and returns the index after
// it. Unlike binary.Uvarint it rejects padded encodings (a last byte of 0),
// so every value has one encoding and decoded data re-encodes to itself.
func Uvarint(p []byte, i int) (v uint64, next int, err error) {
	if i < len(p) && p[i] < 0x80 {
		return uint64(p[i]), i + 1, nil
	}
	var shift uint
	for j := i; j < len(p); j++ {
		b := p[j]
		if j-i == binary.MaxVarintLen64-1 && b > 1 {
			return 0, 0, ErrBadVarint
		}
		if b < 0x80 {
			if b == 0 {
				return 0, 0, ErrBadVarint
			}
			return v | uint64(b)<<shift, j + 1, nil
		}
		v |= uint64(b&0x7f) << shift
		shift += 7
	}
	return 0, 0, ErrTruncated
}
