package httpapi

import (
	"sync/atomic"

	"github.com/lockd-dev/lockd/repl"
)

// GatedNode is a single node whose gate a test sets: a member that does
// not serve (Redirect, with or without the active's address) or holds.
// Set its Local before the engine opens it.
type GatedNode struct {
	*repl.Local
	gate atomic.Pointer[repl.Gate] // nil: Local's, always serving
}

// SetGate replaces the gate (the test then calls the engine's
// GateChanged).
func (g *GatedNode) SetGate(gate repl.Gate) { g.gate.Store(&gate) }

// Gate is the gate set, or Local's.
func (g *GatedNode) Gate() *repl.Gate {
	if p := g.gate.Load(); p != nil {
		return p
	}
	return g.Local.Gate()
}
