package httpapi_test

import (
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/testcerts"
)

var secrets = map[string]string{"orders": "orders-secret", "other": "other-secret", "prom": "prom-secret", "ops": "ops-secret"}

func aclLine(name, keys, role string) string {
	return name + " " + acl.Digest([]byte(secrets[name])) + " " + keys + " " + role + "\n"
}

var aclText = aclLine("orders", "orders/", "client") + aclLine("other", "orders/,other/", "client") +
	aclLine("prom", "*", "monitor") + aclLine("ops", "*", "admin") + "billing cert billing/ client\n"

func withACL(t testing.TB) func(*engine.Config) {
	return func(c *engine.Config) {
		a, err := acl.Parse("test-acl", []byte(aclText))
		if err != nil {
			t.Fatal(err)
		}
		c.ACL = a
	}
}

func basic(user, pass string) []string {
	return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))}
}

func as(name string) []string { return basic(name, secrets[name]) }

// TestACL: with --acl, identities come from basic authentication (user =
// identity, password = secret, as the hello compares them), grants are
// bound to them, and the refusals are 401 (E 5, with a Basic challenge)
// and 403 (E 6).
func TestACL(t *testing.T) {
	e := start(t, opts{engine: withACL(t)})
	acq := `{"key":"orders/1","lease_ms":10000}`
	cases := []struct {
		name   string
		hdr    []string
		status int
		code   string
	}{
		{"no credentials", nil, 401, "unauthenticated"},
		{"wrong secret", basic("orders", "nope"), 401, "unauthenticated"},
		{"unknown identity", basic("nobody", "x"), 401, "unauthenticated"},
		{"a user with a space", basic("orders x", "orders-secret"), 401, "unauthenticated"},
		{"a certificate-only identity by password", basic("billing", "x"), 401, "unauthenticated"},
		{"outside the identity's keys", as("orders"), 200, ""},
	}
	for _, c := range cases[:len(cases)-1] {
		t.Run(c.name, func(t *testing.T) {
			a := e.post("/v1/acquire", acq, c.hdr...).want(t, c.status, c.code)
			if !strings.HasPrefix(a.h.Get("WWW-Authenticate"), "Basic") {
				t.Fatalf("401 without a Basic challenge: %v", a.h)
			}
		})
	}
	// An unauthenticated request with a bad key is E 5 (§8.3: E 5 before
	// E 2); a key the wire cannot carry is refused before (a bad frame).
	e.post("/v1/acquire", `{"key":"","lease_ms":1000}`).want(t, 401, "unauthenticated")
	e.post("/v1/acquire", `{"key":"a\nb","lease_ms":1000}`).want(t, 400, "bad_key")

	e.post("/v1/acquire", `{"key":"billing/1","lease_ms":1000}`, as("orders")...).want(t, 403, "permission_denied")
	e.post("/v1/acquire", acq, as("prom")...).want(t, 403, "permission_denied") // a monitor takes no lock
	tok := e.acquire("orders/1", 10000, as("orders")...)

	// The grant is bound to orders: another identity's release of its
	// token is N, as a stale token; a monitor may validate, inspect and
	// watch it; an admin's release is forced.
	rel := `{"key":"orders/1","token":"` + tok + `"}`
	e.post("/v1/release", rel, as("other")...).want(t, 409, "not_held")
	e.post("/v1/validate", rel, as("prom")...).want(t, 200, "")
	e.inspect("orders/1", as("prom")...)
	s, a := e.watch(e.c, "orders/1", tok, as("prom")...)
	if s == nil {
		t.Fatalf("a monitor's watch: %s", a.raw)
	}
	if ev, _ := s.next(t, 5*time.Second); ev != "watching" {
		t.Fatal(ev)
	}
	e.post("/v1/release", rel, as("ops")...).want(t, 200, "")
	if ev, data := s.next(t, 5*time.Second); ev != "lost" || data["reason_name"] != "forced" {
		t.Fatalf("%s %v", ev, data)
	}

	// Pooled connections keep the identity they said hello as: a request
	// that claims it with a wrong secret is refused, not served by the
	// connection of the one before.
	for i := range 3 {
		key := "orders/p" + itoa(i)
		e.acquire(key, 1000, as("orders")...)
		e.post("/v1/inspect", `{"key":"`+key+`"}`, basic("orders", "wrong")...).want(t, 401, "unauthenticated")
		e.post("/v1/inspect", `{"key":"`+key+`"}`).want(t, 401, "unauthenticated")
		e.post("/v1/release", `{"key":"`+key+`","token":"1"}`, as("orders")...).want(t, 409, "not_held")
	}
}

// TestTLS: the front on HTTPS with client certificates asked for: a
// verified certificate's Common Name is an identity, as on the client
// port; without one basic authentication applies; a certificate the CA
// did not sign fails the handshake.
func TestTLS(t *testing.T) {
	ca, err := testcerts.NewCA("lockd test CA")
	if err != nil {
		t.Fatal(err)
	}
	srvPair, _ := ca.Issue("lockd", "127.0.0.1")
	billing, _ := ca.Issue("billing")
	stranger, _ := testcerts.NewCA("another CA")
	strangerPair, _ := stranger.Issue("billing")
	serverTLS := &tls.Config{Certificates: []tls.Certificate{srvPair.TLS}, ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	client := func(cert *testcerts.Pair) *tls.Config {
		c := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
		if cert != nil {
			c.Certificates = []tls.Certificate{cert.TLS}
		}
		return c
	}
	e := start(t, opts{engine: withACL(t), tls: serverTLS, client: client(billing)})

	tok := e.acquire("billing/1", 10000) // the certificate's identity
	e.post("/v1/acquire", `{"key":"orders/1","lease_ms":1000}`).want(t, 403, "permission_denied")
	// Basic authentication wins over the certificate (as a hello does on
	// a TLS connection).
	e.acquire("orders/1", 1000, as("orders")...)

	plain := e.client(client(nil))
	a := e.postCtx(t.Context(), plain, "/v1/release", `{"key":"billing/1","token":"`+tok+`"}`)
	a.want(t, 401, "unauthenticated")
	e.postCtx(t.Context(), plain, "/v1/inspect", `{"key":"billing/1"}`, as("prom")...).want(t, 200, "")

	// Offered whatever the server's list of CAs says (Go's client would
	// otherwise send no certificate at all).
	badTLS := client(nil)
	badTLS.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &strangerPair.TLS, nil }
	bad := &http.Client{Transport: &http.Transport{TLSClientConfig: badTLS}}
	defer bad.CloseIdleConnections()
	_, err = bad.Post(e.base+"/v1/inspect", "application/json", strings.NewReader(`{"key":"x"}`))
	var ue *tls.CertificateVerificationError
	if err == nil || errors.As(err, &ue) {
		t.Fatalf("a certificate of another CA: %v", err)
	}
}
