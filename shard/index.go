package shard

import "bytes"

// index maps keys to entries inside one shard: open addressing with linear
// probing on the key's 64-bit xxhash (the same hash that chose the shard; the
// shard uses its top bits, the index its low bits), backward-shift deletion
// (no tombstones), and a table that doubles above 3/4 load and halves below
// 1/8 load, so a shard that held a million keys gives the memory back once
// they are released (a Go map never shrinks). Lookups compare the stored hash
// first and the key bytes only on a hash match: no string conversion, no
// allocation.
type index struct {
	slots []islot // len is a power of two ≥ minIndex
	mask  uint64
	n     int
}

// islot is one index slot; e == nil marks an empty slot.
type islot struct {
	h uint64
	e *entry
}

const minIndex = 8

func (x *index) init() { x.resize(minIndex) }

// find returns the entry of key (hash h), or nil.
func (x *index) find(h uint64, key []byte) *entry {
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.e == nil {
			return nil
		}
		if s.h == h && bytes.Equal(s.e.key, key) {
			return s.e
		}
	}
}

// insert adds e, whose key is absent, under hash h.
func (x *index) insert(h uint64, e *entry) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.resize(len(x.slots) * 2)
	}
	x.put(h, e)
	x.n++
}

// put stores e in the first empty slot of its probe sequence.
func (x *index) put(h uint64, e *entry) {
	i := h & x.mask
	for x.slots[i].e != nil {
		i = (i + 1) & x.mask
	}
	x.slots[i] = islot{h: h, e: e}
}

// remove deletes e (present under hash h) and shrinks a sparse table.
func (x *index) remove(h uint64, e *entry) {
	i := h & x.mask
	for x.slots[i].e != e {
		i = (i + 1) & x.mask
	}
	// Backward-shift deletion: pull later members of the probe run into the
	// hole when their home slot is not cyclically within (hole, j].
	for j := (i + 1) & x.mask; x.slots[j].e != nil; j = (j + 1) & x.mask {
		home := x.slots[j].h & x.mask
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
	for _, s := range old {
		if s.e != nil {
			x.put(s.h, s.e)
		}
	}
}
