package shard

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTokensSequence(t *testing.T) {
	tests := []struct {
		name        string
		start, lim  uint64
		n           int
		first, last uint64
	}{
		{"from zero", 0, 100, 5, 1, 5},
		{"from start", 1000, 2000, 3, 1001, 1003},
		{"up to the limit", 7, 10, 3, 8, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk := NewTokens(tc.start, tc.lim)
			if got := tk.Last(); got != tc.start {
				t.Fatalf("Last before Next = %d, want %d", got, tc.start)
			}
			if got := tk.Limit(); got != tc.lim {
				t.Fatalf("Limit = %d, want %d", got, tc.lim)
			}
			prev := tc.start
			for i := 0; i < tc.n; i++ {
				v := tk.Next()
				if v == 0 || v != prev+1 {
					t.Fatalf("Next #%d = %d after %d", i, v, prev)
				}
				prev = v
			}
			if prev != tc.last || tk.Last() != tc.last {
				t.Fatalf("last token %d (Last %d), want %d", prev, tk.Last(), tc.last)
			}
		})
	}
}

func TestTokensConcurrent(t *testing.T) {
	const goroutines, per = 8, 5000
	tk := NewTokens(0, goroutines*per)
	got := make([][]uint64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range per {
				got[g] = append(got[g], tk.Next())
			}
		})
	}
	wg.Wait()
	seen := make(map[uint64]bool, goroutines*per)
	for g, toks := range got {
		for i, v := range toks {
			if v == 0 || seen[v] {
				t.Fatalf("token %d is 0 or duplicate", v)
			}
			seen[v] = true
			if i > 0 && v <= toks[i-1] {
				t.Fatalf("goroutine %d: token %d after %d", g, v, toks[i-1])
			}
		}
	}
	if tk.Last() != goroutines*per {
		t.Fatalf("Last = %d", tk.Last())
	}
}

// TestTokensNeverWait: at the reserved limit Next returns 0 at once (the
// table answers Busy) and signals Want; Extend makes tokens available again,
// continuing the sequence without a gap or a repeat.
func TestTokensNeverWait(t *testing.T) {
	tk := NewTokens(10, 12)
	tk.Next()
	tk.Next()
	for range 3 {
		done := make(chan uint64)
		go func() { done <- tk.Next() }()
		select {
		case v := <-done:
			if v != 0 {
				t.Fatalf("Next = %d beyond the limit 12", v)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Next waits at the limit")
		}
	}
	select {
	case <-tk.Want():
	default:
		t.Fatal("no Want signal at the limit")
	}
	tk.Extend(11) // lower: ignored
	if tk.Limit() != 12 || tk.Next() != 0 {
		t.Fatalf("Limit = %d after a lower Extend", tk.Limit())
	}
	tk.Extend(14)
	if a, b, c := tk.Next(), tk.Next(), tk.Next(); a != 13 || b != 14 || c != 0 {
		t.Fatalf("after Extend(14): %d %d %d, want 13 14 0", a, b, c)
	}
}

// TestTokensObserve: an observed token is never handed out again, and a
// smaller one changes nothing.
func TestTokensObserve(t *testing.T) {
	tk := NewTokens(0, 100)
	tk.Next()
	tk.Observe(50)
	tk.Observe(20)
	if got := tk.Next(); got != 51 {
		t.Fatalf("Next after Observe(50) = %d, want 51", got)
	}
	tk.Observe(200) // beyond the limit: nothing more until Extend
	if got := tk.Next(); got != 0 {
		t.Fatalf("Next after Observe beyond the limit = %d, want 0", got)
	}
	tk.Extend(300)
	if got := tk.Next(); got != 201 {
		t.Fatalf("Next after Extend = %d, want 201", got)
	}
}

// TestTokensObserveRefused: an Observe of the very value that a refused
// Next took above the limit, and is about to give back, still holds: the
// sequence never goes below an observed token (a give-back after the
// Observe would let the next Extend hand that token out a second time).
// Refusals race the Observe over many trials; the trials stop after 2 s.
func TestTokensObserveRefused(t *testing.T) {
	const lim = 10
	deadline := time.Now().Add(2 * time.Second)
	for trial := 0; trial < 3000 && time.Now().Before(deadline); trial++ {
		tk := NewTokens(lim, lim) // every Next is refused
		var stop atomic.Bool
		var refused atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				tk.dry.Store(false) // refuse by taking a value, each time
				if v := tk.Next(); v != 0 {
					t.Errorf("Next at the limit = %d", v)
					return
				}
				refused.Add(1)
			}
		})
		// Observe while the refusals run: now and then between a take and
		// its give-back.
		for refused.Load() < int64(trial%8) {
			runtime.Gosched()
		}
		tk.Observe(lim + 1)
		stop.Store(true)
		wg.Wait()
		if got := tk.Last(); got < lim+1 {
			t.Fatalf("trial %d: Last = %d after Observe(%d)", trial, got, lim+1)
		}
		tk.Extend(lim + 10)
		if got := tk.Next(); got <= lim+1 {
			t.Fatalf("trial %d: Next after Observe(%d) = %d", trial, lim+1, got)
		}
	}
}

func TestTokensWant(t *testing.T) {
	wanted := func(tk *Tokens) bool {
		select {
		case <-tk.Want():
			return true
		default:
			return false
		}
	}
	tk := NewTokens(0, 10) // range 10: signal once fewer than 5 remain
	for i := 1; i <= 5; i++ {
		tk.Next()
		if wanted(tk) {
			t.Fatalf("Want after %d of 10 (5+ left)", i)
		}
	}
	tk.Next() // 4 left
	if !wanted(tk) {
		t.Fatal("no Want with 4 of 10 left")
	}
	tk.Next()
	tk.Next()
	if !wanted(tk) {
		t.Fatal("Want not signalled again while the owner has not extended")
	}
	if wanted(tk) {
		t.Fatal("Want has capacity 1")
	}
	// Extend at 8: the new range is 108-8 = 100; half is 50.
	tk.Extend(108)
	for tk.Last() < 57 {
		tk.Next()
		if wanted(tk) {
			t.Fatalf("Want at %d with range 8..108", tk.Last())
		}
	}
	tk.Next() // 58: 50 left, not fewer than half
	if wanted(tk) {
		t.Fatal("Want with exactly half left")
	}
	tk.Next() // 59: 49 left
	if !wanted(tk) {
		t.Fatal("no Want with 49 of 100 left")
	}
}
