package acl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// example is PROTOCOL.md §8.2's example file, verbatim.
const example = `    # identity   secret                                                                   keys             role
    # (these example secrets are the SHA-256 of "orders-secret", "prometheus-secret", "ops-secret")
    orders       sha256:363838865d67245f6045a510d660614ae477cd64df9f55f5c068b20a1536949a  orders/,jobs/    client
    prometheus   sha256:023c2fdfeec87426e243e1db02dfa4d8f9a17119447561d4d60ccc1317bf845f  -                monitor
    ops          sha256:32323cfa9ec9d62750daad0836a4cf3d7b60d23723b7852a529667deed01669f  *                admin
    billing      cert                                                                     billing/         client
`

const (
	hexOrders = "363838865d67245f6045a510d660614ae477cd64df9f55f5c068b20a1536949a"
	digestA   = "sha256:" + hexOrders
)

func mustParse(t testing.TB, text string) *ACL {
	t.Helper()
	a, err := Parse("acl.txt", []byte(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return a
}

func TestParseExample(t *testing.T) {
	a := mustParse(t, example)
	want := []struct {
		name, keys string
		role       Role
		cert       bool
	}{
		{"orders", "orders/,jobs/", RoleClient, false},
		{"prometheus", "-", RoleMonitor, false},
		{"ops", "*", RoleAdmin, false},
		{"billing", "billing/", RoleClient, true},
	}
	if a.Len() != len(want) {
		t.Fatalf("%d identities, want %d", a.Len(), len(want))
	}
	for i, w := range want {
		id := a.Identities()[i]
		if id.Name != w.name || id.Prefixes() != w.keys || id.Role != w.role || id.CertOnly() != w.cert || id.Index() != i {
			t.Errorf("identity %d: %v (index %d), want %+v", i, id, id.Index(), w)
		}
		if a.Lookup([]byte(w.name)) != id {
			t.Errorf("Lookup(%q) is not identity %d", w.name, i)
		}
	}
	for _, c := range []struct{ name, secret string }{
		{"orders", "orders-secret"}, {"prometheus", "prometheus-secret"}, {"ops", "ops-secret"},
	} {
		if id := a.Authenticate([]byte(c.name), []byte(c.secret)); id == nil || id.Name != c.name {
			t.Errorf("Authenticate(%s, its secret) = %v", c.name, id)
		}
	}
}

func TestParseForms(t *testing.T) {
	for _, c := range []struct {
		name, text string
		n          int
	}{
		{"empty file", "", 0},
		{"only comments and blanks", "# a\n\n   \t\n\t# b\n", 0},
		{"tabs and runs of blanks", "\t a \t\t" + digestA + "  \t x/ \tclient\t \n", 1},
		{"CRLF", "a " + digestA + " x/ client\r\nb cert - monitor\r\n", 2},
		{"no final newline", "a " + digestA + " x/ client", 1},
		{"identity charset and 64 bytes", strings.Repeat("aZ09._@-", 8) + " cert * admin\n", 1},
		{"UTF-8 prefix", "a cert clé/,日本/ client\n", 1},
		{"prefix of 1024 bytes", "a cert " + strings.Repeat("k", MaxPrefix) + " client\n", 1},
		{"comment after blanks", "   #x y z w v\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if a := mustParse(t, c.text); a.Len() != c.n {
				t.Fatalf("%d identities, want %d", a.Len(), c.n)
			}
		})
	}
}

func TestParseBadLines(t *testing.T) {
	good := "ok " + digestA + " x/ client\n"
	for _, c := range []struct {
		name, text string
		line       int
		msg        string // a part of the message
	}{
		{"three fields", "a " + digestA + " x/\n", 1, "3 fields"},
		{"five fields", "a " + digestA + " x/ client extra\n", 1, "5 fields"},
		{"trailing comment is a field", "a " + digestA + " x/ client #c\n", 1, "5 fields"},
		{"identity too long", strings.Repeat("a", 65) + " cert * client\n", 1, "65 bytes"},
		{"identity bad byte", "a/b cert * client\n", 1, "only A-Z"},
		{"identity non-ASCII", "é cert * client\n", 1, "only A-Z"},
		{"identity colon", "a:b cert * client\n", 1, "only A-Z"},
		{"duplicate", good + "# c\nok cert - monitor\n", 3, "first at line 1"},
		{"secret plain", "a hunter2 * client\n", 1, "want sha256:"},
		{"secret uppercase hex", "a sha256:" + strings.ToUpper(hexOrders) + " * client\n", 1, "lowercase"},
		{"secret short", "a sha256:" + hexOrders[:63] + " * client\n", 1, "63 characters"},
		{"secret long", "a sha256:" + hexOrders + "0 * client\n", 1, "65 characters"},
		{"secret not hex", "a sha256:" + hexOrders[:63] + "g * client\n", 1, "hex"},
		{"secret empty digest", "a sha256: * client\n", 1, "0 characters"},
		{"secret CERT", "a CERT * client\n", 1, "want sha256:"},
		{"empty prefix", "a cert x/,,y/ client\n", 1, "empty prefix"},
		{"trailing comma", "a cert x/, client\n", 1, "empty prefix"},
		{"star in a list", "a cert x/,* client\n", 1, "stands alone"},
		{"dash in a list", "a cert -,x/ client\n", 1, "stands alone"},
		{"glob", "a cert orders/* client\n", 1, "ends in *"},
		{"prefix too long", "a cert " + strings.Repeat("k", MaxPrefix+1) + " client\n", 1, "1025 bytes"},
		{"role unknown", "a cert * root\n", 1, "want client, monitor or admin"},
		{"role case", "a cert * Admin\n", 1, "want client"},
		{"not UTF-8", "a cert x\xff client\n", 1, "not UTF-8"},
		{"bad line after good ones", good + "\n# c\n\nb cert\n", 5, "2 fields"},
		{"line too long", good + "a cert " + strings.Repeat("k", MaxLine) + " client\n", 2, "longer than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("/etc/lockd/acl", []byte(c.text))
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("Parse: %v, want a *LineError", err)
			}
			if le.File != "/etc/lockd/acl" || le.Line != c.line || !strings.Contains(le.Msg, c.msg) {
				t.Fatalf("error %q (line %d), want line %d with %q", err, le.Line, c.line, c.msg)
			}
			if !strings.HasPrefix(err.Error(), "/etc/lockd/acl:") {
				t.Fatalf("error %q does not start with the file", err)
			}
		})
	}
}

// TestErrorsNeverQuoteASecret: a secret pasted into the secret field by
// mistake is not repeated in the error (which ends in a log).
func TestErrorsNeverQuoteASecret(t *testing.T) {
	for _, f := range []string{"hunter2-the-secret", "sha256:hunter2-the-secret", "sha256:" + strings.Repeat("Z", 64)} {
		_, err := Parse("f", []byte("a "+f+" * client\n"))
		if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "ZZZZ") {
			t.Fatalf("error %v quotes the secret field", err)
		}
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(p, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Load(p)
	if err != nil || a.Len() != 4 || a.File() != p {
		t.Fatalf("Load: %v, %v", a, err)
	}
	if _, err := Load(p + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load of a missing file: %v", err)
	}
	if err := os.WriteFile(p, []byte("x y z\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var le *LineError
	if _, err := Load(p); !errors.As(err, &le) || le.File != p || le.Line != 1 {
		t.Fatalf("Load of a bad file: %v", err)
	}
}

func TestAuthenticate(t *testing.T) {
	a := mustParse(t, example+"spaced "+Digest([]byte(" a secret with spaces "))+" * client\n")
	for _, c := range []struct {
		name, secret string
		ok           bool
	}{
		{"orders", "orders-secret", true},
		{"orders", "orders-secreT", false},
		{"orders", "orders-secret ", false},
		{"orders", "", false},
		{"Orders", "orders-secret", false},
		{"nobody", "orders-secret", false},
		{"", "orders-secret", false},
		{"billing", "anything", false}, // cert only
		{"billing", "", false},
		{"spaced", " a secret with spaces ", true},
		{"spaced", "a secret with spaces", false},
	} {
		id := a.Authenticate([]byte(c.name), []byte(c.secret))
		if (id != nil) != c.ok || (id != nil && id.Name != c.name) {
			t.Errorf("Authenticate(%q, %q) = %v, want ok=%v", c.name, c.secret, id, c.ok)
		}
	}
}

func TestByCertificate(t *testing.T) {
	a := mustParse(t, example)
	for _, c := range []struct {
		cn   string
		want string
	}{{"billing", "billing"}, {"orders", "orders"}, {"", ""}, {"nobody", ""}, {"Billing", ""}} {
		id := a.ByCertificate(c.cn)
		if got := ""; id != nil {
			got = id.Name
			if got != c.want {
				t.Errorf("ByCertificate(%q) = %q, want %q", c.cn, got, c.want)
			}
		} else if c.want != "" {
			t.Errorf("ByCertificate(%q) = nil, want %q", c.cn, c.want)
		}
	}
}

func TestAllows(t *testing.T) {
	a := mustParse(t, example+"none cert - client\nmulti cert a,ab/,é/ client\nlong cert 12345678,tenant-000042/orders/ client\n")
	for _, c := range []struct {
		id, key string
		ok      bool
	}{
		{"orders", "orders/1", true},
		{"orders", "orders/", true},
		{"orders", "jobs/x", true},
		{"orders", "orders", false},
		{"orders", "Orders/1", false},
		{"orders", "billing/1", false},
		{"orders", "", false},
		{"ops", "anything", true},
		{"ops", "", true},
		{"prometheus", "orders/1", false},
		{"none", "a", false},
		{"multi", "a", true},
		{"multi", "abc", true},
		{"multi", "é/x", true},
		{"multi", "e/x", false},
		{"multi", "b", false},
		{"long", "12345678", true},
		{"long", "1234567", false},
		{"long", "123456789", true},
		{"long", "12345679", false},
		{"long", "tenant-000042/orders/1", true},
		{"long", "tenant-000042/orders/", true},
		{"long", "tenant-000042/orders", false},
		{"long", "tenant-000042/ordersX", false},
		{"long", "tenant-000043/orders/1", false},
	} {
		if got := a.Lookup([]byte(c.id)).Allows([]byte(c.key)); got != c.ok {
			t.Errorf("%s.Allows(%q) = %v, want %v", c.id, c.key, got, c.ok)
		}
	}
}

func TestRoles(t *testing.T) {
	a := mustParse(t, example)
	for name, may := range map[string]bool{"orders": true, "prometheus": false, "ops": true} {
		if a.Lookup([]byte(name)).MayLock() != may {
			t.Errorf("%s.MayLock() != %v", name, may)
		}
	}
	for r, s := range map[Role]string{RoleClient: "client", RoleMonitor: "monitor", RoleAdmin: "admin", 0: "Role(0)"} {
		if r.String() != s {
			t.Errorf("Role %d String %q", r, r.String())
		}
	}
}

func TestStringHasNoDigest(t *testing.T) {
	a := mustParse(t, example)
	for _, id := range a.Identities() {
		if s := id.String(); strings.Contains(s, "3638") || strings.Contains(s, "023c") || strings.Contains(s, "3232") {
			t.Fatalf("%q shows a digest", s)
		}
	}
	if got := a.Lookup([]byte("orders")).String(); got != "orders (client, sha256, keys orders/,jobs/)" {
		t.Fatalf("String = %q", got)
	}
}

func TestDigest(t *testing.T) {
	if got := Digest([]byte("orders-secret")); got != digestA {
		t.Fatalf("Digest = %s", got)
	}
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{"a": true, "a.b_c@d-e": true, "": false, "a b": false, strings.Repeat("x", 64): true, strings.Repeat("x", 65): false} {
		if ValidName(name) != ok {
			t.Errorf("ValidName(%q) != %v", name, ok)
		}
	}
}
