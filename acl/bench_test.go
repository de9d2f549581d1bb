package acl

import "testing"

// BenchmarkAuthenticate compares a known identity with an unknown one and a
// certificate-only one: the three do the same work (a SHA-256 and a
// constant-time comparison), so their times should match.
func BenchmarkAuthenticate(b *testing.B) {
	a := mustParse(b, example)
	secret := []byte("orders-secret")
	for _, c := range []struct{ name, id string }{{"known", "orders"}, {"unknown", "nobody"}, {"cert", "billing"}} {
		b.Run(c.name, func(b *testing.B) {
			name := []byte(c.id)
			b.ReportAllocs()
			for b.Loop() {
				_ = a.Authenticate(name, secret)
			}
		})
	}
}

func BenchmarkAllows(b *testing.B) {
	a := mustParse(b, example)
	id, key := a.Lookup([]byte("orders")), []byte("jobs/000000000042")
	b.ReportAllocs()
	for b.Loop() {
		_ = id.Allows(key)
	}
}
