package repltest

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/shard"
)

// Shared holders (PROTOCOL.md §9.2) as both cluster modes' tests compare
// them: every holder of every key, with its token, identity and key's
// limit, and a load of semaphores, read/write locks and exclusive locks.

// Holder is one holder of a held key as a table's Dump reports it.
type Holder struct {
	Token    uint64
	Ident    string
	Limit    uint16 // the key's limit, 0 exclusive
	Deadline int64  // on that table's clock
}

func (h Holder) String() string { return fmt.Sprintf("%d/%q/%d", h.Token, h.Ident, h.Limit) }

// Holders returns every holder of every held key of tab, by key, in token
// order.
func Holders(tab *shard.Table) map[string][]Holder {
	m := map[string][]Holder{}
	for i := range tab.Shards() {
		tab.Dump(i, func(h *shard.HeldLock) {
			m[string(h.Key)] = append(m[string(h.Key)], Holder{h.Token, string(h.Ident), h.Limit, h.Deadline})
		})
	}
	for _, hs := range m {
		slices.SortFunc(hs, func(a, b Holder) int { return cmp.Compare(a.Token, b.Token) })
	}
	return m
}

// HoldersDiff says how got differs from want ("" when every key has the
// same holders with the same tokens, identities and limits; deadlines are
// not compared).
func HoldersDiff(got, want map[string][]Holder) string {
	eq := func(a, b []Holder) bool {
		return slices.EqualFunc(a, b, func(x, y Holder) bool {
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

// WaitHolders waits up to 10 s for tab to hold want's holders, and fails
// the test with the difference.
func WaitHolders(t testing.TB, who string, tab *shard.Table, want map[string][]Holder) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := HoldersDiff(Holders(tab), want)
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not hold the expected holders after 10 s: %s", who, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SharedCount is how many holders of shared keys hs has, and how many keys
// with more than one.
func SharedCount(hs map[string][]Holder) (holders, multi int) {
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

// WallDeadlines returns each holder's lease end on tab as a wall-clock
// instant (now is tab's clock, read just before), by token: tables of
// different members have different clocks.
func WallDeadlines(tab *shard.Table, now int64) map[uint64]time.Time {
	wall := time.Now()
	out := map[uint64]time.Time{}
	for _, hs := range Holders(tab) {
		for _, h := range hs {
			out[h.Token] = wall.Add(time.Duration(h.Deadline - now))
		}
	}
	return out
}

// SharedKey is a key of SharedLoad and how it is acquired: shared with a
// limit, or exclusively (limit 0; a read/write lock's key appears three
// times, readers twice with 65535 and the writer with 0).
type SharedKey struct {
	Key   []byte
	Limit uint16
}

// SharedIdents are the identities SharedLoad grants to, in turn with none.
var SharedIdents = []string{"orders", "billing@example.com"}

// SharedLoad changes a table as clients of semaphores, read/write locks
// and exclusive locks would: acquires shared and exclusive (some queued
// behind full keys, so a release hands over to them in one step),
// renewals and releases of one holder at a time, by token. Its grants go
// to SharedIdents in turn (and to none). Not safe for concurrent use.
type SharedLoad struct {
	Tab    *shard.Table
	Clock  func() int64
	Keys   []SharedKey
	rng    *rand.Rand
	idents []shard.Ident
	conn   *shard.Conn
	out    shard.Out
	owner  uint64
}

// NewSharedLoad returns a load on tab: 12 semaphores (limits 1, 2, 4,
// 65535), 4 read/write locks, 6 exclusive keys.
func NewSharedLoad(tab *shard.Table, clock func() int64, seed uint64) *SharedLoad {
	l := &SharedLoad{Tab: tab, Clock: clock, rng: rand.New(rand.NewPCG(seed, 9)), conn: shard.NewConn(nil),
		idents: []shard.Ident{shard.NoIdent}}
	for _, name := range SharedIdents {
		l.idents = append(l.idents, tab.Ident([]byte(name)))
	}
	for i := range 12 {
		l.Keys = append(l.Keys, SharedKey{fmt.Appendf(nil, "sem/%d", i), []uint16{1, 2, 4, 65535}[i%4]})
	}
	for i := range 4 {
		k := fmt.Appendf(nil, "rw/%d", i)
		l.Keys = append(l.Keys, SharedKey{k, 65535}, SharedKey{k, 65535}, SharedKey{k, 0})
	}
	for i := range 6 {
		l.Keys = append(l.Keys, SharedKey{fmt.Appendf(nil, "ex/%d", i), 0})
	}
	return l
}

// Step makes one change (or tries to: a full key answers T, a leader
// whose gate does not serve changes nothing the test relies on).
func (l *SharedLoad) Step() {
	l.out.Reset()
	now := l.Clock()
	k := l.Keys[l.rng.IntN(len(l.Keys))]
	d := l.Tab.Detail(k.Key)
	id := l.idents[l.rng.IntN(len(l.idents))]
	l.owner++
	switch op := l.rng.IntN(10); {
	case op < 5 || len(d.Holders) == 0:
		wait := uint8(0)
		if l.rng.IntN(4) == 0 {
			wait = 60 // queued behind a full or exclusive key: a later release grants it
		}
		lease := uint8(30 + l.rng.IntN(30))
		if k.Limit == 0 {
			l.Tab.AcquireAs(now, k.Key, wait, lease, l.owner, id, l.conn, &l.out)
		} else {
			l.Tab.AcquireShared(now, k.Key, wait, lease, l.owner, k.Limit, id, l.conn, &l.out)
		}
	case op < 7:
		h := d.Holders[l.rng.IntN(len(d.Holders))]
		l.Tab.Renew(now, k.Key, uint8(30+l.rng.IntN(60)), h.Token, &l.out)
	default:
		h := d.Holders[l.rng.IntN(len(d.Holders))]
		l.Tab.Release(now, k.Key, h.Token, &l.out)
	}
}
