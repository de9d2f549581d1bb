package shard

import (
	"fmt"
	"math/rand/v2"
	"runtime"
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

// TestConcurrentShared runs workers on semaphores (acquire shared, limit
// 3) and a read/write lock (readers shared with limit 65535, writers
// exclusive) at once, each watching its own grants, with a ticker and a
// dropper whose connections queue and watch, then close (run it with
// -race). It checks that no semaphore ever has more than 3 holders and
// that no reader overlaps a writer, that every watch of a released grant
// gets exactly one L, with reason released, that tokens only grow, that
// each key's records form a valid history (never more holders than the
// limit), and that the table ends empty with no watch left.
func TestConcurrentShared(t *testing.T) {
	const workers, iters, limit = 6, 2000, 3
	var (
		clock atomic.Int64
		recMu sync.Mutex
		recs  = map[string][]Record{}

		handoffs, lost, timeouts atomic.Int64
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
	sems := []string{"sem0", "sem1"}
	var semHeld [2]atomic.Int32
	var readers, writers atomic.Int32
	tokens := make([][]uint64, workers)
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
	bg.Go(func() { // dropper: queues and watches, then its connection closes
		var out Out
		var old []mailbox
		// A grant made before DropConn may be delivered after it: the
		// closed connections' mailboxes are read again and again, and
		// their grants given back.
		reap := func() {
			for _, mb := range old {
				for len(mb) > 0 {
					if e := <-mb; e.Kind == EffectGrant {
						tab.Release(clock.Load(), e.Key, e.Token, &out)
						deliver(&out)
					}
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
			mb := make(mailbox, 256)
			c := NewConn(mb)
			for j, key := range []string{sems[i%2], "rw"} {
				var st Status
				var tok uint64
				if j == 1 && i%3 == 0 {
					st, tok = tab.Acquire(clock.Load(), []byte(key), 1, 255, uint64(j), c, &out)
				} else {
					lim := uint16(limit)
					if key == "rw" {
						lim = 65535
					}
					st, tok = tab.AcquireShared(clock.Load(), []byte(key), 1, 255, uint64(j), lim, NoIdent, c, &out)
				}
				if st == Granted {
					tab.Watch(clock.Load(), []byte(key), tok, c, &out)
					tab.Release(clock.Load(), []byte(key), tok, &out)
				}
				deliver(&out)
			}
			time.Sleep(100 * time.Microsecond)
			tab.DropConn(c)
			if !c.empty() {
				t.Errorf("dropped conn still has %d waiters, %d watches", c.Waiters(), c.Watches())
			}
			old = append(old, mb)
			reap()
		}
	})
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			mb := make(mailbox, 256)
			c := NewConn(mb)
			var out Out
			watched := map[uint64]int{} // token → Ls expected
			take := func(e Effect) {
				if e.Kind != EffectLost {
					t.Errorf("worker %d: unexpected %v effect %+v", w, e.Kind, e)
					return
				}
				if e.Reason != ReasonReleased || watched[e.Token] == 0 {
					t.Errorf("worker %d: L %+v (watches left %d)", w, e, watched[e.Token])
				}
				watched[e.Token]--
				lost.Add(1)
			}
			for i := range iters {
				key, excl := sems[rng.IntN(2)], false
				lim := uint16(limit)
				if rng.IntN(3) == 0 {
					key, lim, excl = "rw", 65535, rng.IntN(4) == 0
				}
				wait := uint8(rng.IntN(2))
				var st Status
				var tok uint64
				if excl {
					st, tok = tab.Acquire(clock.Load(), []byte(key), wait, 255, uint64(i), c, &out)
				} else {
					st, tok = tab.AcquireShared(clock.Load(), []byte(key), wait, 255, uint64(i), lim, NoIdent, c, &out)
				}
				deliver(&out)
				if st == Mismatch {
					t.Errorf("worker %d: mismatch on %s", w, key)
					return
				}
				if st == Queued {
					for {
						e := <-mb
						if e.Kind == EffectLost {
							take(e)
							continue
						}
						if e.Owner != uint64(i) || string(e.Key) != key {
							t.Errorf("worker %d got %+v for owner %d key %s", w, e, i, key)
							return
						}
						st, tok = Granted, e.Token
						if e.Kind != EffectGrant {
							st = TimedOut
						}
						break
					}
					if st == Granted {
						handoffs.Add(1)
					} else {
						timeouts.Add(1)
					}
				}
				if st != Granted {
					continue
				}
				tokens[w] = append(tokens[w], tok)
				n := 1 + rng.IntN(2)
				for range n {
					if tab.Watch(clock.Load(), []byte(key), tok, c, &out) != Watching {
						t.Errorf("worker %d: watch of its own grant %d failed", w, tok)
					}
				}
				watched[tok] += n
				runtime.Gosched() // hold it a while: others queue
				switch {
				case key == "rw" && excl:
					if writers.Add(1) != 1 || readers.Load() != 0 {
						t.Errorf("writer with %d writers, %d readers", writers.Load(), readers.Load())
					}
					writers.Add(-1)
				case key == "rw":
					readers.Add(1)
					if writers.Load() != 0 {
						t.Errorf("reader while a writer holds")
					}
					readers.Add(-1)
				default:
					si := int(key[3] - '0')
					if h := semHeld[si].Add(1); h > limit {
						t.Errorf("%s: %d holders", key, h)
					}
					if _, ok := tab.Validate(clock.Load(), []byte(key), tok, &out); !ok {
						t.Errorf("%s: own token %d not valid", key, tok)
					}
					semHeld[si].Add(-1)
				}
				if !tab.Release(clock.Load(), []byte(key), tok, &out) {
					t.Errorf("release of %s token %d failed", key, tok)
				}
				deliver(&out)
				for len(mb) > 0 { // the Ls of that release (nothing else is owed now)
					take(<-mb)
				}
			}
			for tok, n := range watched {
				if n != 0 {
					t.Errorf("worker %d: %d Ls missing for token %d", w, n, tok)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()

	var out Out
	tab.Tick(clock.Load()+1000*second, &out)
	if st := tab.Stats(); st != (Stats{}) {
		t.Errorf("stats at the end: %+v", st)
	}
	for w, toks := range tokens {
		for i := 1; i < len(toks); i++ {
			if toks[i] <= toks[i-1] {
				t.Fatalf("worker %d: token %d after %d", w, toks[i], toks[i-1])
			}
		}
	}
	for key, rs := range recs {
		holders := map[uint64]bool{}
		var last uint64
		for _, r := range rs {
			switch r.Kind {
			case RecordGrant:
				lim := int(r.Limit)
				if lim == 0 {
					lim = 1
				}
				if r.Token <= last || holders[r.Token] || len(holders) >= lim {
					t.Fatalf("key %s: grant %d (limit %d) with holders %v (last %d)", key, r.Token, r.Limit, holders, last)
				}
				holders[r.Token], last = true, r.Token
			case RecordRenew, RecordRelease, RecordExpire:
				if !holders[r.Token] {
					t.Fatalf("key %s: %v of %d, holders %v", key, r.Kind, r.Token, holders)
				}
				if r.Kind != RecordRenew {
					delete(holders, r.Token)
				}
			}
		}
		if len(holders) != 0 {
			t.Fatalf("key %s still held by %v in the records", key, holders)
		}
	}
	if handoffs.Load() == 0 || lost.Load() == 0 {
		t.Fatalf("only %d handoffs, %d Ls", handoffs.Load(), lost.Load())
	}
	t.Logf("%d handoffs, %d timeouts, %d Ls", handoffs.Load(), timeouts.Load(), lost.Load())
}
