package priority

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// Shared holders (PROTOCOL.md §9.2) in a priority cluster: every holder
// of a shared key, with its token, its identity and its key's limit,
// reaches the standbys in the stream and in snapshots, and the member
// that takes over holds exactly them.

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
			wait.For(t, "member 0 serving with member 1 in sync", func() bool {
				st := ms[1].p.Status()
				return ms[0].serving() && st.Role == "standby" && st.InSync
			})
			a := ms[0]
			load := repltest.NewSharedLoad(a.table, a.clock, uint64(len(tc.name)))
			for range 3000 {
				load.Step()
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
					load.Step()
					time.Sleep(20 * time.Microsecond)
				}
			}()
			ms[2].start(t)
			wait.For(t, "member 2 in sync", func() bool {
				st := ms[2].p.Status()
				return st.Role == "standby" && st.InSync
			})
			for range 3 { // and some changes after it is in sync
				time.Sleep(10 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			for range 2000 {
				load.Step()
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

			want := repltest.Holders(a.table)
			if holders, multi := repltest.SharedCount(want); holders < 20 || multi < 5 {
				t.Fatalf("the load left %d holders of shared keys, %d keys with several: not a test of them", holders, multi)
			}
			for i := 1; i < 3; i++ {
				repltest.WaitHolders(t, fmt.Sprintf("standby %d", i), ms[i].table, want)
			}
			before := repltest.WallDeadlines(a.table, a.clock())

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
			wait.For(t, fmt.Sprintf("member %d to take over", tc.to), s.serving)
			got := repltest.Holders(s.table)
			if d := repltest.HoldersDiff(got, want); d != "" {
				t.Fatalf("the member that took over: %s", d)
			}
			for tok, w := range repltest.WallDeadlines(s.table, s.clock()) {
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
					other := repltest.SharedIdents[0]
					if h.Ident == other {
						other = repltest.SharedIdents[1]
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
	// The member-link versions that carry each records format version:
	// identities came with link version 2, shared grants with 7 (8 changed
	// only the Handoff).
	type span struct{ first, last uint16 }
	linkOf := map[int]span{2: {2, 6}, 3: {7, 8}}
	got, ok := linkOf[records.Version]
	if !ok || protocolVersion < got.first || protocolVersion > got.last || recordsVersion != records.Version {
		t.Fatalf("repl/records writes format version %d, this link carries %d and its version is %d (want %d to %d): raise protocolVersion and recordsVersion together with records.Version",
			records.Version, recordsVersion, protocolVersion, got.first, got.last)
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
		wait.For(t, fmt.Sprintf("member %d to log the refusal with both versions", i), func() bool {
			return sinks[i].has("another version of the member link", "its_version="+its, "version="+here)
		})
	}
	for i, m := range ms {
		other := m.p.cfg.Peers[1-i]
		wait.For(t, fmt.Sprintf("member %d unready, naming member %d", i, 1-i), func() bool {
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
