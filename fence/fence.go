package fence

import (
	"errors"
	"sync"
)

// ErrStale rejects a token smaller than one already seen for the resource.
var ErrStale = errors.New("fence: stale token")

// Checker remembers, per resource name, the largest token seen.
//
// The check and the resource's write must be one atomic step: a Check
// that passes, followed by a write made separately, lets a stale holder
// pass its Check, pause, and write after a newer holder has written — the
// very race fencing exists to stop. Do runs the write under the
// Checker's lock for that reason; a resource with writers in several
// processes must make the comparison part of its own write instead (a
// conditional update: "write if token >= the stored token", in one
// transaction), and keep the largest token beside the data.
type Checker struct {
	mu   sync.Mutex
	last map[string]uint64
}

// Check accepts token for resource if it is at least the largest token seen
// for it, and records it; a smaller token gets ErrStale and changes
// nothing. An equal token is accepted: the same holder may act several
// times under one grant. Check alone does not make a later write safe (see
// Checker); use Do to check and write in one step.
func (c *Checker) Check(resource string, token uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkLocked(resource, token)
}

// Do checks token for resource as Check does and, if it is accepted, runs
// write before any other Check or Do of this Checker can pass: the check
// and the write are one atomic step. It returns ErrStale (write not run)
// or write's error. The token is recorded once accepted, whether or not
// write succeeds, so an older holder cannot write after a newer one tried.
// write must not call the Checker; writes through one Checker are
// serialized.
func (c *Checker) Do(resource string, token uint64, write func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkLocked(resource, token); err != nil {
		return err
	}
	return write()
}

func (c *Checker) checkLocked(resource string, token uint64) error {
	if token < c.last[resource] {
		return ErrStale
	}
	if c.last == nil {
		c.last = make(map[string]uint64)
	}
	c.last[resource] = token
	return nil
}

// Largest returns the largest token seen for resource, 0 if none.
func (c *Checker) Largest(resource string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[resource]
}
