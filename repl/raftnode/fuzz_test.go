package raftnode

import (
	"bytes"
	"errors"
	"testing"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// fuzzSeeds are the seed corpora of the raft log entry and snapshot
// decoders: entries of every kind and version (shared grants included),
// snapshots of every version, and broken ones.
func fuzzSeeds(t *testing.T) repltest.Seeds {
	var seeds repltest.Seeds
	add := seeds.Add
	shared := repltest.FuzzBatch(repltest.FuzzSharedRecords(48))
	rec := appendRecordsEntry(nil, 2, 7, 5e18, 1, 48, 48, shared)
	add("FuzzLogEntry", "records-shared", rec)
	add("FuzzLogEntry", "records-s2", appendRecordsEntry(nil, 1, 3, 5e18, 1, 300, 300, repltest.FuzzBatch(repltest.FuzzSharedRecords(300))))
	add("FuzzLogEntry", "reserve", appendReserveEntry(nil, 6, 3, 1<<40))
	old := bytes.Clone(rec)
	old[1] = 2 // written before versions: the proposer alone
	add("FuzzLogEntry", "records-before-versions", old)
	newer := bytes.Clone(rec)
	newer[1] = 0x42
	add("FuzzLogEntry", "records-version-4", newer)
	add("FuzzLogEntry", "unknown-kind", append([]byte{9}, rec[1:]...))
	add("FuzzLogEntry", "short", rec[:entryHeader-1])

	_, src := sharedRecords(t, 400)
	var b bytes.Buffer
	if _, err := writeSnapshot(&b, src, 1<<35, 42, 4e9, 1.7e18); err != nil {
		t.Fatal(err)
	}
	add("FuzzSnapshot", "version-3-shared", b.Bytes())
	ex, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(1000, 1<<30))
	var out shard.Out
	for i := range 20 {
		ex.AcquireAs(0, []byte{'k', byte(i)}, 0, 30, 0, ex.Ident([]byte(testIdents[i%len(testIdents)])), nil, &out)
	}
	add("FuzzSnapshot", "version-2", writeSnapshotV2(ex, 1<<20, 9, 1e9, 1.7e18))
	add("FuzzSnapshot", "version-1", writeSnapshotV1(ex, 1<<20, 9, 1e9, 1.7e18))
	v4 := bytes.Clone(b.Bytes())
	v4[6] = '4'
	add("FuzzSnapshot", "version-4", v4)
	add("FuzzSnapshot", "cut", b.Bytes()[:len(b.Bytes())/2])
	return seeds
}

// TestRaftFuzzCorpus: the seed corpus under testdata/fuzz holds every seed
// above as it is built now (go test -run TestRaftFuzzCorpus -write-corpus
// rewrites it).
func TestRaftFuzzCorpus(t *testing.T) { repltest.CheckCorpus(t, fuzzSeeds(t)) }

// FuzzLogEntry: any bytes decode as a raft log entry or fail with
// errBadLogEntry or errEntryVersion (a newer version is refused before
// anything else of it is read); what decodes has a known kind, a version
// this member reads, a proposer below 16, and records that read as
// records do (stopping, if at all, at an error the reader documents). A
// reserve entry re-encodes to its bytes (but the stamp, which it does not
// carry) when written at this version.
func FuzzLogEntry(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var e logEntry
		var buf []byte
		err := decodeLogEntry(data, &e, &buf)
		switch {
		case errors.Is(err, errEntryVersion):
			if len(data) < 2 || int(data[1]>>4) <= entryFormat {
				t.Fatalf("refused as a newer version: %x", data)
			}
			return
		case err != nil:
			if !errors.Is(err, errBadLogEntry) {
				t.Fatalf("decode: %v", err)
			}
			return
		}
		if int(data[1]>>4) > entryFormat || e.proposer > 15 {
			t.Fatalf("decoded %+v from %x", e, data)
		}
		switch e.kind {
		case entryReserve:
			if data[1]>>4 == entryFormat {
				// The stamp of a reserve entry is written 0 and not read.
				want := bytes.Clone(data)
				clear(want[10:entryHeader])
				if again := appendReserveEntry(nil, e.proposer, e.term, e.limit); !bytes.Equal(again, want) {
					t.Fatalf("reserve entry %+v re-encodes to %x, read from %x", e, again, data)
				}
			}
		case entryRecords:
			repltest.RecordsRoundTrip(t, e.raw)
		default:
			t.Fatalf("decoded kind %d", e.kind)
		}
	})
}

// FuzzSnapshot: any bytes read as a raft snapshot into an empty table or
// fail with errBadLogEntry, errEntryVersion (nothing restored then) or a
// table's refusal; what reads is a snapshot of a version this member
// reads.
func FuzzSnapshot(f *testing.F) {
	saved := maxSnapShard
	maxSnapShard = 1 << 20 // no gigabyte shards from a few bytes
	f.Cleanup(func() { maxSnapShard = saved })
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		_, err = readSnapshot(bytes.NewReader(data), tab, 1.7e18)
		switch {
		case err == nil:
			if v := snapVersion(data[:len(snapMagic)]); v < 1 || v > entryFormat {
				t.Fatalf("read a snapshot of version %d", v)
			}
		case errors.Is(err, errEntryVersion):
			if tab.Stats().Keys != 0 {
				t.Fatalf("%d keys restored from a snapshot refused as newer", tab.Stats().Keys)
			}
		case errors.Is(err, errBadLogEntry), errors.Is(err, shard.ErrFull):
		default:
			t.Fatalf("readSnapshot: %v", err)
		}
	})
}
