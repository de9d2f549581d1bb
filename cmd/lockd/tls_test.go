package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/proto"
)

// pemFiles is a directory with a CA (ca.pem), the server's certificate
// (server.pem, server-key.pem, CN lockd-1) and a client's (alice).
type pemFiles struct {
	dir               string
	ca                *testcerts.CA
	caFile, cert, key string
	alice             *testcerts.Pair
	garbage, otherKey string
	missing           string
}

func newPEMFiles(t *testing.T) *pemFiles {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	p := &pemFiles{dir: t.TempDir()}
	var err error
	p.ca, err = testcerts.NewCA("lockd test CA")
	must(err)
	p.caFile, err = p.ca.Write(p.dir, "ca")
	must(err)
	p.cert, p.key = p.issue(t, "server", "lockd-1")
	p.alice, err = p.ca.Issue("alice")
	must(err)
	_, p.otherKey = p.issue(t, "other", "other")
	p.garbage = filepath.Join(p.dir, "garbage.pem")
	must(os.WriteFile(p.garbage, []byte("this is not PEM\n"), 0o600))
	p.missing = filepath.Join(p.dir, "missing.pem")
	return p
}

func (p *pemFiles) issue(t *testing.T, name, cn string) (string, string) {
	t.Helper()
	pair, err := p.ca.Issue(cn, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := pair.Write(p.dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// client is a TLS client configuration trusting the CA, presenting alice's
// certificate.
func (p *pemFiles) client() *tls.Config {
	return &tls.Config{RootCAs: p.ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{p.alice.TLS}}
}

// TestTLSFlagErrors: a TLS flag without its partner, or naming a file that
// cannot be read or parsed, is a bad flag: exit 2, naming the flag and
// the file.
func TestTLSFlagErrors(t *testing.T) {
	p := newPEMFiles(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"cert without key", []string{"--tls-cert", p.cert}, []string{"--tls-key", "--tls-cert"}},
		{"key without cert", []string{"--tls-key", p.key}, []string{"--tls-cert", "--tls-key"}},
		{"client CA without cert", []string{"--tls-client-ca", p.caFile}, []string{"--tls-client-ca", p.caFile, "needs --tls-cert"}},
		{"peer CA without cert", []string{"--tls-peer-ca", p.caFile}, []string{"--tls-peer-ca", p.caFile, "needs --tls-cert"}},
		{"cert missing", []string{"--tls-cert", p.missing, "--tls-key", p.key}, []string{"--tls-cert", p.missing, "no such file"}},
		{"cert garbage", []string{"--tls-cert", p.garbage, "--tls-key", p.key}, []string{"--tls-cert", p.garbage}},
		{"key missing", []string{"--tls-cert", p.cert, "--tls-key", p.missing}, []string{"--tls-key", p.missing}},
		{"key garbage", []string{"--tls-cert", p.cert, "--tls-key", p.garbage}, []string{"--tls-key", p.garbage}},
		{"key of another certificate", []string{"--tls-cert", p.cert, "--tls-key", p.otherKey}, []string{"--tls-key", p.otherKey}},
		{"client CA garbage", []string{"--tls-cert", p.cert, "--tls-key", p.key, "--tls-client-ca", p.garbage}, []string{"--tls-client-ca", p.garbage}},
		{"peer CA missing", []string{"--tls-cert", p.cert, "--tls-key", p.key, "--tls-peer-ca", p.missing}, []string{"--tls-peer-ca", p.missing}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(binary, append([]string{"--listen", "127.0.0.1:0", "--admin", "", "--data-dir", t.TempDir()}, c.args...)...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2; stderr: %s", err, stderr.String())
			}
			for _, w := range c.want {
				if !strings.Contains(stderr.String(), w) {
					t.Fatalf("stderr does not name %q: %s", w, stderr.String())
				}
			}
		})
	}
}

// serverCN returns the Common Name of the certificate a fresh handshake
// with addr gets.
func serverCN(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// waitLog waits up to 5 s for a log line containing all of want.
func waitLog(t *testing.T, d *daemon, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(d.logs.String(), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(line, w)
			}
			if ok {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line with %q:\n%s", want, d.logs)
}

// TestTLSBinary runs lockd with mutual TLS: the client port serves TLS
// clients with a certificate and closes plaintext ones; the admin endpoint
// serves HTTPS, asking for but not requiring a client certificate; SIGHUP
// makes new handshakes get a rotated certificate within 1 s, keeps open
// connections, and keeps the old certificate when the new key does not
// parse.
func TestTLSBinary(t *testing.T) {
	p := newPEMFiles(t)
	d := startDaemon(t, t.TempDir(), "--admin", "127.0.0.1:0",
		"--tls-cert", p.cert, "--tls-key", p.key, "--tls-client-ca", p.caFile)

	tc, err := tls.Dial("tcp", d.addr, p.client())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	c := &conn{t: t, c: tc}
	tok := c.grant("job", 60, 1)
	if tok == 0 {
		t.Fatal("no token")
	}

	// A plaintext client reads one plaintext E 1 saying the port speaks
	// TLS, then the close.
	plain := dial(t, d.addr)
	plain.send(proto.AppendPing(nil, 2))
	_ = plain.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(plain.c); err != nil || !bytes.Equal(got, proto.AppendError(nil, proto.OpPing, 0, proto.CodeBadFrame, engine.PlaintextOnTLS)) {
		t.Fatalf("a plaintext client on the TLS port read %q (%v), want one E 1 naming TLS and the close", got, err)
	}
	waitLog(t, d, "TLS handshakes failed")

	admin := strings.Replace(d.adminURL(), "http://", "https://", 1)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.ca.Pool()}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(admin + "/healthz")
	if err != nil {
		t.Fatalf("HTTPS /healthz without a client certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(d.adminURL() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("the admin endpoint answered plain HTTP")
		}
	}

	if cn := serverCN(t, d.addr, p.client()); cn != "lockd-1" {
		t.Fatalf("before SIGHUP: %q", cn)
	}
	// Rotate: a new certificate and key in the same files.
	c2, k2 := p.issue(t, "server2", "lockd-2")
	for from, to := range map[string]string{c2: p.cert, k2: p.key} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.Signal(syscall.SIGHUP)
	time.Sleep(time.Second)
	if cn := serverCN(t, d.addr, p.client()); cn != "lockd-2" {
		t.Fatalf("1 s after SIGHUP the server presents %q, want lockd-2", cn)
	}
	waitLog(t, d, "SIGHUP: reloaded")
	c.send(proto.AppendRelease(nil, tok, "job"))
	c.expect(proto.OpRelease, tok) // the connection from before the reload lives on

	// A key that no longer parses: logged, the old pair kept.
	if err := os.WriteFile(p.key, []byte("truncated"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = d.Signal(syscall.SIGHUP)
	waitLog(t, d, "reload failed", "--tls-key", p.key)
	if cn := serverCN(t, d.addr, p.client()); cn != "lockd-2" {
		t.Fatalf("after a failed reload the server presents %q, want lockd-2", cn)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d.logs)
	}
}

// TestSIGHUPWithoutTLS: a plaintext server survives SIGHUP (nothing to
// reload) and goes on serving.
func TestSIGHUPWithoutTLS(t *testing.T) {
	d := startDaemon(t, t.TempDir())
	_ = d.Signal(syscall.SIGHUP)
	waitLog(t, d, "nothing to reload")
	c := dial(t, d.addr)
	c.send(proto.AppendPing(nil, 5))
	c.expect(proto.OpPing, 5)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// jsonDupKeys returns the keys a JSON log line has more than once.
func jsonDupKeys(line string) ([]string, error) {
	d := json.NewDecoder(strings.NewReader(line))
	if _, err := d.Token(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var dup []string
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return nil, err
		}
		if seen[k.(string)] {
			dup = append(dup, k.(string))
		}
		seen[k.(string)] = true
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
	}
	return dup, nil
}

// TestJSONLogKeysOnce: every line of a JSON log has each key once — the
// admin endpoint's TLS handshake errors included (their message was a
// second "msg") — through a start with TLS and an ACL, refused
// connections, a SIGHUP and a shutdown.
func TestJSONLogKeysOnce(t *testing.T) {
	p := newPEMFiles(t)
	aclFile := filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(aclFile, []byte("ops sha256:32323cfa9ec9d62750daad0836a4cf3d7b60d23723b7852a529667deed01669f * admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, t.TempDir(), "--log-format", "json", "--admin", "127.0.0.1:0",
		"--tls-cert", p.cert, "--tls-key", p.key, "--acl", aclFile)
	// Plain HTTP to the HTTPS admin endpoint: a TLS handshake error.
	if resp, err := http.Get(d.adminURL() + "/livez"); err == nil {
		resp.Body.Close()
	}
	waitLog(t, d, "admin endpoint", "handshake")
	// A plaintext client on the TLS client port, and an unauthenticated one.
	plain := dial(t, d.addr)
	plain.send(proto.AppendPing(nil, 1))
	_ = plain.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.ReadAll(plain.c)
	waitLog(t, d, "TLS handshakes failed")
	_ = d.Signal(syscall.SIGHUP)
	waitLog(t, d, "reloaded")
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, line := range strings.Split(strings.TrimSpace(d.logs.String()), "\n") {
		dup, err := jsonDupKeys(line)
		if err != nil {
			t.Fatalf("not a JSON line %q: %v", line, err)
		}
		if len(dup) > 0 {
			t.Errorf("keys %v twice: %s", dup, line)
		}
	}
}
