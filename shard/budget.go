package shard

import "sync/atomic"

// The table-wide bounds — Config.MaxKeys, MaxWaiters and MaxHolders — are
// counted per shard, so that a request writes nothing that every request
// writes (with a counter per table, each acquire and release of a new key
// wrote one cache line that every event loop also wrote: at 8 loops that
// line was 14 % of lockd's CPU, docs/DESIGN.md "What a request writes").
//
// Each bound is a budget of units (max of them). A shard takes units from
// it in batches and keeps what it does not use as credit; a unit in use is
// counted in the shard (quota.used, under its lock: Stats sums them), and
// a unit given back returns to the shard's credit, which goes back to the
// budget only beyond two batches. So the steady state — a key acquired and
// released, a waiter queued and handed the key — moves units between a
// shard's own count and its own credit, and the budget's line is only
// read (give checks whether the bound is near).
//
// Exactness. taken counts every unit in use or held as credit, and never
// exceeds max: more than max units are never in use. A request is refused
// (Busy) only when no unit can be had after every shard's credit was taken
// back (reclaim) — so only when, at that moment, every unit is in use or in
// a credit that a request on another shard took after the reclaim. Near
// the bound (fewer than near units left) shards take one unit at a time and
// give back every unit they free at once, so such a credit is that other
// request's own unit: the bound is exact up to the requests in flight on
// other shards, as it was with one counter (a release on another shard a
// moment after a refusal makes the same difference). docs/PROTOCOL.md,
// decision 68.
type budget struct {
	taken atomic.Int64 // units in use or held as credit by the shards; ≤ max
	max   int64
	batch int64 // units taken or given back at once while far from max
	near  int64 // fewer than this left: one unit at a time, no credit kept
	// writes counts the changes of taken: none in the steady state
	// (TestBudgetSteadyState).
	writes atomic.Int64
	_      [24]byte
}

// The budgets of a table, by index into Table.budgets and shard.quota.
const (
	budgetKeys    = iota // MaxKeys: held keys (a shared key counts once)
	budgetWaiters        // MaxWaiters: queued acquires
	budgetHolders        // MaxHolders: further holders of shared keys
	nBudgets
)

// budgetBatch is what a shard takes from a budget at once far from its
// bound. Its credit is at most twice that, so the credit parked over all
// shards is at most 2 × budgetBatch × shards units, all taken back when a
// request would otherwise be refused.
const budgetBatch = 32

// quota is one shard's part of a budget.
type quota struct {
	used int64 // units in use in this shard (s.mu)
	// credit is taken from the budget and not in use. Only the shard (under
	// its lock) adds to it or spends it; reclaim, from any shard, takes it
	// all back.
	credit atomic.Int64
}

// init sets b up for a bound of max units over shards shards.
func (b *budget) init(max int64, shards int) {
	b.max = max
	b.batch = budgetBatch
	b.near = 2 * budgetBatch * int64(shards)
}

// grab takes units from b: a batch far from the bound, else one; 0 when
// none is left.
func (b *budget) grab() int64 {
	for {
		v := b.taken.Load()
		room := b.max - v
		if room <= 0 {
			return 0
		}
		n := int64(1)
		if room > b.near {
			n = b.batch
		}
		if b.taken.CompareAndSwap(v, v+n) {
			b.writes.Add(1)
			return n
		}
	}
}

// take counts one unit of budget k as used in s (s.mu held), or reports
// false if the bound is reached.
func (s *shard) take(k int) bool {
	q := &s.quota[k]
	if c := q.credit.Load(); c > 0 && q.credit.CompareAndSwap(c, c-1) {
		q.used++
		return true
	}
	return s.takeSlow(k)
}

// takeSlow is take with no credit left: units from the budget, and if it
// has none, every shard's credit taken back first.
func (s *shard) takeSlow(k int) bool {
	b := &s.t.budgets[k]
	n := b.grab()
	if n == 0 {
		s.t.reclaim(k)
		if n = b.grab(); n == 0 {
			return false
		}
	}
	q := &s.quota[k]
	if n > 1 {
		q.credit.Add(n - 1)
	}
	q.used++
	return true
}

// give counts one unit of budget k as no longer used in s (s.mu held). It
// goes to s's credit; beyond two batches, or near the bound, the credit
// goes back to the budget.
func (s *shard) give(k int) {
	q := &s.quota[k]
	q.used--
	c := q.credit.Add(1)
	b := &s.t.budgets[k]
	keep := b.batch
	if b.taken.Load() > b.max-b.near {
		keep = 0
	} else if c <= 2*b.batch {
		return
	}
	// A reclaim may have taken the credit meanwhile: then it went back.
	if q.credit.CompareAndSwap(c, keep) {
		b.taken.Add(keep - c)
		b.writes.Add(1)
	}
}

// reclaim takes every shard's credit of budget k back to the budget (a
// request found it exhausted). Each shard's credit is an atomic: no shard
// lock is taken, so a shard may call it under its own.
func (t *Table) reclaim(k int) {
	var n int64
	for i := range t.shards {
		if c := &t.shards[i].quota[k].credit; c.Load() > 0 {
			n += c.Swap(0)
		}
	}
	if n != 0 {
		t.budgets[k].taken.Add(-n)
		t.budgets[k].writes.Add(1)
	}
}
