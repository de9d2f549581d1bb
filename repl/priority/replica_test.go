package priority

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
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
// through Batch frames ends with the same held keys and holders — tokens,
// identities, shared keys' limits — and sequences; and a standby (the
// real inbound side, standby.go) loaded from a snapshot of the first cut
// mid-stream — SnapBegin, SnapShard frames in the format version 3, one
// entry per holder, SnapEnd — then fed the batches after the dump, ends
// the same. The active's grants are made to identities in turn (and to
// none), as with --acl; every fourth key is shared (limit 3), with
// holders granted, renewed, released and expired one at a time.
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
			id := idents[i%len(idents)]
			switch d := active.Detail(keys[i]); {
			case i%4 == 0 && (len(d.Holders) == 0 || rng.IntN(2) == 0):
				active.AcquireShared(now, keys[i], 0, uint8(1+rng.IntN(3)), 1, 3, idents[rng.IntN(len(idents))], nil, &out)
			case i%4 == 0 && rng.IntN(3) == 0:
				active.Renew(now, keys[i], 5, d.Holders[rng.IntN(len(d.Holders))].Token, &out)
			case i%4 == 0:
				active.Release(now, keys[i], d.Holders[rng.IntN(len(d.Holders))].Token, &out)
			case tokens[i] == 0:
				if st, tok := active.AcquireAs(now, keys[i], 0, uint8(1+rng.IntN(3)), 1, id, nil, &out); st == shard.Granted {
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

	// The snapshot, cut now, in frames of at most 4 KiB raw per shard, as
	// the active's stream writes it (writeSnapshot).
	var snap []byte
	var raw []byte
	for i := range active.Shards() {
		var dumpErr error
		cut := active.Dump(i, func(h *shard.HeldLock) {
			raw, dumpErr = records.AppendSnapEntryVersion(raw, &records.SnapEntry{Key: h.Key, Token: h.Token,
				Left: time.Duration(h.Deadline - now), Lease: h.Lease, Ident: h.Ident, Limit: h.Limit}, recordsVersion)
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

	frames := func(s []byte, each func(typ msgType, p []byte)) {
		fr := newFrameReader(bytes.NewReader(s))
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatalf("frame: %v %v", typ, err)
			}
			each(typ, p)
		}
	}
	same := func(t *testing.T, tab *shard.Table) {
		want, got := repltest.Holders(active), repltest.Holders(tab)
		named := 0
		for _, hs := range want {
			for _, h := range hs {
				if h.Ident != "" {
					named++
				}
			}
		}
		if holders, multi := repltest.SharedCount(want); len(want) == 0 || named == 0 || holders == 0 || multi == 0 {
			t.Fatalf("the active holds %d keys, %d holders with an identity, %d holders of shared keys (%d keys with several): not a test of them",
				len(want), named, holders, multi)
		}
		if d := repltest.HoldersDiff(got, want); d != "" {
			t.Fatalf("replica: %s", d)
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
		var b batch
		var rr records.RecordReader
		var r shard.Record
		frames(stream, func(typ msgType, p []byte) {
			if typ != msgBatch || b.Decode(p) != nil {
				t.Fatalf("frame %v", typ)
			}
			data, err := b.Raw(nil)
			if err != nil {
				t.Fatal(err)
			}
			for rr.Reset(data); rr.Next(&r); {
				if _, err := replica.Apply(now, &r, &out); err != nil {
					t.Fatalf("Apply %+v: %v", r, err)
				}
			}
			if rr.Err() != nil {
				t.Fatal(rr.Err())
			}
		})
		same(t, replica)
	})
	t.Run("snapshot-then-stream", func(t *testing.T) {
		replica, err := shard.New(shard.Config{Shards: 16}, shard.NewTokens(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeFollower{from: 0, epoch: 1, standby: true}
		sb := &standby{table: replica, clock: func() int64 { return now }, log: repltest.Quiet(), names: []string{"a", "b"}, links: make([]*peer, 2), node: f}
		in := sb.from(0)
		payload := func(f []byte) []byte { return f[frameHead : len(f)-frameTail] }
		if err := in.snapBegin(payload((&snapBegin{ID: 1, Epoch: 1, Shards: 16}).Append(nil))); err != nil {
			t.Fatal(err)
		}
		frames(snap, func(typ msgType, p []byte) {
			if typ != msgSnapShard {
				t.Fatalf("frame %v", typ)
			}
			if err := in.snapShard(p); err != nil {
				t.Fatal(err)
			}
		})
		if err := in.snapEnd(payload((&snapEnd{ID: 1}).Append(nil))); err != nil || !f.insync {
			t.Fatalf("snapshot's end: %v, in sync %v", err, f.insync)
		}
		frames(stream, func(typ msgType, p []byte) { // records up to the cut are skipped, the rest applied
			if err := in.batch(p); err != nil || in.gap {
				t.Fatalf("batch: %v (gap %v)", err, in.gap)
			}
		})
		same(t, replica)
		if snapStream == len(stream) {
			t.Fatal("no records after the snapshot")
		}
	})
}

// fakeFollower is the node as a replica sees it, for white-box tests: it
// follows member 0 at epoch 1 until moved.
type fakeFollower struct {
	mu          sync.Mutex
	from        int
	epoch       uint64
	standby     bool
	insync      bool
	reservedMax uint64
}

func (f *fakeFollower) follows(from int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.standby && f.from == from
}

func (f *fakeFollower) apply(from int, epoch uint64, fn func() error) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.standby || f.from != from || f.epoch != epoch {
		return false, nil
	}
	return true, fn()
}

func (f *fakeFollower) recordReserved(limit uint64) error {
	f.reservedMax = max(f.reservedMax, limit) // under f.mu: called inside apply
	return nil
}

func (f *fakeFollower) desync(uint64) { f.insync = false }

func (f *fakeFollower) synced(from int, epoch uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standby && f.from == from && f.epoch == epoch {
		f.insync = true
	}
}

// TestReplicaAppliesOnlyTheCurrentActive: a snapshot
// is applied only while this member is a standby that follows its sender
// at the snapshot's epoch. One from another epoch is refused whole; once
// the member promotes (or follows another) mid-snapshot, the rest of it —
// entries, shard sequences, its end, the batches after it — never reaches
// the table, and the member is not counted in sync.
func TestReplicaAppliesOnlyTheCurrentActive(t *testing.T) {
	src, err := shard.New(shard.Config{Shards: 4}, shard.NewTokens(100, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	var out shard.Out
	for i := range 400 {
		if st, _ := src.Acquire(1, fmt.Appendf(nil, "k%d", i), 0, 60, 0, nil, &out); st != shard.Granted {
			t.Fatal(st)
		}
	}
	shardFrame := func(i int) []byte {
		var raw []byte
		seq := src.Dump(i, func(h *shard.HeldLock) {
			raw, _ = records.AppendSnapEntryVersion(raw, &records.SnapEntry{Key: h.Key, Token: h.Token, Left: time.Minute, Lease: h.Lease, Ident: h.Ident, Limit: h.Limit}, recordsVersion)
		})
		f := appendSnapShard(nil, uint32(i), seq, true, raw)
		return f[frameHead : len(f)-frameTail]
	}
	payload := func(f []byte) []byte { return f[frameHead : len(f)-frameTail] }
	begin := func(epoch uint64) []byte {
		return payload((&snapBegin{ID: 7, Epoch: epoch, Shards: 4, TokenLast: 500, Reserved: 600}).Append(nil))
	}
	end := payload((&snapEnd{ID: 7, TokenLast: 500, Reserved: 900}).Append(nil))
	newReplica := func() (*replica, *shard.Table, *fakeFollower) {
		tab, err := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeFollower{from: 0, epoch: 1, standby: true}
		s := &standby{table: tab, clock: func() int64 { return 2 }, log: repltest.Quiet(), names: []string{"a", "b"}, links: make([]*peer, 2), node: f}
		return s.from(0), tab, f
	}
	t.Run("whole", func(t *testing.T) {
		in, tab, f := newReplica()
		steps := [][]byte{begin(1), shardFrame(0), shardFrame(1), shardFrame(2), shardFrame(3)}
		if err := in.snapBegin(steps[0]); err != nil {
			t.Fatal(err)
		}
		for _, p := range steps[1:] {
			if err := in.snapShard(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := in.snapEnd(end); err != nil {
			t.Fatal(err)
		}
		if tab.Stats().Keys != 400 || !f.insync || f.reservedMax != 900 {
			t.Fatalf("%d keys, in sync %v, reservation %d", tab.Stats().Keys, f.insync, f.reservedMax)
		}
	})
	t.Run("another epoch", func(t *testing.T) {
		in, tab, f := newReplica()
		if err := in.snapBegin(begin(2)); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if err := in.snapShard(shardFrame(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := in.snapEnd(end); err != nil {
			t.Fatal(err)
		}
		if tab.Stats().Keys != 0 || f.insync {
			t.Fatalf("a snapshot of another epoch: %d keys applied, in sync %v", tab.Stats().Keys, f.insync)
		}
	})
	t.Run("promoted midway", func(t *testing.T) {
		in, tab, f := newReplica()
		if err := in.snapBegin(begin(1)); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := in.snapShard(shardFrame(i)); err != nil {
				t.Fatal(err)
			}
		}
		applied := tab.Stats().Keys
		f.mu.Lock()
		f.standby = false // promoted
		f.mu.Unlock()
		for i := 2; i < 4; i++ {
			if err := in.snapShard(shardFrame(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := in.snapEnd(end); err != nil {
			t.Fatal(err)
		}
		if err := in.batch(payload(appendBatch(nil, 1, nil))); err != nil {
			t.Fatal(err)
		}
		if got := tab.Stats().Keys; got != applied || applied == 0 || applied == 400 {
			t.Fatalf("%d keys after the promotion, %d before it (of 400)", got, applied)
		}
		for i := 2; i < 4; i++ {
			if tab.Seq(i) != 0 {
				t.Fatalf("shard %d's sequence rewritten to %d by a snapshot after the promotion", i, tab.Seq(i))
			}
		}
		if f.insync || f.reservedMax != 0 {
			t.Fatalf("in sync %v, reservation %d after the promotion", f.insync, f.reservedMax)
		}
	})
}

// TestReplicaMalformedBatch: the standby decodes, checks and applies a
// batch in one pass, so a malformed record stops it after the records
// before it. The batch is not acknowledged, the error closes the
// connection, and the member leaves sync and ignores the batches after it
// until a snapshot: a prefix it applied never counts as in sync.
func TestReplicaMalformedBatch(t *testing.T) {
	tab, err := shard.New(shard.Config{Shards: 1}, shard.NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeFollower{from: 0, epoch: 1, standby: true}
	s := &standby{table: tab, clock: func() int64 { return 2 }, log: repltest.Quiet(), names: []string{"a", "b"}, links: make([]*peer, 2), node: f}
	in := s.from(0)
	payload := func(f []byte) []byte { return f[frameHead : len(f)-frameTail] }
	begin := payload((&snapBegin{ID: 1, Epoch: 1, Shards: 1}).Append(nil))
	if err := in.snapBegin(begin); err != nil {
		t.Fatal(err)
	}
	if err := in.snapShard(payload(appendSnapShard(nil, 0, 0, true, nil))); err != nil {
		t.Fatal(err)
	}
	if err := in.snapEnd(payload((&snapEnd{ID: 1}).Append(nil))); err != nil {
		t.Fatal(err)
	}
	if !f.insync {
		t.Fatal("not in sync after the snapshot")
	}
	var w records.BatchWriter
	for i := range 3 {
		r := shard.Record{Kind: shard.RecordGrant, Seq: uint64(i + 1), Key: fmt.Appendf(nil, "k%d", i), Token: uint64(10 + i), Lease: 60}
		if err := w.Add(&r); err != nil {
			t.Fatal(err)
		}
	}
	good := len(w.Bytes())
	r := shard.Record{Kind: shard.RecordGrant, Seq: 4, Key: []byte("k3"), Token: 13, Lease: 60}
	if err := w.Add(&r); err != nil {
		t.Fatal(err)
	}
	raw := w.Bytes()[:good+5] // the fourth record cut short
	if err := in.batch(payload(appendBatch(nil, 1, raw))); err == nil {
		t.Fatal("a malformed batch applied without an error")
	}
	if f.insync {
		t.Fatal("still in sync after a malformed batch")
	}
	if got := tab.Stats().Keys; got != 3 {
		t.Fatalf("%d keys after the batch, want the 3 before the malformed record", got)
	}
	// The batches after it wait for the next snapshot.
	w.Reset()
	r = shard.Record{Kind: shard.RecordGrant, Seq: 4, Key: []byte("k9"), Token: 19, Lease: 60}
	if err := w.Add(&r); err != nil {
		t.Fatal(err)
	}
	if err := in.batch(payload(appendBatch(nil, 2, w.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if got := tab.Stats().Keys; got != 3 {
		t.Fatalf("%d keys: a batch after the malformed one was applied", got)
	}
}
