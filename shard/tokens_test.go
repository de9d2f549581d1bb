package shard

import (
	"sync"
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

func TestTokensBlockUntilExtend(t *testing.T) {
	tk := NewTokens(10, 12)
	tk.Next()
	tk.Next()
	got := make(chan uint64)
	for range 3 {
		go func() { got <- tk.Next() }()
	}
	// The persistence owner is told to reserve more.
	select {
	case <-tk.Want():
	case <-time.After(5 * time.Second):
		t.Fatal("no Want signal at the limit")
	}
	select {
	case v := <-got:
		t.Fatalf("Next returned %d beyond the limit", v)
	case <-time.After(20 * time.Millisecond):
	}
	tk.Extend(11) // lower: ignored
	if tk.Limit() != 12 {
		t.Fatalf("Limit = %d after a lower Extend", tk.Limit())
	}
	tk.Extend(14) // room for two of the three
	seen := map[uint64]bool{}
	for range 2 {
		select {
		case v := <-got:
			seen[v] = true
		case <-time.After(5 * time.Second):
			t.Fatal("Next still blocked after Extend")
		}
	}
	if !seen[13] || !seen[14] {
		t.Fatalf("got %v, want 13 and 14", seen)
	}
	select {
	case v := <-got:
		t.Fatalf("Next returned %d beyond the limit", v)
	case <-time.After(20 * time.Millisecond):
	}
	tk.Extend(100)
	if v := <-got; v != 15 {
		t.Fatalf("Next = %d, want 15", v)
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
