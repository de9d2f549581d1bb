package ratelog

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// event is one call of Allow at a time (ms on the test's clock) and what
// it must answer.
type event struct {
	at   int64 // ms
	ok   bool
	held int
}

const ms = int64(time.Millisecond)

func TestLimiter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		every  time.Duration
		events []event
	}{
		{"the first event passes, even at time 0", 0, []event{{0, true, 0}}},
		{"the first event passes at any time", 0, []event{{-5000, true, 0}, {-4999, false, 0}}},
		{"zero Every is a second", 0, []event{{0, true, 0}, {999, false, 0}, {1000, true, 1}}},
		{"held events are counted into the next line", time.Second,
			[]event{{0, true, 0}, {1, false, 0}, {2, false, 0}, {500, false, 0}, {1000, true, 3}, {1001, false, 0}, {2500, true, 1}}},
		{"the interval runs from the last line, not from the last event", time.Second,
			[]event{{0, true, 0}, {900, false, 0}, {1500, true, 1}, {2400, false, 0}, {2500, true, 1}}},
		{"a quiet spell: every event passes", 10 * time.Millisecond,
			[]event{{0, true, 0}, {10, true, 0}, {100, true, 0}, {105, false, 0}, {200, true, 1}}},
		{"ten seconds", 10 * time.Second, []event{{0, true, 0}, {9999, false, 0}, {10000, true, 1}}},
		{"a clock that stands still holds everything after the first", time.Second,
			[]event{{7, true, 0}, {7, false, 0}, {7, false, 0}}},
	} {
		// Atomic answers as Limiter does on one goroutine.
		for _, kind := range []struct {
			name string
			new  func(time.Duration) allower
		}{
			{"Limiter", func(d time.Duration) allower { return &Limiter{Every: d} }},
			{"Atomic", func(d time.Duration) allower { return &Atomic{Every: d} }},
		} {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				l := kind.new(tc.every)
				for i, e := range tc.events {
					held, ok := l.Allow(e.at * ms)
					if ok != e.ok || held != e.held {
						t.Fatalf("event %d at %d ms: Allow = (%d, %v), want (%d, %v)", i, e.at, held, ok, e.held, e.ok)
					}
				}
			})
		}
	}
}

// allower is what Limiter and Atomic have in common.
type allower interface {
	Allow(now int64) (held int, ok bool)
}

func TestAtomicFlush(t *testing.T) {
	type call struct {
		flush bool // Flush, else Allow
		at    int64
		ok    bool
		held  int
	}
	allow := func(at int64, ok bool, held int) call { return call{false, at, ok, held} }
	flush := func(at int64, ok bool, held int) call { return call{true, at, ok, held} }
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"the zero Atomic has nothing to flush", []call{flush(0, false, 0), flush(5000, false, 0), allow(5000, true, 0)}},
		{"held events are flushed once the interval has passed", []call{
			allow(0, true, 0), allow(1, false, 0), allow(2, false, 0),
			flush(999, false, 0), flush(1000, true, 2), flush(3000, false, 0)}},
		{"the interval runs from the flush", []call{
			allow(0, true, 0), allow(1, false, 0), flush(1500, true, 1),
			allow(2000, false, 0), allow(2499, false, 0), allow(2500, true, 2)}},
		{"a flush with nothing held does not restart the interval", []call{
			allow(0, true, 0), flush(1000, false, 0), allow(1000, true, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Atomic
			for i, c := range tc.calls {
				f, held, ok := "Allow", 0, false
				if c.flush {
					f = "Flush"
					held, ok = a.Flush(c.at * ms)
				} else {
					held, ok = a.Allow(c.at * ms)
				}
				if ok != c.ok || held != c.held {
					t.Fatalf("call %d, %s at %d ms: (%d, %v), want (%d, %v)", i, f, c.at, held, ok, c.held, c.ok)
				}
			}
		})
	}
}

// TestAtomicConcurrent races Allow and Flush on many goroutines. The
// clock moves by Every each tick calls, so many calls read the same time,
// of which at most one may let an event through; and every event is
// counted exactly once, as a line or in a line's held count.
func TestAtomicConcurrent(t *testing.T) {
	const goroutines, each, tick, flushEvery = 8, 4000, 16, 5
	a := Atomic{Every: time.Second}
	var (
		calls   atomic.Int64
		mu      sync.Mutex
		passed  []int64 // times let through
		counted int     // events in lines and held counts
		wg      sync.WaitGroup
	)
	clock := func(n int64) int64 { return n / tick * int64(a.Every) }
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				now := clock(calls.Add(1))
				if i%flushEvery == 0 {
					if held, ok := a.Flush(now); ok {
						mu.Lock()
						counted += held
						mu.Unlock()
					}
					continue
				}
				if held, ok := a.Allow(now); ok {
					mu.Lock()
					passed = append(passed, now)
					counted += 1 + held
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if held, ok := a.Flush(clock(calls.Load()) + int64(time.Hour)); ok {
		counted += held
	}
	const events = goroutines * (each - each/flushEvery)
	if counted != events {
		t.Fatalf("%d events counted, want %d", counted, events)
	}
	slices.Sort(passed)
	for i := 1; i < len(passed); i++ {
		if gap := passed[i] - passed[i-1]; gap < int64(a.Every) {
			t.Fatalf("events let through at %v and %v: closer than Every", time.Duration(passed[i-1]), time.Duration(passed[i]))
		}
	}
	if len(passed) < 2 {
		t.Fatalf("%d events let through over %v", len(passed), time.Duration(clock(goroutines*each)))
	}
}
