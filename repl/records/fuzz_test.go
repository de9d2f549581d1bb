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
	idents := repltest.FuzzBatch(repltest.FuzzIdentRecords(16))
	add("FuzzBatchRecords", "identities", idents)
	long := repltest.Rec(shard.RecordGrant, 7, 9, "k", 5, 10)
	long.Ident = []byte(strings.Repeat("i", 255))
	add("FuzzBatchRecords", "identity-255", repltest.FuzzBatch([]shard.Record{long}))
	add("FuzzBatchRecords", "identity-truncated", idents[:len(idents)-2])
	shared := repltest.FuzzBatch(repltest.FuzzSharedRecords(24))
	add("FuzzBatchRecords", "shared", shared)
	add("FuzzBatchRecords", "shared-truncated", shared[:len(shared)-5])
	sharedEdge := repltest.Rec(shard.RecordGrant, 65535, 1<<64-1, strings.Repeat("k", 1024), 1<<64-1, 255)
	sharedEdge.Limit, sharedEdge.Ident = 65535, []byte(strings.Repeat("i", 255))
	add("FuzzBatchRecords", "shared-edges", repltest.FuzzBatch([]shard.Record{sharedEdge}))

	add("FuzzSnapEntries", "one", repltest.FuzzEntries(1))
	add("FuzzSnapEntries", "sixty-four", repltest.FuzzEntries(64))
	e, _ := records.AppendSnapEntry(nil, &records.SnapEntry{Key: []byte(strings.Repeat("z", records.MaxKey)), Token: 1<<64 - 1, Left: 1<<63 - 1, Lease: 255})
	add("FuzzSnapEntries", "edges", e)

	add("FuzzSnapEntriesIdent", "one", repltest.FuzzIdentEntries(1))
	add("FuzzSnapEntriesIdent", "sixty-four", repltest.FuzzIdentEntries(64))
	e, _ = records.AppendSnapEntryIdent(nil, &records.SnapEntry{Key: []byte("k"), Token: 1, Lease: 1, Ident: []byte(strings.Repeat("i", 255))})
	add("FuzzSnapEntriesIdent", "identity-255", e)
	add("FuzzSnapEntriesIdent", "version-1", repltest.FuzzEntries(8))

	add("FuzzSnapEntriesShared", "one", repltest.FuzzSharedEntries(1))
	add("FuzzSnapEntriesShared", "sixty-four", repltest.FuzzSharedEntries(64))
	e, _ = records.AppendSnapEntryVersion(nil, &records.SnapEntry{Key: []byte(strings.Repeat("z", records.MaxKey)), Token: 1<<64 - 1,
		Left: 1<<63 - 1, Lease: 255, Ident: []byte(strings.Repeat("i", 255)), Limit: 65535}, 3)
	add("FuzzSnapEntriesShared", "edges", e)
	add("FuzzSnapEntriesShared", "version-2", repltest.FuzzIdentEntries(8))
	v3 := repltest.FuzzSharedEntries(8)
	add("FuzzSnapEntriesShared", "truncated-limit", v3[:len(v3)-1])
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

// FuzzSnapEntriesIdent: arbitrary bytes read as snapshot entries in the
// format version 2 (with identities).
func FuzzSnapEntriesIdent(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		repltest.EntriesIdentRoundTrip(t, raw)
	})
}

// FuzzSnapEntriesShared: arbitrary bytes read as snapshot entries in the
// format version 3 (with identities and limits).
func FuzzSnapEntriesShared(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		repltest.EntriesVersionRoundTrip(t, raw, 3)
	})
}
