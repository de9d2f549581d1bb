//go:build !race

package shard

import (
	"fmt"
	"testing"
)

// TestZeroAllocs checks the steady-state hot paths allocate nothing: entries,
// key buffers, waiters and the Out arena are all reused.
func TestZeroAllocs(t *testing.T) {
	tab, err := New(Config{}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef")
	c := NewConn(nil)
	var out Out
	now := int64(0)
	// Hold a second key for the queue cases.
	hkey := []byte("held-key-0123456")
	_, htok := tab.Acquire(now, hkey, 0, 255, 0, nil, &out)
	orders, billing, ops := tab.Ident([]byte("orders")), tab.Ident([]byte("billing")), tab.Ident([]byte("ops"))
	// And a shared key (limit 4) with one holder.
	skey := []byte("shared-key-01234")
	_, stok := tab.AcquireShared(now, skey, 0, 255, 0, 4, NoIdent, nil, &out)

	tests := []struct {
		name string
		fn   func()
	}{
		{"acquire+release", func() {
			_, tok := tab.Acquire(now, key, 0, 10, 1, c, &out)
			tab.Release(now, key, tok, &out)
		}},
		{"acquire held wait=0", func() {
			tab.Acquire(now, hkey, 0, 10, 1, c, &out)
		}},
		{"renew", func() {
			now += 1000
			tab.Renew(now, hkey, 255, htok, &out)
		}},
		{"queue+handoff", func() {
			tab.Acquire(now, hkey, 5, 255, 2, c, &out)
			tab.Release(now, hkey, htok, &out)
			htok = out.Effects[0].Token
			out.Reset()
		}},
		{"tick with nothing due", func() {
			now += 10_000_000
			tab.Tick(now, &out)
		}},
		{"lookup+stats", func() {
			tab.Lookup(hkey)
			tab.Stats()
		}},
		// With identities (PROTOCOL.md §8.3): the grant records a handle.
		{"acquireAs+releaseAs own", func() {
			_, tok := tab.AcquireAs(now, key, 0, 10, 1, orders, c, &out)
			tab.ReleaseAs(now, key, tok, Who{Ident: orders}, &out)
		}},
		{"releaseAs refused, renewAs forced", func() {
			_, tok := tab.AcquireAs(now, key, 0, 10, 1, orders, c, &out)
			tab.ReleaseAs(now, key, tok, Who{Ident: billing}, &out)
			tab.RenewAs(now, key, 10, tok, Who{Ident: ops, Admin: true}, &out)
			tab.ReleaseAs(now, key, tok, Who{Ident: ops, Admin: true}, &out)
		}},
		{"queueAs+handoff", func() {
			tab.AcquireAs(now, hkey, 5, 255, 2, billing, c, &out)
			tab.Release(now, hkey, htok, &out)
			htok = out.Effects[0].Token
			out.Reset()
		}},
		{"ident lookups", func() {
			tab.Ident([]byte("orders"))
			tab.IdentName(orders)
		}},
		// PROTOCOL.md §9: shared holders, validate, inspect, watch.
		{"shared on a free key+release", func() {
			_, tok := tab.AcquireShared(now, key, 0, 10, 1, 4, NoIdent, c, &out)
			tab.Release(now, key, tok, &out)
		}},
		{"shared second holder+release", func() {
			_, tok := tab.AcquireShared(now, skey, 0, 10, 1, 4, orders, c, &out)
			tab.ReleaseAs(now, skey, tok, Who{Ident: orders}, &out)
		}},
		{"shared renew", func() {
			now += 1000
			tab.Renew(now, skey, 255, stok, &out)
		}},
		{"shared queue+handoff of two", func() {
			_, t1 := tab.AcquireShared(now, key, 0, 10, 1, 2, NoIdent, c, &out)
			_, t2 := tab.AcquireShared(now, key, 0, 10, 2, 2, NoIdent, c, &out)
			tab.AcquireShared(now, key, 5, 10, 3, 2, NoIdent, c, &out)
			tab.AcquireShared(now, key, 5, 10, 4, 2, NoIdent, c, &out)
			tab.Release(now, key, t1, &out)
			tab.Release(now, key, t2, &out)
			t3, t4 := out.Effects[0].Token, out.Effects[1].Token
			out.Reset()
			tab.Release(now, key, t3, &out)
			tab.Release(now, key, t4, &out)
		}},
		{"mismatch", func() {
			tab.AcquireShared(now, skey, 5, 10, 1, 3, NoIdent, c, &out)
		}},
		{"validate+inspect", func() {
			tab.Validate(now, hkey, htok, &out)
			tab.Validate(now, skey, stok, &out)
			tab.Inspect(now, skey, &out)
			tab.Inspect(now, key, &out)
		}},
		{"watch+release", func() {
			_, tok := tab.AcquireShared(now, skey, 0, 10, 1, 4, NoIdent, c, &out)
			tab.Watch(now, skey, tok, c, &out)
			tab.Watch(now, skey, tok, c, &out)
			tab.Release(now, skey, tok, &out)
			out.Reset()
		}},
		{"watch+endwatches", func() {
			tab.Watch(now, skey, stok, c, &out)
			tab.EndWatches(&out)
			out.Reset()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn() // warm up pools and the arena
			if n := testing.AllocsPerRun(1000, tc.fn); n != 0 {
				t.Fatalf("%v allocs per run", n)
			}
		})
	}
}

// TestApplyIdentAllocs: a replica applying grants that name an identity
// interns nothing new after the first (a map lookup under the registry's
// mutex) and allocates nothing, and the source's sink gets the name
// without an allocation.
func TestApplyIdentAllocs(t *testing.T) {
	var last Record
	src, err := New(Config{Sink: func(r Record) { last = r }}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := New(Config{}, NewTokens(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	key, id := []byte("0123456789abcdef"), src.Ident([]byte("orders"))
	var out Out
	fn := func() {
		_, tok := src.AcquireAs(0, key, 0, 10, 1, id, nil, &out)
		grant := last
		src.Release(0, key, tok, &out)
		rel := last
		if _, err := dst.Apply(0, &grant, &out); err != nil {
			t.Fatal(err)
		}
		if _, err := dst.Apply(0, &rel, &out); err != nil {
			t.Fatal(err)
		}
	}
	fn()
	if string(last.Ident) != "" || dst.Lookup(key).Held {
		t.Fatalf("release record %+v", last)
	}
	if n := testing.AllocsPerRun(1000, fn); n != 0 {
		t.Fatalf("%v allocs per grant and release applied", n)
	}
}

// TestSinkRefAllocs: handing a change to a SinkRef allocates nothing.
func TestSinkRefAllocs(t *testing.T) {
	n := 0
	tab, err := New(Config{SinkRef: func(r *Record) { n += len(r.Key) }}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key/%02d", i)
	}
	var out Out
	i := 0
	fn := func() {
		k := keys[i%len(keys)]
		i++
		_, tok := tab.Acquire(0, k, 0, 10, 1, nil, &out)
		tab.Release(0, k, tok, &out)
		out.Reset()
	}
	fn()
	if a := testing.AllocsPerRun(1000, fn); a != 0 {
		t.Fatalf("%v allocs per acquire and release with a SinkRef", a)
	}
	if n == 0 {
		t.Fatal("the SinkRef saw no record")
	}
}
