package repl

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/shard"
)

var writeCorpus = flag.Bool("write-corpus", false, "rewrite the fuzz seed corpus under testdata/fuzz")

// fuzzRecords returns n records as a busy active makes them: grants,
// releases, renews and expiries of keys "bench/key/000123", tokens from a
// wall-clock floor, each shard's Seq counting up. Built directly (not by a
// table) so the seeds stay the same whatever the table does.
func fuzzRecords(n int) []shard.Record {
	recs := make([]shard.Record, n)
	seqs := map[uint32]uint64{}
	for i := range recs {
		sh := uint32(i*7) % 64
		seqs[sh]++
		kind := []shard.RecordKind{shard.RecordGrant, shard.RecordRelease, shard.RecordGrant, shard.RecordRenew, shard.RecordExpire}[i%5]
		var lease uint8
		if hasLease(kind) {
			lease = 10
		}
		recs[i] = shard.Record{Kind: kind, Shard: sh, Seq: seqs[sh], Key: fmt.Appendf(nil, "bench/key/%06d", i*37%100000),
			Token: 1_750_000_000_000_000_000 + uint64(i), Lease: lease}
	}
	return recs
}

func fuzzBatch(recs []shard.Record) []byte {
	var w BatchWriter
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			panic(err)
		}
	}
	return append([]byte(nil), w.Bytes()...)
}

func fuzzEntries(n int) []byte {
	var raw []byte
	for _, r := range fuzzRecords(n) {
		var err error
		raw, err = AppendSnapEntry(raw, &SnapEntry{Key: r.Key, Token: r.Token, Left: time.Duration(r.Seq) * 1e8, Lease: 30})
		if err != nil {
			panic(err)
		}
	}
	return raw
}

// fuzzSeed is one file of the seed corpus.
type fuzzSeed struct {
	target, name string
	args         []any
}

func fuzzSeeds() []fuzzSeed {
	var seeds []fuzzSeed
	add := func(target, name string, args ...any) {
		seeds = append(seeds, fuzzSeed{target, name, args})
	}
	// Every message, alone and in one stream; batches and snapshot frames
	// with real records, raw and compressed; broken frames.
	stream, cases := wireStream()
	for _, c := range cases {
		add("FuzzFrameReader", c.name, c.m.Append(nil), uint16(3))
	}
	add("FuzzFrameReader", "all-messages", stream, uint16(37))
	small, large := fuzzBatch(fuzzRecords(5)), fuzzBatch(fuzzRecords(64))
	add("FuzzFrameReader", "batch-raw-records", AppendBatch(nil, 1, small), uint16(20))
	add("FuzzFrameReader", "batch-s2-records", AppendBatch(nil, 2, large), uint16(100))
	add("FuzzFrameReader", "snap-shard-s2-entries", AppendSnapShard(nil, 5, 9, true, fuzzEntries(64)), uint16(50))
	add("FuzzFrameReader", "snap-shard-raw-entries", AppendSnapShard(nil, 5, 9, false, fuzzEntries(3)), uint16(1))
	bad := (&Ack{Kind: AckBatch, Value: 1}).Append(nil)
	bad[len(bad)-1] ^= 1
	add("FuzzFrameReader", "bad-crc", bad, uint16(0))
	add("FuzzFrameReader", "too-large", []byte{0x01, 0, 0, 1, 1}, uint16(2))
	add("FuzzFrameReader", "unknown-type", wireFrame(11, []byte("x")), uint16(4))

	add("FuzzBatchRecords", "one", fuzzBatch(fuzzRecords(1)))
	add("FuzzBatchRecords", "eight", fuzzBatch(fuzzRecords(8)))
	add("FuzzBatchRecords", "sixty-four", large)
	edges := []shard.Record{
		wireRec(shard.RecordGrant, 65535, 1<<64-1, strings.Repeat("k", 300), 1<<64-1, 255),
		wireRec(shard.RecordRelease, 0, 128, "é", 1, 0),
		wireRec(shard.RecordExpire, 1, 16384, "\x00", 2, 0),
		wireRec(shard.RecordRenew, 2, 1, "k", 3, 1),
	}
	add("FuzzBatchRecords", "edges", fuzzBatch(edges))
	add("FuzzBatchRecords", "truncated", large[:len(large)-3])

	add("FuzzSnapEntries", "one", fuzzEntries(1))
	add("FuzzSnapEntries", "sixty-four", fuzzEntries(64))
	e, _ := AppendSnapEntry(nil, &SnapEntry{Key: []byte(strings.Repeat("z", MaxKey)), Token: 1<<64 - 1, Left: 1<<63 - 1, Lease: 255})
	add("FuzzSnapEntries", "edges", e)
	return seeds
}

// fuzzFile is a seed as `go test` stores it.
func fuzzFile(s fuzzSeed) []byte {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range s.args {
		switch a := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", a)
		case uint16:
			fmt.Fprintf(&b, "uint16(%d)\n", a)
		}
	}
	return []byte(b.String())
}

// TestFuzzCorpus: the seed corpus under testdata/fuzz holds every seed
// above as it is built now (go test -run TestFuzzCorpus -write-corpus
// rewrites it).
func TestFuzzCorpus(t *testing.T) {
	for _, s := range fuzzSeeds() {
		path := filepath.Join("testdata", "fuzz", s.target, s.name)
		if *writeCorpus {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, fuzzFile(s), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, fuzzFile(s)) {
			t.Errorf("%s: stale or missing (%v); rewrite with -write-corpus", path, err)
		}
	}
}

// fuzzFrame is what a FrameReader returned.
type fuzzFrame struct {
	t   MsgType
	p   []byte
	err error
}

func fuzzReadFrames(r io.Reader, bufSize int) []fuzzFrame {
	fr := NewFrameReader(r)
	if bufSize > 0 {
		fr.buf = make([]byte, bufSize)
	}
	var out []fuzzFrame
	for {
		t, p, err := fr.Next()
		out = append(out, fuzzFrame{t, append([]byte(nil), p...), err})
		if err != nil {
			return out
		}
	}
}

// FuzzFrameReader: a byte stream read whole, split in two at split, and
// through a tiny buffer yields the same frames and the same final error
// (one the reader documents); every frame re-frames to its own bytes, and
// a payload that decodes as its message re-encodes to the same frame (its
// records or entries too, when they decode).
func FuzzFrameReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		whole := fuzzReadFrames(bytes.NewReader(data), 0)
		cut := int(split) % (len(data) + 1)
		parts := fuzzReadFrames(&wireChunks{chunks: [][]byte{data[:cut:cut], data[cut:]}}, 0)
		tiny := fuzzReadFrames(fuzzOneByte(data), 5)
		for _, other := range [][]fuzzFrame{parts, tiny} {
			if len(other) != len(whole) {
				t.Fatalf("%d frames whole, %d split", len(whole), len(other))
			}
			for i := range whole {
				a, b := whole[i], other[i]
				if a.t != b.t || !bytes.Equal(a.p, b.p) || a.err != b.err {
					t.Fatalf("frame %d: whole %v %x %v, split %v %x %v", i, a.t, a.p, a.err, b.t, b.p, b.err)
				}
			}
		}
		last := whole[len(whole)-1].err
		known := []error{io.EOF, io.ErrUnexpectedEOF, ErrFrameTooLarge, ErrFrameTooShort, ErrBadCRC, ErrUnknownType}
		if !slices.Contains(known, last) {
			t.Fatalf("final error %v", last)
		}
		off := 0
		for _, fr := range whole[:len(whole)-1] {
			frame := AppendFrame(nil, fr.t, fr.p)
			if !bytes.HasPrefix(data[off:], frame) {
				t.Fatalf("frame at %d re-frames to %x", off, frame)
			}
			off += len(frame)
			fuzzMessage(t, fr.t, fr.p, frame)
		}
	})
}

// fuzzOneByte reads data one byte at a time.
func fuzzOneByte(data []byte) io.Reader {
	chunks := make([][]byte, len(data))
	for i := range data {
		chunks[i] = data[i : i+1]
	}
	return &wireChunks{chunks: chunks}
}

// fuzzMessage decodes a payload as its type's message; what decodes must
// re-encode to frame.
func fuzzMessage(t *testing.T, typ MsgType, p, frame []byte) {
	var m wireMsg
	switch typ {
	case MsgHello:
		m = &Hello{}
	case MsgHeartbeat:
		m = &Heartbeat{}
	case MsgBatch:
		m = &Batch{}
	case MsgReserve:
		m = &Reserve{}
	case MsgAck:
		m = &Ack{}
	case MsgSnapBegin:
		m = &SnapBegin{}
	case MsgSnapShard:
		m = &SnapShard{}
	case MsgSnapEnd:
		m = wireSnapEnd{}
	case MsgNeedSnapshot:
		m = &NeedSnapshot{}
	case MsgHandoff:
		m = &Handoff{}
	default:
		t.Fatalf("reader returned type %v", typ)
	}
	err := m.Decode(p)
	if err != nil {
		if !errors.Is(err, ErrShortPayload) && !errors.Is(err, ErrLongPayload) && !errors.Is(err, ErrBadField) &&
			!(typ == MsgHello && errors.Is(err, ErrMismatch)) {
			t.Fatalf("%v: Decode: %v", typ, err)
		}
		return
	}
	if again := m.Append(nil); !bytes.Equal(again, frame) {
		t.Fatalf("%v %+v re-encodes to %x, frame %x", typ, m, again, frame)
	}
	switch m := m.(type) {
	case *Batch:
		if raw, err := m.Raw(nil); err == nil {
			fuzzRecordsOf(t, raw)
		}
	case *SnapShard:
		if raw, err := m.Raw(nil); err == nil {
			fuzzEntriesOf(t, raw)
		}
	}
}

// fuzzRecordsOf reads raw as records: each re-encodes to the bytes it was
// read from, and reading stops at the end or at a documented error.
func fuzzRecordsOf(t *testing.T, raw []byte) {
	var rr RecordReader
	var r shard.Record
	var w BatchWriter
	for rr.Reset(raw); rr.Next(&r); {
		if r.Kind == shard.RecordSkip {
			if err := w.AddSkip(r.Shard, r.From, r.Seq); err != nil || len(r.Key) != 0 {
				t.Fatalf("decoded %+v, not encodable: %v", r, err)
			}
			continue
		}
		if !wireWithin(r.Key, raw) {
			t.Fatalf("key %q not in the batch", r.Key)
		}
		if err := w.Add(&r); err != nil {
			t.Fatalf("decoded %+v, not encodable: %v", r, err)
		}
	}
	if !bytes.HasPrefix(raw, w.Bytes()) {
		t.Fatalf("records re-encode to %x, read from %x", w.Bytes(), raw)
	}
	switch err := rr.Err(); err {
	case nil:
		if len(w.Bytes()) != len(raw) {
			t.Fatalf("clean end after %d of %d bytes", len(w.Bytes()), len(raw))
		}
	case ErrBadRecord, ErrBadKey, ErrTruncated, ErrBadVarint:
	default:
		t.Fatalf("RecordReader: %v", err)
	}
	if n, err := CheckRecords(raw); n != w.Count() || err != rr.Err() {
		t.Fatalf("CheckRecords: %d, %v; reader %d, %v", n, err, w.Count(), rr.Err())
	}
}

// fuzzEntriesOf does for snapshot entries what fuzzRecordsOf does for
// records.
func fuzzEntriesOf(t *testing.T, raw []byte) {
	var sr SnapReader
	var e SnapEntry
	var out []byte
	for sr.Reset(raw); sr.Next(&e); {
		if !wireWithin(e.Key, raw) {
			t.Fatalf("key %q not in the data", e.Key)
		}
		var err error
		if out, err = AppendSnapEntry(out, &e); err != nil {
			t.Fatalf("decoded %+v, not encodable: %v", e, err)
		}
	}
	if !bytes.HasPrefix(raw, out) {
		t.Fatalf("entries re-encode to %x, read from %x", out, raw)
	}
	switch err := sr.Err(); err {
	case nil:
		if len(out) != len(raw) {
			t.Fatalf("clean end after %d of %d bytes", len(out), len(raw))
		}
	case ErrBadEntry, ErrBadKey, ErrTruncated, ErrBadVarint:
	default:
		t.Fatalf("SnapReader: %v", err)
	}
}

// fuzzCompression: raw survives Compress and Decompress; raw taken as s2
// data decodes, at its claimed length, without panicking.
func fuzzCompression(t *testing.T, raw []byte) {
	codec, enc := Compress([]byte{9}, raw)
	back, err := Decompress(nil, codec, enc[1:], len(raw))
	if err != nil || !bytes.Equal(back, raw) {
		t.Fatalf("%v round trip: %v", codec, err)
	}
	for _, n := range []int{0, len(raw), 4 * len(raw), MaxFrame + 1} {
		if out, err := Decompress(nil, CodecS2, raw, n); err == nil && len(out) != n {
			t.Fatalf("s2 of %d bytes decoded to %d", n, len(out))
		}
	}
}

// FuzzBatchRecords: arbitrary bytes read as a batch's records, and as
// data to compress.
func FuzzBatchRecords(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		fuzzRecordsOf(t, raw)
		fuzzCompression(t, raw)
	})
}

// FuzzSnapEntries: arbitrary bytes read as a SnapShard's entries.
func FuzzSnapEntries(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		fuzzEntriesOf(t, raw)
		fuzzCompression(t, raw)
	})
}
