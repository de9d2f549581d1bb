package history

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCheckFenced: the fenced resource's decisions, good and broken.
func TestCheckFenced(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(b *builder)
		want  Verdict
		count int
	}{
		{"handoffs and a stale holder rejected", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.write(a, true, 6)
			b.write(a, true, 7) // the same holder again: equal token accepted
			b.release(a, 8, 9)
			c := b.grant(1, "k", 11, 9, 10)
			b.write(c, true, 11)
			b.write(a, false, 12)         // the old holder wakes up late: rejected
			d := b.grant(2, "j", 5, 0, 1) // another key has its own order
			b.write(d, true, 13)
		}, Pass, 0},
		{"stale write accepted", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			c := b.grant(1, "k", 11, 6, 7)
			b.write(c, true, 8)
			b.write(a, true, 9) // token 10 after 11: the fence let it through
		}, Violated, 1},
		{"double grant with one token: two holders' writes accepted", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			c := b.grant(1, "k", 10, 1, 6)
			b.write(a, true, 7)
			b.write(c, true, 8)
		}, Violated, 1},
		{"write under a token never granted for the key", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			w := b.write(a, true, 6)
			b.h.Ops[w].Token = 99
		}, Violated, 1},
		{"a current token rejected", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.write(a, false, 6)
		}, Violated, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			expect(t, CheckFenced(b.history(t)), tc.want, tc.count)
		})
	}
}

// TestCheckTokens: uniqueness and real-time order, and the windows that
// excuse the order (not uniqueness).
func TestCheckTokens(t *testing.T) {
	split := []Window{{Start: ms(100), End: ms(200), Why: "partition"}}
	for _, tc := range []struct {
		name    string
		build   func(b *builder)
		windows []Window
		want    Verdict
		count   int
		excused float64
	}{
		{"increasing across keys; concurrent grants in any order", func(b *builder) {
			b.grant(0, "a", 10, 0, 5)
			b.grant(1, "b", 12, 6, 9)
			b.grant(2, "c", 11, 7, 10) // concurrent with 12: either order
			b.grant(0, "a", 13, 11, 12)
			b.acquire(1, "a", Unknown, "", 13, 20) // no token: not checked
		}, nil, Pass, 0, 0},
		{"a token granted twice", func(b *builder) {
			b.grant(0, "a", 10, 0, 5)
			b.grant(1, "b", 10, 6, 9)
		}, nil, Violated, 1, 0},
		{"a token regression across keys", func(b *builder) {
			b.grant(0, "a", 20, 0, 5)
			b.grant(1, "b", 10, 6, 9)
		}, nil, Violated, 1, 0},
		{"a regression inside one split-brain window is excused", func(b *builder) {
			b.grant(0, "a", 10, 0, 5)
			b.grant(1, "a", 30, 110, 120) // the new side
			b.grant(2, "a", 20, 130, 140) // the old side, later: lost after the heal
			b.grant(0, "b", 40, 300, 301)
		}, split, Pass, 0, 1},
		{"a regression from before the window is not excused", func(b *builder) {
			b.grant(0, "a", 30, 0, 5)
			b.grant(1, "a", 20, 130, 140)
		}, split, Violated, 1, 0},
		{"a duplicate inside the window is not excused", func(b *builder) {
			b.grant(1, "a", 30, 110, 120)
			b.grant(2, "b", 30, 130, 140)
		}, split, Violated, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			r := CheckTokens(b.history(t), tc.windows)
			expect(t, r, tc.want, tc.count)
			if r.Figures["excused_inversions"] != tc.excused {
				t.Fatalf("excused %v, want %v", r.Figures["excused_inversions"], tc.excused)
			}
		})
	}
}

// TestOverlaps: belief spans, overlaps and lost grants.
func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(b *builder)
		pairs int
		lost  int
		total time.Duration
	}{
		{"handoffs do not overlap", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.release(a, 100, 101)
			c := b.grant(1, "k", 11, 50, 102) // queued, granted at the release
			b.release(c, 200, 201)
		}, 0, 0, 0},
		{"two holders at once", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.release(a, 100, 101)
			b.grant(1, "k", 11, 40, 60) // believes from 60; a until 100
		}, 1, 0, ms(40)},
		{"an expired holder does not overlap", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5) // lease to 3000
			b.op(Release, a, Fail, DetailNotHeld, 3500, 3501)
			b.grant(1, "k", 11, 3001, 3002)
		}, 0, 0, 0},
		{"a renew moves the lease's end", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.op(Renew, a, OK, "", 2000, 2001) // to 5000
			b.grant(1, "k", 11, 3100, 3200)    // overlaps a from 3200
			b.release(a, 4000, 4001)
		}, 1, 0, ms(800)},
		{"a lost grant: N while the lease runs", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.op(Renew, a, Fail, DetailNotHeld, 1000, 1001)
			c := b.grant(1, "k", 11, 1100, 1101)
			b.release(c, 1200, 1201)
		}, 0, 1, 0},
		{"a lost grant: a Release's N with no fault in force", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.fault(100, 200)
			b.op(Release, a, Fail, DetailNotHeld, 1000, 1001)
		}, 0, 1, 0},
		{"a Release's N across a fault: its first attempt may have run", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.fault(900, 1500)
			b.op(Release, a, Fail, DetailNotHeld, 1000, 1600)
			c := b.grant(1, "k", 11, 1100, 1200)
			b.release(c, 1700, 1701)
		}, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			h := b.history(t)
			st := Overlaps(h, nil)
			if st.Pairs != tc.pairs || st.LostGrants != tc.lost || st.Total != tc.total {
				t.Fatalf("pairs %d lost %d total %v, want %d %d %v (%v)", st.Pairs, st.LostGrants, st.Total, tc.pairs, tc.lost, tc.total, st.Examples)
			}
			measured := CheckOverlap(h, false, nil)
			if measured.Verdict != Measured || measured.Count != 0 {
				t.Fatalf("measured: %s", measured)
			}
			asserted := CheckOverlap(h, true, nil)
			if n := tc.pairs + tc.lost; n > 0 {
				expect(t, asserted, Violated, n)
			} else {
				expect(t, asserted, Pass, 0)
			}
		})
	}
}

// TestCheckLinearizable: the lock model on good histories (handoffs,
// expiry, unknown outcomes either way) and on histories no correct lock
// service can produce (a double grant, a token regression on a key, a
// lost grant, a renew of a superseded token); a failure writes the
// visualization.
func TestCheckLinearizable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(b *builder)
		ok    bool
	}{
		{"handoffs and concurrent release/acquire", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			c := b.grant(1, "k", 11, 50, 102) // queued; granted at the release
			b.release(a, 100, 101)
			b.op(Renew, c, OK, "", 150, 160)
			b.release(c, 200, 201)
			b.op(Release, c, Fail, DetailNotHeld, 300, 301) // released already
		}, true},
		{"a lease that ended: a grant after it, the holder's N", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.grant(1, "k", 11, 2900, 3050) // granted once the lease (from 0) could end
			b.op(Release, a, Fail, DetailNotHeld, 3100, 3101)
		}, true},
		{"an unknown acquire that took the key, then expired", func(b *builder) {
			b.acquire(0, "k", Unknown, "", 0, 100)
			b.acquire(2, "k", Fail, DetailTimeout, 10, 20) // left out: no effect
			c := b.grant(1, "k", 11, 200, 3500)
			b.release(c, 3600, 3601)
		}, true},
		{"an unknown release that took effect", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.op(Release, a, Unknown, "", 10, 20)
			c := b.grant(1, "k", 11, 30, 40)
			b.release(c, 50, 60)
		}, true},
		{"an unknown renew that took effect", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.op(Renew, a, Unknown, "", 2000, 2100)
			b.op(Renew, a, OK, "", 4000, 4001) // held past the first lease: the unknown renew did run
			b.release(a, 4500, 4501)
		}, true},
		{"double grant", func(b *builder) {
			b.grant(0, "k", 10, 0, 5)
			b.grant(1, "k", 11, 100, 110) // the first lease runs until ≥ 3000
		}, false},
		{"token regression on a key", func(b *builder) {
			a := b.grant(0, "k", 20, 0, 5)
			b.release(a, 10, 11)
			b.grant(1, "k", 15, 20, 30)
		}, false},
		{"a lost grant: N while the lease surely ran", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.op(Release, a, Fail, DetailNotHeld, 1000, 1001)
		}, false},
		{"a lost grant: N while the lease surely ran, a fault before it", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.fault(100, 200)
			b.op(Release, a, Fail, DetailNotHeld, 1000, 1001)
		}, false},
		{"a Release resent across a fault: N after its first attempt ran", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.fault(900, 1500) // answers lost: the first attempt ran, the resend got N
			b.op(Release, a, Fail, DetailNotHeld, 1000, 1600)
			c := b.grant(1, "k", 11, 1100, 1200) // granted at the first attempt
			b.release(c, 1700, 1701)
		}, true},
		{"a renew of a superseded token answered K", func(b *builder) {
			a := b.grant(0, "k", 10, 0, 5)
			b.release(a, 10, 11)
			b.grant(1, "k", 11, 20, 30)
			b.op(Renew, a, OK, "", 40, 50)
		}, false},
		{"an unknown acquire cannot excuse a double grant", func(b *builder) {
			b.grant(0, "k", 10, 0, 5)
			b.acquire(2, "k", Unknown, "", 50, 60)
			b.grant(1, "k", 11, 100, 110)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			dir := t.TempDir()
			r := CheckLinearizable(b.history(t), LinOptions{Timeout: 10 * time.Second, Dir: dir})
			if tc.ok {
				expect(t, r, Pass, 0)
				return
			}
			expect(t, r, Violated, 1)
			if len(r.Artifacts) != 1 || !strings.HasPrefix(r.Artifacts[0], dir) {
				t.Fatalf("artifacts %v, want one visualization in %s", r.Artifacts, dir)
			}
		})
	}
}

// TestCheckLinearizableLong: a long history with contention, expiries and
// unknown outcomes on 4 keys checks quickly (the search stays linear on a
// correct history).
func TestCheckLinearizableLong(t *testing.T) {
	b := newBuilder()
	var tok uint64 = 100
	now := 0
	for i := range 4000 {
		key := string(rune('a' + i%4))
		tok++
		g := b.grant(i%6, key, tok, now, now+2)
		switch i % 50 {
		case 7: // unknown acquire by another worker while held: no effect
			b.acquire((i+1)%6, key, Unknown, "", now+3, now+5)
		case 13: // unknown release: lets the key go
			b.op(Release, g, Unknown, "", now+4, now+6)
		}
		if i%50 != 13 {
			b.release(g, now+5, now+7)
		}
		now += 8
	}
	began := time.Now()
	r := CheckLinearizable(b.history(t), LinOptions{Timeout: time.Minute})
	expect(t, r, Pass, 0)
	t.Logf("%v for %v operations", time.Since(began), r.Figures["operations"])
}

// TestValidateAndJSON: a history survives its JSON form; malformed ones
// are rejected with ErrBadHistory.
func TestValidateAndJSON(t *testing.T) {
	b := newBuilder()
	a := b.grant(0, "k", 10, 0, 5)
	b.write(a, true, 6)
	b.op(Renew, a, Unknown, "", 7, 8)
	b.release(a, 9, 10)
	b.h.Faults = []Fault{{Kind: "kill", Target: "member 0", Start: ms(1), End: ms(4)}}
	h := b.history(t)
	var buf bytes.Buffer
	if err := h.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Ops) != len(h.Ops) || back.Ops[2] != h.Ops[2] || back.Faults[0] != h.Faults[0] {
		t.Fatalf("round trip: %+v", back)
	}
	for _, tc := range []struct {
		name   string
		break_ func(h *History)
	}{
		{"id", func(h *History) { h.Ops[1].ID = 7 }},
		{"times", func(h *History) { h.Ops[1].Return = 0 }},
		{"kind", func(h *History) { h.Ops[1].Kind = 9 }},
		{"grant", func(h *History) { h.Ops[1].Grant = 3 }},
		{"acquire grant", func(h *History) { h.Ops[0].Grant = 0 }},
		{"write seq", func(h *History) { h.Ops[1].Seq = 0 }},
		{"write unknown", func(h *History) { h.Ops[1].Outcome = Unknown }},
		{"fault", func(h *History) { h.Faults[0].End = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := History{Ops: append([]Op(nil), h.Ops...), Faults: append([]Fault(nil), h.Faults...)}
			tc.break_(&c)
			if err := c.Validate(); !errors.Is(err, ErrBadHistory) {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
	if _, err := ReadJSON(strings.NewReader(`{"ops":[{"kind":"grab"}]}`)); !errors.Is(err, ErrBadHistory) {
		t.Fatalf("unknown kind: %v", err)
	}
}
