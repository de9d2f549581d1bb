package history

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Belief is the span during which the holder of one grant believed it
// held the lock: from the acquire's completion until the first of its
// release's invocation, an N to its renew or release, or the conservative
// end of its lease (Op.Expires, moved by each renew answered K).
type Belief struct {
	Grant      int // the acquire's ID
	Worker     int
	Key        string
	Token      uint64
	Start, End time.Duration
	// Lost: a renew or release of this grant was answered N while its
	// lease could not have ended (before the invocation of its acquire or
	// of its last confirmed renew, plus the lease): the lock service lost
	// the grant.
	Lost bool
	// LostAt is, for a lost grant, when the first such N came back.
	LostAt time.Duration
}

// OverlapStats are the figures of Overlaps.
type OverlapStats struct {
	Grants     int           // granted acquires
	LostGrants int           // grants the service lost (Belief.Lost), the crashes' excused
	CrashLost  int           // grants the crashes may have lost (their beliefs cut at the crash)
	Pairs      int           // pairs of grants of one key whose beliefs overlap
	Total      time.Duration // the overlaps' durations, added up
	Max        time.Duration // the longest overlap
	Examples   []string      // the first few overlapping pairs and lost grants
}

// Beliefs returns every grant's belief span, in acquire order.
func Beliefs(h History) []Belief {
	byGrant := map[int][]Op{}
	for _, o := range h.Ops {
		if (o.Kind == Release || o.Kind == Renew) && o.Grant >= 0 {
			byGrant[o.Grant] = append(byGrant[o.Grant], o)
		}
	}
	var out []Belief
	for _, g := range h.Ops {
		if g.Kind != Acquire || g.Outcome != OK {
			continue
		}
		b := Belief{Grant: g.ID, Worker: g.Worker, Key: g.Key, Token: g.Token, Start: g.Return, End: g.Expires}
		if b.End < b.Start { // no Expires recorded: the lease from the call
			b.End = g.Call + g.Lease
		}
		surely := g.Call + g.Lease // the lease lasts at least until here
		ops := byGrant[g.ID]
		slices.SortStableFunc(ops, func(a, c Op) int { return cmp.Compare(a.Call, c.Call) })
		believing := true
		for _, o := range ops {
			notHeld := o.Outcome == Fail && o.Detail == DetailNotHeld && !h.resent(o)
			if notHeld && o.Return < surely && !b.Lost {
				b.Lost, b.LostAt = true, o.Return
			}
			if !believing {
				continue
			}
			switch {
			case o.Call >= b.End:
				believing = false // the holder had stopped at its lease's end
			case o.Kind == Release:
				b.End = o.Call
				believing = false
			case notHeld:
				b.End = min(b.End, o.Return)
				believing = false
			case o.Kind == Renew && o.Outcome == OK:
				if o.Return > b.End {
					believing = false // the answer came after the holder had stopped
					break
				}
				b.End = max(b.End, o.Expires)
			}
			if o.Kind == Renew && o.Outcome == OK {
				surely = max(surely, o.Call+o.Lease)
			}
		}
		b.End = max(b.End, b.Start)
		out = append(out, b)
	}
	return out
}

// Overlaps measures how often and how long the holders of two grants of
// one key believed they held it at once, and how many grants were lost.
// Against a correct consensus lock service both are zero; a priority
// cluster's split brain and crashes produce them (docs/PROTOCOL.md §6.3).
// A grant one of crashes may have lost (a single node's kill -9, crash.go)
// counts as held only until that crash began.
func Overlaps(h History, crashes []Window) OverlapStats {
	bs, lost := excuseCrashes(h, Beliefs(h), crashes)
	st := OverlapStats{Grants: len(bs), CrashLost: len(lost)}
	const examples = 10
	byKey := map[string][]Belief{}
	for _, b := range bs {
		if b.Lost {
			st.LostGrants++
			if len(st.Examples) < examples {
				st.Examples = append(st.Examples, fmt.Sprintf("lost grant: %q token %d (op %d, worker %d), held from %v",
					b.Key, b.Token, h.ref(b.Grant), b.Worker, b.Start.Round(time.Millisecond)))
			}
		}
		byKey[b.Key] = append(byKey[b.Key], b)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		list := byKey[k]
		slices.SortStableFunc(list, func(a, b Belief) int { return cmp.Compare(a.Start, b.Start) })
		var open []Belief // beliefs that may still overlap the next one
		for _, b := range list {
			keep := open[:0]
			for _, o := range open {
				if o.End > b.Start {
					keep = append(keep, o)
				}
			}
			open = keep
			for _, o := range open {
				d := min(o.End, b.End) - b.Start
				if d <= 0 {
					continue
				}
				st.Pairs++
				st.Total += d
				st.Max = max(st.Max, d)
				if len(st.Examples) < examples {
					st.Examples = append(st.Examples, fmt.Sprintf("overlap %v on %q: token %d (op %d, worker %d) and token %d (op %d, worker %d)",
						d.Round(time.Microsecond), k, o.Token, h.ref(o.Grant), o.Worker, b.Token, h.ref(b.Grant), b.Worker))
				}
			}
			open = append(open, b)
		}
	}
	return st
}

// CheckOverlap reports Overlaps as a Result: with assert, every overlap
// and lost grant is a violation (mutual exclusion, for a consensus
// cluster, or a single node outside its crashes); without, the figures
// are only measured (a priority cluster, where both are the documented
// cost of asynchronous replication).
func CheckOverlap(h History, assert bool, crashes []Window) Result {
	st := Overlaps(h, crashes)
	r := Result{Name: "unfenced-overlap"}
	if assert {
		r.Name = "mutual-exclusion"
	}
	r.figure("grants", float64(st.Grants))
	r.figure("lost_grants", float64(st.LostGrants))
	r.figure("overlapping_pairs", float64(st.Pairs))
	if len(crashes) > 0 {
		r.figure("crash_lost_grants", float64(st.CrashLost))
	}
	r.figure("overlap_total_ms", float64(st.Total.Microseconds())/1000)
	r.figure("overlap_max_ms", float64(st.Max.Microseconds())/1000)
	if assert {
		for _, e := range st.Examples {
			r.violate("%s", e)
		}
		r.Count = st.Pairs + st.LostGrants
		r.settle(Pass)
	} else {
		r.Notes = st.Examples
		r.Verdict = Measured
	}
	r.Summary = fmt.Sprintf("%d grants: %d lost, %d overlapping pairs (%v in all, longest %v)",
		st.Grants, st.LostGrants, st.Pairs, st.Total.Round(time.Microsecond), st.Max.Round(time.Microsecond))
	if len(crashes) > 0 {
		r.Summary += fmt.Sprintf("; %d crashes may have lost %d grants, held until the crash", len(crashes), st.CrashLost)
	}
	return r
}
