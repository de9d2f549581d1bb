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
// semaphore's (raft: asserted; priority: measured).
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
	for _, mode := range []string{"raft", "priority"} {
		cfg := DefaultConfig()
		cfg.Mode = mode
		for name, v := range verdicts(checkHistory(build(2), cfg, t.TempDir())) {
			if v != history.Pass && v != history.Measured && v != history.Skipped {
				t.Errorf("%s, two holders of 2 permits: %s %s", mode, name, v)
			}
		}
		got := verdicts(checkHistory(build(3), cfg, t.TempDir()))
		if mode == "raft" && (got["semaphore-exclusion"] != history.Violated || got["semaphore-fenced"] != history.Violated) {
			t.Errorf("raft, three holders of 2 permits: %v; want semaphore-exclusion and semaphore-fenced failed", got)
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
