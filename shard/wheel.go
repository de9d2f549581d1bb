package shard

// wheel is a shard's hashed timer wheel. Slot i holds the timers whose
// deadline falls in a tick t with t mod len == i (tick = deadline / Config.Tick,
// rounded down); a deadline more than one rotation away simply stays in its
// slot for extra rotations. Lease timers (entries) and wait timers (waiters)
// have separate slot lists so each intrusive list has one element type; both
// are doubly-linked lists (entries linked by ref, ended by ref 0, the first
// entry's back link its slot | headMark; waiters by pointer, nil-terminated),
// so add and remove are O(1) and a renew is a remove plus an add.
//
// Invariant: every timer sits in a slot whose tick is ≥ cur (deadlines
// already in the past are filed under cur), and advance visits every tick
// from cur to the current one, so a deadline fires at the first advance with
// now ≥ deadline: never early, and at most one tick late when advance runs
// every tick. Every held entry is in the wheel between Table calls.
type wheel struct {
	tick    int64 // resolution in ns
	mask    uint64
	cur     int64 // last tick visited by advance
	started bool  // advance has run at least once (cur is meaningful)
	leases  []ref // heads of the entries' lists (0: empty)
	waits   []*waiter
}

func (w *wheel) init(tick int64, slots int) {
	w.tick = tick
	w.mask = uint64(slots - 1)
	w.leases = make([]ref, slots)
	w.waits = make([]*waiter, slots)
}

// floorDiv is a/b rounded towards minus infinity (the caller's clock may be
// negative).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// slot returns the slot index for deadline d.
func (w *wheel) slot(d int64) uint16 {
	t := floorDiv(d, w.tick)
	if w.started && t < w.cur {
		t = w.cur
	}
	return uint16(uint64(t) & w.mask)
}

// addLease files the entry r (e) under its deadline, at the head of its
// slot's list: the head's tprev is headMark | its slot, so that removing
// it needs no slot field.
func (s *shard) addLease(r ref, e *entry) {
	w := &s.wheel
	sl := ref(w.slot(e.deadline))
	e.tprev = headMark | sl
	e.tnext = w.leases[sl]
	if e.tnext != 0 {
		s.ent(e.tnext).tprev = r
	}
	w.leases[sl] = r
}

// delLease takes e out of its wheel slot.
func (s *shard) delLease(e *entry) {
	if p := e.tprev; p&headMark != 0 {
		s.wheel.leases[p&^headMark] = e.tnext
	} else {
		s.ent(p).tnext = e.tnext
	}
	if e.tnext != 0 {
		s.ent(e.tnext).tprev = e.tprev
	}
	e.tnext, e.tprev = 0, 0
}

func (w *wheel) addWait(x *waiter) {
	s := w.slot(x.deadline)
	x.slot = s
	x.tprev = nil
	x.tnext = w.waits[s]
	if x.tnext != nil {
		x.tnext.tprev = x
	}
	w.waits[s] = x
}

func (w *wheel) delWait(x *waiter) {
	if x.tprev != nil {
		x.tprev.tnext = x.tnext
	} else {
		w.waits[x.slot] = x.tnext
	}
	if x.tnext != nil {
		x.tnext.tprev = x.tprev
	}
	x.tnext, x.tprev = nil, nil
}

// span returns the ticks advance must visit for now: from..to inclusive.
// It covers at most one rotation (that visits every slot), and before the
// first advance a whole rotation (timers filed before the wheel started).
func (w *wheel) span(now int64) (from, to int64) {
	to = floorDiv(now, w.tick)
	from = w.cur
	if !w.started || to-from >= int64(len(w.leases)) {
		from = to - int64(len(w.leases)) + 1
	}
	if to < from { // the clock went back: just look at the current slot
		from = to
	}
	return from, to
}

// done records that advance visited every tick up to to.
func (w *wheel) done(to int64) {
	if !w.started || to > w.cur {
		w.cur = to
		w.started = true
	}
}
