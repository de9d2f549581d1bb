package tlsconf_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// files is a directory of PEM files made from one CA: server.pem,
// server-key.pem, ca.pem; more can be written with write.
type files struct {
	t   *testing.T
	dir string
	ca  *testcerts.CA
	f   tlsconf.Files
}

func newFiles(t *testing.T) *files {
	t.Helper()
	ca, err := testcerts.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	x := &files{t: t, dir: t.TempDir(), ca: ca}
	x.f.Cert, x.f.Key = x.issue("server", "lockd-1")
	x.f.ClientCA, err = ca.Write(x.dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// issue writes a certificate named cn (for 127.0.0.1) from the CA under
// name and returns its files.
func (x *files) issue(name, cn string) (string, string) {
	x.t.Helper()
	p, err := x.ca.Issue(cn, "127.0.0.1")
	if err != nil {
		x.t.Fatal(err)
	}
	c, k, err := p.Write(x.dir, name)
	if err != nil {
		x.t.Fatal(err)
	}
	return c, k
}

func (x *files) write(name, content string) string {
	x.t.Helper()
	p := filepath.Join(x.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		x.t.Fatal(err)
	}
	return p
}

// TestLoadErrors: every way a file can be wrong is a FieldError naming
// the field and the file.
func TestLoadErrors(t *testing.T) {
	x := newFiles(t)
	missing := filepath.Join(x.dir, "nope.pem")
	garbage := x.write("garbage.pem", "not PEM at all\n")
	badBlock := x.write("bad.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	keyOnly := x.f.Key
	_, otherKey := x.issue("other", "other")
	cases := []struct {
		name  string
		mod   func(*tlsconf.Files)
		field string
		file  string
		want  string
	}{
		{"cert without key", func(f *tlsconf.Files) { f.Key = "" }, tlsconf.FieldKey, "", "give both"},
		{"key without cert", func(f *tlsconf.Files) { f.Cert, f.ClientCA = "", "" }, tlsconf.FieldCert, "", "give both"},
		{"client CA without cert", func(f *tlsconf.Files) { f.Cert, f.Key = "", "" }, tlsconf.FieldClientCA, x.f.ClientCA, "needs"},
		{"peer CA without cert", func(f *tlsconf.Files) { f.Cert, f.Key, f.ClientCA, f.PeerCA = "", "", "", x.f.ClientCA }, tlsconf.FieldPeerCA, x.f.ClientCA, "needs"},
		{"cert missing", func(f *tlsconf.Files) { f.Cert = missing }, tlsconf.FieldCert, missing, "no such file"},
		{"key missing", func(f *tlsconf.Files) { f.Key = missing }, tlsconf.FieldKey, missing, "no such file"},
		{"cert garbage", func(f *tlsconf.Files) { f.Cert = garbage }, tlsconf.FieldCert, garbage, "no PEM CERTIFICATE"},
		{"cert is a key", func(f *tlsconf.Files) { f.Cert = keyOnly }, tlsconf.FieldCert, keyOnly, "no PEM CERTIFICATE"},
		{"cert bad block", func(f *tlsconf.Files) { f.Cert = badBlock }, tlsconf.FieldCert, badBlock, "PEM block 1"},
		{"key garbage", func(f *tlsconf.Files) { f.Key = garbage }, tlsconf.FieldKey, garbage, "PEM"},
		{"key of another cert", func(f *tlsconf.Files) { f.Key = otherKey }, tlsconf.FieldKey, otherKey, "does not match"},
		{"client CA missing", func(f *tlsconf.Files) { f.ClientCA = missing }, tlsconf.FieldClientCA, missing, "no such file"},
		{"client CA garbage", func(f *tlsconf.Files) { f.ClientCA = garbage }, tlsconf.FieldClientCA, garbage, "no PEM CERTIFICATE"},
		{"peer CA bad block", func(f *tlsconf.Files) { f.PeerCA = badBlock }, tlsconf.FieldPeerCA, badBlock, "PEM block 1"},
		{"nothing", func(f *tlsconf.Files) { *f = tlsconf.Files{} }, tlsconf.FieldCert, "", "no certificate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := x.f
			c.mod(&f)
			_, err := tlsconf.Load(f)
			var fe *tlsconf.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Load: %v, want a FieldError", err)
			}
			if fe.Field != c.field || fe.File != c.file || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load: field %q file %q: %v; want field %q file %q and %q", fe.Field, fe.File, err, c.field, c.file, c.want)
			}
		})
	}
}

// served starts a TLS listener on cfg and returns, for a client trusting
// roots (and presenting client if set), the Common Name of the certificate
// the server presents, or the handshake's error.
func served(t *testing.T, cfg *tls.Config, roots *x509.CertPool, client *tls.Certificate) (string, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_ = c.(*tls.Conn).Handshake()
		_, _ = c.Write([]byte("x"))
	}()
	ccfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if client != nil {
		ccfg.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), ccfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// TestReload: after Reload a handshake gets the new certificate; a file
// that no longer parses is reported and the old material kept; a new CA
// bundle is taken even when the key pair fails.
func TestReload(t *testing.T) {
	x := newFiles(t)
	st, err := tlsconf.Load(x.f)
	if err != nil {
		t.Fatal(err)
	}
	alice, err := x.ca.Issue("alice")
	if err != nil {
		t.Fatal(err)
	}
	roots := x.ca.Pool()
	if cn, err := served(t, st.ServerConfig(), roots, &alice.TLS); err != nil || cn != "lockd-1" {
		t.Fatalf("before reload: %q %v", cn, err)
	}
	if st.Certificate().Leaf.Subject.CommonName != "lockd-1" {
		t.Fatal("Certificate is not the loaded one")
	}

	// A new certificate in the same files.
	c2, k2 := x.issue("server2", "lockd-2")
	for from, to := range map[string]string{c2: x.f.Cert, k2: x.f.Key} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{"client port": st.ServerConfig(), "admin": st.AdminConfig()} {
		if cn, err := served(t, cfg, roots, &alice.TLS); err != nil || cn != "lockd-2" {
			t.Fatalf("%s after reload: %q %v", name, cn, err)
		}
	}

	// A broken key: reported, the old pair kept. The client CA changes to
	// another CA at the same time, and that part is taken.
	other, err := testcerts.NewCA("other CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(x.f.Key, []byte("broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(x.f.ClientCA, other.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	err = st.Reload()
	var fe *tlsconf.FieldError
	if !errors.As(err, &fe) || fe.Field != tlsconf.FieldKey || fe.File != x.f.Key {
		t.Fatalf("reload with a broken key: %v", err)
	}
	if _, err := served(t, st.ServerConfig(), roots, &alice.TLS); err == nil {
		t.Fatal("alice (from the old CA) still admitted after the client CA changed")
	}
	bob, err := other.Issue("bob")
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := served(t, st.ServerConfig(), roots, &bob.TLS); err != nil || cn != "lockd-2" {
		t.Fatalf("after a failed key reload: %q %v (want the kept lockd-2 and bob admitted)", cn, err)
	}
	// The admin endpoint asks for a client certificate but does not need one.
	if cn, err := served(t, st.AdminConfig(), roots, nil); err != nil || cn != "lockd-2" {
		t.Fatalf("admin without a client certificate: %q %v", cn, err)
	}
	if st.PeerCAs() != st.ClientCAs() {
		t.Fatal("PeerCAs is not the client CA pool without a peer CA file")
	}
}

// TestTLSVersion: a client limited to TLS 1.1 is refused.
func TestTLSVersion(t *testing.T) {
	x := newFiles(t)
	x.f.ClientCA = ""
	st, err := tlsconf.Load(x.f)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", st.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	_, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: x.ca.Pool(), ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("a TLS 1.1 client: %v, want the server's protocol version alert", err)
	}
}
