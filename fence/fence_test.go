package fence

import (
	"errors"
	"sync"
	"testing"
)

func TestCheck(t *testing.T) {
	var c Checker
	steps := []struct {
		res   string
		token uint64
		stale bool
	}{
		{"a", 5, false},
		{"a", 5, false}, // same holder again
		{"a", 4, true},
		{"b", 1, false}, // resources are independent
		{"a", 9, false},
		{"a", 6, true},
		{"b", 0, true},
	}
	for i, s := range steps {
		err := c.Check(s.res, s.token)
		if got := errors.Is(err, ErrStale); got != s.stale {
			t.Fatalf("step %d: Check(%q, %d) = %v, want stale %v", i, s.res, s.token, err, s.stale)
		}
	}
	if got := c.Largest("a"); got != 9 {
		t.Fatalf("Largest(a) = %d, want 9", got)
	}
	if got := c.Largest("none"); got != 0 {
		t.Fatalf("Largest(none) = %d, want 0", got)
	}
}

// TestConcurrent: many goroutines checking increasing tokens; the largest
// wins and nothing below an accepted token is accepted after it.
func TestConcurrent(t *testing.T) {
	var c Checker
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				tok := uint64(i*8 + g)
				if err := c.Check("r", tok); err == nil {
					if l := c.Largest("r"); l < tok {
						t.Errorf("Largest %d below accepted %d", l, tok)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	if got := c.Largest("r"); got != 999*8+7 {
		t.Fatalf("Largest = %d, want %d", got, 999*8+7)
	}
}

// TestDoIsAtomic: holders with increasing tokens write concurrently
// through Do; the writes land in token order (a stale holder never writes
// after a newer one), and a rejected holder's write never runs.
func TestDoIsAtomic(t *testing.T) {
	var c Checker
	var written []uint64 // guarded by Do's atomicity, not by a lock of its own
	var wg sync.WaitGroup
	var rejected sync.Map
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				tok := uint64(i*8 + g)
				err := c.Do("r", tok, func() error {
					written = append(written, tok)
					return nil
				})
				if errors.Is(err, ErrStale) {
					rejected.Store(tok, true)
				} else if err != nil {
					t.Errorf("Do: %v", err)
				}
			}
		}(g)
	}
	wg.Wait()
	for i := 1; i < len(written); i++ {
		if written[i] < written[i-1] {
			t.Fatalf("write %d with token %d after token %d", i, written[i], written[i-1])
		}
	}
	for _, tok := range written {
		if _, ok := rejected.Load(tok); ok {
			t.Fatalf("token %d was rejected but written", tok)
		}
	}
	if len(written) == 0 {
		t.Fatal("nothing written")
	}
	failed := errors.New("disk full")
	if err := c.Do("r", 10_000, func() error { return failed }); err != failed {
		t.Fatalf("Do returned %v, want write's error", err)
	}
	if err := c.Do("r", 9_999, func() error { t.Fatal("stale write ran"); return nil }); !errors.Is(err, ErrStale) {
		t.Fatalf("older token after a failed newer write: %v, want ErrStale", err)
	}
}
