package history

// A Release that a client library resends (the Go client's Release tries
// again across connections for Config.ReleaseRetry) can be answered N
// because its first attempt was executed and only its answer was lost: a
// connection reset, answers dropped by a one-way partition, a member that
// stopped after executing it. That N says nothing about the grant, so a
// Release answered N while a fault was in force is taken as unknown — it
// may have released the grant at any moment after its call — rather than
// as a grant the service lost. An N outside every fault window still
// counts in full.

// resent reports whether o is a Release answered N whose call and answer
// straddle part of a fault window, so that an earlier attempt of it may
// have been executed.
func (h History) resent(o Op) bool {
	if o.Kind != Release || o.Outcome != Fail || o.Detail != DetailNotHeld {
		return false
	}
	for _, f := range h.Faults {
		if f.Start <= o.Return && o.Call <= f.End {
			return true
		}
	}
	return false
}
