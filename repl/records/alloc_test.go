//go:build !race

package records_test

import (
	"testing"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// TestRecordAllocs: adding records to a grown BatchWriter, reading them
// back, and the same for snapshot entries, allocate nothing.
func TestRecordAllocs(t *testing.T) {
	recs := repltest.Workload(t, 512, 11)
	var w records.BatchWriter
	add := func() {
		w.Reset()
		for i := range recs {
			if err := w.Add(&recs[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	add() // grows the buffer
	if n := testing.AllocsPerRun(20, add); n != 0 {
		t.Errorf("BatchWriter.Add: %v allocs per batch", n)
	}
	raw := w.Bytes()
	var rr records.RecordReader
	var r shard.Record
	if n := testing.AllocsPerRun(20, func() {
		for rr.Reset(raw); rr.Next(&r); {
		}
		if _, err := records.CheckRecords(raw); err != nil || rr.Err() != nil {
			t.Fatal(err, rr.Err())
		}
	}); n != 0 {
		t.Errorf("RecordReader: %v allocs per batch", n)
	}

	snap := make([]byte, 0, 64<<10)
	var e records.SnapEntry
	var sr records.SnapReader
	if n := testing.AllocsPerRun(20, func() {
		snap = snap[:0]
		for i := range recs {
			var err error
			snap, err = records.AppendSnapEntry(snap, &records.SnapEntry{Key: recs[i].Key, Token: recs[i].Token, Left: 5e9, Lease: 10})
			if err != nil {
				t.Fatal(err)
			}
		}
		for sr.Reset(snap); sr.Next(&e); {
		}
		if sr.Err() != nil {
			t.Fatal(sr.Err())
		}
	}); n != 0 {
		t.Errorf("snapshot entries: %v allocs per batch", n)
	}
}

// TestSharedAllocs: shared grants in a batch and snapshot entries of format
// version 3 are written into grown buffers and read back without
// allocating.
func TestSharedAllocs(t *testing.T) {
	recs := repltest.FuzzSharedRecords(256)
	var w records.BatchWriter
	var rr records.RecordReader
	var r shard.Record
	run := func() {
		w.Reset()
		for i := range recs {
			if err := w.Add(&recs[i]); err != nil {
				t.Fatal(err)
			}
		}
		for rr.Reset(w.Bytes()); rr.Next(&r); {
		}
		if rr.Err() != nil {
			t.Fatal(rr.Err())
		}
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Errorf("shared records: %v allocs per batch", n)
	}
	snap := make([]byte, 0, 64<<10)
	var e records.SnapEntry
	var sr records.SnapReader
	if n := testing.AllocsPerRun(20, func() {
		snap = snap[:0]
		for i := range recs {
			var err error
			snap, err = records.AppendSnapEntryVersion(snap, &records.SnapEntry{Key: recs[i].Key, Token: recs[i].Token, Left: 5e9,
				Lease: 10, Ident: recs[i].Ident, Limit: recs[i].Limit}, records.Version)
			if err != nil {
				t.Fatal(err)
			}
		}
		for sr.ResetVersion(snap, records.Version); sr.Next(&e); {
		}
		if sr.Err() != nil {
			t.Fatal(sr.Err())
		}
	}); n != 0 {
		t.Errorf("snapshot entries version 3: %v allocs per batch", n)
	}
}
