package client

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// aclFile writes an identity file (PROTOCOL.md §8.2) of lines and returns
// its path, for lockd's --acl.
func aclFile(t *testing.T, lines ...string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "acl")
	var b []byte
	for _, l := range lines {
		b = append(b, l+"\n"...)
	}
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// aclDigest is a secret's entry in an identity file: its SHA-256.
func aclDigest(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestSecureServer runs the client against a real server with every client
// protection of PROTOCOL.md §8 on: mutual TLS and an ACL. An identity
// reaches its own keys; another key is ErrPermissionDenied; a wrong secret
// is ErrUnauthenticated, definitive and not retried elsewhere; another
// identity's grant is ErrNotHeld even with its current token, while an
// admin's release of it is done; a certificate identity needs no secret.
func TestSecureServer(t *testing.T) {
	pki := newPKI(t)
	caFile, certFile, keyFile := pki.serverFiles(t)
	acl := aclFile(t,
		"orders "+aclDigest("orders-secret")+" orders/ client",
		"ops "+aclDigest("ops-secret")+" * admin",
		"billing cert billing/ client")
	srv := ownServer(t, "--acl", acl, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile)
	clientTLS := func(cn string) *tls.Config {
		cert, _, _ := pki.issue(t, cn, nil, nil, x509.ExtKeyUsageClientAuth)
		return &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ctx := ctxT(t, 20*time.Second)
	opts := AcquireOptions{Wait: time.Second, Lease: 10 * time.Second}

	cfg := fastConfig(srv.Addr())
	cfg.TLS, cfg.Identity, cfg.Secret = clientTLS("app-1"), "orders", "orders-secret"
	orders := newClient(t, cfg)
	l, err := orders.Acquire(ctx, "orders/1", opts)
	if err != nil {
		t.Fatalf("own key: %v", err)
	}
	if _, err := orders.Acquire(ctx, "billing/1", opts); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("another identity's key: %v, want ErrPermissionDenied", err)
	}

	cfg = fastConfig(srv.Addr())
	cfg.TLS, cfg.Identity, cfg.Secret = clientTLS("app-2"), "orders", "wrong"
	wrong := newClient(t, cfg)
	if _, err := wrong.Acquire(ctx, "orders/2", opts); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("wrong secret: %v, want ErrUnauthenticated", err)
	}

	// billing authenticates by its certificate alone; orders' grant is
	// not its to release, token or not (and not its key either).
	cfg = fastConfig(srv.Addr())
	cfg.TLS = clientTLS("billing")
	billing := newClient(t, cfg)
	b, err := billing.Acquire(ctx, "billing/1", opts)
	if err != nil {
		t.Fatalf("certificate identity: %v", err)
	}
	if err := billing.Release(ctx, l); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("release outside its keys: %v, want ErrPermissionDenied", err)
	}

	cfg = fastConfig(srv.Addr())
	cfg.TLS, cfg.Identity, cfg.Secret = clientTLS("app-3"), "ops", "ops-secret"
	ops := newClient(t, cfg)
	other := Lock{Key: b.Key, Token: b.Token}
	if err := orders.Release(ctx, other); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("orders releasing billing's grant: %v", err)
	}
	if err := ops.Release(ctx, other); err != nil {
		t.Fatalf("an admin's forced release: %v", err)
	}
	if err := billing.Release(ctx, b); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release after the forced release: %v, want ErrNotHeld", err)
	}

	// orders' own grant was untouched by all of it.
	if err := orders.Release(ctx, l); err != nil {
		t.Fatalf("own release: %v", err)
	}
}

// TestSecureServerOtherIdentityNotHeld: with an ACL, a release or renew
// carrying another identity's current token on a key both may use is
// ErrNotHeld — a leaked token is worth nothing (PROTOCOL.md §8.3).
func TestSecureServerOtherIdentityNotHeld(t *testing.T) {
	srv := ownServer(t, "--acl", aclFile(t,
		"a "+aclDigest("a-secret")+" shared/ client",
		"b "+aclDigest("b-secret")+" shared/ client"))
	ctx := ctxT(t, 20*time.Second)
	mk := func(id, secret string) *Client {
		cfg := fastConfig(srv.Addr())
		cfg.Identity, cfg.Secret = id, Secret(secret)
		return newClient(t, cfg)
	}
	a, b := mk("a", "a-secret"), mk("b", "b-secret")
	l, err := a.Acquire(ctx, "shared/k", AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, l, 20*time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("b renewing a's grant: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, l); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("b releasing a's grant: %v, want ErrNotHeld", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("a's own release after b's tries: %v", err)
	}
}
