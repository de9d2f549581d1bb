package repl

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/lockd-dev/lockd/shard"
)

// wireWorkload drives a shard.Table with a mix like bench/'s and returns
// the n first records its Sink received (keys copied, Deadline cleared):
// acquire/release pairs on 16-byte keys "bench/key/000123" over 100,000
// keys, some held a while and renewed; contended handoffs on 16 hot keys
// (a queued acquire granted by the holder's release); and leases of 1 s
// left to expire under Tick. The clock advances 20 µs per operation (50k
// operations/s); tokens start at a wall-clock-like floor, as lockd's do.
func wireWorkload(tb testing.TB, n int, seed uint64) []shard.Record {
	tb.Helper()
	var recs []shard.Record
	cfg := shard.Config{Sink: func(r shard.Record) {
		if len(recs) < n {
			r.Key, r.Deadline = append([]byte(nil), r.Key...), 0
			recs = append(recs, r)
		}
	}}
	const floor = 1_750_000_000_000_000_000
	tab, err := shard.New(cfg, shard.NewTokens(floor, floor+1<<40))
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	key := func(prefix string, i int) []byte {
		k := strconv.AppendInt([]byte(prefix), int64(1_000_000+i), 10)
		return append(k[:len(prefix)], k[len(prefix)+1:]...) // zero-padded to 6 digits
	}
	type lock struct {
		key   []byte
		token uint64
	}
	var held []lock
	hot := make([]uint64, 16) // current token of each hot key, 0 if free
	waiter := shard.NewConn(nil)
	var out shard.Out
	now := int64(0)
	for step := 0; len(recs) < n; step++ {
		if step > 100*n {
			tb.Fatalf("workload: %d records after %d steps", len(recs), step)
		}
		now += 20_000
		out.Reset()
		switch op := rng.IntN(100); {
		case op < 50: // uncontended pair
			k := key("bench/key/", rng.IntN(100_000))
			if st, tok := tab.Acquire(now, k, 0, 10, 1, nil, &out); st == shard.Granted {
				tab.Release(now, k, tok, &out)
			}
		case op < 65: // held for a while
			k := key("bench/key/", rng.IntN(100_000))
			if st, tok := tab.Acquire(now, k, 0, 30, 1, nil, &out); st == shard.Granted {
				held = append(held, lock{k, tok})
			}
		case op < 75 && len(held) > 0: // renew a held lock
			l := held[rng.IntN(len(held))]
			tab.Renew(now, l.key, 30, l.token, &out)
		case op < 85 && len(held) > 0: // release a held lock
			i := rng.IntN(len(held))
			tab.Release(now, held[i].key, held[i].token, &out)
			held[i] = held[len(held)-1]
			held = held[:len(held)-1]
		case op < 97: // contended: queue behind the holder, then hand off
			i := rng.IntN(len(hot))
			k := key("bench/hot/", i)
			if hot[i] == 0 {
				if st, tok := tab.Acquire(now, k, 5, 10, 1, nil, &out); st == shard.Granted {
					hot[i] = tok
				}
				continue
			}
			tab.Acquire(now, k, 5, 10, 2, waiter, &out)
			tab.Release(now, k, hot[i], &out)
			hot[i] = 0
			for _, e := range out.Effects {
				if e.Kind == shard.EffectGrant {
					hot[i] = e.Token
				}
			}
		default: // a lease left to expire
			tab.Acquire(now, key("bench/key/", rng.IntN(100_000)), 0, 1, 1, nil, &out)
		}
		if step%500 == 0 {
			tab.Tick(now, &out)
		}
	}
	return recs
}

// wireBatches cuts recs into raw batches of per records each.
func wireBatches(tb testing.TB, recs []shard.Record, per int) [][]byte {
	tb.Helper()
	var out [][]byte
	var w BatchWriter
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			tb.Fatalf("record %d %+v: %v", i, recs[i], err)
		}
		if w.Count() == per || i == len(recs)-1 {
			out = append(out, append([]byte(nil), w.Bytes()...))
			w.Reset()
		}
	}
	return out
}

func TestWorkloadMix(t *testing.T) {
	recs := wireWorkload(t, 100000, 1)
	kinds := map[shard.RecordKind]int{}
	for _, r := range recs {
		kinds[r.Kind]++
	}
	t.Logf("grant %d, release %d, expire %d, renew %d", kinds[shard.RecordGrant], kinds[shard.RecordRelease],
		kinds[shard.RecordExpire], kinds[shard.RecordRenew])
	for k := shard.RecordGrant; k <= shard.RecordRenew; k++ {
		if kinds[k] < 100 {
			t.Errorf("%v: %d records of %d", k, kinds[k], len(recs))
		}
	}
}

func wireRec(kind shard.RecordKind, sh uint32, seq uint64, key string, token uint64, lease uint8) shard.Record {
	return shard.Record{Kind: kind, Shard: sh, Seq: seq, Key: []byte(key), Token: token, Lease: lease}
}

// TestRecordLayout: a record of each kind encodes to the bytes the format
// says, written out by hand.
func TestRecordLayout(t *testing.T) {
	cases := []struct {
		r    shard.Record
		want string
	}{
		{wireRec(shard.RecordGrant, 5, 1, "k", 0x18700000000000ff, 30), "01 0005 01 18700000000000ff 1e 01 6b"},
		{wireRec(shard.RecordRelease, 65535, 300, "ab", 2, 0), "02 ffff ac02 0000000000000002 00 02 6162"},
		{wireRec(shard.RecordExpire, 0, 1<<64-1, "x", 3, 0), "03 0000 ffffffffffffffffff01 0000000000000003 00 01 78"},
		{wireRec(shard.RecordRenew, 1, 128, strings.Repeat("z", 200), 1<<64-1, 255),
			"04 0001 8001 ffffffffffffffff ff c801 " + strings.Repeat("7a", 200)},
	}
	for _, c := range cases {
		t.Run(c.r.Kind.String(), func(t *testing.T) {
			var w BatchWriter
			r := c.r
			r.Deadline = 12345 // not sent
			if err := w.Add(&r); err != nil {
				t.Fatal(err)
			}
			if want := wireHex(t, c.want); !bytes.Equal(w.Bytes(), want) {
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
		wireRec(shard.RecordGrant, 0, 1, "a", 1, 1),
		wireRec(shard.RecordGrant, 65535, 1<<64-1, strings.Repeat("k", MaxKey), 1<<64-1, 255),
		wireRec(shard.RecordGrant, 3, 127, "bench/key/000123", 1_750_000_000_000_000_001, 0),
		wireRec(shard.RecordRelease, 3, 128, "bench/key/000123", 1_750_000_000_000_000_001, 0),
		wireRec(shard.RecordExpire, 17, 16383, "é/ü", 9, 0),
		wireRec(shard.RecordRenew, 17, 16384, "é/ü", 9, 10),
		wireRec(shard.RecordRenew, 1, 2, "\x00\n\xff", 2, 0),
	}
	var w BatchWriter
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
	if n, err := CheckRecords(raw); n != len(recs) || err != nil {
		t.Fatalf("CheckRecords: %d, %v", n, err)
	}
	var rr RecordReader
	rr.Reset(raw)
	var r shard.Record
	for i := 0; rr.Next(&r); i++ {
		if !reflect.DeepEqual(r, recs[i]) {
			t.Fatalf("record %d: %+v, want %+v", i, r, recs[i])
		}
		if !wireWithin(r.Key, raw) {
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
		if err := w.AddSkip(uint32(bad[0]), bad[1], bad[2]); err != ErrBadRecord {
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

// wireWithin reports whether sub lies inside buf's memory.
func wireWithin(sub, buf []byte) bool {
	if len(sub) == 0 || len(buf) == 0 {
		return false
	}
	for i := range buf {
		if &buf[i] == &sub[0] {
			return i+len(sub) <= len(buf)
		}
	}
	return false
}

// TestBatchWriterRefuses: a record the format cannot carry is refused and
// leaves the batch as it was.
func TestBatchWriterRefuses(t *testing.T) {
	long := strings.Repeat("k", MaxKey+1)
	cases := []struct {
		name string
		r    shard.Record
		want error
	}{
		{"kind-0", wireRec(0, 0, 1, "k", 1, 0), ErrBadRecord},
		{"kind-5-skip-by-Add", wireRec(shard.RecordSkip, 0, 1, "k", 1, 0), ErrBadRecord},
		{"kind-6", wireRec(6, 0, 1, "k", 1, 0), ErrBadRecord},
		{"shard-65536", wireRec(shard.RecordGrant, 65536, 1, "k", 1, 1), ErrBadRecord},
		{"seq-0", wireRec(shard.RecordGrant, 0, 0, "k", 1, 1), ErrBadRecord},
		{"token-0", wireRec(shard.RecordGrant, 0, 1, "k", 0, 1), ErrBadRecord},
		{"release-lease", wireRec(shard.RecordRelease, 0, 1, "k", 1, 1), ErrBadRecord},
		{"expire-lease", wireRec(shard.RecordExpire, 0, 1, "k", 1, 1), ErrBadRecord},
		{"key-empty", wireRec(shard.RecordGrant, 0, 1, "", 1, 1), ErrBadKey},
		{"key-1025", wireRec(shard.RecordGrant, 0, 1, long, 1, 1), ErrBadKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w BatchWriter
			ok := wireRec(shard.RecordGrant, 0, 1, "k", 1, 1)
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
		{"kind-0", "00 0005 01 0000000000000001 1e 01 6b", ErrBadRecord},
		{"kind-6", "06 0005 01 0000000000000001 1e 01 6b", ErrBadRecord},
		{"skip-count-0", "05 0005 03 00", ErrBadRecord},
		{"skip-seq-0", "05 0005 00 01", ErrBadRecord},
		{"skip-count-above-seq", "05 0005 03 04", ErrBadRecord},
		{"skip-count-truncated", "05 0005 03", ErrTruncated},
		{"skip-count-padded", "05 0005 03 8100", ErrBadVarint},
		{"seq-0", "01 0005 00 0000000000000001 1e 01 6b", ErrBadRecord},
		{"token-0", "01 0005 01 0000000000000000 1e 01 6b", ErrBadRecord},
		{"release-lease", "02 0005 01 0000000000000001 1e 01 6b", ErrBadRecord},
		{"expire-lease", "03 0005 01 0000000000000001 01 01 6b", ErrBadRecord},
		{"key-0", "01 0005 01 0000000000000001 1e 00", ErrBadKey},
		{"key-1025", "01 0005 01 0000000000000001 1e 8108" + strings.Repeat("6b", 1025), ErrBadKey},
		{"key-huge", "01 0005 01 0000000000000001 1e ffffffffffffffff7f", ErrBadKey},
		{"key-truncated", "01 0005 01 0000000000000001 1e 02 6b", ErrTruncated},
		{"seq-truncated-varint", "01 0005 80", ErrTruncated},
		{"seq-padded-varint", "01 0005 8100 0000000000000001 1e 01 6b", ErrBadVarint},
		{"seq-over-64-bits", "01 0005 ffffffffffffffffff02 0000000000000001 1e 01 6b", ErrBadVarint},
		{"seq-11-bytes", "01 0005 ffffffffffffffffff8001 0000000000000001 1e 01 6b", ErrBadVarint},
		{"keylen-padded", "01 0005 01 0000000000000001 1e 8100 6b", ErrBadVarint},
		{"token-truncated", "01 0005 01 00000000000000", ErrTruncated},
		{"trailing-byte", "01", ErrTruncated},
		{"trailing-two", "0100", ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := wireHex(t, good+c.raw)
			var rr RecordReader
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
			if n, err := CheckRecords(raw); n != 1 || err != c.want {
				t.Fatalf("CheckRecords: %d, %v", n, err)
			}
		})
	}
}

// TestRecordPrefixes: every prefix of a real batch reads back exactly the
// records it holds whole, and one that ends inside a record is an error.
func TestRecordPrefixes(t *testing.T) {
	recs := wireWorkload(t, 40, 2)
	raw := wireBatches(t, recs, len(recs))[0]
	ends := map[int]int{0: 0} // prefix length at a record boundary → records
	var w BatchWriter
	for i := range recs {
		w.Add(&recs[i])
		ends[w.Len()] = i + 1
	}
	for i := 0; i <= len(raw); i++ {
		n, err := CheckRecords(raw[:i])
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
	entries := []SnapEntry{
		{Key: []byte("k"), Token: 0x0102030405060708, Left: 300, Lease: 30},
		{Key: []byte(strings.Repeat("x", MaxKey)), Token: 1<<64 - 1, Left: math.MaxInt64, Lease: 255},
		{Key: []byte("bench/key/000123"), Token: 1, Left: 0, Lease: 0},
	}
	raw, err := AppendSnapEntry([]byte("pre"), &entries[0])
	if want := wireHex(t, "707265 01 6b 0102030405060708 ac02 1e"); err != nil || !bytes.Equal(raw, want) {
		t.Fatalf("layout: %x, %v\nwant %x", raw, err, want)
	}
	raw = raw[3:]
	for i := 1; i < len(entries); i++ {
		if raw, err = AppendSnapEntry(raw, &entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	neg := SnapEntry{Key: []byte("n"), Token: 5, Left: -time.Second, Lease: 3}
	if raw, err = AppendSnapEntry(raw, &neg); err != nil {
		t.Fatal(err)
	}
	neg.Left = 0 // sent as ended
	entries = append(entries, neg)
	var sr SnapReader
	sr.Reset(raw)
	var e SnapEntry
	i := 0
	for ; sr.Next(&e); i++ {
		if !reflect.DeepEqual(e, entries[i]) || !wireWithin(e.Key, raw) {
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
		b, _ = AppendSnapEntry(b, &entries[i])
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
		e    SnapEntry
		want error
	}{
		{"token-0", SnapEntry{Key: []byte("k")}, ErrBadEntry},
		{"key-empty", SnapEntry{Token: 1}, ErrBadKey},
		{"key-1025", SnapEntry{Key: make([]byte, MaxKey+1), Token: 1}, ErrBadKey},
	} {
		if out, err := AppendSnapEntry([]byte("x"), &c.e); err != c.want || string(out) != "x" {
			t.Errorf("%s: %q, %v; want %v", c.name, out, err, c.want)
		}
	}
	good := "01 6b 0000000000000001 00 00"
	for _, c := range []struct {
		name, raw string
		want      error
	}{
		{"key-0", "00", ErrBadKey},
		{"key-1025", "8108" + strings.Repeat("6b", 1025), ErrBadKey},
		{"key-truncated", "05 6b6b", ErrTruncated},
		{"token-0", "01 6b 0000000000000000 00 00", ErrBadEntry},
		{"token-truncated", "01 6b 00000000", ErrTruncated},
		{"left-truncated", "01 6b 0000000000000001 80", ErrTruncated},
		{"left-padded", "01 6b 0000000000000001 8000 00", ErrBadVarint},
		{"left-over-int64", "01 6b 0000000000000001 ffffffffffffffff8001 00", ErrBadEntry},
		{"lease-missing", "01 6b 0000000000000001 00", ErrTruncated},
		{"keylen-truncated", "80", ErrTruncated},
	} {
		t.Run(c.name, func(t *testing.T) {
			var sr SnapReader
			var e SnapEntry
			sr.Reset(wireHex(t, good+c.raw))
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
	recs := wireWorkload(t, 2000, 3)
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
		want Codec
	}{
		{"empty", nil, CodecRaw},
		{"s2-above-7/8", partly(900), CodecRaw},
		{"s2-below-7/8", partly(800), CodecS2},
		{"tiny-compressible", bytes.Repeat([]byte{'a'}, compressMin-1), CodecRaw},
		{"min-compressible", bytes.Repeat([]byte{'a'}, compressMin), CodecS2},
		{"incompressible", noise, CodecRaw},
		{"batch-2", wireBatches(t, recs[:2], 2)[0], CodecRaw},
		{"batch-64", wireBatches(t, recs[:64], 64)[0], CodecS2},
		{"batch-2000", wireBatches(t, recs, 2000)[0], CodecS2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			codec, out := Compress([]byte("hdr"), c.raw)
			if codec != c.want || string(out[:3]) != "hdr" {
				t.Fatalf("codec %v, want %v", codec, c.want)
			}
			data := out[3:]
			if codec == CodecS2 && len(data)*8 >= len(c.raw)*7 {
				t.Fatalf("s2: %d bytes of %d", len(data), len(c.raw))
			}
			back, err := Decompress(make([]byte, 10), codec, data, len(c.raw))
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
	_, enc := Compress(nil, raw)
	huge := s2.Encode(nil, make([]byte, 2*MaxFrame/1000))[:8] // a header claiming more than is there
	cases := []struct {
		name   string
		c      Codec
		data   []byte
		rawLen int
		want   error
	}{
		{"raw-len-mismatch", CodecRaw, raw, len(raw) - 1, ErrBadField},
		{"s2-len-short", CodecS2, enc, len(raw) - 1, ErrCorrupt},
		{"s2-len-long", CodecS2, enc, len(raw) + 1, ErrCorrupt},
		{"s2-over-max", CodecS2, enc, MaxFrame + 1, ErrBadField},
		{"s2-negative", CodecS2, enc, -1, ErrBadField},
		{"s2-truncated", CodecS2, enc[:len(enc)-1], len(raw), ErrCorrupt},
		{"s2-trailing", CodecS2, append(append([]byte{}, enc...), 0), len(raw), ErrCorrupt},
		{"s2-header-only", CodecS2, huge, 2 * MaxFrame / 1000, ErrCorrupt},
		{"s2-empty", CodecS2, nil, 0, ErrCorrupt},
		{"codec-2", 2, raw, len(raw), ErrBadField},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if out, err := Decompress(nil, c.c, c.data, c.rawLen); err != c.want || out != nil {
				t.Fatalf("Decompress: %d bytes, %v; want %v", len(out), err, c.want)
			}
		})
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = Decompress(nil, CodecS2, enc, MaxFrame+1) }); n != 0 {
		t.Fatalf("refused raw length allocated %v times", n)
	}
}

// TestBatchFrames: real batches of every size travel as Batch frames
// (split at every tenth byte) and come back record for record.
func TestBatchFrames(t *testing.T) {
	recs := wireWorkload(t, 4000, 4)
	for _, per := range []int{1, 8, 64, 512, 2000} {
		t.Run(strconv.Itoa(per), func(t *testing.T) {
			batches := wireBatches(t, recs, per)
			var stream []byte
			codecs := map[Codec]int{}
			for i, raw := range batches {
				stream = AppendBatch(stream, uint64(i+1), raw)
			}
			var chunks [][]byte
			for i := 0; i < len(stream); i += 10 {
				chunks = append(chunks, stream[i:min(i+10, len(stream))])
			}
			fr := NewFrameReader(&wireChunks{chunks: chunks})
			var b Batch
			var rr RecordReader
			var r shard.Record
			var scratch []byte
			next := 0
			for i := range batches {
				typ, p, err := fr.Next()
				if err != nil || typ != MsgBatch {
					t.Fatalf("frame %d: %v %v", i, typ, err)
				}
				if err := b.Decode(p); err != nil || b.Seq != uint64(i+1) || int(b.RawLen) != len(batches[i]) {
					t.Fatalf("batch %d: %+v %v", i, b, err)
				}
				codecs[b.Codec]++
				raw, err := b.Raw(scratch)
				if err != nil {
					t.Fatalf("batch %d: Raw: %v", i, err)
				}
				if b.Codec == CodecS2 {
					scratch = raw
				}
				for rr.Reset(raw); rr.Next(&r); next++ {
					if !reflect.DeepEqual(r, recs[next]) {
						t.Fatalf("record %d: %+v, want %+v", next, r, recs[next])
					}
				}
				if rr.Err() != nil {
					t.Fatalf("batch %d: %v", i, rr.Err())
				}
			}
			if next != len(recs) {
				t.Fatalf("%d records back of %d", next, len(recs))
			}
			if per >= 64 && codecs[CodecRaw] > 1 || per == 1 && codecs[CodecS2] > 0 {
				t.Fatalf("codecs %v", codecs)
			}
		})
	}
}

// TestReplicaFollows: a table applying the records another table streams
// through Batch frames ends with the same held keys, tokens and sequences;
// and a third table loaded from SnapShard frames of the first, then fed
// the records after the dump, ends the same.
func TestReplicaFollows(t *testing.T) {
	var w BatchWriter
	var stream []byte
	seq := uint64(0)
	flush := func() {
		if w.Count() > 0 {
			seq++
			stream = AppendBatch(stream, seq, w.Bytes())
			w.Reset()
		}
	}
	cfg := shard.Config{Shards: 16, Sink: func(r shard.Record) {
		if err := w.Add(&r); err != nil {
			t.Errorf("Add: %v", err)
		}
		if w.Len() >= 64<<10 || w.Count() >= 300 {
			flush()
		}
	}}
	active, err := shard.New(cfg, shard.NewTokens(1000, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	var out shard.Out
	rng := rand.New(rand.NewPCG(5, 5))
	keys := make([][]byte, 3000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench/key/%06d", i)
	}
	tokens := make([]uint64, len(keys))
	now := int64(0)
	play := func(steps int) {
		for range steps {
			now += 1e6
			out.Reset()
			i := rng.IntN(len(keys))
			switch {
			case tokens[i] == 0:
				if st, tok := active.Acquire(now, keys[i], 0, uint8(1+rng.IntN(3)), 1, nil, &out); st == shard.Granted {
					tokens[i] = tok
				}
			case rng.IntN(3) == 0:
				active.Renew(now, keys[i], 5, tokens[i], &out)
			default:
				active.Release(now, keys[i], tokens[i], &out)
				tokens[i] = 0
			}
			if rng.IntN(100) == 0 {
				active.Tick(now, &out) // some leases end: expiry records
			}
		}
		flush()
	}
	play(20000)

	// The snapshot, cut now, in frames of at most 4 KiB raw per shard.
	var snap []byte
	var raw []byte
	for i := range active.Shards() {
		var dumpErr error
		cut := active.DumpShard(i, func(key []byte, token uint64, deadline int64, lease uint8) {
			raw, dumpErr = AppendSnapEntry(raw, &SnapEntry{Key: key, Token: token, Left: time.Duration(deadline - now), Lease: lease})
			if len(raw) >= 4<<10 && dumpErr == nil {
				snap = AppendSnapShard(snap, uint32(i), 0, false, raw)
				raw = raw[:0]
			}
		})
		if dumpErr != nil {
			t.Fatal(dumpErr)
		}
		snap = AppendSnapShard(snap, uint32(i), cut, true, raw)
		raw = raw[:0]
	}
	snapStream := len(stream)
	play(20000)

	follow := func(t *testing.T, tab *shard.Table, s []byte) {
		fr := NewFrameReader(bytes.NewReader(s))
		var b Batch
		var rr RecordReader
		var r shard.Record
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				return
			}
			if err != nil || typ != MsgBatch || b.Decode(p) != nil {
				t.Fatalf("frame: %v %v", typ, err)
			}
			data, err := b.Raw(nil)
			if err != nil {
				t.Fatal(err)
			}
			for rr.Reset(data); rr.Next(&r); {
				if _, err := tab.Apply(now, &r, &out); err != nil {
					t.Fatalf("Apply %+v: %v", r, err)
				}
			}
			if rr.Err() != nil {
				t.Fatal(rr.Err())
			}
		}
	}
	same := func(t *testing.T, tab *shard.Table) {
		want := map[string]uint64{}
		active.Held(func(k []byte, tok uint64, _ int64) { want[string(k)] = tok })
		got := map[string]uint64{}
		tab.Held(func(k []byte, tok uint64, _ int64) { got[string(k)] = tok })
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("replica holds %d keys, active %d (equal %v)", len(got), len(want), reflect.DeepEqual(got, want))
		}
		for i := range active.Shards() {
			if active.Seq(i) != tab.Seq(i) {
				t.Fatalf("shard %d: seq %d, active %d", i, tab.Seq(i), active.Seq(i))
			}
		}
	}
	t.Run("stream", func(t *testing.T) {
		replica, err := shard.New(shard.Config{Shards: 16}, shard.NewTokens(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		follow(t, replica, stream)
		same(t, replica)
	})
	t.Run("snapshot-then-stream", func(t *testing.T) {
		replica, err := shard.New(shard.Config{Shards: 16}, shard.NewTokens(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		fr := NewFrameReader(bytes.NewReader(snap))
		var s SnapShard
		var sr SnapReader
		var e SnapEntry
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				break
			}
			if err != nil || typ != MsgSnapShard || s.Decode(p) != nil {
				t.Fatalf("frame: %v %v", typ, err)
			}
			data, err := s.Raw(nil)
			if err != nil {
				t.Fatal(err)
			}
			for sr.Reset(data); sr.Next(&e); {
				if err := replica.Restore(e.Key, e.Token, now+int64(e.Left)); err != nil {
					t.Fatal(err)
				}
			}
			if sr.Err() != nil {
				t.Fatal(sr.Err())
			}
			if s.Last {
				replica.SetSeq(int(s.Shard), s.Seq)
			}
		}
		follow(t, replica, stream) // records up to the cut are skipped, the rest applied
		same(t, replica)
		if snapStream == len(stream) {
			t.Fatal("no records after the snapshot")
		}
	})
}

// BenchmarkCompress compresses real batches of 8, 64, 512 and 2000
// records (the workload of wireWorkload) with s2 block encoding (s2: the
// codec alone; s2-sent: Compress, which leaves batches under 256 bytes
// raw), and zstd EncodeAll at SpeedFastest and at SpeedDefault (one reused
// encoder, no dictionary). ratio is raw/compressed over all batches; B/rec
// is the compressed bytes per record (wireB/rec: with the Batch frame);
// MB/s counts raw bytes.
func BenchmarkCompress(b *testing.B) {
	recs := wireWorkload(b, 64000, 7)
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
		{"s2-sent", func(dst, raw []byte) []byte { _, out := Compress(dst[:0], raw); return out }},
		{"zstd", func(dst, raw []byte) []byte { return fastest.EncodeAll(raw, dst[:0]) }},
		{"zstd-default", func(dst, raw []byte) []byte { return dflt.EncodeAll(raw, dst[:0]) }},
	}
	for _, c := range codecs {
		for _, per := range []int{8, 64, 512, 2000} {
			batches := wireBatches(b, recs, per)
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
				if c.name == "s2-sent" { // with the Batch frame around it
					frames := 0
					for _, raw := range batches {
						frames += len(AppendBatch(dst[:0], 1, raw))
					}
					b.ReportMetric(float64(frames)/float64(len(batches)*per), "wireB/rec")
				}
			})
		}
	}
}

// BenchmarkDecompress decodes the same batches: s2 block and zstd
// DecodeAll with a reused decoder.
func BenchmarkDecompress(b *testing.B) {
	recs := wireWorkload(b, 64000, 7)
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
			batches := wireBatches(b, recs, per)
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
						_, err = Decompress(dst, CodecS2, encoded[i], len(batches[i]))
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
	recs := wireWorkload(b, 4096, 8)
	var w BatchWriter
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
	raw := wireBatches(b, wireWorkload(b, 2000, 9), 2000)[0]
	var rr RecordReader
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
