package acl

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/proto"
)

// The seed corpora are in testdata/fuzz/FuzzParse and testdata/fuzz/FuzzHello
// (every form and every error of the file; hellos of every shape); these
// add the test's own fixtures.

// format writes a as a file Parse reads back to the same ACL.
func format(a *ACL) []byte {
	var b bytes.Buffer
	for _, id := range a.list {
		secret := "cert"
		if !id.certOnly {
			secret = "sha256:" + hex.EncodeToString(id.digest[:])
		}
		b.WriteString(id.Name + "\t" + secret + "  " + id.Prefixes() + " " + id.Role.String() + "\n")
	}
	return b.Bytes()
}

// same reports whether two ACLs hold the same identities in the same order.
func same(a, b *ACL) bool {
	if len(a.list) != len(b.list) {
		return false
	}
	for i, x := range a.list {
		y := b.list[i]
		if x.Name != y.Name || x.Role != y.Role || x.certOnly != y.certOnly || x.digest != y.digest ||
			x.all != y.all || x.Prefixes() != y.Prefixes() || x.index != i || y.index != i {
			return false
		}
	}
	return true
}

// FuzzParse: Parse never panics; what it accepts is well formed (names in
// the charset and unique, a role, prefixes that are not empty), formats
// back to a file that parses to the same ACL; what it refuses is a
// *LineError whose line exists.
func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("a " + digestA + " x/,y/ client\r\nb cert - monitor\n\t# c\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Parse("f", data)
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("not a LineError: %v", err)
			}
			if le.Line < 1 || le.Line > bytes.Count(data, []byte("\n"))+1 {
				t.Fatalf("line %d of a %d-line input", le.Line, bytes.Count(data, []byte("\n"))+1)
			}
			return
		}
		seen := map[string]bool{}
		for i, id := range a.Identities() {
			if !ValidName(id.Name) || seen[id.Name] || id.index != i || a.Lookup([]byte(id.Name)) != id {
				t.Fatalf("bad identity %d: %v", i, id)
			}
			seen[id.Name] = true
			if id.Role < RoleClient || id.Role > RoleAdmin {
				t.Fatalf("role %v", id.Role)
			}
			for _, p := range id.prefixes {
				if len(p.b) == 0 || len(p.b) > MaxPrefix || !id.Allows(p.b) {
					t.Fatalf("prefix %q", p.b)
				}
			}
			if id.all && len(id.prefixes) > 0 {
				t.Fatal("* with prefixes")
			}
		}
		b, err := Parse("f", format(a))
		if err != nil || !same(a, b) {
			t.Fatalf("round trip: %v\n%s", err, format(a))
		}
	})
}

// helloACL is FuzzHello's file: a client, a certificate-only identity, and
// an identity whose secret has spaces and a 0x20 at its end.
var helloSecrets = map[string]string{"orders": "orders-secret", "sp": "a b  c "}

func helloACL(tb testing.TB) *ACL {
	var text strings.Builder
	for name, secret := range helloSecrets {
		text.WriteString(name + " " + Digest([]byte(secret)) + " * client\n")
	}
	text.WriteString("billing cert * client\n")
	return mustParse(tb, text.String())
}

// FuzzHello runs a hello's tail through what the server does with it
// (proto.SplitHello, then Authenticate) and checks the outcome against the
// contract (PROTOCOL.md §8.3): it succeeds exactly when the tail is
// "identity 0x20 secret" with a known identity that has a sha256 secret,
// the secret's bytes verbatim (spaces included) and 1..256 of them, and
// then names that identity.
func FuzzHello(f *testing.F) {
	a := helloACL(f)
	f.Add([]byte("orders orders-secret"))
	f.Add([]byte("sp a b  c "))
	f.Add([]byte("billing x"))
	f.Fuzz(func(t *testing.T, tail []byte) {
		var id *Identity
		if name, secret, ok := proto.SplitHello(tail); ok {
			id = a.Authenticate(name, secret)
		}
		name, secret, cut := strings.Cut(string(tail), " ")
		want, known := helloSecrets[name]
		ok := cut && known && secret == want && len(secret) >= 1 && len(secret) <= proto.MaxSecret
		if (id != nil) != ok || (id != nil && id.Name != name) {
			t.Fatalf("hello %q: identity %v, want ok=%v", tail, id, ok)
		}
	})
}

// FuzzAllows: the word-at-a-time prefix check answers as bytes.HasPrefix
// over the identity's prefixes does, for any prefixes and key.
func FuzzAllows(f *testing.F) {
	f.Add("orders/,jobs/,bench/", []byte("bench/key/1"))
	f.Add("a,ab/,é/", []byte("é"))
	f.Add("tenant-000042/orders/", []byte("tenant-000042/orders"))
	f.Add("12345678,123456789", []byte("12345678"))
	f.Fuzz(func(t *testing.T, keys string, key []byte) {
		a, err := Parse("f", []byte("x cert "+keys+" client\n"))
		if err != nil {
			return
		}
		id := a.Lookup([]byte("x"))
		want := id.all
		for _, p := range id.prefixes {
			want = want || bytes.HasPrefix(key, p.b)
		}
		if got := id.Allows(key); got != want {
			t.Fatalf("keys %q, key %q: Allows %v, want %v", keys, key, got, want)
		}
	})
}
