package repltest

import (
	"crypto/tls"
	"crypto/x509"
	"sync/atomic"
	"testing"

	"github.com/lockd-dev/lockd/internal/testcerts"
)

// TLSMaterial is a member's TLS material (repl.MemberTLS) that a test can
// swap, as a SIGHUP reload swaps tlsconf's.
type TLSMaterial struct {
	cert atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool]
}

// NewTLSMaterial returns the material of cert, verifying peers against pool.
func NewTLSMaterial(cert tls.Certificate, pool *x509.CertPool) *TLSMaterial {
	m := &TLSMaterial{}
	m.Set(cert, pool)
	return m
}

// Set replaces the certificate and the pool.
func (m *TLSMaterial) Set(cert tls.Certificate, pool *x509.CertPool) {
	m.cert.Store(&cert)
	m.pool.Store(pool)
}

// Certificate is the current certificate.
func (m *TLSMaterial) Certificate() *tls.Certificate { return m.cert.Load() }

// PeerCAs is the current pool.
func (m *TLSMaterial) PeerCAs() *x509.CertPool { return m.pool.Load() }

// MemberTLS returns a CA and, for each member, material holding a
// certificate it issued naming that member's host (hosts[i]) and
// verifying peers against it.
func MemberTLS(tb testing.TB, hosts []string) (*testcerts.CA, []*TLSMaterial) {
	tb.Helper()
	ca, err := testcerts.NewCA("lockd test members")
	if err != nil {
		tb.Fatal(err)
	}
	var out []*TLSMaterial
	for _, h := range hosts {
		p, err := ca.Issue("member "+h, h)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, NewTLSMaterial(p.TLS, ca.Pool()))
	}
	return ca, out
}

// Secret is a cluster secret for tests (32 bytes).
func Secret(b byte) []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = b ^ byte(i*7)
	}
	return s
}

// Forgery is one way a stranger tries a member port (ForgeryCases): the
// cluster's §8.4 setting (Secret, TLS with the members' material) and,
// when not nil, the material the stranger runs the exchange with.
type Forgery struct {
	Name     string
	Secret   []byte
	TLS      bool
	Impostor *TLSMaterial
}

// ForgeryCases returns the members' TLS material (three members on
// 127.0.0.1) and the cases both modes' forged-member tests run: §8.4 off,
// a secret, TLS, both, and both with a certificate of another CA or of
// the right CA naming another host. secret seeds the cluster secret.
func ForgeryCases(tb testing.TB, secret byte) ([]*TLSMaterial, []Forgery) {
	tb.Helper()
	ca, mats := MemberTLS(tb, []string{"127.0.0.1", "127.0.0.1", "127.0.0.1"})
	_, strangers := MemberTLS(tb, []string{"127.0.0.1"})
	elsewhere, err := ca.Issue("elsewhere", "10.9.9.9")
	if err != nil {
		tb.Fatal(err)
	}
	sec := Secret(secret)
	return mats, []Forgery{
		{Name: "off"},
		{Name: "secret", Secret: sec},
		{Name: "tls", TLS: true},
		{Name: "tls+secret", Secret: sec, TLS: true},
		{Name: "tls+secret, certificate of another CA", Secret: sec, TLS: true, Impostor: strangers[0]},
		{Name: "tls+secret, certificate naming another host", Secret: sec, TLS: true,
			Impostor: NewTLSMaterial(elsewhere.TLS, ca.Pool())},
	}
}
