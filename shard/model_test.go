package shard

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The reference model: plain maps and slices, no wheel, no index, no pools.
// It follows PROTOCOL.md §4 as literally as possible.

type mWaiter struct {
	conn     int
	owner    uint64
	deadline int64
	lease    uint8
}

type mKey struct {
	token    uint64
	deadline int64
	queue    []mWaiter
}

// mOut is an effect or a record, comparable as a value.
type mOut struct {
	what  string // effect kind or "record "+record kind
	key   string
	conn  int
	owner uint64
	token uint64
	lease uint8
	dl    int64
}

type model struct {
	keys                        map[string]*mKey
	nwait                       int
	dropped                     map[int]bool
	maxKeys, perKey, maxWaiters int
	perConn                     int
	token                       uint64
	out                         []mOut
}

func (m *model) grant(k string, mk *mKey, now int64, lease uint8) {
	m.token++
	mk.token, mk.deadline = m.token, now+int64(lease)*second
	m.out = append(m.out, mOut{what: "record grant", key: k, token: mk.token, lease: lease, dl: mk.deadline})
}

func (m *model) handoff(k string, mk *mKey, now, freed int64) {
	for len(mk.queue) > 0 {
		w := mk.queue[0]
		mk.queue = mk.queue[1:]
		m.nwait--
		if w.deadline <= freed {
			m.out = append(m.out, mOut{what: "timeout", key: k, conn: w.conn, owner: w.owner})
			continue
		}
		m.grant(k, mk, now, w.lease)
		m.out = append(m.out, mOut{what: "grant", key: k, conn: w.conn, owner: w.owner, token: mk.token})
		return
	}
	delete(m.keys, k)
}

func (m *model) touch(k string, now int64) *mKey {
	mk := m.keys[k]
	if mk != nil && mk.deadline <= now {
		m.out = append(m.out, mOut{what: "record expire", key: k, token: mk.token})
		m.handoff(k, mk, now, mk.deadline)
		mk = m.keys[k]
	}
	return mk
}

func (m *model) acquire(now int64, k string, wait, lease uint8, owner uint64, conn int) (Status, uint64) {
	mk := m.touch(k, now)
	switch {
	case mk == nil && len(m.keys) >= m.maxKeys:
		return Busy, 0
	case mk == nil:
		mk = &mKey{}
		m.keys[k] = mk
		m.grant(k, mk, now, lease)
		return Granted, mk.token
	case wait == 0:
		return TimedOut, 0
	case len(mk.queue) >= m.perKey || m.nwait >= m.maxWaiters || m.dropped[conn] || m.connWaiters(conn) >= m.perConn:
		return Busy, 0
	}
	mk.queue = append(mk.queue, mWaiter{conn: conn, owner: owner, deadline: now + int64(wait)*second, lease: lease})
	m.nwait++
	return Queued, 0
}

// connWaiters counts conn's queued acquires over every key.
func (m *model) connWaiters(conn int) int {
	n := 0
	for _, mk := range m.keys {
		for _, w := range mk.queue {
			if w.conn == conn {
				n++
			}
		}
	}
	return n
}

func (m *model) release(now int64, k string, token uint64) bool {
	mk := m.touch(k, now)
	if mk == nil || mk.token != token {
		return false
	}
	m.out = append(m.out, mOut{what: "record release", key: k, token: token})
	m.handoff(k, mk, now, now)
	return true
}

func (m *model) renew(now int64, k string, lease uint8, token uint64) bool {
	mk := m.touch(k, now)
	if mk == nil || mk.token != token {
		return false
	}
	mk.deadline = now + int64(lease)*second
	m.out = append(m.out, mOut{what: "record renew", key: k, token: token, lease: lease, dl: mk.deadline})
	return true
}

func (m *model) restore(k string, token uint64, deadline int64) error {
	mk := m.keys[k]
	switch {
	case mk == nil && len(m.keys) >= m.maxKeys:
		return ErrFull
	case mk == nil:
		mk = &mKey{}
		m.keys[k] = mk
	case token <= mk.token:
		return nil
	}
	mk.token, mk.deadline = token, deadline
	return nil
}

func (m *model) tick(now int64) {
	for _, k := range m.sortedKeys() {
		m.touch(k, now)
	}
	for _, k := range m.sortedKeys() {
		mk := m.keys[k]
		q := mk.queue[:0]
		for _, w := range mk.queue {
			if w.deadline <= now {
				m.out = append(m.out, mOut{what: "timeout", key: k, conn: w.conn, owner: w.owner})
				m.nwait--
			} else {
				q = append(q, w)
			}
		}
		mk.queue = q
	}
}

func (m *model) dropConn(conn int) {
	m.dropped[conn] = true
	for _, mk := range m.keys {
		q := mk.queue[:0]
		for _, w := range mk.queue {
			if w.conn == conn {
				m.nwait--
			} else {
				q = append(q, w)
			}
		}
		mk.queue = q
	}
}

func (m *model) cancel() {
	for _, k := range m.sortedKeys() {
		mk := m.keys[k]
		for _, w := range mk.queue {
			m.out = append(m.out, mOut{what: "cancel", key: k, conn: w.conn, owner: w.owner})
		}
		m.nwait -= len(mk.queue)
		mk.queue = nil
	}
}

func (m *model) sortedKeys() []string {
	ks := make([]string, 0, len(m.keys))
	for k := range m.keys {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func cmpOut(a, b mOut) int {
	if a.key != b.key {
		if a.key < b.key {
			return -1
		}
		return 1
	}
	if a.what != b.what {
		if a.what < b.what {
			return -1
		}
		return 1
	}
	if a.conn != b.conn {
		return a.conn - b.conn
	}
	if a.owner != b.owner {
		if a.owner < b.owner {
			return -1
		}
		return 1
	}
	return 0
}

var modelSeeds = flag.Int("seeds", 40, "number of random sequences TestModel runs")

// TestModel drives the Table and the model with the same random operations
// on a fake clock and compares every answer, effect and record, and the
// state of every key after every operation.
func TestModel(t *testing.T) {
	seeds, ops := *modelSeeds, 3000
	if testing.Short() {
		seeds = min(seeds, 10)
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, uint64(seed), ops, modelShape{}) })
	}
}

// TestModelSwing is TestModel on a table that grows to thousands of keys of
// every length (inline and long) and shrinks again, phase after phase, so
// that the slab compacts (slab.go) under waiters, renews, restores, ticks
// and dropped connections, with the model checking every key after every
// operation and checkLayout every link.
func TestModelSwing(t *testing.T) {
	seeds, ops := 4, 12000
	if testing.Short() {
		seeds, ops = 2, 6000
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runModel(t, uint64(seed), ops, modelShape{keys: 3000, swing: 3000, maxLease: 250})
		})
	}
}

// modelShape varies runModel's table and operations; the zero value is
// TestModel's: up to 10 one-letter keys, up to 8 held.
type modelShape struct {
	keys     int   // distinct keys, of 2 to 40 bytes
	swing    int   // ops per phase: acquires, then releases (0: no phases)
	maxLease uint8 // longest lease (default 5 s)
}

func runModel(t *testing.T, seed uint64, ops int, shape modelShape) {
	rng := rand.New(rand.NewPCG(seed, 0x10cd))
	var got []mOut
	cfg := Config{
		Shards:            1 << rng.IntN(3),
		MaxKeys:           1 + rng.IntN(8),
		MaxWaitersPerKey:  1 + rng.IntN(4),
		MaxWaiters:        1 + rng.IntN(10),
		MaxWaitersPerConn: 1 + rng.IntN(4),
		Tick:              []time.Duration{10 * time.Millisecond, time.Millisecond, time.Microsecond}[rng.IntN(3)],
		Sink: func(r Record) {
			got = append(got, mOut{what: "record " + r.Kind.String(), key: string(r.Key), token: r.Token, lease: r.Lease, dl: r.Deadline})
		},
	}
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}[:2+rng.IntN(8)]
	maxLease := 5
	if shape.keys > 0 {
		cfg.Shards = 1
		cfg.MaxKeys = shape.keys
		cfg.MaxWaiters = 64
		keys = keys[:0]
		for i := range shape.keys {
			k := fmt.Sprint(i, "/")
			keys = append(keys, k+strings.Repeat("x", 2+rng.IntN(38)-min(len(k), 2)))
		}
	}
	if shape.maxLease > 0 {
		maxLease = int(shape.maxLease)
	}
	tab, err := New(cfg, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	m := &model{keys: map[string]*mKey{}, dropped: map[int]bool{}, maxKeys: cfg.MaxKeys, perKey: cfg.MaxWaitersPerKey, maxWaiters: cfg.MaxWaiters,
		perConn: cfg.MaxWaitersPerConn}
	const nconns = 5
	conns := make([]*Conn, nconns)
	for i := range conns {
		conns[i] = NewConn(i)
	}
	now := int64(rng.IntN(10)-5) * second // negative clocks too
	var out Out
	var owner uint64

	// deadlines returns every pending deadline in the model, so the clock
	// can be moved exactly onto one (or 1 ns before it).
	deadlines := func() []int64 {
		var d []int64
		for _, mk := range m.keys {
			d = append(d, mk.deadline)
			for _, w := range mk.queue {
				d = append(d, w.deadline)
			}
		}
		return d
	}
	for op := range ops {
		out.Reset()
		got = got[:0]
		m.out = m.out[:0]
		k := keys[rng.IntN(len(keys))]
		var desc string
		exact := true // compare outputs in order (else as multisets)
		r := rng.IntN(100)
		if shape.swing > 0 {
			// Grow: acquires instead of releases and renews. Shrink:
			// releases of the current token instead of acquires.
			switch fill := op/shape.swing%2 == 0; {
			case fill && r >= 35 && r < 65:
				r = rng.IntN(35)
			case !fill && r < 35:
				r = 35 + rng.IntN(20)
			}
		}
		switch {
		case r < 35:
			owner++
			wait, lease, ci := uint8(rng.IntN(5)), uint8(1+rng.IntN(maxLease)), rng.IntN(nconns)
			desc = fmt.Sprintf("acquire %s wait=%d lease=%d owner=%d conn=%d", k, wait, lease, owner, ci)
			st, tok := tab.Acquire(now, []byte(k), wait, lease, owner, conns[ci], &out)
			mst, mtok := m.acquire(now, k, wait, lease, owner, ci)
			if st != mst || tok != mtok {
				t.Fatalf("op %d at %d: %s: table %v %d, model %v %d", op, now, desc, st, tok, mst, mtok)
			}
		case r < 55:
			tok := uint64(rng.IntN(int(m.token) + 2))
			if mk := m.keys[k]; mk != nil && rng.IntN(4) > 0 {
				tok = mk.token
			}
			desc = fmt.Sprintf("release %s token=%d", k, tok)
			if a, b := tab.Release(now, []byte(k), tok, &out), m.release(now, k, tok); a != b {
				t.Fatalf("op %d at %d: %s: table %v, model %v", op, now, desc, a, b)
			}
		case r < 65:
			tok := uint64(rng.IntN(int(m.token) + 2))
			if mk := m.keys[k]; mk != nil && rng.IntN(4) > 0 {
				tok = mk.token
			}
			lease := uint8(1 + rng.IntN(maxLease))
			desc = fmt.Sprintf("renew %s lease=%d token=%d", k, lease, tok)
			if a, b := tab.Renew(now, []byte(k), lease, tok, &out), m.renew(now, k, lease, tok); a != b {
				t.Fatalf("op %d at %d: %s: table %v, model %v", op, now, desc, a, b)
			}
		case r < 85:
			desc = "tick"
			exact = false
			tab.Tick(now, &out)
			m.tick(now)
		case r < 88:
			ci := rng.IntN(nconns)
			desc = fmt.Sprintf("dropconn %d", ci)
			tab.DropConn(conns[ci])
			m.dropConn(ci)
			conns[ci] = NewConn(ci) // the engine never reuses a dropped Conn
			delete(m.dropped, ci)
		case r < 91:
			// Restore an old token (never above the allocator's last), with
			// a deadline that may already have passed.
			tok := 1 + uint64(rng.IntN(int(m.token)+1))
			dl := now + rng.Int64N(4*second) - 2*second
			desc = fmt.Sprintf("restore %s token=%d deadline=%d", k, tok, dl)
			if a, b := tab.Restore([]byte(k), tok, dl), m.restore(k, tok, dl); a != b {
				t.Fatalf("op %d at %d: %s: table %v, model %v", op, now, desc, a, b)
			}
		case r < 92:
			desc = "cancel"
			exact = false
			tab.CancelWaiters(&out)
			m.cancel()
		default:
			// Move the clock: onto a pending deadline, 1 ns before one, or by
			// a random step.
			d := deadlines()
			switch x := rng.IntN(4); {
			case x == 0 && len(d) > 0:
				if dl := d[rng.IntN(len(d))]; dl > now && (shape.swing == 0 || dl-now < 2*second) {
					now = dl
				}
			case x == 1 && len(d) > 0:
				if dl := d[rng.IntN(len(d))]; dl-1 > now && (shape.swing == 0 || dl-now < 2*second) {
					now = dl - 1
				}
			case x == 2:
				now += rng.Int64N(int64(cfg.Tick) * 3)
			default:
				now += rng.Int64N(3 * second)
				if rng.IntN(20) == 0 {
					now += 40 * second // past a whole wheel rotation
				}
			}
			continue
		}
		for _, e := range out.Effects {
			got = append(got, mOut{what: e.Kind.String(), key: string(e.Key), conn: e.Conn.Tag.(int), owner: e.Owner, token: e.Token})
		}
		want := m.out
		if !exact {
			// A tick visits deadlines in wheel order, the model key by key:
			// the same outputs, in another order, with the new tokens
			// assigned in another order. Compare per kind/key/waiter and
			// adopt the table's tokens; they must be the next ones.
			want = slices.Clone(want)
			slices.SortStableFunc(want, cmpOut)
			gotS := slices.Clone(got)
			slices.SortStableFunc(gotS, cmpOut)
			if len(gotS) == len(want) {
				base := m.token - uint64(m.countGrants())
				var toks []uint64
				for i := range want {
					if want[i].what == "grant" || want[i].what == "record grant" {
						if want[i].what == "grant" {
							toks = append(toks, gotS[i].token)
						}
						if g := gotS[i]; g.key == want[i].key {
							want[i].token = g.token
							if mk := m.keys[g.key]; mk != nil && g.what == "grant" {
								mk.token = g.token
							}
						}
					}
				}
				// Each key's grant record and grant effect carry one token.
				for _, g := range gotS {
					if g.what == "grant" {
						if mk := m.keys[g.key]; mk == nil || mk.token != g.token {
							t.Fatalf("op %d: %s: grant effect %+v does not match the key", op, desc, g)
						}
						for _, r := range gotS {
							if r.what == "record grant" && r.key == g.key && r.token != g.token {
								t.Fatalf("op %d: %s: record %+v, effect %+v", op, desc, r, g)
							}
						}
					}
				}
				slices.Sort(toks)
				for i, tk := range toks {
					if tk != base+uint64(i)+1 {
						t.Fatalf("op %d: %s: tokens %v, want %d..%d", op, desc, toks, base+1, m.token)
					}
				}
			}
			got = gotS
		}
		// Records and effects are two streams: compare each in its own order.
		isRec := func(o mOut) bool { return len(o.what) > 7 && o.what[:7] == "record " }
		split := func(os []mOut) (recs, effs []mOut) {
			for _, o := range os {
				if isRec(o) {
					recs = append(recs, o)
				} else {
					effs = append(effs, o)
				}
			}
			return recs, effs
		}
		gr, ge := split(got)
		wr, we := split(want)
		if !slices.Equal(gr, wr) || !slices.Equal(ge, we) {
			t.Fatalf("op %d at %d: %s:\ntable %+v\nmodel %+v", op, now, desc, got, want)
		}
		if shape.keys == 0 || op%16 == 0 {
			checkState(t, tab, m, keys, op, desc)
			checkLayout(t, tab)
		} else {
			checkState(t, tab, m, []string{k}, op, desc) // and every key every 16 ops
		}
	}
}

func (m *model) countGrants() int {
	n := 0
	for _, o := range m.out {
		if o.what == "record grant" {
			n++
		}
	}
	return n
}

func checkState(t *testing.T, tab *Table, m *model, keys []string, op int, desc string) {
	t.Helper()
	for _, k := range keys {
		ki := tab.Lookup([]byte(k))
		mk := m.keys[k]
		want := KeyInfo{}
		if mk != nil {
			want = KeyInfo{Held: true, Token: mk.token, Deadline: mk.deadline, Waiters: len(mk.queue)}
		}
		if ki != want {
			t.Fatalf("op %d (%s): key %s: table %+v, model %+v", op, desc, k, ki, want)
		}
	}
	if st := tab.Stats(); st.Keys != len(m.keys) || st.Waiters != m.nwait {
		t.Fatalf("op %d (%s): stats %+v, model keys=%d waiters=%d", op, desc, st, len(m.keys), m.nwait)
	}
	if tab.tokens.Last() != m.token {
		t.Fatalf("op %d (%s): last token %d, model %d", op, desc, tab.tokens.Last(), m.token)
	}
}
