package wait

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// fakeTB records For's failure instead of ending the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestUntil(t *testing.T) {
	errLast := errors.New("the last answer")
	for _, tc := range []struct {
		name     string
		timeout  time.Duration
		nilAfter int // the call that returns nil first (0: none)
		want     error
		minCalls int
	}{
		{"at once", time.Second, 1, nil, 1},
		{"on the fifth call", 5 * time.Second, 5, nil, 5},
		{"never: try's last answer", 30 * time.Millisecond, 0, errLast, 2},
		{"no time at all: one call", 0, 0, errLast, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			began := time.Now()
			err := Until(tc.timeout, time.Millisecond, func() error {
				calls++
				if calls == tc.nilAfter {
					return nil
				}
				return errLast
			})
			if err != tc.want || calls < tc.minCalls || tc.nilAfter > 0 && calls != tc.nilAfter {
				t.Fatalf("Until: %v after %d calls, want %v after %d", err, calls, tc.want, tc.minCalls)
			}
			if took := time.Since(began); tc.want != nil && took < tc.timeout {
				t.Fatalf("gave up after %v, before its timeout %v", took, tc.timeout)
			}
		})
	}
}

func TestFor(t *testing.T) {
	n := 0
	For(t, "the third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times", n)
	}
	if testing.Short() {
		return
	}
	f := &fakeTB{TB: t}
	For(f, "a condition that never holds", func() bool { return false })
	if want := "not within 10s: a condition that never holds"; f.failed != want {
		t.Fatalf("failure %q, want %q", f.failed, want)
	}
}
