package history

import (
	"cmp"
	"slices"
	"time"
)

// Crashes: a lock service that keeps no held lock across a crash — one
// lockd node killed with kill -9 and started again, PROTOCOL.md §4: "A
// crash loses held locks but never tokens" — forgets, at the crash, every
// grant it had made, and grants those keys again after its restart while
// the old holders may still believe they hold them. That overlap is the
// documented cost, not a violation; everything else is still held to the
// rules. A crash is given as a Window: Start before the process was
// killed, End once it was surely gone (or later: a wider window excuses
// more, never less).

// excuseCrashes applies crashes to the beliefs bs of h's grants. A grant
// invoked before a crash ended may have been executed before the kill,
// and so held by the service when it died:
//
//   - if its holder still believed when the crash began, the belief is cut
//     there (the holder goes on believing, but the service holds the key
//     for nobody from then on), and the grant is reported lost, with that
//     crash's start;
//   - an N it got back after the crash began is not a lost grant, whether
//     the holder still believed or had asked to release (a release that
//     could not reach the node before the kill, retried after the restart,
//     finds nothing to release).
//
// It returns the beliefs and the grants whose beliefs were cut.
func excuseCrashes(h History, bs []Belief, crashes []Window) ([]Belief, map[int]time.Duration) {
	if len(crashes) == 0 {
		return bs, nil
	}
	cs := slices.Clone(crashes)
	slices.SortFunc(cs, func(a, b Window) int { return cmp.Compare(a.Start, b.Start) })
	lost := map[int]time.Duration{}
	out := slices.Clone(bs)
	for i := range out {
		b := &out[i]
		call := h.Ops[b.Grant].Call
		for _, c := range cs {
			if call >= c.End {
				continue
			}
			if _, cut := lost[b.Grant]; !cut && b.End > c.Start {
				lost[b.Grant] = c.Start
				b.End = max(b.Start, c.Start)
			}
			if b.Lost && b.LostAt > c.Start {
				b.Lost = false
			}
		}
	}
	return out, lost
}
