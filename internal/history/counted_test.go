package history

import (
	"fmt"
	"strings"
	"testing"
)

// sgrant: worker w took one of limit permits of key with token.
func (b *builder) sgrant(w int, key string, token uint64, limit, call, ret int) int {
	g := b.grant(w, key, token, call, ret)
	b.h.Ops[g].Limit = limit
	return g
}

// cwrite: grant g's holder wrote to the counted resource at t, declaring
// its lease's end (the grant's Expires unless given), accepted or not.
func (b *builder) cwrite(g int, accepted bool, t int, expires ...int) int {
	w := b.write(g, accepted, t)
	b.h.Ops[w].Expires = b.h.Ops[g].Expires
	if len(expires) > 0 {
		b.h.Ops[w].Expires = ms(expires[0])
	}
	return w
}

// leave: grant g's holder told the counted resource it is done, at t.
func (b *builder) leave(g, t int) int {
	gr := b.h.Ops[g]
	b.seq++
	return b.add(Op{Worker: gr.Worker, Kind: Leave, Key: gr.Key, Token: gr.Token, Call: ms(t), Return: ms(t),
		Outcome: OK, Grant: g, Seq: b.seq})
}

// TestCountedChecks: hand-made histories of a semaphore of 2 permits that
// a correct service and resource produce (pass in both modes), that a
// priority failover produces (three holders at once: measured, and
// fencing keeps the newest two), and that a broken service or resource
// produces (fail).
func TestCountedChecks(t *testing.T) {
	type verdicts struct {
		fenced, fencedAssert, overlapAssert Verdict
		counts                              [3]int // violations of the three, in that order
	}
	pass := verdicts{Pass, Pass, Pass, [3]int{}}
	for _, tc := range []struct {
		name  string
		build func(b *builder)
		want  verdicts
		// figures the fenced checker (without assert) must report
		figures map[string]float64
		// a violation text the fenced checker must contain
		mention string
	}{
		{"two holders, a third after a release", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 1, 6)
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
			b.leave(a, 20)
			b.release(a, 21, 22)
			d := b.sgrant(2, "s", 12, 2, 21, 30)
			b.cwrite(d, true, 31)
			b.cwrite(c, true, 32)
		}, pass, map[string]float64{"writes_accepted": 4, "leaves": 1, "evictions": 0, "most_admitted_at_once": 2}, ""},
		{"a lease that ran out frees its place", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 5)
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
			// a's lease ends at 3000 (it stops believing then); a new grant after it
			d := b.sgrant(2, "s", 12, 2, 3001, 3005)
			b.cwrite(d, true, 3006)
		}, pass, map[string]float64{"evictions": 0}, ""},
		{"a paused holder writes late: admitted while there is room, rejected when full", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			b.cwrite(a, true, 10)
			c := b.sgrant(1, "s", 11, 2, 3001, 3005)
			d := b.sgrant(2, "s", 12, 2, 3001, 3005)
			b.cwrite(a, true, 3002) // its lease ended at 3000: late, and room for it
			b.cwrite(c, true, 3010)
			b.cwrite(d, true, 3011)
			b.cwrite(a, false, 3200) // late, and both places taken
		}, pass, map[string]float64{"writes_rejected_late": 1, "writes_rejected_on_time": 0}, ""},
		{"three holders at once (a failover lost a grant): the oldest token is fenced out", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 5)
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
			d := b.sgrant(2, "s", 20, 2, 12, 15) // beyond the limit
			b.cwrite(d, true, 16)                // evicts token 10
			b.cwrite(a, false, 17)               // on time, fenced out
			b.cwrite(c, true, 18)
		}, verdicts{Pass, Violated, Violated, [3]int{0, 2, 1}},
			map[string]float64{"evictions": 1, "writes_rejected_on_time": 1, "most_admitted_at_once": 2}, ""},
		{"a token below the floor is fenced out", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 5)
			x := b.sgrant(3, "s", 9, 2, 0, 5) // an old generation's grant, not yet written
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
			d := b.sgrant(2, "s", 20, 2, 12, 15)
			b.cwrite(d, true, 16) // evicts 10: the floor is 10
			b.leave(c, 17)
			b.cwrite(x, false, 18) // room, but at or below the floor
		}, verdicts{Pass, Violated, Violated, [3]int{0, 2, 1}}, map[string]float64{"writes_rejected_on_time": 1}, ""},
		{"the resource lets a third holder in", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 5)
			d := b.sgrant(2, "s", 20, 2, 0, 5)
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
			b.cwrite(d, true, 12)
			b.cwrite(a, true, 13) // evicted by d: must be rejected
		}, verdicts{Violated, Violated, Violated, [3]int{1, 2, 1}}, nil, "accepted a write the rule rejects"},
		{"the resource turns away a holder with room", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			b.cwrite(a, false, 10)
		}, verdicts{Violated, Violated, Pass, [3]int{1, 2, 0}}, nil, "rejected a write the rule accepts"},
		{"one token, two holders", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 10, 2, 0, 5)
			b.cwrite(a, true, 10)
			b.cwrite(c, true, 11)
		}, verdicts{Violated, Violated, Pass, [3]int{1, 1, 0}}, nil, "two holders"},
		{"a write under a token no acquire granted", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			w := b.cwrite(a, true, 10)
			b.h.Ops[w].Token = 99
		}, verdicts{Violated, Violated, Pass, [3]int{1, 1, 0}}, nil, "no shared acquire"},
		{"a grant lost while its lease surely ran", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			b.op(Renew, a, Fail, DetailNotHeld, 1000, 1001)
		}, verdicts{Pass, Pass, Violated, [3]int{0, 0, 1}}, nil, ""},
		{"exclusive keys are not this checker's", func(b *builder) {
			a := b.grant(0, "m", 10, 0, 5)
			c := b.grant(1, "m", 11, 0, 5)
			b.write(a, true, 10)
			b.write(c, true, 11)
			b.write(a, false, 12)
		}, pass, map[string]float64{"writes_accepted": 0}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			h := b.history(t)
			f := CheckCountedFenced(h, false, nil)
			expect(t, f, tc.want.fenced, tc.want.counts[0])
			expect(t, CheckCountedFenced(h, true, nil), tc.want.fencedAssert, tc.want.counts[1])
			expect(t, CheckCountedOverlap(h, true, nil), tc.want.overlapAssert, tc.want.counts[2])
			if m := CheckCountedOverlap(h, false, nil); m.Verdict != Measured || m.Name != "semaphore-overlap" {
				t.Fatalf("without assert: %s %s, want measured semaphore-overlap", m.Name, m.Verdict)
			}
			for name, want := range tc.figures {
				if got := f.Figures[name]; got != want {
					t.Errorf("figure %s = %v, want %v\n%s", name, got, want, f)
				}
			}
			if tc.mention != "" && !strings.Contains(strings.Join(f.Violations, "\n"), tc.mention) {
				t.Errorf("no violation mentions %q:\n%s", tc.mention, f)
			}
		})
	}
}

// TestCountedOverlapFigures: the most holders at once and how long there
// were more than the limit.
func TestCountedOverlapFigures(t *testing.T) {
	b := newBuilder()
	a := b.sgrant(0, "s", 10, 2, 0, 10)
	c := b.sgrant(1, "s", 11, 2, 0, 20)
	d := b.sgrant(2, "s", 12, 2, 0, 30)
	b.release(a, 50, 51)
	b.release(c, 80, 81)
	b.release(d, 90, 91)
	e := b.sgrant(3, "s", 13, 2, 90, 90) // starts as d's belief ends: no overlap
	b.release(e, 95, 96)
	r := CheckCountedOverlap(b.history(t), true, nil)
	expect(t, r, Violated, 1)
	for name, want := range map[string]float64{"grants": 4, "most_holders_at_once": 3, "beyond_limit_episodes": 1,
		"beyond_limit_total_ms": 20, "beyond_limit_max_ms": 20, "lost_grants": 0} {
		if got := r.Figures[name]; got != want {
			t.Errorf("figure %s = %v, want %v\n%s", name, got, want, r)
		}
	}
}

// TestSelect: a sub-history keeps its keys' operations, renumbered, with
// their grant references mapped, and every fault; SharedKeys names the
// keys taken as shared.
func TestSelect(t *testing.T) {
	b := newBuilder()
	m := b.grant(0, "m", 10, 0, 5)
	s := b.sgrant(1, "s", 11, 3, 0, 5)
	b.write(m, true, 6)
	b.cwrite(s, true, 7)
	b.leave(s, 8)
	b.release(s, 9, 10)
	b.release(m, 9, 10)
	b.h.Faults = []Fault{{Kind: "kill", Start: ms(1), End: ms(2)}}
	h := b.history(t)
	shared := SharedKeys(h)
	if len(shared) != 1 || !shared["s"] {
		t.Fatalf("SharedKeys %v", shared)
	}
	sh := h.Select(func(k string) bool { return shared[k] })
	if err := sh.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(sh.Ops) != 4 || len(sh.Faults) != 1 || sh.Ops[1].Grant != 0 || sh.Ops[3].Kind != Release || sh.Ops[3].Grant != 0 {
		t.Fatalf("shared sub-history %+v", sh)
	}
	ex := h.Select(func(k string) bool { return !shared[k] })
	if err := ex.Validate(); err != nil || len(ex.Ops) != 3 || ex.Ops[2].Grant != 0 {
		t.Fatalf("exclusive sub-history %+v (%v)", ex, err)
	}
	if r := CheckFenced(ex); r.Verdict != Pass {
		t.Fatalf("CheckFenced on the exclusive keys: %s", r)
	}
}

// TestSelectNamesRecordedOps: the checkers name the ops of a selected
// sub-history by their IDs in the recorded history, which is what a
// report's reader has (history.json), not by their new indexes.
func TestSelectNamesRecordedOps(t *testing.T) {
	b := newBuilder()
	m := b.grant(0, "m", 10, 0, 5)
	b.write(m, true, 6)
	b.release(m, 9, 10)
	s := b.sgrant(1, "s", 11, 2, 0, 5)                   // op 3
	r := b.op(Renew, s, Fail, DetailNotHeld, 1000, 1001) // op 4: a lost grant
	h := b.history(t)
	sh := h.Select(func(k string) bool { return k == "s" })
	if sh.Ops[0].ID != 0 || sh.Ops[1].Grant != 0 {
		t.Fatalf("the sub-history is not renumbered: %+v", sh.Ops)
	}
	res := CheckCountedOverlap(sh, true, nil)
	expect(t, res, Violated, 1)
	if v := strings.Join(res.Violations, "\n"); !strings.Contains(v, "(op 3, worker 1)") {
		t.Errorf("violation %q does not name the grant as op %d", v, s)
	}
	if got := sh.Ops[1].String(); !strings.HasPrefix(got, fmt.Sprintf("op %d:", r)) {
		t.Errorf("the renew is %q, want op %d", got, r)
	}
}

// TestValidateLeave: a leave needs a decision order and a grant, and is
// an OK step.
func TestValidateLeave(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(o *Op)
	}{
		{"no seq", func(o *Op) { o.Seq = 0 }},
		{"no grant", func(o *Op) { o.Grant = -1 }},
		{"not ok", func(o *Op) { o.Outcome = Fail }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			s := b.sgrant(0, "s", 11, 3, 0, 5)
			b.leave(s, 8)
			tc.edit(&b.h.Ops[1])
			if err := b.h.Validate(); err == nil {
				t.Fatal("Validate accepted it")
			}
		})
	}
}

// TestCountedExclusionLimit: N holders of a semaphore of N permits whose
// beliefs all overlap pass; one more, in any position, fails the asserted
// checker with one episode, whatever N.
func TestCountedExclusionLimit(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for _, extra := range []bool{false, true} {
			holders := n
			if extra {
				holders++
			}
			for _, last := range []bool{false, true} {
				t.Run(fmt.Sprintf("limit=%d/holders=%d/latecomer-last=%v", n, holders, last), func(t *testing.T) {
					b := newBuilder()
					var gs []int
					for i := range holders {
						// Each believes from 10+i ms; the latecomer (first
						// or last in the history) from 50 ms.
						at := 10 + i
						if (last && i == holders-1) || (!last && i == 0) {
							at = 50
						}
						gs = append(gs, b.sgrant(i, "s", uint64(100+i), n, at-5, at))
					}
					for i, g := range gs {
						b.release(g, 100+i, 101+i)
					}
					r := CheckCountedOverlap(b.history(t), true, nil)
					if !extra {
						expect(t, r, Pass, 0)
						return
					}
					expect(t, r, Violated, 1)
					if r.Figures["most_holders_at_once"] != float64(n+1) || r.Figures["beyond_limit_total_ms"] != 50 {
						t.Fatalf("figures %v, want %d holders at once for 50 ms", r.Figures, n+1)
					}
				})
			}
		}
	}
}

// TestCountedReleaseAnsweredLate: the next holder reads its grant before
// the one it replaces reads its release's answer (the service freed the
// permit and granted it in one step): no overlap, since a holder counts
// until it invokes its release.
func TestCountedReleaseAnsweredLate(t *testing.T) {
	b := newBuilder()
	a := b.sgrant(0, "s", 10, 1, 0, 5)
	c := b.sgrant(1, "s", 11, 1, 6, 60) // queued; granted at a's release
	b.release(a, 50, 70)                // answered after c read its grant
	b.release(c, 80, 81)
	h := b.history(t)
	expect(t, CheckCountedOverlap(h, true, nil), Pass, 0)
}

// TestCrashes: a single node's kill -9 loses its grants (PROTOCOL.md §4);
// the holders it lost may overlap the ones it grants after its restart,
// their N is expected, their tokens may be evicted. With the crash given
// the checkers excuse exactly that; without it, the same history fails.
// Holders granted after the restart are still held to the limit.
func TestCrashes(t *testing.T) {
	crash := []Window{{Start: ms(1000), End: ms(1200), Why: "kill"}}
	type want struct {
		excused, strict Verdict // with the crash given, and without
	}
	for _, tc := range []struct {
		name  string
		build func(b *builder)
		check func(h History, crashes []Window) Result
		want  want
	}{
		{"mutex: a lost holder and the next one", func(b *builder) {
			a := b.grant(0, "m", 10, 0, 5) // believes to 3000
			c := b.grant(1, "m", 5000, 1300, 1310)
			b.op(Renew, a, Fail, DetailNotHeld, 1400, 1401) // lost: N while its lease runs
			b.release(c, 1500, 1501)
		}, func(h History, cs []Window) Result { return CheckOverlap(h, true, cs) }, want{Pass, Violated}},
		{"mutex: an N before the crash is a lost grant still", func(b *builder) {
			a := b.grant(0, "m", 10, 0, 5)
			b.op(Renew, a, Fail, DetailNotHeld, 500, 501)
		}, func(h History, cs []Window) Result { return CheckOverlap(h, true, cs) }, want{Violated, Violated}},
		{"mutex: a release sent before the crash, answered N after the restart", func(b *builder) {
			a := b.grant(0, "m", 10, 0, 5)                   // its lease runs to 3000 at least
			b.op(Release, a, Fail, DetailNotHeld, 100, 1300) // cut off, retried after the restart
		}, func(h History, cs []Window) Result { return CheckOverlap(h, true, cs) }, want{Pass, Violated}},
		{"mutex: a grant after the restart lost", func(b *builder) {
			a := b.grant(0, "m", 10, 1300, 1310)
			b.op(Renew, a, Fail, DetailNotHeld, 1400, 1401)
		}, func(h History, cs []Window) Result { return CheckOverlap(h, true, cs) }, want{Violated, Violated}},
		{"mutex: two holders after the restart", func(b *builder) {
			c := b.grant(1, "m", 5000, 1300, 1310)
			d := b.grant(2, "m", 5001, 1300, 1320)
			b.release(c, 1500, 1501)
			b.release(d, 1500, 1501)
		}, func(h History, cs []Window) Result { return CheckOverlap(h, true, cs) }, want{Violated, Violated}},
		{"semaphore: two lost permits and two new ones", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 6)
			b.cwrite(a, true, 100)
			b.cwrite(c, true, 101)
			d := b.sgrant(2, "s", 5000, 2, 1300, 1310)
			e := b.sgrant(3, "s", 5001, 2, 1300, 1320)
			b.cwrite(d, true, 1330)  // evicts 10
			b.cwrite(a, false, 1340) // on time, fenced out
			b.cwrite(e, true, 1350)  // evicts 11
			b.release(d, 1500, 1501)
			b.release(e, 1500, 1501)
		}, func(h History, cs []Window) Result { return CheckCountedOverlap(h, true, cs) }, want{Pass, Violated}},
		{"semaphore: the fence after the crash", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5)
			c := b.sgrant(1, "s", 11, 2, 0, 6)
			b.cwrite(a, true, 100)
			b.cwrite(c, true, 101)
			d := b.sgrant(2, "s", 5000, 2, 1300, 1310)
			e := b.sgrant(3, "s", 5001, 2, 1300, 1320)
			b.cwrite(d, true, 1330)
			b.cwrite(a, false, 1340)
			b.cwrite(e, true, 1350)
		}, func(h History, cs []Window) Result { return CheckCountedFenced(h, true, cs) }, want{Pass, Violated}},
		{"semaphore: three holders after the restart", func(b *builder) {
			for i := range 3 {
				g := b.sgrant(i, "s", uint64(5000+i), 2, 1300, 1310+i)
				b.release(g, 1500, 1501)
			}
		}, func(h History, cs []Window) Result { return CheckCountedOverlap(h, true, cs) }, want{Violated, Violated}},
		{"semaphore: a permit granted after the restart evicted", func(b *builder) {
			a := b.sgrant(0, "s", 10, 2, 0, 5) // lost in the crash
			b.cwrite(a, true, 100)
			var gs []int
			for i := range 3 {
				gs = append(gs, b.sgrant(1+i, "s", uint64(5000+i), 2, 1300, 1310+i))
			}
			for _, g := range gs {
				b.cwrite(g, true, 1330+g) // the second evicts 10; the third 5000
			}
		}, func(h History, cs []Window) Result { return CheckCountedFenced(h, true, cs) }, want{Violated, Violated}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuilder()
			tc.build(b)
			h := b.history(t)
			if r := tc.check(h, crash); r.Verdict != tc.want.excused {
				t.Errorf("with the crash: %s", r)
			}
			if r := tc.check(h, nil); r.Verdict != tc.want.strict {
				t.Errorf("without: %s", r)
			}
		})
	}
}
