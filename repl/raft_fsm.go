package repl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// The raft log's entries (raft.Log.Data of LogCommand entries):
//
//	records: 1 | proposer u8 | term u64 | stamp i64 | first uvarint | last uvarint |
//	         count uvarint | codec u8 | rawlen uvarint | data
//	reserve: 2 | proposer u8 | term u64 | limit u64
//
// proposer is the member index of the leader that proposed the entry and
// term its term then; stamp is its wall clock (ns since the epoch) when it
// cut the entry: every member's lease of a Grant or Renew in it counts
// from that instant, moved onto its own table clock, so applying reads no
// clock. first..last are the proposer's own record numbers (Committer),
// for diagnosis only. data holds count records in the batch format
// (BatchWriter), raw or one s2 block (Compress). A reserve entry says that
// tokens up to limit may be handed out by the leader that proposed it.
const (
	entryRecords = 1
	entryReserve = 2

	entryHeader = 1 + 1 + 8 + 8 // kind, proposer, term, stamp
)

// ErrBadLogEntry: a raft log entry or snapshot lockd cannot read (a
// member of another version, a damaged disk).
var ErrBadLogEntry = errors.New("repl: malformed raft log entry or snapshot")

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
	dst = append(dst, entryRecords, byte(proposer))
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
	dst = append(dst, entryReserve, byte(proposer))
	dst = binary.BigEndian.AppendUint64(dst, term)
	dst = binary.BigEndian.AppendUint64(dst, 0)
	return binary.BigEndian.AppendUint64(dst, limit)
}

// decodeLogEntry decodes p into e; records are decompressed into *buf's
// memory when they are compressed.
func decodeLogEntry(p []byte, e *logEntry, buf *[]byte) error {
	if len(p) < entryHeader {
		return ErrBadLogEntry
	}
	*e = logEntry{kind: p[0], proposer: int(p[1]), term: binary.BigEndian.Uint64(p[2:]),
		stamp: int64(binary.BigEndian.Uint64(p[10:]))}
	switch e.kind {
	case entryReserve:
		if len(p) != entryHeader+8 {
			return ErrBadLogEntry
		}
		e.limit = binary.BigEndian.Uint64(p[entryHeader:])
		return nil
	case entryRecords:
	default:
		return ErrBadLogEntry
	}
	var vals [4]uint64
	i := entryHeader
	for k := range 3 {
		v, next, err := records.Uvarint(p, i)
		if err != nil {
			return ErrBadLogEntry
		}
		vals[k], i = v, next
	}
	if i >= len(p) {
		return ErrBadLogEntry
	}
	codec := records.Codec(p[i])
	rawLen, i, err := records.Uvarint(p, i+1)
	if err != nil || rawLen > records.MaxRaw || vals[2] > rawLen {
		return ErrBadLogEntry
	}
	raw, err := records.Decompress(*buf, codec, p[i:], int(rawLen))
	if err != nil {
		return ErrBadLogEntry
	}
	if codec == records.CodecS2 {
		*buf = raw[:0]
	}
	e.first, e.last, e.count, e.raw = vals[0], vals[1], int(vals[2]), raw
	return nil
}

// applyState is what applying the log changes: a table and the highest
// token reservation seen. The live FSM and the rebuilds of a snapshot use
// it alike.
type applyState struct {
	table    *shard.Table
	reserved uint64
	errs     uint64 // records Table.Apply refused (a gap, another shard count)
	lastErr  error
	out      shard.Out
	buf      []byte
}

// applyEntry applies a decoded entry: a reservation raises reserved; the
// records are applied in order with their leases counting from the
// entry's stamp moved onto the table's clock (wallAtZero: the wall clock
// at table time 0). skipRecords leaves the table as it is (the leader
// executed them already).
func (s *applyState) applyEntry(e *logEntry, wallAtZero int64, skipRecords bool) {
	if e.kind == entryReserve {
		s.reserved = max(s.reserved, e.limit)
		return
	}
	if skipRecords {
		return
	}
	now := e.stamp - wallAtZero
	var rr records.RecordReader
	var rec shard.Record
	rr.Reset(e.raw)
	for rr.Next(&rec) {
		if _, err := s.table.Apply(now, &rec, &s.out); err != nil {
			s.errs++
			s.lastErr = err
		}
	}
	if err := rr.Err(); err != nil {
		s.errs++
		s.lastErr = err
	}
	// A table fed by the log has no waiters of its own; any effect (a
	// waiter of a key a record freed, on a deposed leader before its
	// rebuild) has no one to answer here.
	s.out.Reset()
}

// The snapshot format (written by lockd into raft's snapshot store):
//
//	magic "LKRAFT1\n" | index u64 | cut i64 | last u64 | reserved u64 | shards u32 |
//	per shard: seq uvarint | count uvarint | codec u8 | rawlen uvarint | datalen uvarint | data
//
// index is the raft index of the last command in it; cut is the wall clock
// (ns) the entries' time left counts from; last is the highest token;
// reserved the highest reservation; each shard's entries (AppendSnapEntry)
// are raw or one s2 block. The file snapshot store adds its own checksum.
var snapMagic = []byte("LKRAFT1\n")

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
		seq := t.DumpShard(i, func(key []byte, token uint64, deadline int64, lease uint8) {
			var err error
			raw, err = records.AppendSnapEntry(raw, &records.SnapEntry{Key: key, Token: token, Left: time.Duration(deadline - now), Lease: lease})
			if err != nil {
				bad = err
				return
			}
			count++
		})
		if bad != nil {
			return total, fmt.Errorf("repl: snapshot of shard %d: %w", i, bad)
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
		return h, fmt.Errorf("%w: header: %v", ErrBadLogEntry, err)
	}
	if string(fixed[:len(snapMagic)]) != string(snapMagic) {
		return h, fmt.Errorf("%w: not a lockd snapshot", ErrBadLogEntry)
	}
	p := fixed[len(snapMagic):]
	h.index = binary.BigEndian.Uint64(p)
	h.cut = int64(binary.BigEndian.Uint64(p[8:]))
	h.last = binary.BigEndian.Uint64(p[16:])
	h.reserved = binary.BigEndian.Uint64(p[24:])
	h.shards = binary.BigEndian.Uint32(p[32:])
	if int(h.shards) != t.Shards() {
		return h, fmt.Errorf("%w: snapshot of a table with %d shards, this one has %d (--shards must be the same on every member)",
			ErrBadLogEntry, h.shards, t.Shards())
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
			return h, fmt.Errorf("%w: shard %d", ErrBadLogEntry, i)
		}
		if uint64(cap(data)) < n {
			data = make([]byte, n)
		}
		data = data[:n]
		if _, err := io.ReadFull(br, data); err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", ErrBadLogEntry, i, err)
		}
		entries, err := decompressSnap(&raw, records.Codec(codec), data, int(rawLen))
		if err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", ErrBadLogEntry, i, err)
		}
		var sr records.SnapReader
		var e records.SnapEntry
		sr.Reset(entries)
		for sr.Next(&e) {
			if err := t.Restore(e.Key, e.Token, cutNow+int64(e.Left)); err != nil {
				return h, err
			}
		}
		if err := sr.Err(); err != nil {
			return h, fmt.Errorf("%w: shard %d: %v", ErrBadLogEntry, i, err)
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
		return nil, ErrBadLogEntry
	}
	if err == nil && c == records.CodecS2 {
		*buf = out[:0]
	}
	return out, err
}

// replayInto builds in t (empty) the state of the log up to index upTo:
// the newest snapshot in the store, then the log's commands after it. It
// returns the highest reservation, the records it could not apply and
// the index the snapshot it started from was cut at.
func replayInto(t *shard.Table, snaps raft.SnapshotStore, logs raft.LogStore, upTo uint64, wallAtZero int64) (st *applyState, from uint64, err error) {
	st = &applyState{table: t}
	metas, err := snaps.List()
	if err != nil {
		return st, 0, err
	}
	next := uint64(1)
	if len(metas) > 0 {
		meta, rc, err := snaps.Open(metas[0].ID)
		if err != nil {
			return st, 0, fmt.Errorf("opening snapshot %s: %w", metas[0].ID, err)
		}
		h, err := readSnapshot(rc, t, wallAtZero)
		rc.Close()
		if err != nil {
			return st, 0, fmt.Errorf("reading snapshot %s: %w", meta.ID, err)
		}
		st.reserved = h.reserved
		from = meta.Index
		next = meta.Index + 1
	}
	if next > upTo {
		return st, from, nil
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return st, from, err
	}
	if first > next {
		return st, from, fmt.Errorf("repl: the raft log starts at %d, after the snapshot's %d", first, next-1)
	}
	var l raft.Log
	var e logEntry
	for i := next; i <= upTo; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return st, from, fmt.Errorf("raft log entry %d: %w", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if err := decodeLogEntry(l.Data, &e, &st.buf); err != nil {
			st.errs++
			st.lastErr = fmt.Errorf("entry %d: %w", i, err)
			continue
		}
		st.applyEntry(&e, wallAtZero, false)
	}
	return st, from, nil
}
