package shard

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// budgetTable returns a table of shards shards with cfg's bounds (0: the
// defaults) and a token range that never runs out.
func budgetTable(t *testing.T, shards int, cfg Config) *Table {
	t.Helper()
	cfg.Shards = shards
	cfg.MaxWaitersPerKey = 1 << 20
	tab, err := New(cfg, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// keyIn returns a key of shard i of tab that it did not return before
// (next holds where each shard's search goes on).
func keyIn(tab *Table, i int, next map[int]int) []byte {
	for n := next[i]; ; n++ {
		k := []byte("budget/" + strconv.Itoa(i) + "/" + strconv.Itoa(n))
		if tab.shardOf(xxhash.Sum64(k)) == &tab.shards[i] {
			next[i] = n + 1
			return k
		}
	}
}

// TestBudgetExact: each table-wide bound (MaxKeys, MaxWaiters, MaxHolders)
// refuses exactly the request beyond it, whatever shard it lands on and
// whatever credit the other shards took in batches meanwhile (they are
// taken back when a request would be refused): a bound far above what
// batches take, filled over every shard, emptied, filled again on one
// shard, and one unit freed in one shard taken by a request on another.
func TestBudgetExact(t *testing.T) {
	for _, shards := range []int{1, 4, 64} {
		near := 2 * budgetBatch * shards
		for _, kind := range []string{"keys", "waiters", "holders"} {
			t.Run(kind+"/"+strconv.Itoa(shards), func(t *testing.T) {
				max := near*3 + 17 // batches far from the bound, one at a time near it
				var cfg Config
				switch kind {
				case "keys":
					cfg.MaxKeys = max
				case "waiters":
					cfg.MaxWaiters = max
				case "holders":
					cfg.MaxHolders = max
				}
				tab := budgetTable(t, shards, cfg)
				used := map[int]int{}
				var out Out
				// One unit on shard i: a new key; a waiter on a key held
				// there; a further holder of a shared key there.
				held := make([][]byte, shards)
				for i := range held {
					held[i] = keyIn(tab, i, used)
					switch kind {
					case "waiters":
						tab.Acquire(0, held[i], 0, 30, 0, nil, &out)
					case "holders":
						tab.AcquireShared(0, held[i], 0, 30, 0, 65535, NoIdent, nil, &out)
					}
				}
				type unit struct {
					key []byte
					tok uint64
				}
				one := func(i int) (unit, Status) {
					switch kind {
					case "keys":
						k := keyIn(tab, i, used)
						st, tok := tab.Acquire(0, k, 0, 30, 0, nil, &out)
						return unit{k, tok}, st
					case "waiters":
						st, _ := tab.Acquire(0, held[i], 5, 30, 0, nil, &out)
						return unit{held[i], 0}, st
					default:
						st, tok := tab.AcquireShared(0, held[i], 0, 30, 0, 65535, NoIdent, nil, &out)
						return unit{held[i], tok}, st
					}
				}
				ok := func(st Status) bool { return st == Granted || st == Queued }
				count := func() int {
					st := tab.Stats()
					return map[string]int{"keys": st.Keys, "waiters": st.Waiters, "holders": st.Holders}[kind]
				}
				base := count() // the keys of held
				// Round 1 spreads the units over every shard; round 2, after
				// they were all freed (every shard keeps some credit), puts
				// them all on shard 0.
				fill := func(round int) []unit {
					var units []unit
					rng := rand.New(rand.NewPCG(uint64(round), 7))
					for {
						i := 0
						if round == 1 {
							i = rng.IntN(shards)
						}
						u, st := one(i)
						if !ok(st) {
							if st != Busy {
								t.Fatalf("round %d: %v after %d units", round, st, len(units))
							}
							break
						}
						units = append(units, u)
					}
					if want := max - base; len(units) != want {
						t.Fatalf("round %d: %d units before Busy, want %d", round, len(units), want)
					}
					if got := count(); got != max {
						t.Fatalf("round %d: Stats counts %d, want %d", round, got, max)
					}
					return units
				}
				free := func(u unit) {
					if !tab.Release(0, u.key, u.tok, &out) {
						t.Fatalf("release of %s failed", u.key)
					}
				}
				units := fill(1)
				if kind == "waiters" {
					// Queued acquires of no Conn leave by timing out.
					tab.Tick(10*second, &out)
				} else {
					for _, u := range units {
						free(u)
					}
				}
				out.Reset()
				if got := count(); got != base {
					t.Fatalf("after freeing: Stats counts %d, want %d", got, base)
				}
				units = fill(2)
				if kind == "waiters" || shards == 1 {
					return
				}
				// A unit freed on one shard is there for a request on
				// another.
				u := units[len(units)/2]
				from := int(tab.shardOf(xxhash.Sum64(u.key)).id)
				free(u)
				if _, st := one((from + 1) % shards); st != Granted {
					t.Fatalf("the unit freed on shard %d: %v on shard %d", from, st, (from+1)%shards)
				}
				if _, st := one(from); st != Busy {
					t.Fatalf("beyond the bound again: %v", st)
				}
			})
		}
	}
}

// TestBudgetConcurrent: goroutines acquire and release keys of their own
// on every shard at once, near a MaxKeys they keep reaching: no more than
// MaxKeys are ever held, the counts agree at the end, and the bound is
// then exact again.
func TestBudgetConcurrent(t *testing.T) {
	const shards, workers = 16, 8
	const max = 2*2*budgetBatch*shards + 100 // far from the bound, then near it
	tab := budgetTable(t, shards, Config{MaxKeys: max})
	var holding atomic.Int64 // keys the workers know they hold: ≤ what the table holds
	var wg sync.WaitGroup
	var over, busy atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var out Out
			type lock struct {
				key []byte
				tok uint64
			}
			var mine []lock
			for i := range 20000 {
				// Slightly more acquires than releases: the workers reach the
				// bound and stay near it.
				if len(mine) > 0 && rng.IntN(20) < 9 {
					j := rng.IntN(len(mine))
					l := mine[j]
					mine[j] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					holding.Add(-1)
					if !tab.Release(0, l.key, l.tok, &out) {
						t.Errorf("release of %s failed", l.key)
						return
					}
					continue
				}
				k := []byte("w" + strconv.Itoa(w) + "/" + strconv.Itoa(i))
				if st, tok := tab.Acquire(0, k, 0, 30, 0, nil, &out); st == Granted {
					mine = append(mine, lock{k, tok})
					if n := holding.Add(1); n > max {
						over.Store(n)
					}
				} else if st == Busy {
					busy.Add(1)
				} else {
					t.Errorf("acquire: %v", st)
					return
				}
			}
			for _, l := range mine {
				holding.Add(-1)
				tab.Release(0, l.key, l.tok, &out)
			}
		}()
	}
	wg.Wait()
	if busy.Load() == 0 {
		t.Fatal("the workers never reached the bound")
	}
	if n := over.Load(); n != 0 {
		t.Fatalf("%d keys held at once, MaxKeys %d", n, max)
	}
	if st := tab.Stats(); st.Keys != 0 {
		t.Fatalf("Stats().Keys = %d after every release", st.Keys)
	}
	var credit int64
	for i := range tab.shards {
		credit += tab.shards[i].quota[budgetKeys].credit.Load()
	}
	if taken := tab.budgets[budgetKeys].taken.Load(); taken != credit {
		t.Fatalf("the budget counts %d units taken, the shards hold %d as credit", taken, credit)
	}
	var out Out
	for i := range max {
		if st, _ := tab.Acquire(0, []byte("after/"+strconv.Itoa(i)), 0, 30, 0, nil, &out); st != Granted {
			t.Fatalf("key %d of %d: %v", i, max, st)
		}
	}
	if st, _ := tab.Acquire(0, []byte("after/beyond"), 0, 30, 0, nil, &out); st != Busy {
		t.Fatalf("key %d: %v, want Busy", max+1, st)
	}
}

// TestBudgetSteadyState: acquires and releases of random keys over every
// shard, and handoffs, write nothing table-wide once each shard has its
// credit: the budgets' counters do not change (a table-wide counter
// changed twice per pair).
func TestBudgetSteadyState(t *testing.T) {
	tab := budgetTable(t, DefaultShards, Config{})
	var out Out
	c := NewConn(nil)
	hot := []byte("steady/hot")
	_, hotTok := tab.Acquire(0, hot, 0, 30, 0, nil, &out)
	rng := rand.New(rand.NewPCG(3, 3))
	round := func(n int) {
		for i := range n {
			k := []byte("steady/" + strconv.Itoa(rng.IntN(1<<20)))
			if st, tok := tab.Acquire(0, k, 0, 30, 0, nil, &out); st == Granted {
				tab.Release(0, k, tok, &out)
			}
			tab.Acquire(int64(i), hot, 5, 30, uint64(i), c, &out)
			tab.Release(int64(i), hot, hotTok, &out)
			hotTok = out.Effects[len(out.Effects)-1].Token
			out.Reset()
		}
	}
	round(20000) // every shard takes its first batch
	var before [nBudgets]int64
	for k := range before {
		before[k] = tab.budgets[k].writes.Load()
	}
	round(100000)
	for k := range before {
		if d := tab.budgets[k].writes.Load() - before[k]; d != 0 {
			t.Errorf("budget %d: %d table-wide writes in 100,000 pairs and handoffs", k, d)
		}
	}
}

// TestShardLayout: two shards never share a cache line, the lines every
// request touches come first, and the table's and the allocator's
// counters that event loops write are each on a line of their own.
func TestShardLayout(t *testing.T) {
	const line = 64
	var s shard
	size := unsafe.Sizeof(s)
	if size%line != 0 {
		t.Errorf("a shard is %d bytes, not a multiple of %d", size, line)
	}
	// The end of the last field that is not padding: the next shard's
	// first line must start at least a line later.
	var end uintptr
	ty := reflect.TypeFor[shard]()
	for i := range ty.NumField() {
		if f := ty.Field(i); f.Name != "_" {
			end = max(end, f.Offset+f.Type.Size())
		}
	}
	if size-end < line {
		t.Errorf("a shard's fields end %d bytes before the next shard: want ≥ %d", size-end, line)
	}
	// What an uncontended acquire and release write: the first three lines.
	for name, off := range map[string]uintptr{
		"mu": unsafe.Offsetof(s.mu), "seq": unsafe.Offsetof(s.seq), "slab": unsafe.Offsetof(s.slab) + unsafe.Sizeof(s.slab) - 1,
		"idx": unsafe.Offsetof(s.idx) + unsafe.Sizeof(s.idx) - 1, "quota": unsafe.Offsetof(s.quota) + unsafe.Sizeof(s.quota) - 1,
		"hooks": unsafe.Offsetof(s.hooks), "untidy": unsafe.Offsetof(s.untidy),
	} {
		if off >= 3*line {
			t.Errorf("shard.%s ends at offset %d: beyond the first three lines", name, off)
		}
	}
	if off := unsafe.Offsetof(s.ctr) + unsafe.Offsetof(s.ctr.Renews); off/line != unsafe.Offsetof(s.ctr)/line || unsafe.Offsetof(s.ctr)%line != 0 {
		t.Errorf("Counters' first fields (%d..%d) are not on one line", unsafe.Offsetof(s.ctr), off)
	}
	// The default table's shards (a large allocation) are line-aligned, so
	// the first three lines are three lines. (A small table's array starts
	// 8 bytes into a line — the heap's allocation header — and the padding
	// above still keeps its shards apart.)
	tab, err := New(Config{}, NewTokens(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if a := uintptr(unsafe.Pointer(&tab.shards[0])); a%line != 0 {
		t.Errorf("%d shards: the first is at %#x, not line-aligned", len(tab.shards), a)
	}
	// Each budget's counter and what give reads beside it (max, near) on
	// one line of their own, whether the table starts on a line or 8
	// bytes into one.
	var b budget
	if unsafe.Sizeof(b) != line || unsafe.Offsetof(b.taken) != 0 || unsafe.Offsetof(b.writes)+8 > line-8 ||
		unsafe.Offsetof(tab.budgets) != 0 {
		t.Errorf("a budget is %d bytes, its fields end at %d: want one line, used fields within %d", unsafe.Sizeof(b), unsafe.Offsetof(b.writes)+8, line-8)
	}
	if a := uintptr(unsafe.Pointer(&tab.budgets[0])); a%line != 0 && a%line != 8 {
		t.Errorf("the budgets start at %#x: neither on a line nor 8 bytes into one", a)
	}
	var tk Tokens
	// The sequence alone on its line, wherever the allocator put Tokens: a
	// line of padding on either side.
	if off := unsafe.Offsetof(tk.last); off < line || unsafe.Offsetof(tk.limit)-off < line {
		t.Errorf("Tokens: last at %d, limit at %d: want a line of padding on either side", off, unsafe.Offsetof(tk.limit))
	}
}
