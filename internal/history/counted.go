package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Counted holders: a semaphore of N permits (PROTOCOL.md §9.2) has up to N
// holders at once, each with its own token, so the fencing rule of a
// single holder — the resource accepts no token smaller than the largest
// it has accepted — would turn away holders that are all current. A
// counted resource admits at most N tokens at once instead; the rule
// (CountedRule) and its checkers follow.

// SharedKeys returns the keys that some acquire of h took as shared
// (Op.Limit > 0).
func SharedKeys(h History) map[string]bool {
	keys := map[string]bool{}
	for _, o := range h.Ops {
		if o.Kind == Acquire && o.Limit > 0 {
			keys[o.Key] = true
		}
	}
	return keys
}

// Select returns the history of the operations on the keys keep accepts,
// with new IDs and the grant references mapped to them, and every fault:
// the exclusive keys' history for the mutual-exclusion checkers and the
// shared keys' for the counted ones.
func (h History) Select(keep func(key string) bool) History {
	out := History{Faults: slices.Clone(h.Faults)}
	ids := make(map[int]int, len(h.Ops))
	for _, o := range h.Ops {
		if !keep(o.Key) {
			continue
		}
		ids[o.ID] = len(out.Ops)
		o.src = o.ref() + 1
		o.ID = len(out.Ops)
		if o.Grant >= 0 {
			if g, ok := ids[o.Grant]; ok {
				o.Grant = g
			} else {
				o.Grant = -1 // a reference to another key's acquire: not well formed anyway
			}
		}
		out.Ops = append(out.Ops, o)
	}
	return out
}

// CountedRule is the counted resource's rule, given as the state it keeps
// per key and the decision it makes on each write. The resource keeps the
// tokens it has admitted, each with the lease end its holder declared
// with its last write, and a floor. On a write of token t declaring the
// lease end e, decided at instant now:
//
//  1. tokens whose declared lease end has passed are forgotten, and so are
//     those whose holders said they were done (Leave);
//  2. t admitted already: accepted (its lease end is updated);
//  3. t at or below the floor: rejected — a newer generation fenced it out;
//  4. fewer than N tokens admitted: t is admitted, accepted;
//  5. all N taken, the write on time (e ≥ now), and t larger than the
//     smallest admitted token: that token is evicted (the floor rises to
//     it) and t admitted, accepted — the newest N tokens win, as the
//     largest one does for a single holder;
//  6. otherwise rejected.
//
// A correct lock service never makes rule 5 or 6 turn away a write that
// is on time: the admitted tokens' holders and t's would be N+1 holders
// of the key whose leases all ran at one instant. Where a service may
// have more (a priority cluster's grants lost at a failover, PROTOCOL.md
// §6.3), the resource still lets at most N act at once, and the ones it
// turns away are the older tokens: the grants the failover lost are below
// every token the successor grants.
type CountedRule struct {
	Limit int
	in    map[uint64]time.Duration // admitted token → declared lease end
	floor uint64
}

// NewCountedRule returns the rule's empty state for a key of limit N.
func NewCountedRule(limit int) *CountedRule {
	return &CountedRule{Limit: limit, in: map[uint64]time.Duration{}}
}

// Decision is the rule's verdict on one write.
type Decision struct {
	Accept  bool
	Evicted uint64 // rule 5: the token evicted (0: none)
	Why     string // why it was rejected
}

// Decide judges a write of token declaring the lease end expires, at
// instant now, and applies the verdict to the state.
func (c *CountedRule) Decide(token uint64, expires, now time.Duration) Decision {
	c.forgetExpired(now)
	if _, ok := c.in[token]; ok {
		c.in[token] = max(c.in[token], expires)
		return Decision{Accept: true}
	}
	if token <= c.floor {
		return Decision{Why: fmt.Sprintf("at or below the floor %d: a newer generation fenced it out", c.floor)}
	}
	if len(c.in) < c.Limit {
		c.in[token] = expires
		return Decision{Accept: true}
	}
	low := c.smallest()
	if expires < now {
		return Decision{Why: fmt.Sprintf("all %d admitted, and its own lease over", c.Limit)}
	}
	if token < low {
		return Decision{Why: fmt.Sprintf("all %d admitted, every one newer", c.Limit)}
	}
	delete(c.in, low)
	c.floor = max(c.floor, low)
	c.in[token] = expires
	return Decision{Accept: true, Evicted: low}
}

// Leave forgets token: its holder is done.
func (c *CountedRule) Leave(token uint64) { delete(c.in, token) }

// Admitted returns how many tokens are admitted at instant now.
func (c *CountedRule) Admitted(now time.Duration) int {
	c.forgetExpired(now)
	return len(c.in)
}

func (c *CountedRule) forgetExpired(now time.Duration) {
	maps.DeleteFunc(c.in, func(_ uint64, end time.Duration) bool { return end < now })
}

func (c *CountedRule) smallest() uint64 {
	low := uint64(0)
	for t := range c.in {
		if low == 0 || t < low {
			low = t
		}
	}
	return low
}

// CheckCountedFenced checks a counted resource's decisions (the writes and
// leaves of the keys taken as shared, in the resource's decision order,
// Op.Seq), key by key, against CountedRule with the limit of the grant
// each write names:
//
//   - every decision is the rule's (a write accepted that the rule
//     rejects is one holder too many, or a fenced-out one, let through; a
//     write rejected that the rule accepts is a broken resource), so that
//     no more than N tokens whose declared leases ran were ever admitted
//     at once;
//   - the writes accepted under one token all came from one grant;
//   - every write accepted carries the token of a grant of that key taken
//     as shared.
//
// With assert (a consensus cluster, or one node), also: no eviction and
// no write on time rejected — either means the service had more than N
// holders at once. Without it these are figures (a priority cluster).
// The token of a grant one of crashes may have lost (a single node's kill
// -9: crash.go) may be evicted, and its holder's writes on time rejected:
// the service granted its permit again after the restart, with a larger
// token, as PROTOCOL.md §4 and §5 say it does.
func CheckCountedFenced(h History, assert bool, crashes []Window) Result {
	r := Result{Name: "semaphore-fenced"}
	_, lost := excuseCrashes(h, Beliefs(h), crashes)
	var steps []Op
	for _, o := range h.Ops {
		if (o.Kind == Write || o.Kind == Leave) && o.Grant >= 0 && o.Grant < len(h.Ops) && h.Ops[o.Grant].Limit > 0 {
			steps = append(steps, o)
		}
	}
	slices.SortFunc(steps, func(a, b Op) int { return cmp.Compare(a.Seq, b.Seq) })
	type owner struct{ grant, worker int }
	rules := map[string]*CountedRule{}
	holders := map[string]map[uint64]owner{} // key → token → the first accepted writer
	var accepted, rejectedOnTime, rejectedLate, evictions, leaves, most int
	var crashEvictions, crashRejected int
	for _, o := range steps {
		g := h.Ops[o.Grant]
		rule := rules[o.Key]
		if rule == nil {
			rule = NewCountedRule(g.Limit)
			rules[o.Key] = rule
		}
		if o.Kind == Leave {
			rule.Leave(o.Token)
			leaves++
			continue
		}
		onTime := o.Expires >= o.Call
		d := rule.Decide(o.Token, o.Expires, o.Call)
		switch {
		case o.Outcome == OK && !d.Accept:
			r.violate("the resource accepted a write the rule rejects (%s): %s", d.Why, o)
			rule.in[o.Token] = o.Expires // follow what the resource did
		case o.Outcome != OK && d.Accept:
			r.violate("the resource rejected a write the rule accepts (the resource is broken): %s", o)
			delete(rule.in, o.Token)
		}
		most = max(most, len(rule.in))
		if o.Outcome == OK && d.Evicted != 0 {
			evictions++
			// Every admitted token was first admitted by an accepted write.
			first, known := holders[o.Key][d.Evicted]
			if _, excused := lost[first.grant]; known && excused {
				crashEvictions++
			} else if assert {
				r.violate("token %d of %q evicted by %s: more than %d holders at once", d.Evicted, o.Key, o, rule.Limit)
			}
		}
		if o.Outcome != OK {
			if onTime {
				rejectedOnTime++
				if _, excused := lost[o.Grant]; excused {
					crashRejected++
				} else if assert {
					r.violate("a write on time rejected (%s): more than %d holders at once: %s", d.Why, rule.Limit, o)
				}
			} else {
				rejectedLate++
			}
			continue
		}
		accepted++
		if g.Kind != Acquire || g.Outcome != OK || g.Key != o.Key || g.Token != o.Token {
			r.violate("write accepted under a token no shared acquire of %q was granted: %s", o.Key, o)
		}
		if holders[o.Key] == nil {
			holders[o.Key] = map[uint64]owner{}
		}
		who := owner{o.Grant, o.Worker}
		if first, ok := holders[o.Key][o.Token]; !ok {
			holders[o.Key][o.Token] = who
		} else if first != who {
			r.violate("writes of two holders accepted under token %d for %q: grant %d (worker %d) and %s",
				o.Token, o.Key, h.ref(first.grant), first.worker, o)
		}
	}
	r.figure("writes_accepted", float64(accepted))
	r.figure("writes_rejected_on_time", float64(rejectedOnTime))
	r.figure("writes_rejected_late", float64(rejectedLate))
	r.figure("evictions", float64(evictions))
	r.figure("leaves", float64(leaves))
	r.figure("most_admitted_at_once", float64(most))
	if len(crashes) > 0 {
		r.figure("crash_lost_evictions", float64(crashEvictions))
		r.figure("crash_lost_rejected_on_time", float64(crashRejected))
	}
	r.settle(Pass)
	r.Summary = fmt.Sprintf("%d writes accepted, %d rejected (%d on time), %d evictions; %d violations",
		accepted, rejectedOnTime+rejectedLate, rejectedOnTime, evictions, r.Count)
	if len(crashes) > 0 {
		r.Summary += fmt.Sprintf(" (%d evictions and %d rejections on time of grants %d crashes may have lost: allowed)",
			crashEvictions, crashRejected, len(crashes))
	}
	return r
}

// CheckCountedOverlap measures, for the keys taken as shared, how often
// and how long more holders than the key's limit believed at once that
// they held it (a belief as Beliefs says: from the grant's answer until
// the release's invocation, an N, or the lease's conservative end), and
// the grants lost. With assert every such moment and every lost grant is
// a violation (a consensus cluster, or one node); without, they are
// measured (a priority cluster, where both are the documented cost of
// asynchronous replication). A grant one of crashes may have lost counts
// as held only until that crash began (crash.go).
//
// A holder counts until it invokes its release, not until the release is
// answered: the service frees the permit and grants it to the next waiter
// in one step, and the new holder may read its grant before the old one
// reads its release's answer, on a correct service. An indeterminate
// acquire is no holder (the client never learned a token to act under);
// an indeterminate renew moves nothing.
func CheckCountedOverlap(h History, assert bool, crashes []Window) Result {
	r := Result{Name: "semaphore-overlap"}
	if assert {
		r.Name = "semaphore-exclusion"
	}
	type edge struct {
		at    time.Duration
		delta int
		b     Belief
	}
	byKey := map[string][]edge{}
	limit := map[string]int{}
	grants, lost := 0, 0
	const examples = 10
	var notes []string
	bs, crashLost := excuseCrashes(h, Beliefs(h), crashes)
	for _, b := range bs {
		n := h.Ops[b.Grant].Limit
		if n <= 0 {
			continue
		}
		grants++
		if l, ok := limit[b.Key]; !ok || n < l {
			limit[b.Key] = n
		}
		if b.Lost {
			lost++
			if len(notes) < examples {
				notes = append(notes, fmt.Sprintf("lost grant: %q token %d (op %d, worker %d), held from %v",
					b.Key, b.Token, h.ref(b.Grant), b.Worker, b.Start.Round(time.Millisecond)))
			}
		}
		if b.End > b.Start {
			byKey[b.Key] = append(byKey[b.Key], edge{b.Start, +1, b}, edge{b.End, -1, b})
		}
	}
	episodes, most := 0, 0
	var total, longest time.Duration
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		es := byKey[key]
		// At one instant a belief that ends goes before one that starts:
		// touching spans do not overlap.
		slices.SortStableFunc(es, func(a, b edge) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return cmp.Compare(a.delta, b.delta)
		})
		n, over := 0, time.Duration(-1)
		open := map[int]Belief{}
		for _, e := range es {
			n += e.delta
			if e.delta > 0 {
				open[e.b.Grant] = e.b
			} else {
				delete(open, e.b.Grant)
			}
			most = max(most, n)
			switch {
			case n > limit[key] && over < 0:
				over = e.at
				episodes++
				if len(notes) < examples {
					var toks []uint64
					for _, b := range open {
						toks = append(toks, b.Token)
					}
					slices.Sort(toks)
					notes = append(notes, fmt.Sprintf("%d holders of %q (limit %d) at %v: tokens %v", n, key, limit[key], e.at.Round(time.Microsecond), toks))
				}
			case n <= limit[key] && over >= 0:
				d := e.at - over
				total += d
				longest = max(longest, d)
				over = -1
			}
		}
	}
	r.figure("grants", float64(grants))
	r.figure("lost_grants", float64(lost))
	r.figure("most_holders_at_once", float64(most))
	r.figure("beyond_limit_episodes", float64(episodes))
	r.figure("beyond_limit_total_ms", float64(total.Microseconds())/1000)
	r.figure("beyond_limit_max_ms", float64(longest.Microseconds())/1000)
	if len(crashes) > 0 {
		n := 0
		for g := range crashLost {
			if h.Ops[g].Limit > 0 {
				n++
			}
		}
		r.figure("crash_lost_grants", float64(n))
	}
	if assert {
		for _, e := range notes {
			r.violate("%s", e)
		}
		r.Count = episodes + lost
		r.settle(Pass)
	} else {
		r.Notes = notes
		r.Verdict = Measured
	}
	r.Summary = fmt.Sprintf("%d shared grants: %d lost, more holders than the limit %d times (%v in all, longest %v), at most %d at once",
		grants, lost, episodes, total.Round(time.Microsecond), longest.Round(time.Microsecond), most)
	return r
}
