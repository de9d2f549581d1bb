package raftnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// TestRaftEntryRoundTrip: records and reserve entries decode to what was
// encoded (small entries raw, large ones compressed); applying a records
// entry on another table gives the source's locks, with leases counting
// from the entry's stamp on the applying table's clock; malformed entries
// are refused.
func TestRaftEntryRoundTrip(t *testing.T) {
	for _, n := range []int{1, 8, 500} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var w records.BatchWriter
			src, err := shard.New(shard.Config{Shards: 4, Sink: func(r shard.Record) {
				if err := w.Add(&r); err != nil {
					t.Fatal(err)
				}
			}}, shard.NewTokens(100, 1<<20))
			if err != nil {
				t.Fatal(err)
			}
			var out shard.Out
			for i := range n {
				src.Acquire(0, []byte(fmt.Sprintf("bench/key/%06d", i)), 0, 10, 0, nil, &out)
			}
			stamp := int64(5e18)
			data := appendRecordsEntry(nil, 2, 7, stamp, 11, 10+uint64(n), w.Count(), w.Bytes())
			if n == 500 && len(data) >= len(w.Bytes()) {
				t.Fatalf("500 records not compressed: %d bytes for %d raw", len(data), len(w.Bytes()))
			}
			var e logEntry
			var buf []byte
			if err := decodeLogEntry(data, &e, &buf); err != nil {
				t.Fatal(err)
			}
			if e.kind != entryRecords || e.proposer != 2 || e.term != 7 || e.stamp != stamp || e.first != 11 ||
				e.last != 10+uint64(n) || e.count != n || !bytes.Equal(e.raw, w.Bytes()) {
				t.Fatalf("decoded %+v", e)
			}
			dst, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
			wallAtZero := stamp - 3e9 // the stamp is 3 s after dst's time 0
			st := &applyState{table: dst}
			st.applyEntry(&e, wallAtZero, false)
			if st.errs != 0 || dst.Stats().Keys != n {
				t.Fatalf("applied %d keys, %d errors (%v)", dst.Stats().Keys, st.errs, st.lastErr)
			}
			if info := dst.Lookup([]byte("bench/key/000000")); info.Token != 101 || info.Deadline != 13e9 {
				t.Fatalf("first key on the applying table: %+v, want token 101 until 13 s", info)
			}
			skip, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
			(&applyState{table: skip}).applyEntry(&e, wallAtZero, true)
			if skip.Stats().Keys != 0 {
				t.Fatal("skipRecords applied records")
			}
			for cut := range len(data) {
				if err := decodeLogEntry(data[:cut], &e, &buf); err == nil {
					t.Fatalf("a records entry cut at %d of %d decoded", cut, len(data))
				}
			}
		})
	}
	res := appendReserveEntry(nil, 1, 3, 1<<40)
	var e logEntry
	if err := decodeLogEntry(res, &e, nil); err != nil || e.kind != entryReserve || e.limit != 1<<40 || e.term != 3 {
		t.Fatalf("reserve entry: %+v %v", e, err)
	}
	st := &applyState{reserved: 1 << 41}
	st.applyEntry(&e, 0, true)
	if st.reserved != 1<<41 {
		t.Fatal("a lower reservation lowered the mark")
	}
	for _, bad := range [][]byte{nil, {9, 0}, append([]byte{9}, res[1:]...), res[:len(res)-1]} {
		if err := decodeLogEntry(bad, &e, nil); !errors.Is(err, errBadLogEntry) {
			t.Fatalf("decoding %x: %v, want errBadLogEntry", bad, err)
		}
	}
}

// TestRaftSnapshotRoundTrip: a snapshot restores every lock with its
// token and its deadline (wall-clock based, onto another clock), each
// shard's Seq (so the records after it apply exactly after it), the last
// token and the reservation; a table of another shard count refuses it.
func TestRaftSnapshotRoundTrip(t *testing.T) {
	src, _ := shard.New(shard.Config{Shards: 8}, shard.NewTokens(1000, 1<<30))
	var out shard.Out
	for i := range 3000 {
		id := src.Ident([]byte(testIdents[i%len(testIdents)]))
		src.AcquireAs(int64(i)*1e6, []byte(fmt.Sprintf("s/%d", i)), 0, uint8(1+i%200), 0, id, nil, &out)
	}
	for i := 0; i < 3000; i += 3 {
		src.Release(5e9, []byte(fmt.Sprintf("s/%d", i)), 1001+uint64(i), &out)
	}
	var b bytes.Buffer
	srcWall := int64(1.7e18)
	now := int64(4e9)
	size, err := writeSnapshot(&b, src, 1<<35, 42, now, srcWall)
	if err != nil || size != int64(b.Len()) {
		t.Fatalf("write: %d bytes (%d) %v", size, b.Len(), err)
	}
	dstWall := srcWall + 2e9 // the restoring process started 2 s later
	dst, _ := shard.New(shard.Config{Shards: 8}, shard.NewTokens(0, 0))
	h, err := readSnapshot(bytes.NewReader(b.Bytes()), dst, dstWall)
	if err != nil {
		t.Fatal(err)
	}
	if h.index != 42 || h.reserved != 1<<35 || h.last != src.Tokens().Last() || dst.Tokens().Last() != h.last {
		t.Fatalf("header %+v, tokens last %d", h, dst.Tokens().Last())
	}
	want := map[string]shard.KeyInfo{}
	for i := range src.Shards() {
		src.Dump(i, func(h *shard.HeldLock) {
			want[string(h.Key)] = shard.KeyInfo{Held: true, Token: h.Token, Deadline: h.Deadline, Ident: string(h.Ident)}
		})
	}
	if dst.Stats().Keys != len(want) {
		t.Fatalf("restored %d keys, want %d", dst.Stats().Keys, len(want))
	}
	for key, w := range want {
		got := dst.Lookup([]byte(key))
		wantDeadline := max(w.Deadline, now) - 2e9 // on dst's clock; an ended lease counts as ended at the cut
		if !got.Held || got.Token != w.Token || got.Deadline != wantDeadline || got.Ident != w.Ident {
			t.Fatalf("%s: %+v, want token %d deadline %d identity %q", key, got, w.Token, wantDeadline, w.Ident)
		}
	}
	for i := range 8 {
		if dst.Seq(i) != src.Seq(i) {
			t.Fatalf("shard %d seq %d, want %d", i, dst.Seq(i), src.Seq(i))
		}
	}
	other, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	if _, err := readSnapshot(bytes.NewReader(b.Bytes()), other, dstWall); !errors.Is(err, errBadLogEntry) {
		t.Fatalf("another shard count: %v", err)
	}
	for _, cut := range []int{0, 10, b.Len() / 2, b.Len() - 1} {
		t2, _ := shard.New(shard.Config{Shards: 8}, shard.NewTokens(0, 0))
		if _, err := readSnapshot(bytes.NewReader(b.Bytes()[:cut]), t2, dstWall); err == nil {
			t.Fatalf("a snapshot cut at %d of %d read", cut, b.Len())
		}
	}
}

// TestRaftSinkCutsEntries: records are numbered 1, 2, 3… in Sink order
// (Barrier is the last), none while the member does not lead (they mark
// the table dirty instead), and a burst is cut into entries of at most
// raftMaxEntry raw bytes plus one record, numbered without gaps.
func TestRaftSinkCutsEntries(t *testing.T) {
	n := &node{kick: make(chan struct{}, 1), actKick: make(chan struct{}, 1), log: repltest.Quiet()}
	key := bytes.Repeat([]byte("k"), 100)
	r := shard.Record{Kind: shard.RecordGrant, Shard: 1, Key: key, Token: 5, Lease: 3}
	r.Seq = 1
	n.sink(r)
	if n.Barrier() != 0 || !n.dirty {
		t.Fatalf("a record while not leading: barrier %d dirty %v", n.Barrier(), n.dirty)
	}
	n.proposing, n.first = true, 1
	const total = 30000 // ~3.5 MiB
	for i := range total {
		r.Seq = uint64(i + 1)
		n.sink(r)
	}
	if n.Barrier() != total {
		t.Fatalf("barrier %d, want %d", n.Barrier(), total)
	}
	next := uint64(1)
	for _, s := range n.full {
		if s.first != next || s.last-s.first+1 != uint64(s.w.Count()) || s.w.Len() > raftMaxEntry+len(key)+32 {
			t.Fatalf("sealed entry %d..%d with %d records, %d bytes", s.first, s.last, s.w.Count(), s.w.Len())
		}
		next = s.last + 1
	}
	if len(n.full) < 3 || n.first != next || uint64(n.buf.Count()) != total-next+1 {
		t.Fatalf("%d sealed entries, then %d records from %d (next %d)", len(n.full), n.buf.Count(), n.first, next)
	}
}

// The magics of the snapshots of the versions before shared holders
// (version 2) and before identities (version 1), which lockd still reads.
var (
	snapMagicV1 = []byte("LKRAFT1\n")
	snapMagicV2 = []byte("LKRAFT2\n")
)

// writeSnapshotV1 writes t as the code before identities did (magic
// "LKRAFT1\n", entries in the format version 1, raw): the reference for
// TestRaftSnapshotVersion1Loads.
func writeSnapshotV1(t *shard.Table, reserved, index uint64, now, wallAtZero int64) []byte {
	b := append([]byte(nil), snapMagicV1...)
	b = binary.BigEndian.AppendUint64(b, index)
	b = binary.BigEndian.AppendUint64(b, uint64(now+wallAtZero))
	b = binary.BigEndian.AppendUint64(b, t.Tokens().Last())
	b = binary.BigEndian.AppendUint64(b, reserved)
	b = binary.BigEndian.AppendUint32(b, uint32(t.Shards()))
	for i := range t.Shards() {
		var raw []byte
		count := 0
		seq := t.DumpShard(i, func(key []byte, token uint64, deadline int64, lease uint8) {
			raw, _ = records.AppendSnapEntry(raw, &records.SnapEntry{Key: key, Token: token, Left: time.Duration(deadline - now), Lease: lease})
			count++
		})
		b = binary.AppendUvarint(b, seq)
		b = binary.AppendUvarint(b, uint64(count))
		b = append(b, byte(records.CodecRaw))
		b = binary.AppendUvarint(b, uint64(len(raw)))
		b = binary.AppendUvarint(b, uint64(len(raw)))
		b = append(b, raw...)
	}
	return b
}

// TestRaftSnapshotVersion1Loads: a snapshot written before identities
// (raft's snapshot store keeps them across an upgrade) still loads, every
// lock with its token and no identity.
func TestRaftSnapshotVersion1Loads(t *testing.T) {
	src, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(1000, 1<<30))
	var out shard.Out
	for i := range 200 {
		src.Acquire(0, []byte(fmt.Sprintf("v/%d", i)), 0, 30, 0, nil, &out)
	}
	b := writeSnapshotV1(src, 1<<20, 7, 1e9, 1.7e18)
	dst, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	h, err := readSnapshot(bytes.NewReader(b), dst, 1.7e18)
	if err != nil || h.index != 7 || dst.Stats().Keys != 200 {
		t.Fatalf("version 1: %+v, %d keys, %v", h, dst.Stats().Keys, err)
	}
	for i := range 200 {
		key := []byte(fmt.Sprintf("v/%d", i))
		if got, want := dst.Lookup(key), src.Lookup(key); !got.Held || got.Token != want.Token || got.Ident != "" {
			t.Fatalf("%s: %+v, want token %d and no identity", key, got, want.Token)
		}
	}
}
