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
