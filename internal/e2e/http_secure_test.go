package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/openapitest"
	"github.com/lockd-dev/lockd/internal/testcerts"
)

// TestHTTPSecureCluster: the HTTP API of a priority cluster with §8 on —
// HTTPS with the members' certificates, client certificates of a CA of
// their own asked for, --acl — on real processes. Basic authentication
// travels: a request at a standby is forwarded over HTTPS and judged
// there (200, 401, 403). A request authenticated by its certificate's
// Common Name is served by the active and redirected (307) by a standby,
// whose forward could not carry that identity.
func TestHTTPSecureCluster(t *testing.T) {
	short(t)
	dir := t.TempDir()
	clientCA, err := testcerts.NewCA("http clients")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := clientCA.Write(dir, "clients")
	if err != nil {
		t.Fatal(err)
	}
	billing, _ := clientCA.Issue("billing")
	line := func(name, secret, keys, role string) string {
		if secret == "cert" {
			return name + " cert " + keys + " " + role + "\n"
		}
		sum := sha256.Sum256([]byte(secret))
		return name + " sha256:" + hex.EncodeToString(sum[:]) + " " + keys + " " + role + "\n"
	}
	aclFile := filepath.Join(dir, "acl")
	text := line("orders", "orders-secret", "orders/", "client") + line("prom", "prom-secret", "-", "monitor") +
		line("billing", "cert", "billing/", "client")
	if err := os.WriteFile(aclFile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModePriority, Members: 3, Secure: true, HTTPOffset: httpOffset,
		ExtraArgs: []string{"--acl", aclFile, "--tls-client-ca", caFile}, AdminUser: "prom", AdminPassword: "prom-secret"})
	noRaces(t, c)
	// The client port now needs a client certificate (mutual TLS), which
	// the harness's probes do not have: who serves comes from /status.
	lead, err := c.WaitLeader(20*time.Second, clustertest.Running())
	if err != nil {
		t.Fatal(err)
	}
	standby := (lead + 1) % 3

	client := func(cert *testcerts.Pair) *http.Client {
		cfg := c.ClientTLS()
		if cert != nil {
			cfg.Certificates = []tls.Certificate{cert.TLS}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	plain, withCert := client(nil), client(billing)
	resp, err := plain.Get("https://" + c.Member(0).HTTPAddr() + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	doc, err := openapitest.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	check := func(hc *http.Client) *web {
		tr := hc.Transport
		hc.Transport = openapitest.Transport(t, doc, tr)
		t.Cleanup(tr.(*http.Transport).CloseIdleConnections)
		return &web{t: t, c: hc}
	}
	wPlain, wCert := check(plain), check(withCert)
	post := func(w *web, i int, path, body string, auth ...string) reply {
		req, _ := http.NewRequest(http.MethodPost, "https://"+c.Member(i).HTTPAddr()+path, strings.NewReader(body))
		if len(auth) == 2 {
			req.SetBasicAuth(auth[0], auth[1])
		}
		resp, err := w.c.Do(req)
		if err != nil {
			t.Fatalf("POST %s at %d: %v", path, i, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		r := reply{status: resp.StatusCode, raw: string(raw)}
		_ = decodeInto(raw, &r.body)
		if loc := resp.Header.Get("Location"); loc != "" {
			r.body["location"] = loc
		}
		return r
	}
	want := func(r reply, status int, code string) reply {
		t.Helper()
		if r.status != status || code != "" && r.code() != code {
			t.Fatalf("got %d %s, want %d %s", r.status, r.raw, status, code)
		}
		return r
	}

	// Basic authentication, at the standby: forwarded over HTTPS.
	g := want(post(wPlain, standby, "/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, "orders", "orders-secret"), 200, "")
	want(post(wPlain, standby, "/v1/acquire", `{"key":"orders/2","lease_ms":30000}`, "orders", "wrong"), 401, "unauthenticated")
	want(post(wPlain, standby, "/v1/acquire", `{"key":"orders/2","lease_ms":30000}`), 401, "unauthenticated")
	want(post(wPlain, standby, "/v1/acquire", `{"key":"billing/2","lease_ms":30000}`, "orders", "orders-secret"), 403, "permission_denied")
	want(post(wPlain, standby, "/v1/release", `{"key":"orders/1","token":"`+g.str("token")+`"}`, "orders", "orders-secret"), 200, "")

	// The certificate's identity: served at the active, redirected by a
	// standby to the active's HTTPS endpoint, where it is served.
	want(post(wCert, lead, "/v1/acquire", `{"key":"billing/1","lease_ms":30000}`), 200, "")
	want(post(wCert, lead, "/v1/acquire", `{"key":"orders/3","lease_ms":30000}`), 403, "permission_denied")
	r := want(post(wCert, standby, "/v1/acquire", `{"key":"billing/2","lease_ms":30000}`), 307, "moved")
	loc, _ := r.body["location"].(string)
	if loc != "https://"+c.Member(lead).HTTPAddr()+"/v1/acquire" {
		t.Fatalf("Location %q, want the active's HTTPS endpoint", loc)
	}
	req, _ := http.NewRequest(http.MethodPost, loc, strings.NewReader(`{"key":"billing/2","lease_ms":30000}`))
	resp, err = wCert.c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("following the 307: %v %v", err, resp)
	}
	resp.Body.Close()
}
