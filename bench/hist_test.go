package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// checkQuantiles compares h's quantiles with the exact ones of the sorted
// samples: they must agree within the histogram's 1 % precision.
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
	mean := h.Mean()
	if math.Abs(float64(mean)-float64(5*time.Millisecond)) > float64(100*time.Microsecond) {
		t.Errorf("mean %v, want ≈5ms", mean)
	}
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

func TestHistBucketsCoverRange(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 40, math.MaxInt64, math.MaxUint64} {
		i := histIndex(v)
		if i < 0 || i >= histBuckets {
			t.Fatalf("index of %d out of range: %d", v, i)
		}
		lo, hi := histBounds(i)
		if v < lo || v > hi {
			t.Fatalf("%d not within its bucket [%d, %d]", v, lo, hi)
		}
		if lo >= histSub && float64(hi-lo)/float64(lo) > 1.0/histSub {
			t.Fatalf("bucket [%d, %d] wider than 1/%d", lo, hi, histSub)
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
	if *a != *all {
		t.Fatal("merged histogram differs from the one that saw every value")
	}
}

func TestHistEmpty(t *testing.T) {
	h := NewHist()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Fatal("empty histogram must report zeros")
	}
}
