package history

import (
	"cmp"
	"fmt"
	"slices"
)

// CheckFenced checks the fenced resource's decisions, in the order it
// made them (Op.Seq), key by key:
//
//   - it never accepted a write whose token is smaller than one it had
//     accepted before (a stale holder got through);
//   - the writes it accepted under one token all came from one grant (two
//     holders of one key writing at once, which fencing cannot tell apart
//     when the lock service gave them the same token);
//   - every write it accepted carries a token that an acquire of that key
//     was granted (OK), and it rejected no write whose token was at least
//     the largest it had accepted (the resource itself is broken).
//
// Figures: writes accepted and rejected, late writes (made after the
// holder's lease, on purpose) accepted and rejected.
func CheckFenced(h History) Result {
	r := Result{Name: "fenced-safety"}
	var writes []Op
	for _, o := range h.Ops {
		if o.Kind == Write {
			writes = append(writes, o)
		}
	}
	slices.SortFunc(writes, func(a, b Op) int { return cmp.Compare(a.Seq, b.Seq) })
	type owner struct {
		grant, worker int
	}
	largest := map[string]Op{}               // key → the accepted write with the largest token
	holders := map[string]map[uint64]owner{} // key → token → first accepted writer
	var accepted, rejected, lateAccepted, lateRejected int
	for _, w := range writes {
		if w.Outcome != OK {
			rejected++
			if w.Late {
				lateRejected++
			}
			if top, ok := largest[w.Key]; !ok || w.Token >= top.Token {
				r.violate("the resource rejected a write whose token was not stale (largest accepted for %q: %d): %s", w.Key, top.Token, w)
			}
			continue
		}
		accepted++
		if w.Late {
			lateAccepted++
		}
		if top, ok := largest[w.Key]; ok && w.Token < top.Token {
			r.violate("stale write accepted: %s after %s", w, top)
		} else {
			largest[w.Key] = w
		}
		if w.Grant < 0 || w.Grant >= len(h.Ops) || h.Ops[w.Grant].Kind != Acquire || h.Ops[w.Grant].Outcome != OK ||
			h.Ops[w.Grant].Key != w.Key || h.Ops[w.Grant].Token != w.Token {
			r.violate("write accepted under a token no acquire of %q was granted: %s", w.Key, w)
		}
		if holders[w.Key] == nil {
			holders[w.Key] = map[uint64]owner{}
		}
		who := owner{w.Grant, w.Worker}
		if first, ok := holders[w.Key][w.Token]; !ok {
			holders[w.Key][w.Token] = who
		} else if first != who {
			r.violate("writes of two holders accepted under token %d for %q: grant %d (worker %d) and %s",
				w.Token, w.Key, h.ref(first.grant), first.worker, w)
		}
	}
	r.figure("writes_accepted", float64(accepted))
	r.figure("writes_rejected_stale", float64(rejected))
	r.figure("late_writes_accepted", float64(lateAccepted))
	r.figure("late_writes_rejected", float64(lateRejected))
	r.settle(Pass)
	r.Summary = fmt.Sprintf("%d writes accepted, %d rejected as stale; %d violations", accepted, rejected, r.Count)
	return r
}
