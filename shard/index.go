package shard

import "bytes"

// index maps keys to entries inside one shard: open addressing with linear
// probing on the key's 64-bit xxhash (the same hash that chose the shard; the
// shard uses its top bits, the index its low bits), backward-shift deletion
// (no tombstones), and a table that doubles above 3/4 load and halves below
// 1/8 load, so a shard that held a million keys gives the memory back once
// they are released (a Go map never shrinks). A slot is 8 bytes: the low 32
// bits of the hash (which place the key: a shard's table is far below 2³²
// slots) and the entry's ref. Lookups compare the stored hash bits first
// and the key bytes only on a match: no string conversion, no allocation.
//
// The load factor: linear probing probes ½(1 + 1/(1−α)²) slots on average
// for an absent key, 8.5 at α = 3/4 and 32 at 7/8 (8 slots to a cache
// line), and a slot costs 8/α bytes per key: 10.7–21.3 B between the
// doublings at 3/4, 9.1–18.3 B at 7/8. At the shard sizes of 1M and 10M
// keys over 64 shards (15,625 and 156,250 keys per shard) both thresholds
// pick the same table (load 0.48 and 0.60): 3/4 stays (BENCHMARKS.md
// "Memory per held lock").
type index struct {
	slots []islot // len is a power of two ≥ minIndex
	mask  uint64
	n     int
}

// islot is one index slot; r == 0 marks an empty slot.
type islot struct {
	h uint32 // the low 32 bits of the key's hash
	r ref
}

const minIndex = 8

func (x *index) init() { x.resize(minIndex) }

// find returns the ref and entry of key (hash h), or 0 and nil.
func (s *shard) find(h uint64, key []byte) (ref, *entry) {
	x := &s.idx
	h32 := uint32(h)
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		sl := x.slots[i]
		if sl.r == 0 {
			return 0, nil
		}
		if sl.h == h32 {
			if e := s.ent(sl.r); bytes.Equal(s.keyOf(e), key) {
				return sl.r, e
			}
		}
	}
}

// insert adds r, whose key is absent, under hash h.
func (x *index) insert(h uint64, r ref) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.resize(len(x.slots) * 2)
	}
	x.put(islot{h: uint32(h), r: r})
	x.n++
}

// put stores sl in the first empty slot of its probe sequence.
func (x *index) put(sl islot) {
	i := uint64(sl.h) & x.mask
	for x.slots[i].r != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = sl
}

// at returns the position of r (present under hash h).
func (x *index) at(h uint64, r ref) uint64 {
	i := h & x.mask
	for x.slots[i].r != r {
		i = (i + 1) & x.mask
	}
	return i
}

// repoint makes the slot of from (present under hash h) name to.
func (x *index) repoint(h uint64, from, to ref) { x.slots[x.at(h, from)].r = to }

// remove deletes r (present under hash h) and shrinks a sparse table.
func (x *index) remove(h uint64, r ref) {
	i := x.at(h, r)
	// Backward-shift deletion: pull later members of the probe run into the
	// hole when their home slot is not cyclically within (hole, j].
	for j := (i + 1) & x.mask; x.slots[j].r != 0; j = (j + 1) & x.mask {
		home := uint64(x.slots[j].h) & x.mask
		if (j-home)&x.mask >= (j-i)&x.mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = islot{}
	x.n--
	if len(x.slots) > minIndex && x.n*8 < len(x.slots) {
		size := len(x.slots) / 2
		for size > minIndex && x.n*2 < size/2 {
			size /= 2
		}
		x.resize(size)
	}
}

// resize rebuilds the table with size slots (a power of two).
func (x *index) resize(size int) {
	old := x.slots
	x.slots = make([]islot, size)
	x.mask = uint64(size - 1)
	for _, sl := range old {
		if sl.r != 0 {
			x.put(sl)
		}
	}
}
