package main

import (
	"math"
	"math/bits"
	"time"
)

// histSub is the number of linear sub-buckets per power of two: values are
// kept with a relative error below 1/histSub (0.8 %).
const (
	histSubBits = 7
	histSub     = 1 << histSubBits
	histBuckets = histSub + (64-histSubBits)*histSub
)

// Hist is an HDR-style log-linear histogram of durations in nanoseconds:
// values below 128 ns are exact, larger ones fall in one of 128 linear
// buckets per power of two, so any recorded value is known to within 0.8 %.
// It covers the whole int64 range in a fixed 58 KiB array. A Hist is not safe
// for concurrent use: keep one per goroutine and Merge them.
type Hist struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

// NewHist returns an empty histogram.
func NewHist() *Hist { return &Hist{min: math.MaxInt64} }

// histIndex returns the bucket of v (v ≥ 0).
func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // ≥ 0
	m := v >> uint(e)                    // in [histSub, 2·histSub)
	return histSub + e*histSub + int(m-histSub)
}

// histBounds returns the smallest and largest value that fall in bucket i.
func histBounds(i int) (lo, hi uint64) {
	if i < histSub {
		return uint64(i), uint64(i)
	}
	e := (i - histSub) / histSub
	m := uint64(histSub + (i-histSub)%histSub)
	lo = m << uint(e)
	return lo, lo + (uint64(1) << uint(e)) - 1
}

// Record adds one duration; negative durations count as 0.
func (h *Hist) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(uint64(v))]++
	h.n++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Merge adds every value recorded in o to h.
func (h *Hist) Merge(o *Hist) {
	if o == nil || o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Count returns the number of recorded values.
func (h *Hist) Count() uint64 { return h.n }

// Mean returns the exact mean of the recorded values (0 if none).
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Max returns the largest recorded value, exactly.
func (h *Hist) Max() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.max)
}

// Quantile returns the value at quantile q (0..1): the smallest recorded
// value v such that at least q of the values are ≤ v, to within the bucket
// precision (the bucket's midpoint, clamped to the exact min and max).
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	if rank >= h.n {
		return time.Duration(h.max)
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			lo, hi := histBounds(i)
			v := int64(lo + (hi-lo)/2)
			v = max(v, h.min)
			v = min(v, h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}
