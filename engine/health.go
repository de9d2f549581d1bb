package engine

// Draining reports whether the shutdown sequence has begun (PROTOCOL.md §4):
// the node is about to stop and should take no new work. It reads one
// atomic, takes no lock, and is cheap enough for a health probe.
func (s *Server) Draining() bool { return s.draining.Load() }
