package fence

import (
	"errors"
	"sync"
)

// ErrStale rejects a token smaller than one already seen for the resource.
var ErrStale = errors.New("fence: stale token")

// Checker remembers, per resource name, the largest token seen.
type Checker struct {
	mu   sync.Mutex
	last map[string]uint64
}

// Check accepts token for resource if it is at least the largest token seen
// for it, and records it; a smaller token gets ErrStale and changes
// nothing. An equal token is accepted: the same holder may act several
// times under one grant.
func (c *Checker) Check(resource string, token uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
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
