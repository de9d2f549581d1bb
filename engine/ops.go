package engine

import (
	"errors"
	"fmt"
	"time"
)

// LiveStall is how long the event loops' ticker may go without a run
// before Live reports the server stuck. It ticks every 5 ms (tickEvery)
// and runs the table's timers: a ticker silent for seconds means leases
// and waits no longer end on time.
const LiveStall = 3 * time.Second

// ErrNotLive wraps Live's answers when the server does not serve its
// loops.
var ErrNotLive = errors.New("engine: not live")

// Hurry cuts the drain of a running or coming Shutdown short: the
// connections are closed at once (their answers flushed as far as they
// go), and Shutdown goes on to stop the loops and let the node write
// what it keeps (a single node's snapshot). The operator's second signal
// (cmd/lockd). Safe from any goroutine, any number of times.
func (s *Server) Hurry() { s.hurryOnce.Do(func() { close(s.hurry) }) }

// Live is nil while the process serves its event loops: starting (not
// yet Ready), serving with the loops' ticker run within LiveStall, or in
// a shutdown that was asked for (Shutdown: it ends on its own). It
// wraps ErrNotLive once the loops stopped without a shutdown (the
// listener failed for good: the process is about to exit) or while the
// ticker is stuck. It reads atomics only, for a liveness probe.
func (s *Server) Live() error {
	if s.draining.Load() {
		return nil
	}
	if s.stopped.Load() {
		return fmt.Errorf("%w: the event loops stopped", ErrNotLive)
	}
	select {
	case <-s.ready:
	default:
		return nil // starting: the loops are not running yet
	}
	if age := time.Duration(s.now() - s.lastTick.Load()); age > LiveStall {
		return fmt.Errorf("%w: the event loops' ticker last ran %s ago", ErrNotLive, age.Round(time.Millisecond))
	}
	return nil
}
