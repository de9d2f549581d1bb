package shard

import "testing"

// Counters count what happened, and handoff effects carry the time their
// acquire was queued.
func TestCountersAndQueuedTime(t *testing.T) {
	tb, err := New(Config{Shards: 4}, NewTokens(0, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	var out Out
	a, b := NewConn("a"), NewConn("b")
	k := []byte("k")
	now := int64(1e9)
	_, t1 := tb.Acquire(now, k, 0, 1, 1, a, &out) // grant
	tb.Acquire(now+5, k, 10, 1, 2, b, &out)       // queued at now+5
	tb.Acquire(now+6, k, 1, 1, 3, b, &out)        // queued, times out
	tb.Renew(now+7, k, 1, t1, &out)               // renew
	tb.Release(now+8, k, t1, &out)                // release + handoff to 2
	if len(out.Effects) != 1 || out.Effects[0].Owner != 2 || out.Effects[0].Queued != now+5 {
		t.Fatalf("handoff effect %+v", out.Effects)
	}
	out.Reset()
	tb.Tick(now+8+int64(1e9), &out) // waiter 3's wait (1 s from now+6) passed; lease of 2 (1 s from now+8) ends
	got := tb.Counters()
	want := Counters{Grants: 2, Handoffs: 1, Expiries: 1, Timeouts: 1, Releases: 1, Renews: 1}
	if got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}
}

// The Ls given to watches are counted by reason.
func TestCountersLost(t *testing.T) {
	tb, err := New(Config{Shards: 2}, NewTokens(0, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	var out Out
	k := []byte("k")
	orders, ops := tb.Ident([]byte("orders")), tb.Ident([]byte("ops"))
	_, t1 := tb.AcquireShared(0, k, 0, 1, 1, 2, orders, nil, &out)
	_, t2 := tb.AcquireShared(0, k, 0, 5, 2, 2, orders, nil, &out)
	for _, tok := range []uint64{t1, t1, t2} {
		if st := tb.Watch(0, k, tok, nil, &out); st != Watching {
			t.Fatalf("watch %d: %v", tok, st)
		}
	}
	tb.Tick(int64(1e9), &out)                                           // t1 expires: 2 Ls
	tb.ReleaseAs(int64(1e9), k, t2, Who{Ident: ops, Admin: true}, &out) // forced: 1 L
	want := [5]uint64{0, 0, 2, 1, 0}
	if got := tb.Counters().Lost; got != want {
		t.Fatalf("Lost %v, want %v", got, want)
	}
	if n := len(out.Effects); n != 3 {
		t.Fatalf("%d effects: %+v", n, out.Effects)
	}
}
