package priority

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// Shared holders (PROTOCOL.md §9.2) in a priority cluster: every holder
// of a shared key, with its token, its identity and its key's limit,
// reaches the standbys in the stream and in snapshots, and the member
// that takes over holds exactly them.

// heldHolder is one holder of a held key as a table's Dump reports it.
type heldHolder struct {
	Token    uint64
	Ident    string
	Limit    uint16 // the key's limit, 0 exclusive
	Deadline int64  // on that table's clock
}

func (h heldHolder) String() string { return fmt.Sprintf("%d/%q/%d", h.Token, h.Ident, h.Limit) }

// holdersOf returns every holder of every held key of tab, by key, in
// token order.
func holdersOf(tab *shard.Table) map[string][]heldHolder {
	m := map[string][]heldHolder{}
	for i := range tab.Shards() {
		tab.Dump(i, func(h *shard.HeldLock) {
			m[string(h.Key)] = append(m[string(h.Key)], heldHolder{h.Token, string(h.Ident), h.Limit, h.Deadline})
		})
	}
	for _, hs := range m {
		slices.SortFunc(hs, func(a, b heldHolder) int { return cmp.Compare(a.Token, b.Token) })
	}
	return m
}

// holdersDiff says how got differs from want ("" when every key has the
// same holders with the same tokens, identities and limits; deadlines are
// not compared).
func holdersDiff(got, want map[string][]heldHolder) string {
	eq := func(a, b []heldHolder) bool {
		return slices.EqualFunc(a, b, func(x, y heldHolder) bool {
			return x.Token == y.Token && x.Ident == y.Ident && x.Limit == y.Limit
		})
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !eq(got[k], want[k]) {
			return fmt.Sprintf("%s: holders %v, want %v", k, got[k], want[k])
		}
	}
	for k, hs := range got {
		if _, ok := want[k]; !ok {
			return fmt.Sprintf("%s: holders %v, want none", k, hs)
		}
	}
	return ""
}

// waitHolders waits up to 10 s for tab to hold want's holders, and fails
// the test with the difference.
func waitHolders(t *testing.T, who string, tab *shard.Table, want map[string][]heldHolder) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := holdersDiff(holdersOf(tab), want)
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not hold the active's holders after 10 s: %s", who, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sharedKey is a key of sharedLoad and how it is acquired: shared with a
// limit, or exclusively (limit 0; a read/write lock's key appears twice,
// readers with 65535 and the writer with 0).
type sharedKey struct {
	key   []byte
	limit uint16
}

// sharedLoad changes a table as clients of semaphores, read/write locks
// and exclusive locks would: acquires shared and exclusive (some queued
// behind full keys, so a release hands over to them in one step),
// renewals and releases of one holder at a time, by token. Its grants go
// to the identities in turn (and to none).
type sharedLoad struct {
	tab    *shard.Table
	clock  func() int64
	rng    *rand.Rand
	keys   []sharedKey
	idents []shard.Ident
	conn   *shard.Conn
	out    shard.Out
	owner  uint64
}

func newSharedLoad(tab *shard.Table, clock func() int64, seed uint64) *sharedLoad {
	l := &sharedLoad{tab: tab, clock: clock, rng: rand.New(rand.NewPCG(seed, 9)), conn: shard.NewConn(nil),
		idents: []shard.Ident{shard.NoIdent, tab.Ident([]byte("orders")), tab.Ident([]byte("billing@example.com"))}}
	for i := range 12 {
		limit := []uint16{1, 2, 4, 65535}[i%4]
		l.keys = append(l.keys, sharedKey{fmt.Appendf(nil, "sem/%d", i), limit})
	}
	for i := range 4 {
		k := fmt.Appendf(nil, "rw/%d", i)
		l.keys = append(l.keys, sharedKey{k, 65535}, sharedKey{k, 65535}, sharedKey{k, 0})
	}
	for i := range 6 {
		l.keys = append(l.keys, sharedKey{fmt.Appendf(nil, "ex/%d", i), 0})
	}
	return l
}

// step makes one change (or tries to: a full key answers T).
func (l *sharedLoad) step() {
	l.out.Reset()
	now := l.clock()
	k := l.keys[l.rng.IntN(len(l.keys))]
	d := l.tab.Detail(k.key)
	id := l.idents[l.rng.IntN(len(l.idents))]
	l.owner++
	switch op := l.rng.IntN(10); {
	case op < 5 || len(d.Holders) == 0:
		wait := uint8(0)
		if l.rng.IntN(4) == 0 {
			wait = 60 // queued behind a full or exclusive key: a later release grants it
		}
		lease := uint8(30 + l.rng.IntN(30))
		if k.limit == 0 {
			l.tab.AcquireAs(now, k.key, wait, lease, l.owner, id, l.conn, &l.out)
		} else {
			l.tab.AcquireShared(now, k.key, wait, lease, l.owner, k.limit, id, l.conn, &l.out)
		}
	case op < 7:
		h := d.Holders[l.rng.IntN(len(d.Holders))]
		l.tab.Renew(now, k.key, uint8(30+l.rng.IntN(60)), h.Token, &l.out)
	default:
		h := d.Holders[l.rng.IntN(len(d.Holders))]
		l.tab.Release(now, k.key, h.Token, &l.out)
	}
}

// sharedCount is how many holders of shared keys hs has, and how many keys
// with more than one.
func sharedCount(hs map[string][]heldHolder) (holders, multi int) {
	for _, h := range hs {
		if h[0].Limit != 0 {
			holders += len(h)
			if len(h) > 1 {
				multi++
			}
		}
	}
	return holders, multi
}

// wallDeadlines returns each holder's lease end as a wall-clock instant
// (the table's clock moved onto time.Now), by token: tables of different
// members have different clocks.
func wallDeadlines(m *member) map[uint64]time.Time {
	at, wall := m.clock(), time.Now()
	out := map[uint64]time.Time{}
	for _, hs := range holdersOf(m.table) {
		for _, h := range hs {
			out[h.Token] = wall.Add(time.Duration(h.Deadline - at))
		}
	}
	return out
}

// TestPrioritySharedHolders: shared holders made on the active — grants,
// handoffs to queued acquires, renewals, releases and expiries of one
// holder at a time — reach a standby in the stream from the start and
// one that joins by a snapshot cut while the active keeps changing them,
// each holder with its token, identity and key's limit. The member that
// takes over — after a kill of the active, of both the active and the
// first standby (the one that joined by snapshot takes over), or a
// planned handover — holds exactly those holders, none ending earlier
// than on the old active (PROTOCOL.md §6.2), and serves them: each holder
// validates, its own identity releases it and another's is refused, a
// key with room grants another holder above every token before, and
// another limit is a mismatch.
func TestPrioritySharedHolders(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill int // members killed, from member 0; 0: member 0 hands over (Stop)
		to   int // the member that takes over
	}{
		{"kill-active", 1, 1},
		{"kill-active-and-standby", 2, 2},
		{"handover", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := openMembers(t, 3)
			ms[0].start(t)
			ms[1].start(t)
			repltest.WaitFor(t, "member 0 serving with member 1 in sync", func() bool {
				st := ms[1].p.Status()
				return ms[0].serving() && st.Role == "standby" && st.InSync
			})
			a := ms[0]
			load := newSharedLoad(a.table, a.clock, uint64(len(tc.name)))
			for range 3000 {
				load.step()
			}
			// Member 2 joins while the active keeps changing holders: its
			// snapshot is cut shard by shard between changes, and the
			// stream after it continues every shard exactly.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					load.step()
					time.Sleep(20 * time.Microsecond)
				}
			}()
			ms[2].start(t)
			repltest.WaitFor(t, "member 2 in sync", func() bool {
				st := ms[2].p.Status()
				return st.Role == "standby" && st.InSync
			})
			for range 3 { // and some changes after it is in sync
				time.Sleep(10 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			for range 2000 {
				load.step()
			}
			// Holders whose leases end: each expires alone.
			var out shard.Out
			for i := range 3 {
				if st, _ := a.table.AcquireShared(a.clock(), []byte("short"), 0, 1, uint64(i), 3, shard.NoIdent, nil, &out); st != shard.Granted {
					t.Fatalf("short holder %d: %v", i, st)
				}
			}
			if st, _ := a.table.AcquireShared(a.clock(), []byte("short"), 0, 1, 9, 4, shard.NoIdent, nil, &out); st != shard.Mismatch {
				t.Fatalf("another limit on a shared key: %v, want mismatch", st)
			}
			a.table.Renew(a.clock(), []byte("short"), 60, a.table.Detail([]byte("short")).Holders[1].Token, &out)
			time.Sleep(1100 * time.Millisecond)
			a.table.Tick(a.clock(), &out)
			if d := a.table.Detail([]byte("short")); len(d.Holders) != 1 {
				t.Fatalf("short: %d holders after their leases ended, want the renewed one", len(d.Holders))
			}

			want := holdersOf(a.table)
			if holders, multi := sharedCount(want); holders < 20 || multi < 5 {
				t.Fatalf("the load left %d holders of shared keys, %d keys with several: not a test of them", holders, multi)
			}
			for i := 1; i < 3; i++ {
				waitHolders(t, fmt.Sprintf("standby %d", i), ms[i].table, want)
			}
			before := wallDeadlines(a)

			// The takeover.
			s := ms[tc.to]
			if tc.kill == 0 {
				if succ := a.p.Stop(context.Background()); succ != s.p.self {
					t.Fatalf("Stop handed over to %q, want %q", succ, s.p.self)
				}
			}
			for i := range tc.kill {
				ms[i].p.Close(context.Background(), repl.Discard) // no goodbye: as kill -9
				ms[i] = nil
			}
			repltest.WaitFor(t, fmt.Sprintf("member %d to take over", tc.to), s.serving)
			got := holdersOf(s.table)
			if d := holdersDiff(got, want); d != "" {
				t.Fatalf("the member that took over: %s", d)
			}
			for tok, w := range wallDeadlines(s) {
				if b := before[tok]; w.Before(b.Add(-time.Millisecond)) {
					t.Fatalf("holder %d ends %v earlier on the member that took over", tok, b.Sub(w))
				}
			}

			// It serves them, holder by holder.
			last := uint64(0)
			for _, hs := range got {
				for _, h := range hs {
					last = max(last, h.Token)
				}
			}
			now := s.clock()
			var checked, released, refused, granted, mismatched int
			for key, hs := range got {
				for _, h := range hs {
					if _, ok := s.table.Validate(now, []byte(key), h.Token, &out); !ok {
						t.Fatalf("%s: holder %d not valid on the member that took over", key, h.Token)
					}
					checked++
				}
				if hs[0].Limit == 0 {
					continue
				}
				h := hs[len(hs)-1]
				if h.Ident != "" {
					other := "orders"
					if h.Ident == other {
						other = "billing@example.com"
					}
					if r, _ := s.table.ReleaseAs(now, []byte(key), h.Token, shard.Who{Ident: s.table.Ident([]byte(other))}, &out); r != shard.ResultRefused {
						t.Fatalf("%s: %s's release of %s's holder %d: %v, want refused", key, other, h.Ident, h.Token, r)
					}
					refused++
				}
				if r, _ := s.table.ReleaseAs(now, []byte(key), h.Token, shard.Who{Ident: s.table.Ident([]byte(h.Ident))}, &out); r != shard.ResultOK {
					t.Fatalf("%s: the owner's release of holder %d: %v", key, h.Token, r)
				}
				released++
				if len(hs) > 1 { // holders are left: the key's limit stands
					if st, _ := s.table.AcquireShared(now, []byte(key), 0, 30, 1, h.Limit%65535+1, shard.NoIdent, nil, &out); st != shard.Mismatch {
						t.Fatalf("%s: an acquire with limit %d beside holders of limit %d: %v, want mismatch", key, h.Limit%65535+1, h.Limit, st)
					}
					mismatched++
				}
				if d := s.table.Detail([]byte(key)); len(d.Waiters) == 0 && len(d.Holders) < int(h.Limit) {
					st, tok := s.table.AcquireShared(now, []byte(key), 0, 30, 1, h.Limit, shard.NoIdent, nil, &out)
					if st != shard.Granted || tok <= last {
						t.Fatalf("%s: a holder more on the member that took over: %v, token %d, want granted above %d", key, st, tok, last)
					}
					granted++
				}
			}
			t.Logf("%d holders validated; %d released by their owner, %d refused to another identity, %d granted, %d mismatches",
				checked, released, refused, granted, mismatched)
			if refused == 0 || granted == 0 || mismatched == 0 {
				t.Fatal("no refusal, no new holder or no mismatch checked")
			}
		})
	}
}

// TestLinkVersionFollowsRecords: the member-link version implies the
// format of the records and snapshot entries it carries, so a change of
// repl/records' formats must raise it (a member of the earlier version is
// then refused at its Hello instead of misreading them).
func TestLinkVersionFollowsRecords(t *testing.T) {
	// The member-link version of each records format version since the
	// link carried one: identities came with link version 2, shared
	// grants with 7.
	linkOf := map[int]uint16{2: 6, 3: 7}
	if got := linkOf[records.Version]; got != protocolVersion || recordsVersion != records.Version {
		t.Fatalf("repl/records writes format version %d, this link carries %d and its version is %d (want %d): raise protocolVersion and recordsVersion together with records.Version",
			records.Version, recordsVersion, protocolVersion, got)
	}
}

// TestMixedVersionPair: a member of this lockd and one of the previous
// member-link version (before shared holders) refuse each other at the
// Hello, each logging both versions at error, and neither follows the
// other nor takes its records; each says it is not ready, naming the
// other (docs/PROTOCOL.md decisions 37, 38).
func TestMixedVersionPair(t *testing.T) {
	ms := openMembers(t, 2, func(p *node) {
		if p.cfg.Self == 1 {
			p.version = protocolVersion - 1 // the lockd before shared holders
		}
	})
	var sinks [2]lineSink
	for i, m := range ms {
		m.p.link.log = slog.New(teeHandler{m.p.link.log.Handler(), slog.NewTextHandler(&sinks[i], nil)})
		m.start(t)
	}
	old, cur := fmt.Sprint(protocolVersion-1), fmt.Sprint(protocolVersion)
	for i := range ms {
		its, here := old, cur
		if i == 1 {
			its, here = cur, old
		}
		repltest.WaitFor(t, fmt.Sprintf("member %d to log the refusal with both versions", i), func() bool {
			return sinks[i].has("another version of the member link", "its_version="+its, "version="+here)
		})
	}
	for i, m := range ms {
		other := m.p.cfg.Peers[1-i]
		repltest.WaitFor(t, fmt.Sprintf("member %d unready, naming member %d", i, 1-i), func() bool {
			err := m.p.Health()
			return err != nil && strings.Contains(err.Error(), "refused") && strings.Contains(err.Error(), other)
		})
		if st := m.p.Status(); st.Role == "standby" && st.Active != "" {
			t.Fatalf("member %d follows %q across versions", i, st.Active)
		}
	}
	// Neither takes the other's changes: a grant on one never reaches
	// the other's table.
	var out shard.Out
	for i, m := range ms {
		if m.serving() {
			m.table.AcquireShared(m.clock(), fmt.Appendf(nil, "only/%d", i), 0, 30, 1, 2, shard.NoIdent, nil, &out)
		}
	}
	time.Sleep(3 * ms[0].p.cfg.FailoverTimeout / 10)
	for i, m := range ms {
		if m.table.Lookup(fmt.Appendf(nil, "only/%d", 1-i)).Held {
			t.Fatalf("member %d holds a grant made on the other version's member", i)
		}
	}
}

// lineSink keeps the lines a text handler writes.
type lineSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *lineSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.lines = append(s.lines, string(p))
	s.mu.Unlock()
	return len(p), nil
}

// has reports whether a line contains every fragment.
func (s *lineSink) has(fragments ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(l, f)
		}
		if ok {
			return true
		}
	}
	return false
}

// teeHandler hands every record to both handlers.
type teeHandler struct{ a, b slog.Handler }

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.a.Enabled(ctx, l) || h.b.Enabled(ctx, l)
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	_ = h.b.Handle(ctx, r.Clone())
	return h.a.Handle(ctx, r)
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{h.a.WithAttrs(as), h.b.WithAttrs(as)}
}

func (h teeHandler) WithGroup(g string) slog.Handler {
	return teeHandler{h.a.WithGroup(g), h.b.WithGroup(g)}
}
