package main

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency histograms are HdrHistograms of nanoseconds from 1 ns to histMax
// with histDigits significant digits: every recorded value is known to
// within 0.1 % (1,024 linear sub-buckets per power of two), in 264 KiB.
const (
	histMax    = time.Hour
	histDigits = 3
)

// Hist adapts an hdrhistogram.Histogram to durations, and keeps the exact
// smallest and largest value beside it (the histogram knows them only to
// within its precision), so that the extremes, and a percentile that falls
// on them, are exact. Like the histogram it wraps, it is not safe for
// concurrent use: keep one per goroutine (or per lock-guarded shard) and
// Merge them.
type Hist struct {
	h        *hdrhistogram.Histogram
	min, max time.Duration
}

// NewHist returns an empty histogram.
func NewHist() *Hist {
	return &Hist{h: hdrhistogram.New(1, int64(histMax), histDigits), min: histMax}
}

// Record adds one duration. A negative duration counts as 0 and one above
// histMax as histMax: no run lasts that long, and a value is never dropped.
func (h *Hist) Record(d time.Duration) {
	d = min(max(d, 0), histMax)
	h.h.RecordValue(int64(d)) // in range by construction: cannot fail
	h.min, h.max = min(h.min, d), max(h.max, d)
}

// Merge adds every value recorded in o to h.
func (h *Hist) Merge(o *Hist) {
	if o == nil || o.h.TotalCount() == 0 {
		return
	}
	h.h.Merge(o.h) // the same range on both sides: drops nothing
	h.min, h.max = min(h.min, o.min), max(h.max, o.max)
}

// Count returns the number of recorded values.
func (h *Hist) Count() uint64 { return uint64(h.h.TotalCount()) }

// Quantile returns the value at quantile q (0..1), to within the
// histogram's precision and clamped to the exact extremes; 0 if nothing was
// recorded.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.h.TotalCount() == 0 {
		return 0
	}
	return min(max(time.Duration(h.h.ValueAtQuantile(q*100)), h.min), h.max)
}

// Max returns the largest recorded value, exactly.
func (h *Hist) Max() time.Duration { return h.max }
