package admin_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

var secrets = map[string]string{
	"orders":   "orders-secret",
	"orders-b": "orders-b-secret",
	"prom":     "prom-secret",
	"ops":      "ops-secret",
}

func aclLine(name, keys, role string) string {
	return name + " " + acl.Digest([]byte(secrets[name])) + " " + keys + " " + role + "\n"
}

var aclText = aclLine("orders", "orders/", "client") + aclLine("orders-b", "orders/", "client") +
	aclLine("prom", "-", "monitor") + aclLine("ops", "*", "admin")

func parseACL(t *testing.T, text string) *acl.ACL {
	t.Helper()
	a, err := acl.Parse("test", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// setupACL is setup with the test ACL; the fixture's connection is
// authenticated as orders.
func setupACL(t *testing.T) *fixture {
	f := setupWith(t, func(c *engine.Config) { c.ACL = parseACL(t, aclText) })
	f.login("orders")
	return f
}

func (f *fixture) login(name string) {
	f.t.Helper()
	if r := f.do(proto.AppendHello(nil, 1, name, secrets[name])); r.Op != proto.OpHello {
		f.t.Fatalf("hello as %s: %c code %d", name, r.Op, r.Code)
	}
}

// req makes an HTTP request as user (none if ""), returning the status,
// the WWW-Authenticate header and the body.
func (f *fixture) req(method, path, user, pass string) (int, string, []byte) {
	f.t.Helper()
	r, err := http.NewRequest(method, f.http.URL+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if user != "" {
		r.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body
}

// TestAdminAuth: §8.5 row by row — the health paths answer anyone; every
// other path needs a monitor or admin identity (401 with a challenge
// without valid credentials, 403 for a client); a change needs an admin.
func TestAdminAuth(t *testing.T) {
	f := setupACL(t)
	for _, c := range []struct {
		name, method, path, user, pass string
		code                           int
	}{
		{"healthz open", "GET", "/healthz", "", "", 200},
		{"healthz with bad credentials", "GET", "/healthz", "ops", "wrong", 200},
		{"livez open", "GET", "/livez", "", "", 200},
		{"readyz open", "GET", "/readyz", "", "", 200},
		{"readyz as a client", "GET", "/readyz", "orders", "orders-secret", 200},
		{"metrics without credentials", "GET", "/metrics", "", "", 401},
		{"metrics wrong secret", "GET", "/metrics", "prom", "prom-secreT", 401},
		{"metrics unknown identity", "GET", "/metrics", "nobody", "prom-secret", 401},
		{"metrics empty password", "GET", "/metrics", "prom", "", 401},
		{"metrics client", "GET", "/metrics", "orders", "orders-secret", 403},
		{"metrics monitor", "GET", "/metrics", "prom", "prom-secret", 200},
		{"metrics admin", "GET", "/metrics", "ops", "ops-secret", 200},
		{"status monitor", "GET", "/status", "prom", "prom-secret", 200},
		{"status without credentials", "GET", "/status", "", "", 401},
		{"key monitor", "GET", "/keys/orders/x", "prom", "prom-secret", 200},
		{"key client", "GET", "/keys/orders/x", "orders", "orders-secret", 403},
		{"key without credentials", "GET", "/keys/orders/x", "", "", 401},
		{"debug/locks without credentials", "GET", "/debug/locks", "", "", 401},
		{"debug/locks monitor", "GET", "/debug/locks", "prom", "prom-secret", 200},
		{"pprof without credentials", "GET", "/debug/pprof/", "", "", 401},
		{"pprof monitor", "GET", "/debug/pprof/", "prom", "prom-secret", 200},
		{"unknown path without credentials", "GET", "/nothing", "", "", 401},
		{"release without credentials", "DELETE", "/keys/orders/x", "", "", 401},
		{"release client", "DELETE", "/keys/orders/x", "orders", "orders-secret", 403},
		{"release monitor", "DELETE", "/keys/orders/x", "prom", "prom-secret", 403},
		{"release admin, key free", "DELETE", "/keys/orders/x", "ops", "ops-secret", 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, challenge, body := f.req(c.method, c.path, c.user, c.pass)
			if code != c.code {
				t.Fatalf("%s %s as %q: %d %s, want %d", c.method, c.path, c.user, code, body, c.code)
			}
			if code == 401 && !strings.HasPrefix(challenge, "Basic ") {
				t.Fatalf("401 with WWW-Authenticate %q", challenge)
			}
			if strings.Contains(string(body), "secret") {
				t.Fatalf("the answer mentions a secret: %s", body)
			}
		})
	}
	// /livez and /readyz are open too (whether or not the server has them).
	for _, p := range []string{"/livez", "/readyz"} {
		if code, _, _ := f.req("GET", p, "", ""); code == 401 || code == 403 {
			t.Fatalf("GET %s without credentials: %d", p, code)
		}
	}
	if strings.Join(admin.OpenPaths, " ") != "/healthz /livez /readyz" {
		t.Fatalf("open paths %v", admin.OpenPaths)
	}
	fams := f.scrapeAs("prom")
	if v := value(t, fams, "lockd_admin_auth_failures_total", "code", "401"); v != 10 {
		t.Fatalf("401s counted %v, want 10", v)
	}
	if v := value(t, fams, "lockd_admin_auth_failures_total", "code", "403"); v != 4 {
		t.Fatalf("403s counted %v, want 4", v)
	}
}

// TestAdminAuthFollowsReload: the admin endpoint reads the ACL in force at
// each request.
func TestAdminAuthFollowsReload(t *testing.T) {
	f := setupACL(t)
	if code, _, _ := f.req("GET", "/status", "prom", "prom-secret"); code != 200 {
		t.Fatalf("before the reload: %d", code)
	}
	if err := f.srv.SetACL(parseACL(t, aclLine("ops", "*", "admin"))); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := f.req("GET", "/status", "prom", "prom-secret"); code != 401 {
		t.Fatalf("a removed identity after the reload: %d", code)
	}
}

// TestAdminNoACL: without an ACL nothing asks for credentials (the
// release included: without --acl anyone who reaches the endpoint is
// trusted, as on the client port).
func TestAdminNoACL(t *testing.T) {
	f := setup(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "k"))
	if code, _, _ := f.req("GET", "/metrics", "", ""); code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	code, _, body := f.req("DELETE", "/keys/k", "", "")
	var rel api.Release
	if err := json.Unmarshal(body, &rel); err != nil || code != 200 || !rel.Released || rel.Token != strconv.FormatUint(a.Token, 10) || rel.Identity != "" {
		t.Fatalf("release: %d %s", code, body)
	}
}

func (f *fixture) scrapeAs(user string) map[string]*dto.MetricFamily {
	f.t.Helper()
	old := f.http.URL
	u := strings.Replace(old, "http://", "http://"+user+":"+secrets[user]+"@", 1)
	f.http.URL = u
	defer func() { f.http.URL = old }()
	return f.scrape()
}

// TestAdminRelease: DELETE /keys/{key} frees the grant of any identity —
// the one named by ?token=, or whatever holds the key — hands the key to
// its waiter, says whose grant it was, and is counted; the key view shows
// each grant's identity.
func TestAdminRelease(t *testing.T) {
	f := setupACL(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "orders/x"))
	var k api.Key
	if code := f.getAs("/keys/orders/x", "prom", &k); code != 200 || !k.Held || k.Identity != "orders" {
		t.Fatalf("key view: %d %+v", code, k)
	}
	waiter := f.other("orders-b")
	if _, err := waiter.conn.Write(proto.AppendAcquire(nil, 10, 30, 2, "orders/x")); err != nil {
		t.Fatal(err)
	}
	tok := strconv.FormatUint(a.Token, 10)
	if code, _, body := f.req("DELETE", "/keys/orders/x?token="+strconv.FormatUint(a.Token+1, 10), "ops", "ops-secret"); code != 404 {
		t.Fatalf("release of another token: %d %s", code, body)
	}
	if code, _, body := f.req("DELETE", "/keys/orders/x?token=zero", "ops", "ops-secret"); code != 400 {
		t.Fatalf("release with a bad token: %d %s", code, body)
	}
	code, _, body := f.req("DELETE", "/keys/orders/x?token="+tok, "ops", "ops-secret")
	var rel api.Release
	if err := json.Unmarshal(body, &rel); err != nil || code != 200 || rel.Token != tok || rel.Identity != "orders" || rel.Key != "orders/x" {
		t.Fatalf("release: %d %s", code, body)
	}
	next := waiter.read()
	if next.Op != proto.OpAcquire || next.ID != 2 {
		t.Fatalf("the waiter got %c", next.Op)
	}
	if code := f.getAs("/keys/orders/x", "prom", &k); code != 200 || k.Identity != "orders-b" || k.Token != strconv.FormatUint(next.Token, 10) {
		t.Fatalf("key view after the handoff: %+v", k)
	}
	code, _, body = f.req("DELETE", "/keys/orders/x", "ops", "ops-secret") // whatever holds it
	if err := json.Unmarshal(body, &rel); err != nil || code != 200 || rel.Identity != "orders-b" {
		t.Fatalf("release without a token: %d %s", code, body)
	}
	// The owner's release afterwards: not held.
	if r := f.do(proto.AppendRelease(nil, a.Token, "orders/x")); r.Op != proto.OpNotHeld {
		t.Fatalf("owner's release after the admin's: %c", r.Op)
	}
	fams := f.scrapeAs("ops")
	if v := value(t, fams, "lockd_admin_releases_total"); v != 2 {
		t.Fatalf("admin releases %v, want 2", v)
	}
	if v := value(t, fams, "lockd_other_identity_ops_total", "op", "release", "result", "forced"); v != 2 {
		t.Fatalf("forced releases %v, want 2", v)
	}
}

// TestOtherIdentityMetric: a release or renew with the current token of
// another identity's grant is refused (N) and counted; the grant's own
// identity, on another connection, is not counted (what
// lockd_foreign_token_ops_total used to count is no longer anything).
func TestOtherIdentityMetric(t *testing.T) {
	f := setupACL(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "orders/v"))
	same, thief := f.other("orders"), f.other("orders-b")
	if r := same.doOn(proto.AppendRenew(nil, 30, a.Token, "orders/v")); r.Op != proto.OpRenew {
		t.Fatalf("renew from the same identity's other connection: %c", r.Op)
	}
	if r := thief.doOn(proto.AppendRenew(nil, 30, a.Token, "orders/v")); r.Op != proto.OpNotHeld {
		t.Fatalf("renew by another identity: %c", r.Op)
	}
	if r := thief.doOn(proto.AppendRelease(nil, a.Token, "orders/v")); r.Op != proto.OpNotHeld {
		t.Fatalf("release by another identity: %c", r.Op)
	}
	if r := thief.doOn(proto.AppendAcquire(nil, 0, 30, 3, "billing/1")); r.Op != proto.OpError || r.Code != proto.CodePermissionDenied {
		t.Fatalf("acquire outside the keys: %c %d", r.Op, r.Code)
	}
	fams := f.scrapeAs("prom")
	for _, c := range []struct {
		op, result string
		want       float64
	}{{"release", "refused", 1}, {"renew", "refused", 1}, {"release", "forced", 0}, {"renew", "forced", 0}} {
		if v := value(t, fams, "lockd_other_identity_ops_total", "op", c.op, "result", c.result); v != c.want {
			t.Fatalf("%s %s = %v, want %v", c.op, c.result, v, c.want)
		}
	}
	if v := value(t, fams, "lockd_auth_failures_total", "reason", "permission_denied"); v != 1 {
		t.Fatalf("denied %v, want 1", v)
	}
	if v := value(t, fams, "lockd_errors_total", "code", "6"); v != 1 {
		t.Fatalf("E 6 sent %v, want 1", v)
	}
	if _, ok := fams["lockd_foreign_token_ops_total"]; ok {
		t.Fatal("lockd_foreign_token_ops_total is still exported")
	}
}

// other opens another client connection authenticated as name.
func (f *fixture) other(name string) *fixture {
	f.t.Helper()
	c, err := net.Dial("tcp", f.srv.Addr())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	o := &fixture{t: f.t, srv: f.srv, http: f.http, conn: c}
	o.login(name)
	return o
}

func (f *fixture) doOn(frame []byte) proto.Response { f.t.Helper(); return f.do(frame) }

// read reads one answer without sending anything.
func (f *fixture) read() proto.Response { f.t.Helper(); return f.do(nil) }

func (f *fixture) getAs(path, user string, v any) int {
	f.t.Helper()
	code, _, body := f.req("GET", path, user, secrets[user])
	if err := json.Unmarshal(body, v); err != nil {
		f.t.Fatalf("GET %s: %v in %s", path, err, body)
	}
	return code
}
