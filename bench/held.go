package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// wlHeld is the memory workload of issue 22, outside the standard suite
// (-workloads held): the connections of the uncontended workload (-conns ×
// -depth slots) acquire -held distinct 16-byte keys between them, pipelined,
// with 255 s leases, and keep them; once every slot is done the server's
// memory is read (heap after a forced GC, and RSS), then every key is
// released, so the next round and the next workload start from an empty
// table. It reports the fill rate (locks/s, acquire latency), the memory per
// held lock (after − before the fill, ÷ locks held) and the server's whole
// memory with every lock held.
const wlHeld = "held"

// heldKeyLen is the length of every key of the held workload.
const heldKeyLen = 16

// maxHeld bounds -held: the keys are "held/" and 11 digits.
const maxHeld = 100_000_000_000

// appendHeldKey appends the 16-byte key of lock i ("held/%011d").
func appendHeldKey(dst []byte, i int) []byte {
	dst = append(dst, "held/"...)
	var d [20]byte
	digits := strconv.AppendUint(d[:0], uint64(i), 10)
	for range heldKeyLen - 5 - len(digits) {
		dst = append(dst, '0')
	}
	return append(dst, digits...)
}

// held is the workload's state. Slot s acquires keys s.id, s.id + slots,
// s.id + 2·slots, …, then polls (opWake) until release is set, then
// releases the keys it holds in the same order (s.token is 0 until its
// first release).
type held struct {
	n, slots int
	tokens   []uint64 // by key: the token it is held with (0: not held)
	acq, rel []int    // by slot: the next key to acquire, to release
	poll     time.Duration
	acquired atomic.Int64
	filled   atomic.Int64 // slots done acquiring
	release  atomic.Bool  // the memory was read: release everything
}

func newHeld(n, slots int) *held {
	return &held{n: n, slots: slots, tokens: make([]uint64, n), acq: make([]int, slots), rel: make([]int, slots),
		poll: 20 * time.Millisecond}
}

func (h *held) acquire(s *slot) action {
	i := h.acq[s.id]
	if i >= h.n {
		h.filled.Add(1)
		return action{op: opWake, delay: h.poll}
	}
	h.acq[s.id] = i + h.slots
	s.key = appendHeldKey(s.key[:0], i)
	return action{op: opAcquire, key: s.key, lease: 255}
}

func (h *held) releaseNext(s *slot) action {
	i := h.rel[s.id]
	for i < h.n && h.tokens[i] == 0 {
		i += h.slots
	}
	if i >= h.n {
		return action{}
	}
	h.rel[s.id] = i + h.slots
	s.key, s.token = appendHeldKey(s.key[:0], i), h.tokens[i]
	return action{op: opRelease, key: s.key, token: s.token}
}

func (h *held) first(s *slot, now time.Duration) action {
	h.acq[s.id], h.rel[s.id] = s.id, s.id
	return h.acquire(s)
}

func (h *held) next(s *slot, a *answer, now time.Duration, st *stats) action {
	switch a.kind {
	case ansGranted:
		h.tokens[h.acq[s.id]-h.slots] = a.token
		h.acquired.Add(1)
		st.ops++
		st.acq.Record(now - s.sentAt)
		return h.acquire(s)
	case ansRefused:
		st.refused++
		return h.acquire(s)
	case ansWake:
		if !h.release.Load() {
			return action{op: opWake, delay: h.poll}
		}
		return h.releaseNext(s)
	case ansReleased:
	case ansNotHeld:
		st.notHeld++
	default:
		st.errs++
		if s.token == 0 { // the answer to an acquire
			return h.acquire(s)
		}
	}
	return h.releaseNext(s)
}

// runHeld runs the held workload on t.
func runHeld(t *target, cfg *config, res *Result) error {
	if t.etcd != nil {
		res.Skipped = "a request at a time: millions of locks would take minutes"
		return nil
	}
	res.Unit = "locks/s"
	res.Conns = cfg.Conns
	slots := cfg.Conns * cfg.Depth
	h := newHeld(cfg.Held, slots)
	var m1, m2 memStat
	var memErr error
	measure := func(m *memStat) {
		if t.mem != nil && memErr == nil {
			*m, memErr = t.mem()
		}
	}
	var start time.Time
	afterDial := func() {
		time.Sleep(200 * time.Millisecond)
		measure(&m1)
		start = time.Now()
	}
	// Once every slot has made its acquires, read the memory, then let the
	// slots release.
	var finished atomic.Bool
	fillDone := make(chan time.Duration, 1)
	go func() {
		for h.filled.Load() < int64(slots) && !finished.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		fillDone <- time.Since(start)
		if !finished.Load() {
			time.Sleep(200 * time.Millisecond) // let the last answers' buffers go
			measure(&m2)
		}
		h.release.Store(true)
	}()
	// Room for the fill and the release on a loaded machine: 20 µs a lock.
	c := *cfg
	c.Drain += time.Duration(cfg.Held) * 20 * time.Microsecond
	var clk clock
	st, err := drive(t, &c, &clk, 0, h, makeSlots(slots, cfg.Conns, rand.Uint64()), 64<<10, afterDial)
	finished.Store(true)
	fill := <-fillDone
	if err != nil {
		return err
	}
	res.Seconds = fill.Seconds()
	res.Ops = st.ops
	res.Rate = float64(st.ops) / res.Seconds
	res.hist, res.Latency = st.acq, pcts(st.acq)
	res.Refused, res.Timeouts, res.NotHeld, res.Lost, res.Errors = st.refused, st.timeouts, st.notHeld, st.lost, st.errs
	switch n := h.acquired.Load(); {
	case memErr != nil:
		if cfg.Progress != nil {
			cfg.Progress(fmt.Sprintf("    %s: memory not measured: %v", t.name, memErr))
		}
	case t.mem != nil && n > 0 && m2 != (memStat{}):
		res.MemPerLock = &memStat{Heap: (m2.Heap - m1.Heap) / n, RSS: (m2.RSS - m1.RSS) / n}
		res.MemHeld = &m2
	}
	return nil
}
