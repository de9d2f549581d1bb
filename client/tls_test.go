package client

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testPKI is a CA and the certificates it signed, made in the test.
type testPKI struct {
	caPEM                  []byte
	pool                   *x509.CertPool
	server, client, wrongN tls.Certificate // wrongN: a server certificate for another name
	serverPEM, serverKey   []byte
	clientPEM, clientKey   []byte

	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial atomic.Int64 // the last serial number issued
}

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lockd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := &testPKI{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pool: x509.NewCertPool(), ca: ca, caKey: caKey}
	p.serial.Store(1)
	p.pool.AddCert(ca)
	p.server, p.serverPEM, p.serverKey = p.issue(t, "lockd", []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"}, x509.ExtKeyUsageServerAuth)
	p.client, p.clientPEM, p.clientKey = p.issue(t, "orders", nil, nil, x509.ExtKeyUsageClientAuth)
	p.wrongN, _, _ = p.issue(t, "elsewhere", nil, []string{"lockd.example"}, x509.ExtKeyUsageServerAuth)
	return p
}

// issue signs a certificate for cn (and ips and dns), returning it and its
// certificate and key PEMs.
func (p *testPKI) issue(t testing.TB, cn string, ips []net.IP, dns []string, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: ips, DNSNames: dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	cp := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kp := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	c, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	return c, cp, kp
}

// serverFiles writes the CA and the server's certificate and key to dir
// for a lockd's --tls-client-ca, --tls-cert and --tls-key.
func (p *testPKI) serverFiles(t testing.TB) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for f, b := range map[string][]byte{ca: p.caPEM, cert: p.serverPEM, key: p.serverKey} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

// files writes the CA, server and client PEMs to dir.
func (p *testPKI) files(t testing.TB) (ca, cert, key string) {
	dir := t.TempDir()
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	for f, b := range map[string][]byte{ca: p.caPEM, cert: p.clientPEM, key: p.clientKey} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

// tlsFront terminates TLS on 127.0.0.1 and forwards the plaintext to
// target (a real lockd): what lockd's TLS port looks like to a client.
type tlsFront struct {
	ln         net.Listener
	handshakes atomic.Int64 // handshakes that succeeded
	mu         sync.Mutex
	conns      []net.Conn
	wg         sync.WaitGroup
}

func newTLSFront(t testing.TB, target string, cfg *tls.Config) *tlsFront {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &tlsFront{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.track(c)
			f.wg.Add(1)
			go f.serve(c.(*tls.Conn), target)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			_ = c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *tlsFront) track(c net.Conn) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
}

func (f *tlsFront) addr() string { return f.ln.Addr().String() }

func (f *tlsFront) serve(c *tls.Conn, target string) {
	defer f.wg.Done()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		return // the client sees the alert or the close
	}
	_ = c.SetDeadline(time.Time{})
	f.handshakes.Add(1)
	u, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	f.track(u)
	defer u.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.Close()
		close(done)
	}()
	_, _ = io.Copy(c, u)
	_ = c.Close()
	<-done
}

func serverTLS(p *testPKI, cert tls.Certificate, clientAuth tls.ClientAuthType) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: clientAuth, ClientCAs: p.pool, MinVersion: tls.VersionTLS12}
}

// TestTLS: the client over TLS to a real lockd (behind a TLS front end),
// with server verification, mutual TLS, a server name, credentials, and
// the failures a misconfiguration gives: ErrNoConnection with the reason,
// at once with FailFast, never ErrIndeterminate.
func TestTLS(t *testing.T) {
	srv := sharedServer(t)
	pki := newPKI(t)
	caFile, certFile, keyFile := pki.files(t)
	plain := newTLSFront(t, srv.Addr(), serverTLS(pki, pki.server, tls.NoClientCert))
	mutual := newTLSFront(t, srv.Addr(), serverTLS(pki, pki.server, tls.RequireAndVerifyClientCert))
	named := newTLSFront(t, srv.Addr(), serverTLS(pki, pki.wrongN, tls.NoClientCert))

	load := func(f TLSFiles) *tls.Config {
		cfg, err := LoadTLS(f)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ok := []struct {
		name  string
		addr  string
		tls   *tls.Config
		creds bool
	}{
		{"server verified", plain.addr(), load(TLSFiles{CA: caFile}), false},
		{"with credentials", plain.addr(), load(TLSFiles{CA: caFile}), true},
		{"mutual TLS", mutual.addr(), load(TLSFiles{CA: caFile, Cert: certFile, Key: keyFile}), true},
		{"server name", named.addr(), load(TLSFiles{CA: caFile, ServerName: "lockd.example"}), false},
		{"TLS 1.2 only", plain.addr(), &tls.Config{RootCAs: pki.pool, MaxVersion: tls.VersionTLS12}, false},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig(tc.addr)
			if tc.creds {
				cfg = credConfig(tc.addr)
			}
			cfg.TLS = tc.tls
			cl := newClient(t, cfg)
			ctx := ctxT(t, 10*time.Second)
			for i := 0; i < 4; i++ {
				l, err := cl.Acquire(ctx, "TestTLS/"+tc.name, AcquireOptions{Wait: time.Second, Lease: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if err := cl.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := cl.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	if plain.handshakes.Load() == 0 || mutual.handshakes.Load() == 0 || named.handshakes.Load() == 0 {
		t.Fatal("no TLS handshake reached the front ends")
	}

	bad := []struct {
		name string
		addr string
		tls  *tls.Config
		want string // in the error
	}{
		{"unknown CA", plain.addr(), &tls.Config{}, "certificate"},
		{"wrong name", named.addr(), load(TLSFiles{CA: caFile}), "certificate"},
		// TLS 1.3: the client's handshake completes, the server's alert
		// comes with the first read; nothing sent was executed.
		{"no client certificate", mutual.addr(), load(TLSFiles{CA: caFile}), "refused the TLS connection: remote error: tls: certificate required"},
		{"no client certificate, TLS 1.2", mutual.addr(), &tls.Config{RootCAs: pki.pool, MaxVersion: tls.VersionTLS12}, "TLS handshake with"},
		{"plaintext to TLS", plain.addr(), nil, "closed it at once"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig(tc.addr)
			cfg.TLS = tc.tls
			cfg.FailFast = true
			cl := newClient(t, cfg)
			ctx := ctxT(t, 10*time.Second)
			start := time.Now()
			if tc.tls != nil {
				// The acquire first: where the client's handshake
				// completes (TLS 1.3) it is sent, and the refusal shows
				// it was not executed.
				if strings.Contains(tc.want, "refused the TLS") {
					waitUp(t, cl, 1)
				}
				_, err := cl.Acquire(ctx, "TestTLS/bad", AcquireOptions{Wait: 3 * time.Second})
				if !errors.Is(err, ErrNoConnection) || errors.Is(err, ErrIndeterminate) {
					t.Fatalf("acquire: %v, want ErrNoConnection", err)
				}
			}
			_, err := cl.Ping(ctx)
			if !errors.Is(err, ErrNoConnection) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ping: %v, want ErrNoConnection naming %q", err, tc.want)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("took %v with FailFast", el)
			}
			t.Log(err)
		})
	}
}

func TestLoadTLSErrors(t *testing.T) {
	pki := newPKI(t)
	caFile, certFile, keyFile := pki.files(t)
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	_ = os.WriteFile(junk, []byte("not a certificate\n"), 0o600)
	cases := []struct {
		name  string
		f     TLSFiles
		field string
	}{
		{"missing CA", TLSFiles{CA: filepath.Join(dir, "none.pem")}, "TLSFiles.CA"},
		{"CA without PEM", TLSFiles{CA: junk}, "TLSFiles.CA"},
		{"cert without key", TLSFiles{CA: caFile, Cert: certFile}, "TLSFiles.Key"},
		{"key without cert", TLSFiles{Key: keyFile}, "TLSFiles.Cert"},
		{"key of another cert", TLSFiles{Cert: certFile, Key: caFile}, "TLSFiles.Cert"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTLS(tc.f)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a FieldError on %s", err, tc.field)
			}
		})
	}
	cfg, err := LoadTLS(TLSFiles{CA: caFile, Cert: certFile, Key: keyFile, ServerName: "x"})
	if err != nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "x" || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("LoadTLS: %+v, %v", cfg, err)
	}
	// Validate keeps a copy and raises an old MinVersion.
	orig := &tls.Config{MinVersion: tls.VersionTLS10}
	c := Config{Addrs: []string{"127.0.0.1:1"}, TLS: orig}
	if err := c.Validate(); err != nil || c.TLS == orig || c.TLS.MinVersion != tls.VersionTLS12 || orig.MinVersion != tls.VersionTLS10 {
		t.Fatalf("Validate: %+v %v", c.TLS, err)
	}
}
