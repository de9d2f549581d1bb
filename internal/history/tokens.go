package history

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Window is a span of a run during which the lock service is allowed to
// break real-time token order between grants it makes inside the span: a
// priority cluster's split brain, from a partition's start until the
// member that became active earlier has stepped down after the heal
// (docs/PROTOCOL.md §6.3).
type Window struct {
	Start, End time.Duration
	Why        string
}

// intersects reports whether w and [call, ret] overlap.
func (w Window) intersects(call, ret time.Duration) bool { return w.Start <= ret && call <= w.End }

// CheckTokens checks the tokens of every granted acquire (outcome OK):
//
//   - every token is unique, across all keys (docs/PROTOCOL.md §5);
//   - tokens increase in real-time order: a grant that completed before
//     another was invoked has the smaller token — across all keys.
//
// A pair of grants that both intersect one of the excused windows is not
// held to the order (uniqueness still holds); such inversions are counted
// in the figure excused_inversions. Pass no windows to check strictly.
func CheckTokens(h History, excused []Window) Result {
	r := Result{Name: "tokens"}
	var grants []Op
	for _, o := range h.Ops {
		if o.Kind == Acquire && o.Outcome == OK {
			grants = append(grants, o)
		}
	}
	r.figure("grants", float64(len(grants)))

	byToken := map[uint64]Op{}
	for _, g := range grants {
		if first, dup := byToken[g.Token]; dup {
			r.violate("token %d granted twice: %s and %s", g.Token, first, g)
			continue
		}
		byToken[g.Token] = g
	}

	// byRet sorts the grants by completion; best[i] is the index (in
	// byRet) of the largest token among byRet[:i+1].
	byRet := slices.Clone(grants)
	slices.SortStableFunc(byRet, func(a, b Op) int { return cmp.Compare(a.Return, b.Return) })
	best := make([]int, len(byRet))
	for i := range byRet {
		best[i] = i
		if i > 0 && byRet[best[i-1]].Token >= byRet[i].Token {
			best[i] = best[i-1]
		}
	}
	// before returns the grant with the largest token among those that
	// completed strictly before t, and whether there is one.
	before := func(t time.Duration) (Op, bool) {
		n := sort.Search(len(byRet), func(i int) bool { return byRet[i].Return >= t })
		if n == 0 {
			return Op{}, false
		}
		return byRet[best[n-1]], true
	}
	excusedCount := 0
	for _, g := range grants {
		// Grants that completed before `from` cannot share an excused
		// window with g: they are held to the order. Those between
		// `from` and g's call all intersect a window g intersects.
		from := g.Call
		for _, w := range excused {
			if w.intersects(g.Call, g.Return) {
				from = min(from, w.Start)
			}
		}
		if p, ok := before(from); ok && p.Token > g.Token {
			r.violate("token order: %s completed before %s was invoked, with a larger token", p, g)
			continue
		}
		if p, ok := before(g.Call); ok && p.Token > g.Token {
			excusedCount++
		}
	}
	r.figure("excused_inversions", float64(excusedCount))
	r.settle(Pass)
	r.Summary = fmt.Sprintf("%d grants, %d distinct tokens; %d violations", len(grants), len(byToken), r.Count)
	if len(excused) > 0 {
		r.Summary += fmt.Sprintf(" (%d inversions inside %d split-brain windows excused)", excusedCount, len(excused))
	}
	return r
}
