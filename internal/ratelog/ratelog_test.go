package ratelog

import (
	"sync"
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
		t.Run(tc.name, func(t *testing.T) {
			l := Limiter{Every: tc.every}
			for i, e := range tc.events {
				held, ok := l.Allow(e.at * ms)
				if ok != e.ok || held != e.held {
					t.Fatalf("event %d at %d ms: Allow = (%d, %v), want (%d, %v)", i, e.at, held, ok, e.held, e.ok)
				}
			}
		})
	}
}

func TestShared(t *testing.T) {
	s := NewShared(time.Second)
	if held, ok := s.Allow(0); !ok || held != 0 {
		t.Fatalf("first event: (%d, %v)", held, ok)
	}
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				if _, ok := s.Allow(int64(i) * 1000); ok { // all within the first ms
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if passed != 0 {
		t.Fatalf("%d events passed within the interval", passed)
	}
	if held, ok := s.Allow(int64(time.Second)); !ok || held != goroutines*each {
		t.Fatalf("after the interval: (%d, %v), want (%d, true)", held, ok, goroutines*each)
	}
	var zero Shared
	if _, ok := zero.Allow(0); !ok {
		t.Fatal("the zero Shared held the first event")
	}
	if _, ok := zero.Allow(int64(time.Second) - 1); ok {
		t.Fatal("the zero Shared let a second event through within a second")
	}
}

func TestKeyed(t *testing.T) {
	type call struct {
		key  string
		at   int64 // ms
		ok   bool
		held int
		keys int // Len after the call
	}
	for _, tc := range []struct {
		name  string
		max   int
		calls []call
	}{
		{"keys are limited apart", 0, []call{
			{"a", 0, true, 0, 1}, {"b", 1, true, 0, 2}, {"a", 2, false, 0, 2}, {"a", 3, false, 0, 2},
			{"b", 500, false, 0, 2}, {"a", 1000, true, 2, 2}, {"b", 1001, true, 1, 2}}},
		{"the empty key is a key", 0, []call{{"", 0, true, 0, 1}, {"", 1, false, 0, 1}, {"x", 2, true, 0, 2}}},
		{"at Max, the idle keys are forgotten", 2, []call{
			{"a", 0, true, 0, 1}, {"b", 600, true, 0, 2}, {"a", 700, false, 0, 2},
			{"c", 1100, true, 0, 2}, // a is idle (its line was 1100 ms ago): forgotten, with the event it held
			{"a", 1200, true, 0, 2}, // b (600) is not idle: the oldest, b, goes
			{"c", 1300, false, 0, 2}}},
		{"at Max with no idle key, the oldest goes", 2, []call{
			{"a", 0, true, 0, 1}, {"b", 10, true, 0, 2}, {"c", 20, true, 0, 2},
			{"b", 30, false, 0, 2},  // b stays limited
			{"a", 40, true, 0, 2}}}, // a was forgotten: a first event again
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := NewKeyed(time.Second)
			k.Max = tc.max
			for i, c := range tc.calls {
				held, ok := k.Allow(c.key, c.at*ms)
				if ok != c.ok || held != c.held || k.Len() != c.keys {
					t.Fatalf("call %d (%q at %d ms): (%d, %v) with %d keys, want (%d, %v) with %d",
						i, c.key, c.at, held, ok, k.Len(), c.held, c.ok, c.keys)
				}
			}
		})
	}
}
