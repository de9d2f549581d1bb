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
//	magic "LKRAFT3\n" | index u64 | cut i64 | last u64 | reserved u64 | shards u32 |
//	per shard: seq uvarint | count uvarint | codec u8 | rawlen uvarint | datalen uvarint | data
//
// index is the raft index of the last command in it; cut is the wall clock
// (ns) the entries' time left counts from; last is the highest token;
// reserved the highest reservation; each shard's entries, raw or one s2
// block, are in the snapshot entry format of the magic's digit:
// repl/records' version 3 (AppendSnapEntryVersion: one entry per holder,
// with its identity and its key's limit, PROTOCOL.md §8.3, §9.2), and
// count is the number of entries (holders). The file snapshot store adds
// its own checksum. Snapshots of the versions before load too:
// "LKRAFT1\n" (before identities, entries in the format version 1) and
// "LKRAFT2\n" (entries in the format version 2, exclusive keys only). A
// snapshot of a newer version (a digit above entryFormat) is refused
// whole, naming both versions (errEntryVersion); a member of version 2
// finds the magic unknown and refuses it too ("not a lockd snapshot").
var snapMagic = []byte("LKRAFT3\n")

// snapVersion returns the format version of a snapshot's magic
// ("LKRAFT" digit "\n"), 0 if it is not one.
func snapVersion(magic []byte) int {
	if len(magic) != len(snapMagic) || string(magic[:6]) != "LKRAFT" || magic[7] != '\n' || magic[6] < '1' || magic[6] > '9' {
		return 0
	}
	return int(magic[6] - '0')
}

// maxSnapShard bounds a shard's data in a snapshot, raw and encoded (a
// variable: the fuzz target lowers it).
var maxSnapShard uint64 = records.MaxRaw * 64

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
			raw, err = records.AppendSnapEntryVersion(raw, &records.SnapEntry{Key: h.Key, Token: h.Token,
				Left: time.Duration(h.Deadline - now), Lease: h.Lease, Ident: h.Ident, Limit: h.Limit}, entryFormat)
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
// empty: Reset) and returns its header. Every holder comes back with its
// token, identity, key's limit and its deadline moved onto t's clock
// (wallAtZero); each shard's
// Seq is set, so the log entries after the snapshot apply exactly after
// it; the token allocator observes the snapshot's last token.
func readSnapshot(r io.Reader, t *shard.Table, wallAtZero int64) (snapHeader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var h snapHeader
	fixed := make([]byte, len(snapMagic)+8*4+4)
	if _, err := io.ReadFull(br, fixed); err != nil {
		return h, fmt.Errorf("%w: header: %v", errBadLogEntry, err)
	}
	version := snapVersion(fixed[:len(snapMagic)])
	switch {
	case version == 0:
		return h, fmt.Errorf("%w: not a lockd snapshot", errBadLogEntry)
	case version > entryFormat:
		return h, versionError("raft snapshot", version)
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
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil || n > maxSnapShard || rawLen > maxSnapShard {
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
		sr.ResetVersion(entries, version)
		for sr.Next(&e) {
			// Holder by holder: a shared key has one entry per holder,
			// each with the key's limit (RestoreHolder rebuilds it in any
			// order); entries of the versions before are exclusive.
			hl := shard.HeldLock{Key: e.Key, Token: e.Token, Deadline: cutNow + int64(e.Left), Ident: e.Ident, Limit: e.Limit}
			if err := t.RestoreHolder(&hl); err != nil {
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
