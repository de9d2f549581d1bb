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

// BenchmarkAllows: the prefix check every lock request makes, with the
// lockd-acl bench target's identity (three prefixes, the key under the
// last) and a long prefix.
func BenchmarkAllows(b *testing.B) {
	for _, c := range []struct{ keys, key string }{
		{"orders/,jobs/,bench/", "bench/key/123456"},
		{"orders/,jobs/,bench/", "other/key/123456"},
		{"tenant-000042/orders/", "tenant-000042/orders/123456"},
		{"*", "bench/key/123456"},
	} {
		b.Run(c.keys, func(b *testing.B) {
			a := mustParse(b, "x cert "+c.keys+" client\n")
			id, key := a.Lookup([]byte("x")), []byte(c.key)
			b.ReportAllocs()
			for b.Loop() {
				_ = id.Allows(key)
			}
		})
	}
}
