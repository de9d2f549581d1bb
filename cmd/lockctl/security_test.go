package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/proto"
)

// pki is a CA and a server certificate for 127.0.0.1, made in the test,
// with the CA's PEM in a file.
type pki struct {
	caFile string
	server tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lockctl test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "lockd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	p.server = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsFront terminates TLS on 127.0.0.1 and forwards the bytes to target:
// a TLS port in front of a real lockd's client or admin port.
func tlsFront(t *testing.T, target string, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				track(u)
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestTLSFlags: lockctl over TLS (a TLS front in front of a real lockd's
// client and admin ports), and what a missing or wrong CA gives.
func TestTLSFlags(t *testing.T) {
	s := startLockd(t)
	p := newPKI(t)
	front, adminFront := tlsFront(t, s.addr, p.server), tlsFront(t, s.admin, p.server)
	tlsArgs := []string{"--addr", front, "--tls-ca", p.caFile}
	out, errs, code := ctl(t, nil, append([]string{"acquire", "tls-key"}, tlsArgs...)...)
	if code != 0 {
		t.Fatalf("acquire over TLS: %d %s", code, errs)
	}
	tok := strings.TrimSpace(out)
	out, errs, code = ctl(t, nil, append([]string{"status", "tls-key", "--admin", adminFront}, tlsArgs...)...)
	if code != 0 || !strings.Contains(out, tok) {
		t.Fatalf("status KEY over HTTPS: %d %q %s", code, out, errs)
	}
	if _, errs, code := ctl(t, nil, append([]string{"release", "tls-key", tok}, tlsArgs...)...); code != 0 {
		t.Fatalf("release over TLS: %d %s", code, errs)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"plaintext to a TLS port", []string{"ping", "--addr", front}, exitError, "a TLS port"},
		{"system roots only", []string{"ping", "--addr", front, "--tls"}, exitError, "certificate"},
		{"wrong server name", []string{"ping", "--addr", front, "--tls-ca", p.caFile, "--tls-server-name", "elsewhere"}, exitError, "certificate"},
		{"TLS to a plaintext port", []string{"ping", "--addr", s.addr, "--tls-ca", p.caFile}, exitError, "TLS handshake"},
		{"CA file missing", []string{"ping", "--addr", front, "--tls-ca", "/no/such.pem"}, exitUsage, "--tls-ca"},
		{"CA file not PEM", []string{"ping", "--addr", front, "--tls-ca", os.Args[0]}, exitUsage, "--tls-ca"},
		{"cert without key", []string{"ping", "--addr", front, "--tls-cert", p.caFile}, exitUsage, "--tls-key"},
		{"plain HTTP to HTTPS admin", []string{"status", "--admin", adminFront}, exitError, "admin endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, errs, code := ctl(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errs, tc.code, tc.want)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("took %v", el)
			}
		})
	}
}

// fakeLockd answers a hello with E 5 when the secret is not want, E 6 to
// any lock request on a key outside "orders/", and grants the rest, as a
// lockd with --acl does.
func fakeLockd(t *testing.T, want string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	serve := func(c net.Conn) {
		defer wg.Done()
		defer c.Close()
		var in []byte
		buf := make([]byte, 4096)
		var r proto.Request
		token := uint64(1000)
		for {
			n, err := c.Read(buf)
			in = append(in, buf[:n]...)
			var out []byte
			for {
				m, perr := proto.ParseRequest(in, 0, &r)
				if perr == proto.ErrIncomplete {
					break
				}
				if perr != nil {
					return
				}
				key := string(r.Key)
				switch {
				case r.Op == proto.OpHello:
					if _, secret, ok := proto.SplitHello(r.Key); !ok || string(secret) != want {
						out = proto.AppendError(out, proto.OpHello, r.ID, proto.CodeUnauthenticated, "unauthenticated")
						_, _ = c.Write(out)
						// Close as lockd does; read what the client sent
						// meanwhile first, so the close is not a reset.
						_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
						_, _ = io.Copy(io.Discard, c)
						return
					}
					out = proto.AppendWelcome(out, r.ID, proto.HelloIdentity(r.Key))
				case r.Op == proto.OpPing:
					out = proto.AppendPong(out, r.ID)
				case !strings.HasPrefix(key, "orders/"):
					out = proto.AppendError(out, r.Op, r.ID, proto.CodePermissionDenied, "permission denied")
				case r.Op == proto.OpAcquire:
					token++
					out = proto.AppendAcquired(out, r.ID, token, key)
				case r.Op == proto.OpRelease:
					out = proto.AppendReleased(out, r.ID, key)
				case r.Op == proto.OpRenew:
					out = proto.AppendRenewed(out, r.ID, key)
				}
				in = in[m:]
			}
			if len(out) > 0 {
				_, _ = c.Write(out)
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestRefusedCredentials: E 5 is exit 15 and E 6 exit 16, each with a
// message that names the identity (and the key) but never the secret.
func TestRefusedCredentials(t *testing.T) {
	addr := fakeLockd(t, "right-secret")
	dir := t.TempDir()
	right, wrong := filepath.Join(dir, "right"), filepath.Join(dir, "wrong")
	_ = os.WriteFile(right, []byte("right-secret\n"), 0o600)
	_ = os.WriteFile(wrong, []byte("wrong-secret\n"), 0o600)
	env := func(file string) []string {
		return []string{"LOCKD_ADDRS=" + addr, "LOCKD_IDENTITY=orders", "LOCKD_SECRET_FILE=" + file}
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		want []string
	}{
		{"allowed", env(right), []string{"acquire", "orders/1"}, 0, nil},
		{"wrong secret: ping", env(wrong), []string{"ping"}, exitUnauthenticated, []string{"unauthenticated", `"orders"`}},
		{"wrong secret: acquire", env(wrong), []string{"acquire", "orders/1"}, exitUnauthenticated, []string{"unauthenticated", `"orders"`}},
		{"wrong secret: run", env(wrong), []string{"run", "orders/1", "--", "true"}, exitUnauthenticated, []string{"unauthenticated"}},
		{"other key: acquire", env(right), []string{"acquire", "billing/1"}, exitPermissionDenied, []string{"permission denied", `"billing/1"`, `"orders"`}},
		{"other key: release", env(right), []string{"release", "billing/1", "5"}, exitPermissionDenied, []string{"permission denied"}},
		{"other key: renew", env(right), []string{"renew", "billing/1", "5"}, exitPermissionDenied, []string{"permission denied"}},
		{"other key: run", env(right), []string{"run", "billing/1", "--", "true"}, exitPermissionDenied, []string{"permission denied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := ctl(t, tc.env, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; %s", code, tc.code, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q lacks %q", errs, w)
				}
			}
			if strings.Contains(out+errs, "right-secret") || strings.Contains(out+errs, "wrong-secret") {
				t.Errorf("a secret was printed: %s %s", out, errs)
			}
		})
	}
}

// TestAdminAuth: status reaches the admin endpoint over HTTPS with the CA
// of --tls-ca and sends the identity and secret as basic authentication;
// 401 is exit 15 and 403 exit 16.
func TestAdminAuth(t *testing.T) {
	p := newPKI(t)
	roles := map[string]string{"prometheus": "monitor-secret", "orders": "client-secret"}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		switch {
		case r.TLS == nil:
			http.Error(w, "not over TLS", http.StatusBadRequest)
		case !ok || roles[user] != pass:
			w.Header().Set("WWW-Authenticate", `Basic realm="lockd"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case user != "prometheus":
			http.Error(w, "forbidden", http.StatusForbidden)
		case r.URL.Path == api.PathStatus:
			_ = json.NewEncoder(w).Encode(api.Status{Role: api.RoleActive, Mode: api.ModeSingle, Addr: "127.0.0.1:7070", Keys: 3})
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.server}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	admin := strings.TrimPrefix(srv.URL, "https://")
	dir := t.TempDir()
	secret := func(s string) string {
		f := filepath.Join(dir, s)
		_ = os.WriteFile(f, []byte(s+"\n"), 0o600)
		return f
	}
	base := []string{"status", "--admin", admin, "--tls-ca", p.caFile}
	for _, tc := range []struct {
		name  string
		creds []string
		code  int
		want  string
	}{
		{"monitor", []string{"--identity", "prometheus", "--secret-file", secret("monitor-secret")}, 0, "held keys:   3"},
		{"no credentials", nil, exitUnauthenticated, "needs a monitor or admin identity"},
		{"wrong secret", []string{"--identity", "prometheus", "--secret-file", secret("wrong-secret")}, exitUnauthenticated, "refused identity \"prometheus\""},
		{"client identity", []string{"--identity", "orders", "--secret-file", secret("client-secret")}, exitPermissionDenied, "not a monitor or admin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := ctl(t, nil, append(base, tc.creds...)...)
			if code != tc.code || !strings.Contains(out+errs, tc.want) {
				t.Fatalf("exit %d, out %q, err %q; want %d and %q", code, out, errs, tc.code, tc.want)
			}
			for _, sec := range []string{"monitor-secret", "wrong-secret", "client-secret"} {
				if strings.Contains(out+errs, sec) {
					t.Fatalf("a secret was printed: %s %s", out, errs)
				}
			}
		})
	}
}

// TestMessagesNameTheCause: what went wrong is said in lockctl's terms —
// its flags, the identity lockd logs, the limit a key broke — and "is it
// running?" only where nothing answered. Against real lockd processes:
// a TLS port, one with mutual TLS and an ACL, one with an ACL alone.
func TestMessagesNameTheCause(t *testing.T) {
	ca, err := testcerts.NewCA("lockctl messages CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := ca.Issue("lockd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := srv.Write(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.Write(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	billing, err := ca.Issue("billing")
	if err != nil {
		t.Fatal(err)
	}
	bcert, bkey, err := billing.Write(dir, "billing")
	if err != nil {
		t.Fatal(err)
	}
	aclFile := filepath.Join(dir, "acl")
	if err := os.WriteFile(aclFile, []byte("billing cert billing/ client\norders "+digest("orders-secret")+" orders/ client\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsPort := startLockd(t, "--tls-cert", cert, "--tls-key", key)
	mutual := startLockd(t, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", caFile, "--acl", aclFile)
	withACL := startLockd(t, "--acl", aclFile)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	long := strings.Repeat("k", 1025)

	const running = "is it running?"
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		want   []string
		unwant []string
	}{
		{"plaintext to lockd's TLS port", []string{"acquire", "k", "--addr", tlsPort.addr},
			exitError, []string{"speaks TLS", "--tls-ca"}, []string{running, "indeterminate"}},
		{"no client certificate for mutual TLS", []string{"acquire", "billing/1", "--addr", mutual.addr, "--tls-ca", caFile},
			exitError, []string{"TLS", "--tls-cert", "--tls-key"}, []string{running, "indeterminate"}},
		{"no identity", []string{"acquire", "orders/1", "--addr", withACL.addr},
			exitUnauthenticated, []string{"requires an identity", "--identity", "--secret-file"}, []string{"Config."}},
		{"a certificate's identity outside its keys", []string{"acquire", "orders/1", "--addr", mutual.addr, "--tls-ca", caFile, "--tls-cert", bcert, "--tls-key", bkey},
			exitPermissionDenied, []string{`identity "billing"`, `"orders/1"`}, []string{`identity ""`}},
		{"a key over 1024 bytes", []string{"acquire", long, "--addr", withACL.addr},
			exitUsage, []string{"1025 bytes", "1024"}, nil},
		{"nothing listening", []string{"ping", "--addr", deadAddr},
			exitError, []string{"connection refused", running}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs, code := ctl(t, nil, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr lacks %q: %s", w, errs)
				}
			}
			for _, w := range tc.unwant {
				if strings.Contains(errs, w) {
					t.Errorf("stderr says %q: %s", w, errs)
				}
			}
		})
	}
}

// digest is an ACL file's sha256: secret field for secret.
func digest(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(sum[:])
}
