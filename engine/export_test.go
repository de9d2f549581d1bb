package engine

// SessionCommonNames returns the verified client certificate Common Name
// of every open session (CertCommonName, the identity code's hook), for
// the tests of package engine_test.
func SessionCommonNames(s *Server) []string {
	var out []string
	for _, ss := range s.snapshotSessions() {
		out = append(out, ss.CertCommonName())
	}
	return out
}

// StallTicker makes the event loops' ticker wait (it takes the barrier
// that OnTick reads under) until the returned function is called, as a
// stuck loop would: for the tests of Live.
func StallTicker(s *Server) (resume func()) {
	s.barrier.Lock()
	return s.barrier.Unlock
}
