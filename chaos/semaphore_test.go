package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/history"
)

// TestCountedFenceFollowsTheRule: the resource's counted fence and the
// checker's statement of the rule (history.CountedRule) decide every
// write alike, over random sequences of writes on time and late, with
// leaves, expiries and more holders than the limit.
func TestCountedFenceFollowsTheRule(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		limit := 1 + rng.IntN(3)
		fence := &countedKey{limit: limit, tokens: map[uint64]time.Duration{}}
		rule := history.NewCountedRule(limit)
		now := time.Duration(0)
		for step := range 300 {
			now += time.Duration(rng.IntN(40)) * time.Millisecond
			token := uint64(1 + rng.IntN(30))
			if rng.IntN(6) == 0 {
				delete(fence.tokens, token)
				rule.Leave(token)
				continue
			}
			expires := now + time.Duration(rng.IntN(400)-100)*time.Millisecond // some already over: late
			got := fence.admit(token, expires, now)
			want := rule.Decide(token, expires, now)
			if got != want.Accept {
				t.Fatalf("seed %d step %d: token %d (lease end %v) at %v: the fence says %v, the rule %v (%s)",
					seed, step, token, expires, now, got, want.Accept, want.Why)
			}
			running := 0 // the fence's admitted tokens whose lease has not ended
			for _, end := range fence.tokens {
				if end >= now {
					running++
				}
			}
			if n := rule.Admitted(now); running != n || n > limit {
				t.Fatalf("seed %d step %d: the fence admits %d, the rule %d, limit %d", seed, step, running, n, limit)
			}
		}
	}
}

// TestCheckHistorySplitsKeys: the mutex checkers see only the exclusive
// keys and the counted ones only the shared keys, so two holders of a
// semaphore of 2 permits pass every checker, and three fail the
// semaphore's (raft and single: asserted; priority: measured).
func TestCheckHistorySplitsKeys(t *testing.T) {
	build := func(holders int) history.History {
		var h history.History
		add := func(o history.Op) int {
			o.ID = len(h.Ops)
			h.Ops = append(h.Ops, o)
			return o.ID
		}
		lease := 3 * time.Second
		ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
		seq := uint64(0)
		grant := func(w int, key string, token uint64, limit, at int) int {
			return add(history.Op{Worker: w, Kind: history.Acquire, Key: key, Token: token, Lease: lease, Limit: limit,
				Call: ms(at), Return: ms(at + 1), Outcome: history.OK, Expires: ms(at) + lease, Grant: -1})
		}
		write := func(g, at int) {
			seq++
			o := h.Ops[g]
			add(history.Op{Worker: o.Worker, Kind: history.Write, Key: o.Key, Token: o.Token, Call: ms(at), Return: ms(at),
				Outcome: history.OK, Grant: g, Seq: seq, Expires: o.Expires})
		}
		done := func(g, at int) {
			o := h.Ops[g]
			if o.Limit > 0 {
				seq++
				add(history.Op{Worker: o.Worker, Kind: history.Leave, Key: o.Key, Token: o.Token, Call: ms(at), Return: ms(at),
					Outcome: history.OK, Grant: g, Seq: seq})
			}
			add(history.Op{Worker: o.Worker, Kind: history.Release, Key: o.Key, Token: o.Token, Call: ms(at), Return: ms(at + 1),
				Outcome: history.OK, Grant: g})
		}
		m := grant(0, "chaos/0", 1, 0, 0)
		write(m, 5)
		done(m, 10)
		var gs []int
		for i := range holders {
			gs = append(gs, grant(1+i, "chaos/sem/0", uint64(10+i), 2, 20))
		}
		for i, g := range gs {
			write(g, 30+i)
		}
		for i, g := range gs {
			done(g, 100+i)
		}
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		return h
	}
	verdicts := func(rs []history.Result) map[string]history.Verdict {
		out := map[string]history.Verdict{}
		for _, r := range rs {
			out[r.Name] = r.Verdict
		}
		return out
	}
	for _, mode := range []string{"raft", "single", "priority"} {
		cfg := DefaultConfig()
		cfg.Mode = mode
		for name, v := range verdicts(checkHistory(build(2), cfg, t.TempDir())) {
			if v != history.Pass && v != history.Measured && v != history.Skipped {
				t.Errorf("%s, two holders of 2 permits: %s %s", mode, name, v)
			}
		}
		got := verdicts(checkHistory(build(3), cfg, t.TempDir()))
		if mode != "priority" && (got["semaphore-exclusion"] != history.Violated || got["semaphore-fenced"] != history.Violated) {
			t.Errorf("%s, three holders of 2 permits: %v; want semaphore-exclusion and semaphore-fenced failed", mode, got)
		}
		if mode == "priority" && (got["semaphore-overlap"] != history.Measured || got["semaphore-fenced"] != history.Pass) {
			t.Errorf("priority, three holders of 2 permits: %v; want the overlap measured and the fence passed", got)
		}
		for _, name := range []string{"fenced-safety", "tokens"} {
			if got[name] != history.Pass {
				t.Errorf("%s: %s %s; the mutex checkers must not see the semaphore's holders", mode, name, got[name])
			}
		}
	}
}

// TestCheckHistorySingleCrash: a single node's kill -9 loses its grants
// (PROTOCOL.md §4): the holders it lost believe on while it grants their
// keys again after its restart. Single mode excuses exactly that — in a
// history with the kill, mutual exclusion and the semaphore's limit pass
// (linearizability is skipped); raft, which may lose nothing, fails the
// same history. Holders granted after the restart beyond the limit fail
// single mode too, and a single-mode history without a crash is checked
// for linearizability.
func TestCheckHistorySingleCrash(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	lease := 3 * time.Second
	build := func(kill bool, after int) history.History {
		var h history.History
		add := func(o history.Op) int {
			o.ID = len(h.Ops)
			h.Ops = append(h.Ops, o)
			return o.ID
		}
		seq := uint64(0)
		grant := func(w int, key string, token uint64, limit, at int) int {
			return add(history.Op{Worker: w, Kind: history.Acquire, Key: key, Token: token, Lease: lease, Limit: limit,
				Call: ms(at), Return: ms(at + 1), Outcome: history.OK, Expires: ms(at) + lease, Grant: -1})
		}
		write := func(g, at int, ok bool) {
			seq++
			o := h.Ops[g]
			w := history.Op{Worker: o.Worker, Kind: history.Write, Key: o.Key, Token: o.Token, Call: ms(at), Return: ms(at),
				Outcome: history.OK, Grant: g, Seq: seq, Expires: o.Expires}
			if !ok {
				w.Outcome, w.Detail = history.Fail, history.DetailStale
			}
			add(w)
		}
		// Before the kill at 1000 ms: a mutex holder and two permits.
		m := grant(0, "chaos/0", 10, 0, 0)
		a := grant(1, "chaos/sem/0", 11, 2, 0)
		b := grant(2, "chaos/sem/0", 12, 2, 0)
		write(m, 100, true)
		write(a, 100, true)
		write(b, 100, true)
		if kill {
			h.Faults = append(h.Faults, history.Fault{Kind: FaultKill, Target: "member 0", Start: ms(1000), End: ms(1500)})
		}
		// After the restart: the mutex key and `after` permits granted
		// again with larger tokens, while the old holders believe on.
		m2 := grant(3, "chaos/0", 5000, 0, 1600)
		write(m2, 1700, true)
		write(m, 1710, false) // the lost holder, fenced out
		for i := range after {
			g := grant(4+i, "chaos/sem/0", uint64(5001+i), 2, 1600)
			write(g, 1700+i, true) // evicts a lost permit's token
		}
		add(history.Op{Worker: 0, Kind: history.Renew, Key: "chaos/0", Token: 10, Lease: lease, Call: ms(1800), Return: ms(1801),
			Outcome: history.Fail, Detail: history.DetailNotHeld, Grant: m})
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		return h
	}
	verdicts := func(mode string, h history.History) map[string]history.Verdict {
		cfg := DefaultConfig()
		cfg.Mode = mode
		out := map[string]history.Verdict{}
		for _, r := range checkHistory(h, cfg, t.TempDir()) {
			out[r.Name] = r.Verdict
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		mode  string
		kill  bool
		after int
		want  map[string]history.Verdict
	}{
		{"single, a kill", "single", true, 2, map[string]history.Verdict{"fenced-safety": history.Pass, "tokens": history.Pass,
			"linearizability": history.Skipped, "mutual-exclusion": history.Pass, "semaphore-fenced": history.Pass, "semaphore-exclusion": history.Pass}},
		{"raft, the same history", "raft", true, 2, map[string]history.Verdict{"mutual-exclusion": history.Violated,
			"semaphore-fenced": history.Violated, "semaphore-exclusion": history.Violated}},
		{"single, no kill", "single", false, 2, map[string]history.Verdict{"linearizability": history.Violated,
			"mutual-exclusion": history.Violated, "semaphore-exclusion": history.Violated}},
		{"single, a kill, three permits after the restart", "single", true, 3, map[string]history.Verdict{
			"mutual-exclusion": history.Pass, "semaphore-fenced": history.Violated, "semaphore-exclusion": history.Violated}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdicts(tc.mode, build(tc.kill, tc.after))
			for name, v := range tc.want {
				if got[name] != v {
					t.Errorf("%s: %s, want %s (all: %v)", name, got[name], v, got)
				}
			}
		})
	}
}

// TestCrashWindows: a single-node run's kills and unexpected exits are its
// crash windows, from the fault's start to its end; other faults are not.
func TestCrashWindows(t *testing.T) {
	s := time.Second
	h := history.History{Faults: []history.Fault{
		{Kind: FaultKill, Start: 1 * s, End: 2 * s},
		{Kind: FaultStop, Start: 3 * s, End: 5 * s},
		{Kind: FaultHandover, Start: 6 * s, End: 7 * s},
		{Kind: faultCrash, Start: 8 * s, End: 9 * s},
	}}
	w := crashWindows(h)
	if len(w) != 2 || w[0].Start != s || w[0].End != 2*s || w[1].Start != 8*s || w[1].End != 9*s {
		t.Fatalf("windows %+v, want the kill's and the crash's", w)
	}
}
