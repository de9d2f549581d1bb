package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// checkQuantiles compares h's quantiles with the exact ones of the sorted
// samples: they must agree within 1 % (the histogram promises 0.1 %), and
// the extremes exactly.
func checkQuantiles(t *testing.T, name string, h *Hist, samples []time.Duration) {
	t.Helper()
	s := slices.Clone(samples)
	slices.Sort(s)
	for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999} {
		rank := int(math.Ceil(q*float64(len(s)))) - 1
		want := s[max(rank, 0)]
		got := h.Quantile(q)
		if diff := math.Abs(float64(got-want)) / float64(want); diff > 0.01 {
			t.Errorf("%s: q%.4f = %v, exact %v (%.2f%% off)", name, q, got, want, diff*100)
		}
	}
	if h.Max() != s[len(s)-1] || h.Quantile(0) != s[0] || h.Quantile(1) != s[len(s)-1] {
		t.Errorf("%s: min/max %v/%v, exact %v/%v", name, h.Quantile(0), h.Max(), s[0], s[len(s)-1])
	}
	if h.Count() != uint64(len(s)) {
		t.Errorf("%s: count %d, want %d", name, h.Count(), len(s))
	}
}

func TestHistUniform(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHist()
	var xs []time.Duration
	for range 200_000 {
		d := time.Microsecond + time.Duration(rng.Int64N(int64(10*time.Millisecond)))
		h.Record(d)
		xs = append(xs, d)
	}
	checkQuantiles(t, "uniform 1µs..10ms", h, xs)
}

func TestHistExponential(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := NewHist()
	var xs []time.Duration
	for range 200_000 {
		d := time.Duration(rng.ExpFloat64()*float64(200*time.Microsecond)) + time.Microsecond
		h.Record(d)
		xs = append(xs, d)
	}
	checkQuantiles(t, "exponential mean 200µs", h, xs)
	// The analytic p99 of an exponential is mean·ln(100).
	want := 200*time.Microsecond*time.Duration(math.Log(100)*1000)/1000 + time.Microsecond
	if got := h.Quantile(0.99); math.Abs(float64(got-want))/float64(want) > 0.05 {
		t.Errorf("p99 %v, analytic %v", got, want)
	}
}

func TestHistSmallValuesExact(t *testing.T) {
	h := NewHist()
	for v := range 128 {
		h.Record(time.Duration(v))
	}
	for v := range 128 {
		q := float64(v+1) / 128
		if got := h.Quantile(q); got != time.Duration(v) {
			t.Fatalf("q%.3f = %v, want %dns", q, got, v)
		}
	}
	h.Record(-5) // clamped to 0
	if h.Quantile(0) != 0 {
		t.Errorf("negative value not clamped to 0")
	}
}

// TestHistRange: the extremes of the range are recorded, not dropped; a
// value beyond it counts as the largest.
func TestHistRange(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 127, 2047, 2048, 2049, time.Microsecond + 1, time.Second, histMax, histMax + 1, math.MaxInt64} {
		h := NewHist()
		h.Record(d)
		want := min(d, histMax)
		if h.Count() != 1 || h.Max() != want || h.Quantile(0.5) != want {
			t.Errorf("%v: count %d, max %v, p50 %v; want 1, %v", d, h.Count(), h.Max(), h.Quantile(0.5), want)
		}
	}
}

func TestHistMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	all, a, b := NewHist(), NewHist(), NewHist()
	for i := range 50_000 {
		d := time.Duration(rng.Int64N(int64(time.Second)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(b)
	a.Merge(nil)
	a.Merge(NewHist())
	if !a.h.Equals(all.h) || a.min != all.min || a.max != all.max {
		t.Fatal("merged histogram differs from the one that saw every value")
	}
}

func TestHistEmpty(t *testing.T) {
	h := NewHist()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Count() != 0 {
		t.Fatal("empty histogram must report zeros")
	}
}
