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

// lostInCrashes returns, for every grant of h that one of crashes may have
// lost, the start of the first such crash: a grant invoked before the
// crash ended (it may have been executed before the kill) whose holder
// still believed it held the lock when the crash began.
func lostInCrashes(h History, bs []Belief, crashes []Window) map[int]time.Duration {
	if len(crashes) == 0 {
		return nil
	}
	cs := slices.Clone(crashes)
	slices.SortFunc(cs, func(a, b Window) int { return cmp.Compare(a.Start, b.Start) })
	out := map[int]time.Duration{}
	for _, b := range bs {
		call := h.Ops[b.Grant].Call
		for _, c := range cs {
			if call < c.End && b.End > c.Start {
				out[b.Grant] = c.Start
				break
			}
		}
	}
	return out
}

// excuseCrashes cuts the belief of every grant a crash may have lost at
// that crash's start (the holder goes on believing, but the service holds
// the key for nobody from then on), and clears the Lost mark of a grant
// whose N came after that start. It returns the beliefs and the grants
// the crashes may have lost, each with the start of the crash.
func excuseCrashes(h History, bs []Belief, crashes []Window) ([]Belief, map[int]time.Duration) {
	lost := lostInCrashes(h, bs, crashes)
	if len(lost) == 0 {
		return bs, lost
	}
	out := slices.Clone(bs)
	for i := range out {
		b := &out[i]
		at, ok := lost[b.Grant]
		if !ok {
			continue
		}
		b.End = max(b.Start, min(b.End, at))
		if b.Lost && b.LostAt > at {
			b.Lost = false
		}
	}
	return out, lost
}
