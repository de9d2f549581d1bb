package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/wait"
)

// TestHTTPRoutesOfTheBinary: every route of the HTTP API on the lockd
// binary, with --acl and small limits, through the answers a user meets —
// 200, 400, 401, 403, 404, 405, 409 timeout and not_held, 413, 429 busy,
// 503 too_many_long_polls, too_many_streams and shutting_down — each
// checked against the OpenAPI document the binary serves; a watch ended by
// a release; a client that goes away mid-wait leaves no waiter.
func TestHTTPRoutesOfTheBinary(t *testing.T) {
	short(t)
	dir := t.TempDir()
	secret := map[string]string{"orders": "orders-secret", "prom": "prom-secret", "ops": "ops-secret"}
	line := func(name, keys, role string) string {
		sum := sha256.Sum256([]byte(secret[name]))
		return name + " sha256:" + hex.EncodeToString(sum[:]) + " " + keys + " " + role + "\n"
	}
	aclFile := filepath.Join(dir, "acl")
	if err := os.WriteFile(aclFile, []byte(line("orders", "orders/", "client")+line("prom", "*", "monitor")+line("ops", "*", "admin")), 0o600); err != nil {
		t.Fatal(err)
	}
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModeSingle, Members: 1, HTTPOffset: httpOffset,
		ExtraArgs: []string{"--acl", aclFile, "--max-waiters-per-key", "1", "--http-max-long-polls", "2", "--http-max-streams", "1"},
		AdminUser: "prom", AdminPassword: secret["prom"]})
	addr := c.Member(0).HTTPAddr()
	w := newWeb(t, c)
	type call struct {
		path, body string
		user       string // "" none, "bad" a wrong secret
	}
	send := func(ctx context.Context, x call) reply {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+x.path, strings.NewReader(x.body))
		switch x.user {
		case "":
		case "bad":
			req.SetBasicAuth("orders", "wrong")
		default:
			req.SetBasicAuth(x.user, secret[x.user])
		}
		resp, err := w.c.Do(req)
		if err != nil {
			return reply{err: err}
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		r := reply{status: resp.StatusCode, raw: string(raw)}
		_ = decodeInto(raw, &r.body)
		return r
	}
	must := func(x call, status int, code string) reply {
		t.Helper()
		r := send(context.Background(), x)
		if r.err != nil || r.status != status || code != "" && r.code() != code {
			t.Fatalf("POST %s %s as %q: %d %s %v, want %d %s", x.path, x.body, x.user, r.status, r.raw, r.err, status, code)
		}
		return r
	}
	bg := func(ctx context.Context, x call) <-chan reply {
		ch := make(chan reply, 1)
		go func() { ch <- send(ctx, x) }()
		return ch
	}
	waiters := func(key string, n int64) {
		t.Helper()
		wait.For(t, fmt.Sprintf("key %s with %d waiters", key, n), func() bool {
			return must(call{"/v1/inspect", `{"key":"` + key + `"}`, "prom"}, 200, "").num("waiters") == n
		})
	}

	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, ""}, 401, "unauthenticated")
	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, "bad"}, 401, "unauthenticated")
	must(call{"/v1/acquire", `{"key":"billing/1","lease_ms":30000}`, "orders"}, 403, "permission_denied")
	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, "prom"}, 403, "permission_denied")
	tok := must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, "orders"}, 200, "").str("token")
	must(call{"/v1/acquire", `{"key":"orders/2","lease_ms":30000}`, "orders"}, 200, "")
	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":30000}`, "orders"}, 409, "timeout")
	must(call{"/v1/validate", `{"key":"orders/1","token":"` + tok + `"}`, "prom"}, 200, "")
	must(call{"/v1/renew", `{"key":"orders/1","token":"` + tok + `","lease_ms":30000}`, "orders"}, 200, "")
	must(call{"/v1/release", `{"key":"orders/1","token":"1"}`, "orders"}, 409, "not_held")
	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":1000,"wait_ms":255001}`, "orders"}, 400, "bad_wait")
	must(call{"/v1/acquire", `not json`, "orders"}, 400, "bad_request")
	must(call{"/v1/inspect", `{"key":"` + strings.Repeat("x", 20000) + `"}`, "prom"}, 413, "body_too_large")
	must(call{"/v1/nothing", `{}`, "orders"}, 404, "not_found")
	if resp, err := w.c.Get("http://" + addr + "/v1/acquire"); err != nil || resp.StatusCode != 405 {
		t.Fatalf("GET /v1/acquire: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	// Long-polls: the one waiter a key may have, then B; the bound of
	// long-polls, then 503. A client that goes away leaves no waiter.
	granted := bg(context.Background(), call{"/v1/acquire", `{"key":"orders/1","lease_ms":5000,"wait_ms":20000}`, "orders"})
	waiters("orders/1", 1)
	must(call{"/v1/acquire", `{"key":"orders/1","lease_ms":5000,"wait_ms":20000}`, "orders"}, 429, "busy")
	gone, leave := context.WithCancel(context.Background())
	left := bg(gone, call{"/v1/acquire", `{"key":"orders/2","lease_ms":5000,"wait_ms":20000}`, "orders"})
	waiters("orders/2", 1)
	must(call{"/v1/acquire", `{"key":"orders/2","lease_ms":5000,"wait_ms":20000}`, "orders"}, 503, "too_many_long_polls")
	leave()
	if r := <-left; r.err == nil {
		t.Fatalf("the cancelled long-poll was answered: %d %s", r.status, r.raw)
	}
	waiters("orders/2", 0)
	// Its handler ends just after the close that withdrew it: the bound
	// of long-polls frees then.
	hc := c.HTTPClient(5 * time.Second)
	wait.For(t, "lockd_http_long_polls 1 (the one granted below still waits)", func() bool {
		resp, err := hc.Get(c.Member(0).AdminURL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(metrics), "\nlockd_http_long_polls 1\n")
	})

	// A watch (one stream allowed), ended by the release that hands the
	// key to the long-poll.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/watch?key=orders%2F1&token="+tok, nil)
	req.SetBasicAuth("prom", secret["prom"])
	resp, err := w.c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", err, resp)
	}
	defer resp.Body.Close()
	events := readEvents(resp.Body)
	if ev := <-events; ev[0] != "watching" {
		t.Fatalf("first event %v", ev)
	}
	req2, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/watch?key=orders%2F1&token="+tok, nil)
	req2.SetBasicAuth("prom", secret["prom"])
	if r2, err := w.c.Do(req2); err != nil || r2.StatusCode != 503 {
		t.Fatalf("a second stream: %v %v", err, r2)
	} else {
		r2.Body.Close()
	}
	must(call{"/v1/release", `{"key":"orders/1","token":"` + tok + `"}`, "orders"}, 200, "")
	if ev := <-events; ev[0] != "lost" || !strings.Contains(ev[1], `"reason_name":"released"`) {
		t.Fatalf("event %v", ev)
	}
	g := <-granted
	if g.status != 200 || tokenOf(t, g.str("token")) <= tokenOf(t, tok) {
		t.Fatalf("the long-poll after the release: %d %s %v", g.status, g.raw, g.err)
	}
	must(call{"/v1/release", `{"key":"orders/1","token":"` + g.str("token") + `"}`, "orders"}, 200, "")

	// SIGTERM while a long-poll waits: E 4, 503 shutting_down.
	waiting := bg(context.Background(), call{"/v1/acquire", `{"key":"orders/2","lease_ms":5000,"wait_ms":20000}`, "orders"})
	waiters("orders/2", 1)
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := <-waiting; r.status != 503 || r.code() != "shutting_down" {
		t.Fatalf("the long-poll at the shutdown: %d %s %v", r.status, r.raw, r.err)
	}
	if code, err := c.Member(0).Wait(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
}
