package raftnode

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// The snapshot format (written by lockd into raft's snapshot store):
//
//	magic "LKRAFT2\n" | index u64 | cut i64 | last u64 | reserved u64 | shards u32 |
//	per shard: seq uvarint | count uvarint | codec u8 | rawlen uvarint | datalen uvarint | data
//
// index is the raft index of the last command in it; cut is the wall clock
// (ns) the entries' time left counts from; last is the highest token;
// reserved the highest reservation; each shard's entries
// (AppendSnapEntryIdent: with each grant's identity, PROTOCOL.md §8.3) are
// raw or one s2 block. The file snapshot store adds its own checksum.
// Snapshots written before identities ("LKRAFT1\n", entries in the
// format version 1) still load, their grants without one.
var (
	snapMagic   = []byte("LKRAFT2\n")
	snapMagicV1 = []byte("LKRAFT1\n")
)

// snapHeader is a snapshot's header.
type snapHeader struct {
	index, last, reserved uint64
	cut                   int64
	shards                uint32
}

// writeSnapshot writes t (every shard dumped under its lock at its Seq),
// reserved and index to w; now is t's clock at the cut and wallAtZero the
// wall clock at t's time 0. It returns the bytes written.
func writeSnapshot(w io.Writer, t *shard.Table, reserved, index uint64, now, wallAtZero int64) (int64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	hdr := append([]byte(nil), snapMagic...)
	hdr = binary.BigEndian.AppendUint64(hdr, index)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(now+wallAtZero))
	hdr = binary.BigEndian.AppendUint64(hdr, t.Tokens().Last())
	hdr = binary.BigEndian.AppendUint64(hdr, reserved)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(t.Shards()))
	total := int64(len(hdr))
	if _, err := bw.Write(hdr); err != nil {
		return total, err
	}
	var raw, frame, data []byte
	for i := range t.Shards() {
		raw = raw[:0]
		count := 0
		var bad error
		seq := t.Dump(i, func(h *shard.HeldLock) {
			var err error
			raw, err = records.AppendSnapEntryIdent(raw, &records.SnapEntry{Key: h.Key, Token: h.Token,
				Left: time.Duration(h.Deadline - now), Lease: h.Lease, Ident: h.Ident})
			if err != nil {
				bad = err
				return
			}
			count++
		})
		if bad != nil {
			return total, fmt.Errorf("raftnode: snapshot of shard %d: %w", i, bad)
		}
		frame = binary.AppendUvarint(frame[:0], seq)
		frame = binary.AppendUvarint(frame, uint64(count))
		at := len(frame)
		frame = append(frame, 0)
		frame = binary.AppendUvarint(frame, uint64(len(raw)))
		var codec records.Codec
		codec, data = records.Compress(data[:0], raw)
		frame[at] = byte(codec)
		frame = binary.AppendUvarint(frame, uint64(len(data)))
		frame = append(frame, data...)
		total += int64(len(frame))
		if _, err := bw.Write(frame); err != nil {
			return total, err
		}
	}
	return total, bw.Flush()
}

// readSnapshot replaces t's state with the snapshot in r (t must be
// empty: Reset) and returns its header. Every lock comes back with its
// token and its deadline moved onto t's clock (wallAtZero); each shard's
// Seq is set, so the log entries after the snapshot apply exactly after
// it; the token allocator observes the snapshot's last token.
func readSnapshot(r io.Reader, t *shard.Table, wallAtZero int64) (snapHeader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var h snapHeader
	fixed := make([]byte, len(snapMagic)+8*4+4)
	if _, err := io.ReadFull(br, fixed); err != nil {
		return h, fmt.Errorf("%w: header: %v", errBadLogEntry, err)
	}
	idents := true
	switch string(fixed[:len(snapMagic)]) {
	case string(snapMagic):
	case string(snapMagicV1):
		idents = false
	default:
		return h, fmt.Errorf("%w: not a lockd snapshot", errBadLogEntry)
	}
	p := fixed[len(snapMagic):]
	h.index = binary.BigEndian.Uint64(p)
	h.cut = int64(binary.BigEndian.Uint64(p[8:]))
	h.last = binary.BigEndian.Uint64(p[16:])
	h.reserved = binary.BigEndian.Uint64(p[24:])
	h.shards = binary.BigEndian.Uint32(p[32:])
	if int(h.shards) != t.Shards() {
		return h, fmt.Errorf("%w: snapshot of a table with %d shards, this one has %d (every member must use the same shard count)",
			errBadLogEntry, h.shards, t.Shards())
	}
	cutNow := h.cut - wallAtZero // the cut on t's clock
	var data, raw []byte
	for i := range int(h.shards) {
		seq, err1 := binary.ReadUvarint(br)
		_, err2 := binary.ReadUvarint(br)
		codec, err3 := br.ReadByte()
		rawLen, err4 := binary.ReadUvarint(br)
		n, err5 := binary.ReadUvarint(br)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil || n > records.MaxRaw*64 || rawLen > records.MaxRaw*64 {
			return h, fmt.Errorf("%w: shard %d", errBadLogEntry, i)
		}
		if uint64(cap(data)) < n {
			data = make([]byte, n)
		}
		data = data[:n]
		if _, err := io.ReadFull(br, data); err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", errBadLogEntry, i, err)
		}
		entries, err := decompressSnap(&raw, records.Codec(codec), data, int(rawLen))
		if err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", errBadLogEntry, i, err)
		}
		var sr records.SnapReader
		var e records.SnapEntry
		if idents {
			sr.ResetIdent(entries)
		} else {
			sr.Reset(entries)
		}
		for sr.Next(&e) {
			if err := t.RestoreAs(e.Key, e.Token, cutNow+int64(e.Left), e.Ident); err != nil {
				return h, err
			}
		}
		if err := sr.Err(); err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", errBadLogEntry, i, err)
		}
		t.SetSeq(i, seq)
	}
	t.Tokens().Observe(h.last)
	return h, nil
}

// decompressSnap is Decompress without its limit (a shard of a snapshot
// can be larger than a batch); the decoded shard stays in *buf's memory
// for the next.
func decompressSnap(buf *[]byte, c records.Codec, data []byte, rawLen int) ([]byte, error) {
	out, err := records.DecompressUpTo(*buf, c, data, rawLen, math.MaxInt)
	if errors.Is(err, records.ErrBadCodec) {
		return nil, errBadLogEntry
	}
	if err == nil && c == records.CodecS2 {
		*buf = out[:0]
	}
	return out, err
}
