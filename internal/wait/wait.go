package wait

import (
	"errors"
	"testing"
	"time"
)

// Timeout bounds For's wait: long enough for a cluster to elect on a
// loaded 2-core machine, short enough that a condition that never holds
// fails the test soon.
const Timeout = 10 * time.Second

// Every is how often For asks again.
const Every = 2 * time.Millisecond

// For asks cond every Every until it holds, and fails tb (Fatalf, so from
// the test's goroutine only) once Timeout has passed without it, naming
// what it waited for.
func For(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if err := Until(Timeout, Every, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}); err != nil {
		tb.Fatalf("not within %v: %s", Timeout, what)
	}
}

// errNotYet is For's "not yet".
var errNotYet = errors.New("wait: not yet")

// Until calls try, then again every every, until it returns nil or
// timeout has passed, and returns try's last answer (try runs at least
// once).
func Until(timeout, every time.Duration, try func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := try()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(every)
	}
}
