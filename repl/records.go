// Compression of the replication stream: s2 block, chosen by measurement.
//
// BenchmarkCompress and BenchmarkDecompress (records_test.go) on real
// batches: a shard.Table driven like bench/ (acquire/release pairs on
// 16-byte keys "bench/key/000123" over 100,000 keys, locks held and
// renewed, handoffs on 16 contended keys, 1 s leases left to expire;
// tokens from a wall-clock floor), its records cut every 8, 64, 512 and
// 2000 records. A record is 30.9 bytes raw. Medians of 6 runs, 2 vCPUs,
// klauspost/compress v1.20.4, one reused zstd encoder (no dictionary);
// the machine is noisy (±30% per figure), the ratios are exact:
//
//	records  s2 block            zstd EncodeAll fastest  zstd default
//	         ratio B/rec  µs     ratio B/rec  µs         ratio B/rec  µs
//	8        1.64  18.8   0.49   1.70  18.2   9.3        1.70  18.2   8.8
//	64       1.91  16.2   3.2    2.88  10.7   21         2.97  10.4   23
//	512      1.95  15.8   22     3.20   9.6   104        3.38   9.1   96
//	2000     1.92  16.1   101    3.21   9.6   317        3.34   9.3   362
//
// Decoding 512 records: s2 15 µs, zstd DecodeAll 35 µs.
//
// Choice: s2 block. zstd sends 40% fewer bytes from 64 records up, but
// costs 3-7× the CPU to compress (0.16-0.33 µs a record against 0.04-0.05)
// and 1.5-5× to decode, on a 2-core machine whose event loops need the CPU
// (the cluster must keep 80% of single-node throughput); at ~16 bytes a
// record, even 500,000 records/s are 8 MB/s, which loopback or a LAN
// carries easily. The cost of s2 per batch also stays below 0.2 ms at
// 2000 records, inside the 5 ms lag budget.
//
// Batches under 256 bytes stay raw (the format's rule): 8 records (247
// bytes) go raw at 30.9 bytes a record, 33.6 with the Batch frame; from 64
// records up a batch travels at 16.5 bytes a record with its frame.
// Compressing the 8-record batches would save 39% for 0.5 µs each.

package repl

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/lockd-dev/lockd/shard"
)

// MaxKey is the longest key a record or snapshot entry may carry (the
// client protocol's limit).
const MaxKey = 1024

// compressMin is the smallest raw batch Compress tries to compress.
const compressMin = 256

// Errors of records, snapshot entries and compressed data.
var (
	// ErrBadRecord: a record of an unknown kind, shard above 65535, Seq 0,
	// token 0, or a lease on a release or expiry.
	ErrBadRecord = errors.New("repl: malformed record")
	// ErrBadEntry: a snapshot entry with token 0 or a time left beyond
	// int64 nanoseconds.
	ErrBadEntry = errors.New("repl: malformed snapshot entry")
	// ErrBadKey: a key length outside 1..MaxKey.
	ErrBadKey = errors.New("repl: key length outside 1..1024")
	// ErrTruncated: data ends inside a record or entry (or its varint).
	ErrTruncated = errors.New("repl: truncated record or entry")
	// ErrBadVarint: a varint longer than needed or above 64 bits.
	ErrBadVarint = errors.New("repl: malformed varint")
	// ErrCorrupt: compressed data that does not decode to its raw length.
	ErrCorrupt = errors.New("repl: corrupt compressed data")
)

// Records inside a Batch, repeated until the end:
//
//	kind u8 | shard u16 | seq uvarint | token u64 | lease u8 | keylen uvarint | key
//
// kind is shard.RecordKind (1 grant, 2 release, 3 expire, 4 renew); lease
// is 0 for release and expire. A skip (kind 5) stands for records of its
// shard that cancelled out before the batch was cut (a grant and its end,
// with any renewal between):
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

// Add appends r (its Kind, Shard, Seq, Token, Lease and Key; Deadline is
// not sent). A record the format cannot carry (ErrBadRecord, ErrBadKey)
// is not added.
func (w *BatchWriter) Add(r *shard.Record) error {
	if r.Kind < shard.RecordGrant || r.Kind > shard.RecordRenew || r.Shard > math.MaxUint16 ||
		r.Seq == 0 || r.Token == 0 || (r.Lease != 0 && !hasLease(r.Kind)) {
		return ErrBadRecord
	}
	if len(r.Key) == 0 || len(r.Key) > MaxKey {
		return ErrBadKey
	}
	b := append(w.buf, byte(r.Kind))
	b = binary.BigEndian.AppendUint16(b, uint16(r.Shard))
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, r.Token)
	b = append(b, r.Lease)
	b = binary.AppendUvarint(b, uint64(len(r.Key)))
	w.buf = append(b, r.Key...)
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

// Bytes returns the raw records (for AppendBatch), valid until the next
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
	kind := shard.RecordKind(p[0])
	if kind < shard.RecordGrant || kind > shard.RecordSkip {
		return 0, ErrBadRecord
	}
	seq, i, err := readUvarint(p, 3)
	if err != nil {
		return 0, err
	}
	if kind == shard.RecordSkip {
		count, j, err := readUvarint(p, i)
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
	key, i, err := readKey(p, i+9)
	if err != nil {
		return 0, err
	}
	*r = shard.Record{
		Kind:  kind,
		Shard: uint32(binary.BigEndian.Uint16(p[1:])),
		Seq:   seq,
		Key:   key,
		Token: token,
		Lease: lease,
	}
	return i, nil
}

// Entries inside a SnapShard, repeated until the end:
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
	if len(e.Key) == 0 || len(e.Key) > MaxKey {
		return dst, ErrBadKey
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
	dst = append(dst, e.Key...)
	dst = binary.BigEndian.AppendUint64(dst, e.Token)
	dst = binary.AppendUvarint(dst, uint64(max(e.Left, 0)))
	return append(dst, e.Lease), nil
}

// SnapReader iterates over the entries of a raw SnapShard without
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
	left, i, err := readUvarint(p, i+8)
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
	n, i, err := readUvarint(p, i)
	switch {
	case err != nil:
		return nil, 0, err
	case n == 0 || n > MaxKey:
		return nil, 0, ErrBadKey
	case uint64(len(p)-i) < n:
		return nil, 0, ErrTruncated
	}
	next = i + int(n)
	return p[i:next:next], next, nil
}

// readUvarint reads a canonical uvarint at p[i:] and returns the index after
// it. Unlike binary.Uvarint it rejects padded encodings (a last byte of 0),
// so every value has one encoding and decoded data re-encodes to itself.
func readUvarint(p []byte, i int) (v uint64, next int, err error) {
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

// Compress appends raw to dst encoded as it should travel: one s2 block
// (CodecS2) when raw is at least 256 bytes and the block is smaller than
// 7/8 of it, else raw itself (CodecRaw). It returns the codec and the
// extended dst. raw must be at most MaxFrame bytes.
func Compress(dst, raw []byte) (Codec, []byte) {
	if len(raw) >= compressMin {
		n := s2.MaxEncodedLen(len(raw))
		dst = slices.Grow(dst, n)
		enc := s2.Encode(dst[len(dst):len(dst)+n], raw)
		if len(enc)*8 < len(raw)*7 {
			return CodecS2, dst[:len(dst)+len(enc)]
		}
	}
	return CodecRaw, append(dst, raw...)
}

// Decompress returns the rawLen bytes that data encodes with codec c. Raw
// data is returned as it is; s2 data is decoded into dst's memory (from
// its start; a new buffer when dst is too small). rawLen is checked before
// anything is allocated: above MaxFrame, or not what the s2 block says,
// is an error, so a peer cannot make the caller allocate more than
// MaxFrame.
func Decompress(dst []byte, c Codec, data []byte, rawLen int) ([]byte, error) {
	return decompress(dst, c, data, rawLen, MaxFrame)
}

// decompress is Decompress with limit in place of MaxFrame.
func decompress(dst []byte, c Codec, data []byte, rawLen, limit int) ([]byte, error) {
	switch {
	case c == CodecRaw && len(data) == rawLen:
		return data, nil
	case c != CodecS2 || rawLen < 0 || rawLen > limit:
		return nil, ErrBadField
	}
	if n, err := s2.DecodedLen(data); err != nil || n != rawLen {
		return nil, ErrCorrupt
	}
	if cap(dst) < rawLen {
		dst = make([]byte, rawLen)
	}
	out, err := s2.Decode(dst[:rawLen], data)
	if err != nil {
		return nil, ErrCorrupt
	}
	return out, nil
}
