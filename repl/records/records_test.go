package records_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// TestRecordLayout: a record of each kind encodes to the bytes the format
// says, written out by hand.
func TestRecordLayout(t *testing.T) {
	cases := []struct {
		r    shard.Record
		want string
	}{
		{repltest.Rec(shard.RecordGrant, 5, 1, "k", 0x18700000000000ff, 30), "01 0005 01 18700000000000ff 1e 01 6b"},
		{repltest.Rec(shard.RecordRelease, 65535, 300, "ab", 2, 0), "02 ffff ac02 0000000000000002 00 02 6162"},
		{repltest.Rec(shard.RecordExpire, 0, 1<<64-1, "x", 3, 0), "03 0000 ffffffffffffffffff01 0000000000000003 00 01 78"},
		{repltest.Rec(shard.RecordRenew, 1, 128, strings.Repeat("z", 200), 1<<64-1, 255),
			"04 0001 8001 ffffffffffffffff ff c801 " + strings.Repeat("7a", 200)},
	}
	for _, c := range cases {
		t.Run(c.r.Kind.String(), func(t *testing.T) {
			var w records.BatchWriter
			r := c.r
			r.Deadline = 12345 // not sent
			if err := w.Add(&r); err != nil {
				t.Fatal(err)
			}
			if want := repltest.Hex(t, c.want); !bytes.Equal(w.Bytes(), want) {
				t.Fatalf("got %x\nwant %x", w.Bytes(), want)
			}
		})
	}
}

// TestRecordRoundTrip: records of every kind and at the edges of every
// field, written by a BatchWriter, read back as they were (Deadline
// aside), with keys pointing into the batch.
func TestRecordRoundTrip(t *testing.T) {
	recs := []shard.Record{
		repltest.Rec(shard.RecordGrant, 0, 1, "a", 1, 1),
		repltest.Rec(shard.RecordGrant, 65535, 1<<64-1, strings.Repeat("k", records.MaxKey), 1<<64-1, 255),
		repltest.Rec(shard.RecordGrant, 3, 127, "bench/key/000123", 1_750_000_000_000_000_001, 0),
		repltest.Rec(shard.RecordRelease, 3, 128, "bench/key/000123", 1_750_000_000_000_000_001, 0),
		repltest.Rec(shard.RecordExpire, 17, 16383, "é/ü", 9, 0),
		repltest.Rec(shard.RecordRenew, 17, 16384, "é/ü", 9, 10),
		repltest.Rec(shard.RecordRenew, 1, 2, "\x00\n\xff", 2, 0),
	}
	var w records.BatchWriter
	w.Add(&recs[0]) // dropped by Reset
	w.Reset()
	for i := range recs {
		recs[i].Deadline = int64(i) * 1e9
		if err := w.Add(&recs[i]); err != nil {
			t.Fatalf("Add %d: %v", i, err)
		}
		recs[i].Deadline = 0
	}
	if w.Count() != len(recs) || w.Len() != len(w.Bytes()) {
		t.Fatalf("Count %d, Len %d (%d bytes)", w.Count(), w.Len(), len(w.Bytes()))
	}
	raw := w.Bytes()
	if n, err := records.CheckRecords(raw); n != len(recs) || err != nil {
		t.Fatalf("CheckRecords: %d, %v", n, err)
	}
	var rr records.RecordReader
	rr.Reset(raw)
	var r shard.Record
	for i := 0; rr.Next(&r); i++ {
		if !reflect.DeepEqual(r, recs[i]) {
			t.Fatalf("record %d: %+v, want %+v", i, r, recs[i])
		}
		if !repltest.Within(r.Key, raw) {
			t.Fatalf("record %d: key not in the batch", i)
		}
	}
	if rr.Err() != nil || rr.Next(&r) {
		t.Fatalf("end: %v", rr.Err())
	}

	// Skip records: their layout, refusals and the way back.
	w.Reset()
	skips := []shard.Record{
		{Kind: shard.RecordSkip, Shard: 5, Seq: 3, From: 1},
		{Kind: shard.RecordSkip, Shard: 65535, Seq: 1<<64 - 1, From: 1},
		{Kind: shard.RecordSkip, Shard: 0, Seq: 200, From: 200},
	}
	for _, sk := range skips {
		if err := w.AddSkip(sk.Shard, sk.From, sk.Seq); err != nil {
			t.Fatalf("AddSkip %+v: %v", sk, err)
		}
	}
	if got := fmt.Sprintf("%x", w.Bytes()[:5]); got != "0500050303" {
		t.Fatalf("skip layout %s, want 05 0005 03 03", got)
	}
	for _, bad := range [][3]uint64{{65536, 1, 1}, {0, 0, 1}, {0, 3, 2}} {
		if err := w.AddSkip(uint32(bad[0]), bad[1], bad[2]); err != records.ErrBadRecord {
			t.Fatalf("AddSkip%v: %v", bad, err)
		}
	}
	rr.Reset(w.Bytes())
	for i := 0; rr.Next(&r); i++ {
		if !reflect.DeepEqual(r, skips[i]) {
			t.Fatalf("skip %d: %+v, want %+v", i, r, skips[i])
		}
	}
	if rr.Err() != nil || w.Count() != len(skips) {
		t.Fatalf("skips: %v, count %d", rr.Err(), w.Count())
	}
}

// TestBatchWriterRefuses: a record the format cannot carry is refused and
// leaves the batch as it was.
func TestBatchWriterRefuses(t *testing.T) {
	long := strings.Repeat("k", records.MaxKey+1)
	cases := []struct {
		name string
		r    shard.Record
		want error
	}{
		{"kind-0", repltest.Rec(0, 0, 1, "k", 1, 0), records.ErrBadRecord},
		{"kind-5-skip-by-Add", repltest.Rec(shard.RecordSkip, 0, 1, "k", 1, 0), records.ErrBadRecord},
		{"kind-6", repltest.Rec(6, 0, 1, "k", 1, 0), records.ErrBadRecord},
		{"shard-65536", repltest.Rec(shard.RecordGrant, 65536, 1, "k", 1, 1), records.ErrBadRecord},
		{"seq-0", repltest.Rec(shard.RecordGrant, 0, 0, "k", 1, 1), records.ErrBadRecord},
		{"token-0", repltest.Rec(shard.RecordGrant, 0, 1, "k", 0, 1), records.ErrBadRecord},
		{"release-lease", repltest.Rec(shard.RecordRelease, 0, 1, "k", 1, 1), records.ErrBadRecord},
		{"expire-lease", repltest.Rec(shard.RecordExpire, 0, 1, "k", 1, 1), records.ErrBadRecord},
		{"key-empty", repltest.Rec(shard.RecordGrant, 0, 1, "", 1, 1), records.ErrBadKey},
		{"key-1025", repltest.Rec(shard.RecordGrant, 0, 1, long, 1, 1), records.ErrBadKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w records.BatchWriter
			ok := repltest.Rec(shard.RecordGrant, 0, 1, "k", 1, 1)
			w.Add(&ok)
			before := string(w.Bytes())
			if err := w.Add(&c.r); err != c.want {
				t.Fatalf("Add: %v, want %v", err, c.want)
			}
			if string(w.Bytes()) != before || w.Count() != 1 {
				t.Fatalf("batch changed: %x, %d records", w.Bytes(), w.Count())
			}
		})
	}
}

// TestRecordReaderRefuses: malformed batches stop the reader with their
// error, after the good records before them.
func TestRecordReaderRefuses(t *testing.T) {
	good := "01 0005 01 0000000000000001 1e 01 6b" // grant seq 1 token 1 lease 30 key "k"
	cases := []struct {
		name string
		raw  string
		want error
	}{
		{"kind-0", "00 0005 01 0000000000000001 1e 01 6b", records.ErrBadRecord},
		{"kind-6", "06 0005 01 0000000000000001 1e 01 6b", records.ErrBadRecord},
		{"skip-count-0", "05 0005 03 00", records.ErrBadRecord},
		{"skip-seq-0", "05 0005 00 01", records.ErrBadRecord},
		{"skip-count-above-seq", "05 0005 03 04", records.ErrBadRecord},
		{"skip-count-truncated", "05 0005 03", records.ErrTruncated},
		{"skip-count-padded", "05 0005 03 8100", records.ErrBadVarint},
		{"seq-0", "01 0005 00 0000000000000001 1e 01 6b", records.ErrBadRecord},
		{"token-0", "01 0005 01 0000000000000000 1e 01 6b", records.ErrBadRecord},
		{"release-lease", "02 0005 01 0000000000000001 1e 01 6b", records.ErrBadRecord},
		{"expire-lease", "03 0005 01 0000000000000001 01 01 6b", records.ErrBadRecord},
		{"key-0", "01 0005 01 0000000000000001 1e 00", records.ErrBadKey},
		{"key-1025", "01 0005 01 0000000000000001 1e 8108" + strings.Repeat("6b", 1025), records.ErrBadKey},
		{"key-huge", "01 0005 01 0000000000000001 1e ffffffffffffffff7f", records.ErrBadKey},
		{"key-truncated", "01 0005 01 0000000000000001 1e 02 6b", records.ErrTruncated},
		{"seq-truncated-varint", "01 0005 80", records.ErrTruncated},
		{"seq-padded-varint", "01 0005 8100 0000000000000001 1e 01 6b", records.ErrBadVarint},
		{"seq-over-64-bits", "01 0005 ffffffffffffffffff02 0000000000000001 1e 01 6b", records.ErrBadVarint},
		{"seq-11-bytes", "01 0005 ffffffffffffffffff8001 0000000000000001 1e 01 6b", records.ErrBadVarint},
		{"keylen-padded", "01 0005 01 0000000000000001 1e 8100 6b", records.ErrBadVarint},
		{"token-truncated", "01 0005 01 00000000000000", records.ErrTruncated},
		{"trailing-byte", "01", records.ErrTruncated},
		{"trailing-two", "0100", records.ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := repltest.Hex(t, good+c.raw)
			var rr records.RecordReader
			rr.Reset(raw)
			var r shard.Record
			if !rr.Next(&r) || string(r.Key) != "k" {
				t.Fatalf("good record: %+v %v", r, rr.Err())
			}
			if rr.Next(&r) {
				t.Fatalf("accepted %+v", r)
			}
			if rr.Err() != c.want || rr.Next(&r) {
				t.Fatalf("Err %v, want %v", rr.Err(), c.want)
			}
			if n, err := records.CheckRecords(raw); n != 1 || err != c.want {
				t.Fatalf("CheckRecords: %d, %v", n, err)
			}
		})
	}
}

// TestRecordPrefixes: every prefix of a real batch reads back exactly the
// records it holds whole, and one that ends inside a record is an error.
func TestRecordPrefixes(t *testing.T) {
	recs := repltest.Workload(t, 40, 2)
	raw := repltest.Batches(t, recs, len(recs))[0]
	ends := map[int]int{0: 0} // prefix length at a record boundary → records
	var w records.BatchWriter
	for i := range recs {
		w.Add(&recs[i])
		ends[w.Len()] = i + 1
	}
	for i := 0; i <= len(raw); i++ {
		n, err := records.CheckRecords(raw[:i])
		whole, boundary := ends[i]
		switch {
		case boundary && (err != nil || n != whole):
			t.Fatalf("prefix %d: %d records, %v; want %d", i, n, err, whole)
		case !boundary && err == nil:
			t.Fatalf("prefix %d inside a record: %d records, no error", i, n)
		}
	}
}

func TestSnapEntryLayoutAndRoundTrip(t *testing.T) {
	entries := []records.SnapEntry{
		{Key: []byte("k"), Token: 0x0102030405060708, Left: 300, Lease: 30},
		{Key: []byte(strings.Repeat("x", records.MaxKey)), Token: 1<<64 - 1, Left: math.MaxInt64, Lease: 255},
		{Key: []byte("bench/key/000123"), Token: 1, Left: 0, Lease: 0},
	}
	raw, err := records.AppendSnapEntry([]byte("pre"), &entries[0])
	if want := repltest.Hex(t, "707265 01 6b 0102030405060708 ac02 1e"); err != nil || !bytes.Equal(raw, want) {
		t.Fatalf("layout: %x, %v\nwant %x", raw, err, want)
	}
	raw = raw[3:]
	for i := 1; i < len(entries); i++ {
		if raw, err = records.AppendSnapEntry(raw, &entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	neg := records.SnapEntry{Key: []byte("n"), Token: 5, Left: -time.Second, Lease: 3}
	if raw, err = records.AppendSnapEntry(raw, &neg); err != nil {
		t.Fatal(err)
	}
	neg.Left = 0 // sent as ended
	entries = append(entries, neg)
	var sr records.SnapReader
	sr.Reset(raw)
	var e records.SnapEntry
	i := 0
	for ; sr.Next(&e); i++ {
		if !reflect.DeepEqual(e, entries[i]) || !repltest.Within(e.Key, raw) {
			t.Fatalf("entry %d: %+v, want %+v", i, e, entries[i])
		}
	}
	if sr.Err() != nil || i != len(entries) {
		t.Fatalf("end after %d: %v", i, sr.Err())
	}
	// Every prefix that ends inside an entry is an error.
	ends := map[int]bool{0: true}
	var b []byte
	for i := range entries {
		b, _ = records.AppendSnapEntry(b, &entries[i])
		ends[len(b)] = true
	}
	for n := 0; n <= len(raw); n++ {
		sr.Reset(raw[:n])
		for sr.Next(&e) {
		}
		if (sr.Err() == nil) != ends[n] {
			t.Fatalf("prefix %d: %v", n, sr.Err())
		}
	}
}

func TestSnapEntryRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		e    records.SnapEntry
		want error
	}{
		{"token-0", records.SnapEntry{Key: []byte("k")}, records.ErrBadEntry},
		{"key-empty", records.SnapEntry{Token: 1}, records.ErrBadKey},
		{"key-1025", records.SnapEntry{Key: make([]byte, records.MaxKey+1), Token: 1}, records.ErrBadKey},
	} {
		if out, err := records.AppendSnapEntry([]byte("x"), &c.e); err != c.want || string(out) != "x" {
			t.Errorf("%s: %q, %v; want %v", c.name, out, err, c.want)
		}
	}
	good := "01 6b 0000000000000001 00 00"
	for _, c := range []struct {
		name, raw string
		want      error
	}{
		{"key-0", "00", records.ErrBadKey},
		{"key-1025", "8108" + strings.Repeat("6b", 1025), records.ErrBadKey},
		{"key-truncated", "05 6b6b", records.ErrTruncated},
		{"token-0", "01 6b 0000000000000000 00 00", records.ErrBadEntry},
		{"token-truncated", "01 6b 00000000", records.ErrTruncated},
		{"left-truncated", "01 6b 0000000000000001 80", records.ErrTruncated},
		{"left-padded", "01 6b 0000000000000001 8000 00", records.ErrBadVarint},
		{"left-over-int64", "01 6b 0000000000000001 ffffffffffffffff8001 00", records.ErrBadEntry},
		{"lease-missing", "01 6b 0000000000000001 00", records.ErrTruncated},
		{"keylen-truncated", "80", records.ErrTruncated},
	} {
		t.Run(c.name, func(t *testing.T) {
			var sr records.SnapReader
			var e records.SnapEntry
			sr.Reset(repltest.Hex(t, good+c.raw))
			if !sr.Next(&e) {
				t.Fatalf("good entry: %v", sr.Err())
			}
			if sr.Next(&e) || sr.Err() != c.want {
				t.Fatalf("Err %v, want %v (entry %+v)", sr.Err(), c.want, e)
			}
		})
	}
}

// TestCompress: the codec each kind of batch gets, and the round trip.
func TestCompress(t *testing.T) {
	recs := repltest.Workload(t, 2000, 3)
	rng := rand.New(rand.NewPCG(3, 3))
	noise := make([]byte, 4096)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	// 1024 bytes of which the first n are noise: s2 saves about 1024-n.
	partly := func(n int) []byte { return append(append([]byte{}, noise[:n]...), make([]byte, 1024-n)...) }
	for n, in := range map[int][2]int{900: {7, 8}, 800: {0, 7}} {
		if enc := len(s2.Encode(nil, partly(n))); enc*8 < in[0]*1024 || enc*8 >= in[1]*1024 {
			t.Fatalf("%d noise bytes: s2 gives %d of 1024, not within %d/8..%d/8", n, enc, in[0], in[1])
		}
	}
	cases := []struct {
		name string
		raw  []byte
		want records.Codec
	}{
		{"empty", nil, records.CodecRaw},
		{"s2-above-7/8", partly(900), records.CodecRaw},
		{"s2-below-7/8", partly(800), records.CodecS2},
		{"tiny-compressible", bytes.Repeat([]byte{'a'}, records.CompressMin-1), records.CodecRaw},
		{"min-compressible", bytes.Repeat([]byte{'a'}, records.CompressMin), records.CodecS2},
		{"incompressible", noise, records.CodecRaw},
		{"batch-2", repltest.Batches(t, recs[:2], 2)[0], records.CodecRaw},
		{"batch-64", repltest.Batches(t, recs[:64], 64)[0], records.CodecS2},
		{"batch-2000", repltest.Batches(t, recs, 2000)[0], records.CodecS2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			codec, out := records.Compress([]byte("hdr"), c.raw)
			if codec != c.want || string(out[:3]) != "hdr" {
				t.Fatalf("codec %v, want %v", codec, c.want)
			}
			data := out[3:]
			if codec == records.CodecS2 && len(data)*8 >= len(c.raw)*7 {
				t.Fatalf("s2: %d bytes of %d", len(data), len(c.raw))
			}
			back, err := records.Decompress(make([]byte, 10), codec, data, len(c.raw))
			if err != nil || !bytes.Equal(back, c.raw) {
				t.Fatalf("Decompress: %v", err)
			}
		})
	}
}

// TestDecompressRefuses: a raw length that does not match, is too large
// or negative, corrupt s2 data and unknown codecs are errors; the raw
// length is checked before any allocation.
func TestDecompressRefuses(t *testing.T) {
	raw := bytes.Repeat([]byte("bench/key/000123"), 64)
	_, enc := records.Compress(nil, raw)
	huge := s2.Encode(nil, make([]byte, 2*records.MaxRaw/1000))[:8] // a header claiming more than is there
	cases := []struct {
		name   string
		c      records.Codec
		data   []byte
		rawLen int
		want   error
	}{
		{"raw-len-mismatch", records.CodecRaw, raw, len(raw) - 1, records.ErrBadCodec},
		{"s2-len-short", records.CodecS2, enc, len(raw) - 1, records.ErrCorrupt},
		{"s2-len-long", records.CodecS2, enc, len(raw) + 1, records.ErrCorrupt},
		{"s2-over-max", records.CodecS2, enc, records.MaxRaw + 1, records.ErrBadCodec},
		{"s2-negative", records.CodecS2, enc, -1, records.ErrBadCodec},
		{"s2-truncated", records.CodecS2, enc[:len(enc)-1], len(raw), records.ErrCorrupt},
		{"s2-trailing", records.CodecS2, append(append([]byte{}, enc...), 0), len(raw), records.ErrCorrupt},
		{"s2-header-only", records.CodecS2, huge, 2 * records.MaxRaw / 1000, records.ErrCorrupt},
		{"s2-empty", records.CodecS2, nil, 0, records.ErrCorrupt},
		{"codec-2", 2, raw, len(raw), records.ErrBadCodec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if out, err := records.Decompress(nil, c.c, c.data, c.rawLen); err != c.want || out != nil {
				t.Fatalf("Decompress: %d bytes, %v; want %v", len(out), err, c.want)
			}
		})
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = records.Decompress(nil, records.CodecS2, enc, records.MaxRaw+1) }); n != 0 {
		t.Fatalf("refused raw length allocated %v times", n)
	}
}

// BenchmarkCompress compresses real batches of 8, 64, 512 and 2000
// records (the workload of repltest.Workload) with s2 block encoding (s2: the
// codec alone; s2-sent: Compress, which leaves batches under 256 bytes
// raw), and zstd EncodeAll at SpeedFastest and at SpeedDefault (one reused
// encoder, no dictionary). ratio is raw/compressed over all batches; B/rec
// is the compressed bytes per record (wireB/rec: with the Batch frame);
// MB/s counts raw bytes.
func BenchmarkCompress(b *testing.B) {
	recs := repltest.Workload(b, 64000, 7)
	fastest, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	defer fastest.Close()
	dflt, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	defer dflt.Close()
	codecs := []struct {
		name string
		enc  func(dst, raw []byte) []byte
	}{
		{"s2", func(dst, raw []byte) []byte { return s2.Encode(dst[:cap(dst)], raw) }},
		{"s2-sent", func(dst, raw []byte) []byte { _, out := records.Compress(dst[:0], raw); return out }},
		{"zstd", func(dst, raw []byte) []byte { return fastest.EncodeAll(raw, dst[:0]) }},
		{"zstd-default", func(dst, raw []byte) []byte { return dflt.EncodeAll(raw, dst[:0]) }},
	}
	for _, c := range codecs {
		for _, per := range []int{8, 64, 512, 2000} {
			batches := repltest.Batches(b, recs, per)
			batches = batches[:len(batches)-1] // whole batches only
			b.Run(fmt.Sprintf("%s/%d", c.name, per), func(b *testing.B) {
				dst := make([]byte, 0, 2*s2.MaxEncodedLen(64<<10))
				var rawBytes, encBytes int
				for _, raw := range batches {
					rawBytes += len(raw)
					encBytes += len(c.enc(dst, raw))
				}
				b.SetBytes(int64(rawBytes / len(batches)))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					c.enc(dst, batches[i])
					if i++; i == len(batches) {
						i = 0
					}
				}
				b.ReportMetric(float64(rawBytes)/float64(encBytes), "ratio")
				b.ReportMetric(float64(encBytes)/float64(len(batches)*per), "B/rec")
				b.ReportMetric(float64(rawBytes)/float64(len(batches)*per), "rawB/rec")
				if c.name == "s2-sent" { // with the member link's Batch frame around it
					frames := 0
					for _, raw := range batches {
						frames += len(c.enc(dst, raw)) + batchFrame
					}
					b.ReportMetric(float64(frames)/float64(len(batches)*per), "wireB/rec")
				}
			})
		}
	}
}

// batchFrame is what a member link's Batch frame adds to its data: length
// u32, type u8, seq u64, codec u8, raw_len u32, crc u32 (MEMBER-LINK.md).
const batchFrame = 4 + 1 + 8 + 1 + 4 + 4

// BenchmarkDecompress decodes the same batches: s2 block and zstd
// DecodeAll with a reused decoder.
func BenchmarkDecompress(b *testing.B) {
	recs := repltest.Workload(b, 64000, 7)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	defer dec.Close()
	for _, name := range []string{"s2", "zstd"} {
		for _, per := range []int{8, 64, 512, 2000} {
			batches := repltest.Batches(b, recs, per)
			batches = batches[:len(batches)-1]
			b.Run(fmt.Sprintf("%s/%d", name, per), func(b *testing.B) {
				encoded := make([][]byte, len(batches))
				rawBytes := 0
				for i, raw := range batches {
					rawBytes += len(raw)
					if name == "s2" {
						encoded[i] = s2.Encode(nil, raw)
					} else {
						encoded[i] = enc.EncodeAll(raw, nil)
					}
				}
				dst := make([]byte, 0, 128<<10)
				b.SetBytes(int64(rawBytes / len(batches)))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					var err error
					if name == "s2" {
						_, err = records.Decompress(dst, records.CodecS2, encoded[i], len(batches[i]))
					} else {
						_, err = dec.DecodeAll(encoded[i], dst[:0])
					}
					if err != nil {
						b.Fatal(err)
					}
					if i++; i == len(batches) {
						i = 0
					}
				}
			})
		}
	}
}

// BenchmarkBatchWriter encodes real records; BenchmarkRecordReader decodes
// them (per record).
func BenchmarkBatchWriter(b *testing.B) {
	recs := repltest.Workload(b, 4096, 8)
	var w records.BatchWriter
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if w.Len() >= 64<<10 {
			w.Reset()
		}
		if err := w.Add(&recs[i&4095]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkRecordReader(b *testing.B) {
	raw := repltest.Batches(b, repltest.Workload(b, 2000, 9), 2000)[0]
	var rr records.RecordReader
	var r shard.Record
	rr.Reset(raw)
	b.SetBytes(int64(len(raw) / 2000))
	b.ReportAllocs()
	for b.Loop() {
		if !rr.Next(&r) {
			if rr.Err() != nil {
				b.Fatal(rr.Err())
			}
			rr.Reset(raw)
		}
	}
}

// TestIdentityRecords: a grant made to an identity (PROTOCOL.md §8.3) is
// kind 0x81 with the identity after the key, reads back with it (pointing
// into the batch), and a grant without one stays kind 1 — so batches and
// raft logs written before identities read as they did.
func TestIdentityRecords(t *testing.T) {
	g := repltest.Rec(shard.RecordGrant, 5, 1, "k", 0x18700000000000ff, 30)
	g.Ident = []byte("orders")
	var w records.BatchWriter
	if err := w.Add(&g); err != nil {
		t.Fatal(err)
	}
	if want := repltest.Hex(t, "81 0005 01 18700000000000ff 1e 01 6b 06 6f7264657273"); !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("layout %x\nwant   %x", w.Bytes(), want)
	}
	plain := repltest.Rec(shard.RecordGrant, 5, 2, "k", 7, 30)
	long := repltest.Rec(shard.RecordGrant, 6, 1, "j", 8, 1)
	long.Ident = []byte(strings.Repeat("i", 255))
	for _, r := range []*shard.Record{&plain, &long} {
		if err := w.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	raw := w.Bytes()
	var rr records.RecordReader
	var r shard.Record
	want := []shard.Record{g, plain, long}
	rr.Reset(raw)
	for i := 0; rr.Next(&r); i++ {
		if !reflect.DeepEqual(r, want[i]) || len(r.Ident) > 0 && !repltest.Within(r.Ident, raw) {
			t.Fatalf("record %d: %+v, want %+v", i, r, want[i])
		}
	}
	if rr.Err() != nil {
		t.Fatal(rr.Err())
	}
	for _, c := range []struct {
		name string
		r    shard.Record
	}{
		{"release-with-identity", shard.Record{Kind: shard.RecordRelease, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Ident: []byte("x")}},
		{"renew-with-identity", shard.Record{Kind: shard.RecordRenew, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Lease: 1, Ident: []byte("x")}},
		{"identity-256", shard.Record{Kind: shard.RecordGrant, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Lease: 1, Ident: make([]byte, 256)}},
	} {
		if err := w.Add(&c.r); err != records.ErrBadRecord {
			t.Errorf("%s: %v, want ErrBadRecord", c.name, err)
		}
	}
	good := "01 0005 01 0000000000000001 1e 01 6b"
	for _, c := range []struct {
		name, raw string
		want      error
	}{
		{"identity-empty", "81 0005 02 0000000000000002 1e 01 6b 00", records.ErrBadRecord},
		{"identity-missing", "81 0005 02 0000000000000002 1e 01 6b", records.ErrTruncated},
		{"identity-truncated", "81 0005 02 0000000000000002 1e 01 6b 03 6162", records.ErrTruncated},
		{"release-with-identity-bit", "82 0005 02 0000000000000002 00 01 6b 01 61", records.ErrBadRecord},
		{"skip-with-identity-bit", "85 0005 03 01", records.ErrBadRecord},
	} {
		t.Run(c.name, func(t *testing.T) {
			rr.Reset(repltest.Hex(t, good+c.raw))
			if !rr.Next(&r) {
				t.Fatalf("good record: %v", rr.Err())
			}
			if rr.Next(&r) || rr.Err() != c.want {
				t.Fatalf("Err %v, want %v (%+v)", rr.Err(), c.want, r)
			}
		})
	}
}

// TestSnapEntryIdentity: the snapshot entry format version 2 carries each
// grant's identity after its lease (identlen 0: none); version 1 refuses
// an entry with one rather than drop it.
func TestSnapEntryIdentity(t *testing.T) {
	entries := []records.SnapEntry{
		{Key: []byte("k"), Token: 0x0102030405060708, Left: 300, Lease: 30, Ident: []byte("orders")},
		{Key: []byte("j"), Token: 2, Left: 0, Lease: 0},
		{Key: []byte("l"), Token: 3, Left: 1, Lease: 1, Ident: []byte(strings.Repeat("i", 255))},
	}
	raw, err := records.AppendSnapEntryIdent(nil, &entries[0])
	if want := repltest.Hex(t, "01 6b 0102030405060708 ac02 1e 06 6f7264657273"); err != nil || !bytes.Equal(raw, want) {
		t.Fatalf("layout %x, %v\nwant %x", raw, err, want)
	}
	for i := 1; i < len(entries); i++ {
		if raw, err = records.AppendSnapEntryIdent(raw, &entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	var sr records.SnapReader
	var e records.SnapEntry
	sr.ResetIdent(raw)
	i := 0
	for ; sr.Next(&e); i++ {
		if !reflect.DeepEqual(e, entries[i]) {
			t.Fatalf("entry %d: %+v, want %+v", i, e, entries[i])
		}
	}
	if sr.Err() != nil || i != len(entries) {
		t.Fatalf("end after %d: %v", i, sr.Err())
	}
	if out, err := records.AppendSnapEntry([]byte("x"), &entries[0]); err != records.ErrBadEntry || string(out) != "x" {
		t.Fatalf("version 1 with an identity: %q, %v", out, err)
	}
	over := records.SnapEntry{Key: []byte("k"), Token: 1, Ident: make([]byte, 256)}
	if out, err := records.AppendSnapEntryIdent([]byte("x"), &over); err != records.ErrBadEntry || string(out) != "x" {
		t.Fatalf("identity of 256 bytes: %q, %v", out, err)
	}
	sr.ResetIdent(repltest.Hex(t, "01 6b 0000000000000001 00 00 03 6162"))
	if sr.Next(&e) || sr.Err() != records.ErrTruncated {
		t.Fatalf("truncated identity: %v", sr.Err())
	}
}

// TestSharedRecords: a shared grant (PROTOCOL.md §9.2) is kind 0x41 (0xC1
// with an identity) with its limit after its lease, reads back with it,
// and a grant without one keeps the layout of format version 2. A limit on
// another kind is refused; a limit bit with limit 0, a truncated limit and
// the limit bit on another kind stop the reader.
func TestSharedRecords(t *testing.T) {
	g := repltest.Rec(shard.RecordGrant, 5, 1, "k", 0x18700000000000ff, 30)
	g.Limit = 4
	gi := repltest.Rec(shard.RecordGrant, 5, 2, "k", 0x1870000000000100, 30)
	gi.Limit, gi.Ident = 65535, []byte("orders")
	var w records.BatchWriter
	for _, r := range []*shard.Record{&g, &gi} {
		if err := w.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	want := repltest.Hex(t, "41 0005 01 18700000000000ff 1e 0004 01 6b"+
		"c1 0005 02 1870000000000100 1e ffff 01 6b 06 6f7264657273")
	if !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("layout %x\nwant   %x", w.Bytes(), want)
	}
	rel := repltest.Rec(shard.RecordRelease, 5, 3, "k", 0x18700000000000ff, 0)
	if err := w.Add(&rel); err != nil {
		t.Fatal(err)
	}
	raw := w.Bytes()
	var rr records.RecordReader
	var r shard.Record
	rr.Reset(raw)
	for i, wr := range []shard.Record{g, gi, rel} {
		if !rr.Next(&r) || !reflect.DeepEqual(r, wr) {
			t.Fatalf("record %d: %+v (%v), want %+v", i, r, rr.Err(), wr)
		}
	}
	if rr.Next(&r) || rr.Err() != nil {
		t.Fatalf("after the last: %v", rr.Err())
	}
	for _, c := range []shard.Record{
		{Kind: shard.RecordRelease, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Limit: 2},
		{Kind: shard.RecordRenew, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Lease: 1, Limit: 2},
		{Kind: shard.RecordExpire, Shard: 1, Seq: 1, Key: []byte("k"), Token: 1, Limit: 2},
	} {
		if err := w.Add(&c); err != records.ErrBadRecord {
			t.Errorf("%v with a limit: %v, want ErrBadRecord", c.Kind, err)
		}
	}
	good := "01 0005 01 0000000000000001 1e 01 6b"
	for _, c := range []struct {
		name, raw string
		want      error
	}{
		{"limit-0", "41 0005 02 0000000000000002 1e 0000 01 6b", records.ErrBadRecord},
		{"limit-truncated", "41 0005 02 0000000000000002 1e 00", records.ErrTruncated},
		{"release-with-limit-bit", "42 0005 02 0000000000000002 00 0002 01 6b", records.ErrBadRecord},
		{"skip-with-limit-bit", "45 0005 03 01", records.ErrBadRecord},
		{"identity-and-limit-truncated-identity", "c1 0005 02 0000000000000002 1e 0002 01 6b 03 61", records.ErrTruncated},
	} {
		t.Run(c.name, func(t *testing.T) {
			rr.Reset(repltest.Hex(t, good+c.raw))
			if !rr.Next(&r) {
				t.Fatalf("good record: %v", rr.Err())
			}
			if rr.Next(&r) || rr.Err() != c.want {
				t.Fatalf("Err %v, want %v (%+v)", rr.Err(), c.want, r)
			}
		})
	}
}

// TestSnapEntryShared: the snapshot entry format version 3 carries each
// holder's key limit after its identity; versions 1 and 2 refuse an entry
// with a limit rather than drop it; an unknown version reads and writes
// nothing.
func TestSnapEntryShared(t *testing.T) {
	entries := []records.SnapEntry{
		{Key: []byte("k"), Token: 0x0102030405060708, Left: 300, Lease: 30, Ident: []byte("orders"), Limit: 4},
		{Key: []byte("k"), Token: 0x0102030405060709, Left: 301, Lease: 30, Limit: 4},
		{Key: []byte("j"), Token: 2},
		{Key: []byte("l"), Token: 3, Left: 1, Lease: 1, Ident: []byte(strings.Repeat("i", 255)), Limit: 65535},
	}
	raw, err := records.AppendSnapEntryVersion(nil, &entries[0], 3)
	if want := repltest.Hex(t, "01 6b 0102030405060708 ac02 1e 06 6f7264657273 0004"); err != nil || !bytes.Equal(raw, want) {
		t.Fatalf("layout %x, %v\nwant %x", raw, err, want)
	}
	for i := 1; i < len(entries); i++ {
		if raw, err = records.AppendSnapEntryVersion(raw, &entries[i], records.Version); err != nil {
			t.Fatal(err)
		}
	}
	var sr records.SnapReader
	var e records.SnapEntry
	sr.ResetVersion(raw, 3)
	i := 0
	for ; sr.Next(&e); i++ {
		if !reflect.DeepEqual(e, entries[i]) {
			t.Fatalf("entry %d: %+v, want %+v", i, e, entries[i])
		}
	}
	if sr.Err() != nil || i != len(entries) {
		t.Fatalf("end after %d: %v", i, sr.Err())
	}
	// The versions before 3 cannot carry a limit.
	for v, add := range map[int]func([]byte, *records.SnapEntry) ([]byte, error){1: records.AppendSnapEntry, 2: records.AppendSnapEntryIdent} {
		if out, err := add([]byte("x"), &entries[1]); err != records.ErrBadEntry || string(out) != "x" {
			t.Errorf("version %d with a limit: %q, %v", v, out, err)
		}
	}
	// Without a limit, versions 1 and 2 write what they always did.
	plain := records.SnapEntry{Key: []byte("j"), Token: 2, Ident: []byte("o")}
	v2, _ := records.AppendSnapEntryIdent(nil, &plain)
	v2v, _ := records.AppendSnapEntryVersion(nil, &plain, 2)
	if !bytes.Equal(v2, v2v) {
		t.Fatalf("version 2: %x and %x", v2, v2v)
	}
	for _, v := range []int{0, 4} {
		if out, err := records.AppendSnapEntryVersion([]byte("x"), &plain, v); err != records.ErrVersion || string(out) != "x" {
			t.Errorf("version %d: %q, %v", v, out, err)
		}
		sr.ResetVersion(raw, v)
		if sr.Next(&e) || sr.Err() != records.ErrVersion {
			t.Errorf("reading version %d: %v", v, sr.Err())
		}
	}
	sr.ResetVersion(raw[:len(raw)-1], 3)
	for sr.Next(&e) {
	}
	if sr.Err() != records.ErrTruncated {
		t.Fatalf("truncated limit: %v", sr.Err())
	}
}

// TestCompatible: only a peer of the same format version replicates; the
// refusal names both versions.
func TestCompatible(t *testing.T) {
	if records.Version != 3 {
		t.Fatalf("Version %d: update this test and docs/MEMBER-LINK.md", records.Version)
	}
	if err := records.Compatible(records.Version); err != nil {
		t.Fatal(err)
	}
	for _, v := range []uint32{0, 1, 2, 4, 1 << 31} {
		err := records.Compatible(v)
		if !errors.Is(err, records.ErrVersion) || !strings.Contains(err.Error(), fmt.Sprintf("version %d", v)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("version %d", records.Version)) {
			t.Errorf("Compatible(%d) = %v", v, err)
		}
	}
}

// TestSharedThroughTheFormat: a table driven with shared keys (acquires
// shared with their limits and mismatches, exclusive acquires among them,
// releases and renews of one holder, expiries, handoffs of several holders
// at once) sends its records through batches — cut by a Canceller, encoded,
// read back — into another table by Apply, and its dump through snapshot
// entries of format version 3 into a third by RestoreHolder: both end
// holding exactly the source's holders, with their limits.
func TestSharedThroughTheFormat(t *testing.T) {
	const shards = 4
	pending := make([]records.Indexed, shards)
	src, err := shard.New(shard.Config{Shards: shards, Sink: func(r shard.Record) {
		if err := pending[r.Shard].Add(&r); err != nil {
			t.Fatalf("add %+v: %v", r, err)
		}
	}}, shard.NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	replica, err := shard.New(shard.Config{Shards: shards}, shard.NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var c records.Canceller
	var batch records.BatchWriter
	var rr records.RecordReader
	var rec shard.Record
	cancelled, multi := 0, 0
	flush := func(now int64) {
		for i := range pending {
			src.Locked(i, func(i int) {
				batch.Reset()
				cancelled += c.Cut(&batch, uint32(i), &pending[i])
				pending[i].Reset()
			})
			var out shard.Out
			for rr.Reset(batch.Bytes()); rr.Next(&rec); {
				if _, err := replica.Apply(now, &rec, &out); err != nil {
					t.Fatalf("apply %+v: %v", rec, err)
				}
			}
			if rr.Err() != nil {
				t.Fatal(rr.Err())
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	conn := shard.NewConn(nil)
	var out shard.Out
	toks := map[string][]uint64{}
	var now int64
	for op := range 20000 {
		ki := rng.IntN(12)
		key := fmt.Sprintf("sem/%d", ki)
		switch x := rng.IntN(10); {
		case x < 4:
			limit := uint16(2 + ki%4)
			if rng.IntN(10) == 0 {
				limit = uint16(1 + rng.IntN(5))
			}
			var st shard.Status
			var tok uint64
			if rng.IntN(6) == 0 {
				st, tok = src.Acquire(now, []byte(key), uint8(rng.IntN(3)), uint8(1+rng.IntN(5)), uint64(op), conn, &out)
			} else {
				st, tok = src.AcquireShared(now, []byte(key), uint8(rng.IntN(3)), uint8(1+rng.IntN(5)), uint64(op), limit, shard.NoIdent, conn, &out)
			}
			if st == shard.Granted {
				toks[key] = append(toks[key], tok)
			}
		case x < 7:
			if l := toks[key]; len(l) > 0 {
				src.Release(now, []byte(key), l[rng.IntN(len(l))], &out)
			}
		case x < 8:
			if l := toks[key]; len(l) > 0 {
				src.Renew(now, []byte(key), uint8(1+rng.IntN(5)), l[rng.IntN(len(l))], &out)
			}
		default:
			now += int64(rng.IntN(300)) * 1e6
			src.Tick(now, &out)
		}
		for _, e := range out.Effects {
			if e.Kind == shard.EffectGrant {
				toks[string(e.Key)] = append(toks[string(e.Key)], e.Token)
			}
		}
		out.Reset()
		if src.Lookup([]byte(key)).Holders > 1 {
			multi++
		}
		if op%50 == 49 {
			flush(now)
		}
	}
	flush(now)
	if multi < 1000 || cancelled == 0 {
		t.Fatalf("%d operations with several holders, %d records cancelled: the test drives too little", multi, cancelled)
	}
	// The replica's leases count from the flush: compare holders and limits.
	type holder struct {
		key   string
		token uint64
		limit uint16
	}
	dump := func(tab *shard.Table) []holder {
		var hs []holder
		for i := range tab.Shards() {
			tab.Dump(i, func(h *shard.HeldLock) { hs = append(hs, holder{string(h.Key), h.Token, h.Limit}) })
		}
		slices.SortFunc(hs, func(a, b holder) int { return cmp.Compare(a.token, b.token) })
		return hs
	}
	want := dump(src)
	if got := dump(replica); !slices.Equal(got, want) {
		t.Fatalf("replica holds %v\nsource holds %v", got, want)
	}
	// Through a snapshot: every holder as a version 3 entry.
	restored, err := shard.New(shard.Config{Shards: shards}, shard.NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.Shards() {
		var raw []byte
		src.Dump(i, func(h *shard.HeldLock) {
			var err error
			raw, err = records.AppendSnapEntryVersion(raw, &records.SnapEntry{Key: h.Key, Token: h.Token, Left: time.Second,
				Lease: h.Lease, Ident: h.Ident, Limit: h.Limit}, records.Version)
			if err != nil {
				t.Fatal(err)
			}
		})
		var sr records.SnapReader
		var e records.SnapEntry
		for sr.ResetVersion(raw, records.Version); sr.Next(&e); {
			if err := restored.RestoreHolder(&shard.HeldLock{Key: e.Key, Token: e.Token, Deadline: int64(e.Left), Ident: e.Ident, Limit: e.Limit}); err != nil {
				t.Fatal(err)
			}
		}
		if sr.Err() != nil {
			t.Fatal(sr.Err())
		}
	}
	if got := dump(restored); !slices.Equal(got, want) {
		t.Fatalf("restored %v\nsource %v", got, want)
	}
}

// TestCutReadsEveryShape: a Canceller reads each record's kind, Seq, token
// and end from the records themselves when it cuts, so records of every
// shape — a grant with an identity and a limit, a key of 300 bytes (a
// two-byte length), Seqs past 127 (multi-byte), a renewal between — are
// taken out or kept whole: what it appends reads back as exactly the
// records that stay, with one skip for the run that cancelled.
func TestCutReadsEveryShape(t *testing.T) {
	long := []byte(strings.Repeat("k", 300))
	in := []shard.Record{
		{Kind: shard.RecordRelease, Shard: 3, Seq: 200, Key: []byte("old"), Token: 7},                                                     // of an earlier batch: stays
		{Kind: shard.RecordGrant, Shard: 3, Seq: 201, Key: long, Token: 9, Lease: 5, Ident: []byte("orders"), Limit: 3},                   // cancels
		{Kind: shard.RecordRenew, Shard: 3, Seq: 202, Key: long, Token: 9, Lease: 7},                                                      // cancels
		{Kind: shard.RecordGrant, Shard: 3, Seq: 203, Key: []byte("stays"), Token: 10, Lease: 1, Ident: []byte(strings.Repeat("i", 255))}, // stays
		{Kind: shard.RecordRelease, Shard: 3, Seq: 204, Key: long, Token: 9},                                                              // cancels
		{Kind: shard.RecordGrant, Shard: 3, Seq: 205, Key: []byte("e"), Token: 11, Lease: 2, Limit: 65535},                                // cancels
		{Kind: shard.RecordExpire, Shard: 3, Seq: 206, Key: []byte("e"), Token: 11},                                                       // cancels
	}
	var x records.Indexed
	for i := range in {
		if err := x.Add(&in[i]); err != nil {
			t.Fatalf("add %+v: %v", in[i], err)
		}
	}
	var c records.Canceller
	var out records.BatchWriter
	if n := c.Cut(&out, 3, &x); n != 5 {
		t.Fatalf("%d records taken out, want 5", n)
	}
	want := []shard.Record{in[0], {Kind: shard.RecordSkip, Shard: 3, Seq: 202, From: 201}, in[3],
		{Kind: shard.RecordSkip, Shard: 3, Seq: 206, From: 204}}
	var rr records.RecordReader
	var got []shard.Record
	var r shard.Record
	for rr.Reset(out.Bytes()); rr.Next(&r); {
		r.Key, r.Ident = slices.Clone(r.Key), slices.Clone(r.Ident)
		got = append(got, r)
	}
	if rr.Err() != nil {
		t.Fatal(rr.Err())
	}
	for i := range want {
		want[i].Deadline = 0 // not sent
		if len(want[i].Ident) == 0 {
			want[i].Ident = nil
		}
	}
	for i := range got {
		if len(got[i].Ident) == 0 {
			got[i].Ident = nil
		}
		if len(got[i].Key) == 0 {
			got[i].Key = nil
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cut read back as\n%+v\nwant\n%+v", got, want)
	}
}

// BenchmarkCut is a Canceller's cut of one shard's millisecond under the
// pipelined pair load (ns/op per record): 64 pairs in flight, so most
// grants end within the batch and cancel.
func BenchmarkCut(b *testing.B) {
	const pairs, inflight = 1024, 64
	var x records.Indexed
	seq := uint64(0)
	add := func(r shard.Record) {
		seq++
		r.Seq = seq
		if err := x.Add(&r); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([][]byte, pairs)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench/key/%06d", i)
	}
	for i := range pairs + inflight {
		if i < pairs {
			add(shard.Record{Kind: shard.RecordGrant, Key: keys[i], Token: uint64(1000 + i), Lease: 10, Deadline: 1})
		}
		if j := i - inflight; j >= 0 {
			add(shard.Record{Kind: shard.RecordRelease, Key: keys[j], Token: uint64(1000 + j)})
		}
	}
	var c records.Canceller
	var out records.BatchWriter
	for b.Loop() {
		out.Reset()
		c.Cut(&out, 0, &x)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(x.Count()), "ns/record")
}
