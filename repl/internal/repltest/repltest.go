package repltest

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/freeport"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// Quiet is a logger that discards everything.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Clock returns a monotonic test clock (ns since the call).
func Clock() func() int64 {
	start := time.Now()
	return func() int64 { return int64(time.Since(start)) }
}

// FreeAddrs returns n addresses 127.0.0.1:p such that p and p+offset
// were free (a member's client port and its member port), outside the
// ephemeral range and never handed out before in this process
// (internal/freeport).
func FreeAddrs(tb testing.TB, n, offset int) []string {
	tb.Helper()
	return freeport.Addrs(tb, n, offset)
}

// Workload drives a shard.Table with a mix like bench/'s and returns
// the n first records its Sink received (keys copied, Deadline cleared):
// acquire/release pairs on 16-byte keys "bench/key/000123" over 100,000
// keys, some held a while and renewed; contended handoffs on 16 hot keys
// (a queued acquire granted by the holder's release); and leases of 1 s
// left to expire under Tick. The clock advances 20 µs per operation (50k
// operations/s); tokens start at a wall-clock-like floor, as lockd's do.
func Workload(tb testing.TB, n int, seed uint64) []shard.Record {
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

// Batches cuts recs into raw batches of per records each.
func Batches(tb testing.TB, recs []shard.Record, per int) [][]byte {
	tb.Helper()
	var out [][]byte
	var w records.BatchWriter
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

// Rec is a record of the given fields.
func Rec(kind shard.RecordKind, sh uint32, seq uint64, key string, token uint64, lease uint8) shard.Record {
	return shard.Record{Kind: kind, Shard: sh, Seq: seq, Key: []byte(key), Token: token, Lease: lease}
}

// Within reports whether sub lies inside buf's memory.
func Within(sub, buf []byte) bool {
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

// Hex decodes s, spaces ignored.
func Hex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzRecords returns n records as a busy active makes them: grants,
// releases, renews and expiries of keys "bench/key/000123", tokens from a
// wall-clock floor, each shard's Seq counting up. Built directly (not by a
// table) so the seeds stay the same whatever the table does.
func FuzzRecords(n int) []shard.Record {
	recs := make([]shard.Record, n)
	seqs := map[uint32]uint64{}
	for i := range recs {
		sh := uint32(i*7) % 64
		seqs[sh]++
		kind := []shard.RecordKind{shard.RecordGrant, shard.RecordRelease, shard.RecordGrant, shard.RecordRenew, shard.RecordExpire}[i%5]
		var lease uint8
		if kind == shard.RecordGrant || kind == shard.RecordRenew {
			lease = 10
		}
		recs[i] = shard.Record{Kind: kind, Shard: sh, Seq: seqs[sh], Key: fmt.Appendf(nil, "bench/key/%06d", i*37%100000),
			Token: 1_750_000_000_000_000_000 + uint64(i), Lease: lease}
	}
	return recs
}

// FuzzBatch encodes recs as a batch.
func FuzzBatch(recs []shard.Record) []byte {
	var w records.BatchWriter
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			panic(err)
		}
	}
	return append([]byte(nil), w.Bytes()...)
}

// FuzzIdents are the identities FuzzIdentRecords and FuzzIdentEntries
// give their grants in turn ("": none).
var FuzzIdents = []string{"orders", "", "billing@example.com", "ops"}

// FuzzIdentRecords is FuzzRecords with its grants made to FuzzIdents in
// turn.
func FuzzIdentRecords(n int) []shard.Record {
	recs := FuzzRecords(n)
	for i := range recs {
		if recs[i].Kind == shard.RecordGrant {
			recs[i].Ident = []byte(FuzzIdents[i%len(FuzzIdents)])
		}
	}
	return recs
}

// FuzzIdentEntries returns n snapshot entries in the format version 2,
// made of FuzzIdentRecords' keys with FuzzIdents in turn.
func FuzzIdentEntries(n int) []byte {
	var raw []byte
	for i, r := range FuzzRecords(n) {
		var err error
		raw, err = records.AppendSnapEntryIdent(raw, &records.SnapEntry{Key: r.Key, Token: r.Token,
			Left: time.Duration(r.Seq) * 1e8, Lease: 30, Ident: []byte(FuzzIdents[i%len(FuzzIdents)])})
		if err != nil {
			panic(err)
		}
	}
	return raw
}

// FuzzSharedRecords is FuzzIdentRecords with every third grant a shared
// one (PROTOCOL.md §9.2), with limits 1, 4 and 65535 in turn.
func FuzzSharedRecords(n int) []shard.Record {
	recs := FuzzIdentRecords(n)
	for i := range recs {
		if recs[i].Kind == shard.RecordGrant && i%3 == 0 {
			recs[i].Limit = []uint16{1, 4, 65535}[i/3%3]
		}
	}
	return recs
}

// FuzzSharedEntries returns n snapshot entries in the format version 3,
// made of FuzzIdentEntries' holders, every other one a holder of a shared
// key (limits 1, 4 and 65535 in turn).
func FuzzSharedEntries(n int) []byte {
	var raw []byte
	for i, r := range FuzzRecords(n) {
		e := records.SnapEntry{Key: r.Key, Token: r.Token, Left: time.Duration(r.Seq) * 1e8, Lease: 30,
			Ident: []byte(FuzzIdents[i%len(FuzzIdents)])}
		if i%2 == 0 {
			e.Limit = []uint16{1, 4, 65535}[i/2%3]
		}
		var err error
		if raw, err = records.AppendSnapEntryVersion(raw, &e, 3); err != nil {
			panic(err)
		}
	}
	return raw
}

// FuzzEntries returns n snapshot entries made of FuzzRecords.
func FuzzEntries(n int) []byte {
	var raw []byte
	for _, r := range FuzzRecords(n) {
		var err error
		raw, err = records.AppendSnapEntry(raw, &records.SnapEntry{Key: r.Key, Token: r.Token, Left: time.Duration(r.Seq) * 1e8, Lease: 30})
		if err != nil {
			panic(err)
		}
	}
	return raw
}

// Seed is one file of the seed corpus.
type Seed struct {
	Target, Name string // the fuzz target and the file's name
	Args         []any  // its arguments: []byte or uint16
}

// Seeds is a seed corpus being built.
type Seeds []Seed

// Add adds the seed name of target with args.
func (s *Seeds) Add(target, name string, args ...any) {
	*s = append(*s, Seed{Target: target, Name: name, Args: args})
}

// fuzzFile is a seed as `go test` stores it.
func fuzzFile(s Seed) []byte {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range s.Args {
		switch a := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", a)
		case uint16:
			fmt.Fprintf(&b, "uint16(%d)\n", a)
		}
	}
	return []byte(b.String())
}

// writeCorpus is the flag of every test binary that checks a corpus.
var writeCorpus = flag.Bool("write-corpus", false, "rewrite the fuzz seed corpus under testdata/fuzz")

// CheckCorpus: the seed corpus under testdata/fuzz holds every seed as it
// is built now; with -write-corpus, it is rewritten instead.
func CheckCorpus(t *testing.T, seeds Seeds) {
	t.Helper()
	for _, s := range seeds {
		path := filepath.Join("testdata", "fuzz", s.Target, s.Name)
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

// RecordsRoundTrip reads raw as records: each re-encodes to the bytes it was
// read from, and reading stops at the end or at a documented error.
func RecordsRoundTrip(t *testing.T, raw []byte) {
	var rr records.RecordReader
	var r shard.Record
	var w records.BatchWriter
	for rr.Reset(raw); rr.Next(&r); {
		if r.Kind == shard.RecordSkip {
			if err := w.AddSkip(r.Shard, r.From, r.Seq); err != nil || len(r.Key) != 0 {
				t.Fatalf("decoded %+v, not encodable: %v", r, err)
			}
			continue
		}
		if !Within(r.Key, raw) || len(r.Ident) > 0 && !Within(r.Ident, raw) {
			t.Fatalf("key %q or identity %q not in the batch", r.Key, r.Ident)
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
	case records.ErrBadRecord, records.ErrBadKey, records.ErrTruncated, records.ErrBadVarint:
	default:
		t.Fatalf("RecordReader: %v", err)
	}
	if n, err := records.CheckRecords(raw); n != w.Count() || err != rr.Err() {
		t.Fatalf("CheckRecords: %d, %v; reader %d, %v", n, err, w.Count(), rr.Err())
	}
}

// EntriesRoundTrip does for snapshot entries (format version 1) what
// RecordsRoundTrip does for records.
func EntriesRoundTrip(t *testing.T, raw []byte) { EntriesVersionRoundTrip(t, raw, 1) }

// EntriesIdentRoundTrip is EntriesRoundTrip for the format version 2 (with
// identities).
func EntriesIdentRoundTrip(t *testing.T, raw []byte) { EntriesVersionRoundTrip(t, raw, 2) }

// EntriesVersionRoundTrip is EntriesRoundTrip for the format version v.
func EntriesVersionRoundTrip(t *testing.T, raw []byte, v int) {
	var sr records.SnapReader
	var e records.SnapEntry
	var out []byte
	add := func(dst []byte, e *records.SnapEntry) ([]byte, error) {
		return records.AppendSnapEntryVersion(dst, e, v)
	}
	for sr.ResetVersion(raw, v); sr.Next(&e); {
		if !Within(e.Key, raw) || len(e.Ident) > 0 && !Within(e.Ident, raw) {
			t.Fatalf("key %q or identity %q not in the data", e.Key, e.Ident)
		}
		var err error
		if out, err = add(out, &e); err != nil {
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
	case records.ErrBadEntry, records.ErrBadKey, records.ErrTruncated, records.ErrBadVarint:
	default:
		t.Fatalf("SnapReader: %v", err)
	}
}
