package client

// pendTable maps a request id (owner, token or nonce) to the oldest
// request awaiting an answer with that id; requests with equal ids are
// chained through Ticket.next, in send order. It is an open-addressing
// table with linear probing and backward-shift deletion (no tombstones),
// kept at most half full.
//
// A Go map cost about 95 ns per request (lookup and insert when sent,
// lookup and delete when answered) with a few hundred requests in flight;
// this table costs a fraction of that, and the client does it twice per
// round trip on the hot path.
type pendTable struct {
	slots []pendSlot // len is a power of two; t == nil marks a free slot
	n     int        // used slots
	shift uint8      // 64 - log2(len(slots))
}

type pendSlot struct {
	id uint64
	t  *Ticket
}

const pendMinSlots = 64

func (p *pendTable) init(size int) {
	p.slots = make([]pendSlot, size)
	p.n = 0
	p.shift = 64
	for s := size; s > 1; s >>= 1 {
		p.shift--
	}
}

// home is the slot an id hashes to (Fibonacci hashing: owners are random,
// tokens consecutive; both spread).
func (p *pendTable) home(id uint64) int {
	return int((id * 0x9E3779B97F4A7C15) >> p.shift)
}

// find returns the slot of id and true, or the free slot where id would
// be inserted and false.
func (p *pendTable) find(id uint64) (int, bool) {
	if p.slots == nil {
		p.init(pendMinSlots)
	}
	mask := len(p.slots) - 1
	for i := p.home(id); ; i = (i + 1) & mask {
		s := &p.slots[i]
		if s.t == nil {
			return i, false
		}
		if s.id == id {
			return i, true
		}
	}
}

// add appends t to the chain of t.id.
func (p *pendTable) add(t *Ticket) {
	t.next = nil
	i, ok := p.find(t.id)
	if ok {
		head := p.slots[i].t
		for head.next != nil {
			head = head.next
		}
		head.next = t
		return
	}
	p.slots[i] = pendSlot{id: t.id, t: t}
	p.n++
	if 2*p.n > len(p.slots) {
		p.grow()
	}
}

// take removes and returns the head of id's chain, or nil.
func (p *pendTable) take(id uint64) *Ticket {
	if p.n == 0 {
		return nil
	}
	i, ok := p.find(id)
	if !ok {
		return nil
	}
	head := p.slots[i].t
	if head.next != nil {
		p.slots[i].t = head.next
		head.next = nil
	} else {
		p.deleteAt(i)
	}
	return head
}

// replace puts n in t's place in its chain (n.id == t.id).
func (p *pendTable) replace(t, n *Ticket) {
	if p.n == 0 {
		return
	}
	i, ok := p.find(t.id)
	if !ok {
		return
	}
	n.next = t.next
	t.next = nil
	if p.slots[i].t == t {
		p.slots[i].t = n
		return
	}
	for q := p.slots[i].t; q.next != nil; q = q.next {
		if q.next == t {
			q.next = n
			return
		}
	}
	t.next, n.next = n.next, nil // t was not in the chain: leave it as it was
}

// deleteAt frees slot i and shifts back the entries after it whose probe
// sequence passes through i, so that every entry stays reachable from its
// home slot without a tombstone.
func (p *pendTable) deleteAt(i int) {
	mask := len(p.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		s := p.slots[j]
		if s.t == nil {
			break
		}
		// s may move to i if its home is not in the cyclic range (i, j].
		k := p.home(s.id)
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			p.slots[i] = s
			i = j
		}
	}
	p.slots[i] = pendSlot{}
	p.n--
}

func (p *pendTable) grow() {
	old := p.slots
	p.init(2 * len(old))
	for _, s := range old {
		if s.t != nil {
			i, _ := p.find(s.id)
			p.slots[i] = s
			p.n++
		}
	}
}

// drain calls f with every chain's head and empties the table.
func (p *pendTable) drain(f func(head *Ticket)) {
	for i, s := range p.slots {
		if s.t != nil {
			p.slots[i] = pendSlot{}
			f(s.t)
		}
	}
	p.n = 0
}

// each calls f with every request in the table, chains included.
func (p *pendTable) each(f func(t *Ticket)) {
	if p.n == 0 {
		return
	}
	for _, s := range p.slots {
		for t := s.t; t != nil; t = t.next {
			f(t)
		}
	}
}

// awaiting reports whether a request other than a stand-in awaits an
// answer.
func (p *pendTable) awaiting() bool {
	if p.n == 0 {
		return false
	}
	for _, s := range p.slots {
		for t := s.t; t != nil; t = t.next {
			if !t.tomb {
				return true
			}
		}
	}
	return false
}
