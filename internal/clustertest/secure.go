package clustertest

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/lockd-dev/lockd/internal/testcerts"
)

// security is a Secure cluster's material (PROTOCOL.md §8.1, §8.4): a CA
// made for the cluster, a certificate per member naming 127.0.0.1, and a
// cluster secret, as files in the cluster's directory.
type security struct {
	ca     *testcerts.CA
	caFile string
	certs  [][2]string // member i's certificate and key files
	secret string      // the secret's file
}

// newSecurity writes the material of n members under dir/tls.
func newSecurity(dir string, n int) (*security, error) {
	d := filepath.Join(dir, "tls")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	ca, err := testcerts.NewCA("clustertest CA")
	if err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	s := &security{ca: ca}
	if s.caFile, err = ca.Write(d, "ca"); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	for i := range n {
		p, err := ca.Issue(fmt.Sprintf("lockd member %d", i), host)
		if err != nil {
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		cert, key, err := p.Write(d, fmt.Sprintf("member%d", i))
		if err != nil {
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		s.certs = append(s.certs, [2]string{cert, key})
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	s.secret = filepath.Join(d, "cluster-secret")
	if err := os.WriteFile(s.secret, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	return s, nil
}

// args are member i's security flags: TLS on the client port and the
// admin endpoint, mutual TLS on the member link, and the secret.
func (s *security) args(i int) []string {
	return []string{"--tls-cert", s.certs[i][0], "--tls-key", s.certs[i][1], "--tls-peer-ca", s.caFile, "--cluster-secret", s.secret}
}

// clientTLS is what a client of a member needs: the CA.
func (s *security) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: s.pool(), MinVersion: tls.VersionTLS12}
}

func (s *security) pool() *x509.CertPool { return s.ca.Pool() }

// ClientTLS is the TLS configuration a client of a Secure cluster needs
// (it trusts the cluster's CA; the server name is the address's host, as
// client.Config sets it), nil for another cluster. A copy each call.
func (c *Cluster) ClientTLS() *tls.Config {
	if c.sec == nil {
		return nil
	}
	return c.sec.clientTLS()
}

// Dial connects a raw protocol client to addr, over TLS when the cluster is
// Secure.
func (c *Cluster) Dial(addr string) (*Conn, error) {
	if c.sec == nil {
		return Dial(addr)
	}
	cfg := c.sec.clientTLS()
	cfg.ServerName, _, _ = net.SplitHostPort(addr)
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: DefaultConnTimeout}, "tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	return &Conn{nc: nc, timeout: DefaultConnTimeout}, nil
}

// memberArgs are member i's flags after the harness's: the security
// flags of a Secure cluster, then extra.
func (c *Cluster) memberArgs(i int, extra []string) []string {
	if c.sec == nil {
		return extra
	}
	return append(c.sec.args(i), extra...)
}

// HTTPClient is an HTTP client for the members' admin endpoints (it
// trusts a Secure cluster's CA and carries Options.AdminUser's basic
// authentication), with the given timeout.
func (c *Cluster) HTTPClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	if c.sec != nil {
		tr.TLSClientConfig = c.sec.clientTLS()
	}
	var rt http.RoundTripper = tr
	if c.opts.AdminUser != "" {
		rt = basicAuth{c.opts.AdminUser, c.opts.AdminPassword, rt}
	}
	return &http.Client{Timeout: timeout, Transport: rt}
}
