package priority

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// TestBatchFrames: real batches of every size travel as Batch frames
// (split at every tenth byte) and come back record for record.
func TestBatchFrames(t *testing.T) {
	recs := repltest.Workload(t, 4000, 4)
	for _, per := range []int{1, 8, 64, 512, 2000} {
		t.Run(strconv.Itoa(per), func(t *testing.T) {
			batches := repltest.Batches(t, recs, per)
			var stream []byte
			codecs := map[records.Codec]int{}
			for i, raw := range batches {
				stream = appendBatch(stream, uint64(i+1), raw)
			}
			var chunks [][]byte
			for i := 0; i < len(stream); i += 10 {
				chunks = append(chunks, stream[i:min(i+10, len(stream))])
			}
			fr := newFrameReader(&wireChunks{chunks: chunks})
			var b batch
			var rr records.RecordReader
			var r shard.Record
			var scratch []byte
			next := 0
			for i := range batches {
				typ, p, err := fr.Next()
				if err != nil || typ != msgBatch {
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
				if b.Codec == records.CodecS2 {
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
			if per >= 64 && codecs[records.CodecRaw] > 1 || per == 1 && codecs[records.CodecS2] > 0 {
				t.Fatalf("codecs %v", codecs)
			}
		})
	}
}

// TestReplicaFollows: a table applying the records another table streams
// through Batch frames ends with the same held keys, tokens, identities
// and sequences; and a third table loaded from SnapShard frames of the
// first, then fed the records after the dump, ends the same. The active's
// grants are made to identities in turn (and to none), as with --acl.
func TestReplicaFollows(t *testing.T) {
	var w records.BatchWriter
	var stream []byte
	seq := uint64(0)
	flush := func() {
		if w.Count() > 0 {
			seq++
			stream = appendBatch(stream, seq, w.Bytes())
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
	idents := []shard.Ident{shard.NoIdent, active.Ident([]byte("orders")), active.Ident([]byte("billing@x"))}
	now := int64(0)
	play := func(steps int) {
		for range steps {
			now += 1e6
			out.Reset()
			i := rng.IntN(len(keys))
			switch {
			case tokens[i] == 0:
				if st, tok := active.AcquireAs(now, keys[i], 0, uint8(1+rng.IntN(3)), 1, idents[i%len(idents)], nil, &out); st == shard.Granted {
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
		cut := active.Dump(i, func(h *shard.HeldLock) {
			raw, dumpErr = records.AppendSnapEntryIdent(raw, &records.SnapEntry{Key: h.Key, Token: h.Token,
				Left: time.Duration(h.Deadline - now), Lease: h.Lease, Ident: h.Ident})
			if len(raw) >= 4<<10 && dumpErr == nil {
				snap = appendSnapShard(snap, uint32(i), 0, false, raw)
				raw = raw[:0]
			}
		})
		if dumpErr != nil {
			t.Fatal(dumpErr)
		}
		snap = appendSnapShard(snap, uint32(i), cut, true, raw)
		raw = raw[:0]
	}
	snapStream := len(stream)
	play(20000)

	follow := func(t *testing.T, tab *shard.Table, s []byte) {
		fr := newFrameReader(bytes.NewReader(s))
		var b batch
		var rr records.RecordReader
		var r shard.Record
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				return
			}
			if err != nil || typ != msgBatch || b.Decode(p) != nil {
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
	held := func(tab *shard.Table) map[string]string {
		m := map[string]string{}
		for i := range tab.Shards() {
			tab.Dump(i, func(h *shard.HeldLock) { m[string(h.Key)] = fmt.Sprint(h.Token, " ", string(h.Ident)) })
		}
		return m
	}
	same := func(t *testing.T, tab *shard.Table) {
		want, got := held(active), held(tab)
		named := 0
		for _, v := range want {
			if !strings.HasSuffix(v, " ") {
				named++
			}
		}
		if len(want) == 0 || named == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("replica holds %d keys, active %d (%d with an identity; equal %v)", len(got), len(want), named, reflect.DeepEqual(got, want))
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
		fr := newFrameReader(bytes.NewReader(snap))
		var s snapShard
		var sr records.SnapReader
		var e records.SnapEntry
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				break
			}
			if err != nil || typ != msgSnapShard || s.Decode(p) != nil {
				t.Fatalf("frame: %v %v", typ, err)
			}
			data, err := s.Raw(nil)
			if err != nil {
				t.Fatal(err)
			}
			for sr.ResetIdent(data); sr.Next(&e); {
				if err := replica.RestoreAs(e.Key, e.Token, now+int64(e.Left), e.Ident); err != nil {
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
