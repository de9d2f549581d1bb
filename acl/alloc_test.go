//go:build !race

package acl

import "testing"

// The race detector's instrumentation allocates, so these run without it.

// TestAuthAllocs: what a hello and every lock request cost on the request
// path allocates nothing.
func TestAuthAllocs(t *testing.T) {
	a := mustParse(t, example)
	known, unknown, cert := []byte("orders"), []byte("nobody"), []byte("billing")
	secret, key := []byte("orders-secret"), []byte("jobs/42")
	id := a.Lookup(known)
	for name, f := range map[string]func(){
		"Authenticate":         func() { _ = a.Authenticate(known, secret) },
		"Authenticate/unknown": func() { _ = a.Authenticate(unknown, secret) },
		"Authenticate/cert":    func() { _ = a.Authenticate(cert, secret) },
		"Lookup":               func() { _ = a.Lookup(known) },
		"Allows":               func() { _ = id.Allows(key) },
		"MayLock":              func() { _ = id.MayLock() },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs, want 0", name, n)
		}
	}
}
