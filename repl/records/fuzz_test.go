package records_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

func recordSeeds() repltest.Seeds {
	var seeds repltest.Seeds
	add := seeds.Add
	large := repltest.FuzzBatch(repltest.FuzzRecords(64))
	add("FuzzBatchRecords", "one", repltest.FuzzBatch(repltest.FuzzRecords(1)))
	add("FuzzBatchRecords", "eight", repltest.FuzzBatch(repltest.FuzzRecords(8)))
	add("FuzzBatchRecords", "sixty-four", large)
	edges := []shard.Record{
		repltest.Rec(shard.RecordGrant, 65535, 1<<64-1, strings.Repeat("k", 300), 1<<64-1, 255),
		repltest.Rec(shard.RecordRelease, 0, 128, "é", 1, 0),
		repltest.Rec(shard.RecordExpire, 1, 16384, "\x00", 2, 0),
		repltest.Rec(shard.RecordRenew, 2, 1, "k", 3, 1),
	}
	add("FuzzBatchRecords", "edges", repltest.FuzzBatch(edges))
	add("FuzzBatchRecords", "truncated", large[:len(large)-3])

	add("FuzzSnapEntries", "one", repltest.FuzzEntries(1))
	add("FuzzSnapEntries", "sixty-four", repltest.FuzzEntries(64))
	e, _ := records.AppendSnapEntry(nil, &records.SnapEntry{Key: []byte(strings.Repeat("z", records.MaxKey)), Token: 1<<64 - 1, Left: 1<<63 - 1, Lease: 255})
	add("FuzzSnapEntries", "edges", e)
	return seeds
}

// TestFuzzCorpus: the seed corpus under testdata/fuzz holds every seed
// above as it is built now (go test -run TestFuzzCorpus -write-corpus
// rewrites it).
func TestFuzzCorpus(t *testing.T) { repltest.CheckCorpus(t, recordSeeds()) }

// fuzzCompression: raw survives Compress and Decompress; raw taken as s2
// data decodes, at its claimed length, without panicking.
func fuzzCompression(t *testing.T, raw []byte) {
	codec, enc := records.Compress([]byte{9}, raw)
	back, err := records.Decompress(nil, codec, enc[1:], len(raw))
	if err != nil || !bytes.Equal(back, raw) {
		t.Fatalf("%v round trip: %v", codec, err)
	}
	for _, n := range []int{0, len(raw), 4 * len(raw), records.MaxRaw + 1} {
		if out, err := records.Decompress(nil, records.CodecS2, raw, n); err == nil && len(out) != n {
			t.Fatalf("s2 of %d bytes decoded to %d", n, len(out))
		}
	}
}

// FuzzBatchRecords: arbitrary bytes read as a batch's records, and as
// data to compress.
func FuzzBatchRecords(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		repltest.RecordsRoundTrip(t, raw)
		fuzzCompression(t, raw)
	})
}

// FuzzSnapEntries: arbitrary bytes read as a SnapShard's entries.
func FuzzSnapEntries(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		repltest.EntriesRoundTrip(t, raw)
		fuzzCompression(t, raw)
	})
}
