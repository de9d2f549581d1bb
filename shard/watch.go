package shard

// Watches (PROTOCOL.md §9.4). A watch is a pooled waiter with watch set,
// linked to its Conn (which bounds them, Config.MaxWatchesPerConn, and
// drops them with DropConn) and to the chain of the watches of its token in
// the shard's watch index (token → first watch). It names the entry that
// holds the watched grant (e), so that EndWatches finds its key; move and
// promote repoint it.
//
// Every way a grant ends — release (ReasonReleased or, by an admin
// identity of another's grant or the admin endpoint, ReasonForced),
// expiry (ReasonExpired, or ReasonForced after an admin renewed it),
// EndWatches (ReasonCannotTell), a replicated or restored grant replacing
// it, Reset — goes through ended, which hands each of its watches one
// EffectLost and forgets them: exactly one per watch. A table with no
// watch pays one count check per ended grant (hooked).

// watchIndex maps a token to the first watch of its chain: open addressing
// with linear probing on mixToken, backward-shift deletion, doubling above
// 3/4 load and halving below 1/8, as index does. It is made at the first
// watch and never shrinks below minIndex slots.
type watchIndex struct {
	slots []wslot
	mask  uint64
	n     int
}

type wslot struct {
	token uint64
	w     *waiter // nil: empty
}

// find returns the position of token's slot, or -1.
func (x *watchIndex) find(token uint64) int {
	if x.n == 0 {
		return -1
	}
	for i := mixToken(token) & x.mask; ; i = (i + 1) & x.mask {
		sl := &x.slots[i]
		if sl.w == nil {
			return -1
		}
		if sl.token == token {
			return int(i)
		}
	}
}

// insert adds token (absent) with its first watch w.
func (x *watchIndex) insert(token uint64, w *waiter) {
	if x.slots == nil {
		x.resize(minIndex)
	} else if (x.n+1)*4 > len(x.slots)*3 {
		x.resize(len(x.slots) * 2)
	}
	x.put(wslot{token, w})
	x.n++
}

func (x *watchIndex) put(sl wslot) {
	i := mixToken(sl.token) & x.mask
	for x.slots[i].w != nil {
		i = (i + 1) & x.mask
	}
	x.slots[i] = sl
}

// remove deletes the slot at i.
func (x *watchIndex) remove(i uint64) {
	for j := (i + 1) & x.mask; x.slots[j].w != nil; j = (j + 1) & x.mask {
		home := mixToken(x.slots[j].token) & x.mask
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = wslot{}
	x.n--
	if len(x.slots) > minIndex && x.n*8 < len(x.slots) {
		size := len(x.slots) / 2
		for size > minIndex && x.n*2 < size/2 {
			size /= 2
		}
		x.resize(size)
	}
}

func (x *watchIndex) resize(size int) {
	old := x.slots
	x.slots = make([]wslot, size)
	x.mask = uint64(size - 1)
	for _, sl := range old {
		if sl.w != nil {
			x.put(sl)
		}
	}
}

// watch registers a watch of the holder x (xe) of a key for c. It reports
// false if c was dropped or has Config.MaxWatchesPerConn watches.
func (s *shard) watch(x ref, xe *entry, c *Conn) bool {
	w := s.newWaiter()
	w.watch, w.owner, w.e, w.conn = true, xe.token, x, c
	if c != nil && !c.linkWatch(w, s.t.maxWatchesPerConn) {
		s.freeWaiter(w)
		return false
	}
	if i := s.watches.find(xe.token); i >= 0 {
		// At the head of the chain: the newest first (the order of the Ls
		// of one grant is not specified).
		sl := &s.watches.slots[i]
		w.next = sl.w
		sl.w.prev = w
		sl.w = w
	} else {
		s.watches.insert(xe.token, w)
	}
	s.nwatch++
	s.hooks++
	return true
}

// ended runs what the end of the grant token of key owes besides its
// record: an admin's renew turns an expiry into ReasonForced, and each
// watch of the grant gets its EffectLost. Call it when hooked.
func (s *shard) ended(token uint64, key []byte, reason Reason, out *Out) {
	if s.unmarkForced(token) && reason == ReasonExpired {
		reason = ReasonForced
	}
	if s.nwatch != 0 {
		s.fire(token, key, reason, out)
	}
}

// endedQuietly is ended with ReasonCannotTell for a grant that a
// replicated or restored grant replaces, or that leaves with its key; with
// a nil out its watches go without an effect.
func (s *shard) endedQuietly(token uint64, key []byte, out *Out) {
	if !s.hooked() {
		return
	}
	if out != nil {
		s.ended(token, key, ReasonCannotTell, out)
		return
	}
	s.unmarkForced(token)
	if i := s.watches.find(token); i >= 0 {
		w := s.watches.slots[i].w
		s.watches.remove(uint64(i))
		for w != nil {
			next := w.next
			s.forget(w)
			w = next
		}
	}
}

// fire gives every watch of token its EffectLost and forgets them.
func (s *shard) fire(token uint64, key []byte, reason Reason, out *Out) {
	i := s.watches.find(token)
	if i < 0 {
		return
	}
	w := s.watches.slots[i].w
	s.watches.remove(uint64(i))
	for w != nil {
		next := w.next
		out.addLost(w, token, key, reason)
		s.ctr.Lost[reason]++
		s.forget(w)
		w = next
	}
}

// forget unlinks the watch w (out of its chain already) from its Conn and
// frees it.
func (s *shard) forget(w *waiter) {
	w.next, w.prev = nil, nil
	if w.conn != nil {
		w.conn.unlink(w) // bumps gen under conn.mu
	} else {
		w.gen++
	}
	s.nwatch--
	s.hooks--
	s.freeWaiter(w)
}

// unwatch removes the watch w from its chain and forgets it, without an
// effect (its connection is gone: DropWaiters).
func (s *shard) unwatch(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
		if w.next != nil {
			w.next.prev = w.prev
		}
	} else {
		i := s.watches.find(w.owner)
		if w.next != nil {
			w.next.prev = nil
			s.watches.slots[i].w = w.next
		} else {
			s.watches.remove(uint64(i))
		}
	}
	s.forget(w)
}

// repointWatches makes the watches of token name the entry r (the grant
// moved there).
func (s *shard) repointWatches(token uint64, r ref) {
	if i := s.watches.find(token); i >= 0 {
		for w := s.watches.slots[i].w; w != nil; w = w.next {
			w.e = r
		}
	}
}

// endWatches gives every watch of the shard an EffectLost with
// ReasonCannotTell and forgets them.
func (s *shard) endWatches(out *Out) {
	if s.nwatch == 0 {
		return
	}
	for i := range s.watches.slots {
		sl := &s.watches.slots[i]
		if sl.w == nil {
			continue
		}
		e := s.ent(sl.w.e)
		if e.kl == klHolder {
			e = s.ent(s.queues[e.q-1].e)
		}
		key := s.keyOf(e)
		for w := sl.w; w != nil; {
			next := w.next
			out.addLost(w, sl.token, key, ReasonCannotTell)
			s.ctr.Lost[ReasonCannotTell]++
			s.forget(w)
			w = next
		}
		*sl = wslot{}
	}
	s.watches.n = 0
}

// markForced notes that an admin renewed another identity's grant token:
// if its lease ends, the reason is ReasonForced.
func (s *shard) markForced(token uint64) {
	if s.forced == nil {
		s.forced = make(map[uint64]struct{})
	}
	if _, ok := s.forced[token]; !ok {
		s.forced[token] = struct{}{}
		s.hooks++
	}
}

// unmarkForced forgets token's mark, if any, and reports whether it had
// one.
func (s *shard) unmarkForced(token uint64) bool {
	if len(s.forced) == 0 {
		return false
	}
	if _, ok := s.forced[token]; !ok {
		return false
	}
	delete(s.forced, token)
	s.hooks--
	return true
}
