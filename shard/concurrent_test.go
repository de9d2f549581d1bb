package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mailbox is a test connection's inbox: effects are copied into it by
// whoever produced them, after the table call returned (as the engine does).
type mailbox chan Effect

func deliver(out *Out) {
	for _, e := range out.Effects {
		e.Key = slices.Clone(e.Key)
		e.Conn.Tag.(mailbox) <- e
	}
	out.Reset()
}

// TestConcurrent runs workers that acquire (immediately or queued), renew and
// release shared and private keys, a ticker that advances a shared fake
// clock, and a dropper that queues on shared keys and drops its connections,
// all at once (run it with -race). It checks mutual exclusion, that every
// goroutine sees strictly increasing tokens and no token is issued twice,
// that each key's records form a valid history with increasing grant tokens,
// and that the table ends empty.
func TestConcurrent(t *testing.T) {
	const workers, iters = 6, 3000
	var (
		clock atomic.Int64
		recMu sync.Mutex
		recs  = map[string][]Record{}

		handoffs, drops atomic.Int64
	)
	tab, err := New(Config{Shards: 8, Sink: func(r Record) {
		r.Key = slices.Clone(r.Key)
		recMu.Lock()
		recs[string(r.Key)] = append(recs[string(r.Key)], r)
		recMu.Unlock()
	}}, NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	shared := []string{"s0", "s1", "s2", "s3"}
	var held [4]atomic.Int32
	sharedIdx := map[string]int{"s0": 0, "s1": 1, "s2": 2, "s3": 3}
	tokens := make([][]uint64, workers+1)
	stop := make(chan struct{})
	var wg, bg sync.WaitGroup

	bg.Go(func() { // ticker
		var out Out
		for {
			select {
			case <-stop:
				return
			default:
			}
			tab.Tick(clock.Add(int64(time.Millisecond)), &out)
			deliver(&out)
			time.Sleep(50 * time.Microsecond)
		}
	})
	bg.Go(func() { // dropper
		var out Out
		var old []mailbox
		reap := func() {
			for _, mb := range old {
				for {
					select {
					case e := <-mb:
						if e.Kind == EffectGrant { // undeliverable: give it back
							tab.Release(clock.Load(), e.Key, e.Token, &out)
							deliver(&out)
						}
						continue
					default:
					}
					break
				}
			}
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				reap()
				return
			default:
			}
			c := NewConn(make(mailbox, 64))
			for j := range 3 {
				key := []byte(shared[(i+j)%4])
				if st, tok := tab.Acquire(clock.Load(), key, 1, 255, uint64(j), c, &out); st == Granted {
					tab.Release(clock.Load(), key, tok, &out)
				}
				deliver(&out)
			}
			time.Sleep(100 * time.Microsecond)
			tab.DropConn(c)
			drops.Add(1)
			if n := c.Waiters(); n != 0 {
				t.Errorf("dropped conn still has %d waiters", n)
			}
			old = append(old, c.Tag.(mailbox))
			reap()
		}
	})
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			mb := make(mailbox, 64)
			c := NewConn(mb)
			var out Out
			private := fmt.Sprintf("p%d", w)
			for i := range iters {
				key := private
				if rng.IntN(3) > 0 {
					key = shared[rng.IntN(len(shared))]
				}
				wait := uint8(rng.IntN(2))
				st, tok := tab.Acquire(clock.Load(), []byte(key), wait, 255, uint64(i), c, &out)
				deliver(&out)
				if st == Queued {
					e := <-mb
					if e.Owner != uint64(i) || string(e.Key) != key {
						t.Errorf("worker %d got %+v for owner %d key %s", w, e, i, key)
						return
					}
					if e.Kind != EffectGrant {
						continue
					}
					st, tok = Granted, e.Token
					handoffs.Add(1)
				}
				if st != Granted {
					continue
				}
				tokens[w] = append(tokens[w], tok)
				if si, ok := sharedIdx[key]; ok {
					if !held[si].CompareAndSwap(0, 1) {
						t.Errorf("key %s granted twice", key)
					}
					if rng.IntN(2) == 0 && !tab.Renew(clock.Load(), []byte(key), 255, tok, &out) {
						t.Errorf("renew of %s token %d failed", key, tok)
					}
					held[si].Store(0)
				}
				if !tab.Release(clock.Load(), []byte(key), tok, &out) {
					t.Errorf("release of %s token %d failed", key, tok)
				}
				deliver(&out)
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()

	// Flush every remaining waiter (the dropper's grants were given back).
	var out Out
	tab.Tick(clock.Load()+1000*second, &out)
	if st := tab.Stats(); st != (Stats{}) {
		t.Errorf("stats at the end: %+v", st)
	}
	seen := map[uint64]bool{}
	for w, toks := range tokens {
		for i, tk := range toks {
			if seen[tk] {
				t.Fatalf("token %d granted twice", tk)
			}
			seen[tk] = true
			if i > 0 && tk <= toks[i-1] {
				t.Fatalf("worker %d: token %d after %d", w, tk, toks[i-1])
			}
		}
	}
	for key, rs := range recs {
		var last uint64
		holder := uint64(0)
		for _, r := range rs {
			switch r.Kind {
			case RecordGrant:
				if holder != 0 || r.Token <= last {
					t.Fatalf("key %s: grant %d while held by %d (last %d)", key, r.Token, holder, last)
				}
				holder, last = r.Token, r.Token
			case RecordRenew, RecordRelease, RecordExpire:
				if r.Token != holder {
					t.Fatalf("key %s: %v of %d while held by %d", key, r.Kind, r.Token, holder)
				}
				if r.Kind != RecordRenew {
					holder = 0
				}
			}
		}
		if holder != 0 {
			t.Fatalf("key %s still held by %d in the records", key, holder)
		}
	}
	if len(seen) < workers*iters/4 || handoffs.Load() == 0 || drops.Load() == 0 {
		t.Fatalf("only %d grants, %d handoffs, %d drops", len(seen), handoffs.Load(), drops.Load())
	}
	t.Logf("%d grants, %d handoffs, %d drops", len(seen), handoffs.Load(), drops.Load())
}

// TestDropConnRace races DropConn against handoffs and timeouts of the same
// waiters: whatever wins, the counters and the Conn's list end consistent.
func TestDropConnRace(t *testing.T) {
	tab, err := New(Config{Shards: 4}, NewTokens(0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 200 {
		var out Out
		now := int64(round) * 100 * second
		keys := [][]byte{[]byte("a"), []byte("b"), []byte("c")}
		toks := make([]uint64, len(keys))
		for i, k := range keys {
			_, toks[i] = tab.Acquire(now, k, 0, 10, 0, nil, &out)
		}
		c := NewConn(nil)
		for i := range 30 {
			tab.Acquire(now, keys[i%3], uint8(1+i%2), 10, uint64(i), c, &out)
		}
		var wg sync.WaitGroup
		wg.Go(func() { tab.DropConn(c) })
		wg.Go(func() {
			var out Out
			for i, k := range keys { // hand off to c's waiters meanwhile
				tab.Release(now, k, toks[i], &out)
			}
			tab.Tick(now+1*second, &out) // and time some out
			for _, e := range out.Effects {
				if e.Kind == EffectGrant {
					tab.Release(now+1*second, e.Key, e.Token, &out)
				}
			}
		})
		wg.Wait()
		if n := c.Waiters(); n != 0 {
			t.Fatalf("round %d: %d waiters left on the conn", round, n)
		}
		tab.Tick(now+50*second, &out)
		if st := tab.Stats(); st != (Stats{}) {
			t.Fatalf("round %d: stats %+v", round, st)
		}
	}
}
