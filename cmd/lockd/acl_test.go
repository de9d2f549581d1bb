package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/proto"
)

var aclSecrets = map[string]string{
	"orders":   "orders-secret",
	"orders-b": "orders-b-secret",
	"prom":     "prom-secret",
	"ops":      "ops-secret",
}

func aclLine(name, keys, role string) string {
	return name + " " + acl.Digest([]byte(aclSecrets[name])) + " " + keys + " " + role + "\n"
}

var aclFile = "# the test's identities\n" + aclLine("orders", "orders/", "client") + aclLine("orders-b", "orders/", "client") +
	aclLine("prom", "-", "monitor") + aclLine("ops", "*", "admin")

func writeACL(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func (c *conn) login(name string) {
	c.t.Helper()
	c.send(proto.AppendHello(nil, 1, name, aclSecrets[name]))
	if r := c.read(); r.Op != proto.OpHello || string(r.Tail) != name {
		c.t.Fatalf("hello as %s: %c code %d %q", name, r.Op, r.Code, r.Tail)
	}
}

// closedWithin reports whether the server closes c within d.
func (c *conn) closedWithin(d time.Duration) bool {
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	for {
		_, err := c.c.Read(b[:])
		if err != nil {
			return !isTimeout(err)
		}
	}
}

// TestACLFlag: a bad ACL file is a bad flag at start (exit 2, the message
// names --acl, the file and the line).
func TestACLFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad-acl")
	writeACL(t, bad, aclLine("orders", "orders/", "client")+"\n# c\nops sha256:1234 * admin\n")
	for _, c := range []struct {
		path string
		want []string
	}{
		{bad, []string{"--acl", bad + ":4:", "sha256:"}},
		{filepath.Join(dir, "missing"), []string{"--acl", filepath.Join(dir, "missing"), "no such file"}},
	} {
		var stderr strings.Builder
		cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", filepath.Join(dir, "data"), "--acl", c.path)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("exit %v, want 2; stderr: %s", err, stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stderr.String(), w) {
				t.Fatalf("stderr does not say %q: %s", w, stderr.String())
			}
		}
	}
}

// TestACLOfTheBinary: the daemon with --acl, from outside: E 5 and close
// without an identity, E 6 outside the keys, a grant bound to its
// identity, an admin's forced release; the admin endpoint's basic
// authentication and its release.
func TestACLOfTheBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acl")
	writeACL(t, path, aclFile)
	d := startDaemon(t, t.TempDir(), "--acl", path, "--admin", "127.0.0.1:0")
	anon := dial(t, d.addr)
	anon.send(proto.AppendPing(nil, 1))
	anon.expect(proto.OpPing, 1)
	anon.send(proto.AppendAcquire(nil, 0, 30, 2, "orders/1"))
	if r := anon.expect(proto.OpError, 2); r.Code != proto.CodeUnauthenticated {
		t.Fatalf("acquire without an identity: code %d", r.Code)
	}
	if !anon.closedWithin(5 * time.Second) {
		t.Fatal("E 5 did not close the connection")
	}

	owner, other, admin := dial(t, d.addr), dial(t, d.addr), dial(t, d.addr)
	owner.login("orders")
	other.login("orders-b")
	admin.login("ops")
	owner.send(proto.AppendAcquire(nil, 0, 30, 3, "billing/1"))
	if r := owner.expect(proto.OpError, 3); r.Code != proto.CodePermissionDenied {
		t.Fatalf("outside the keys: code %d", r.Code)
	}
	tok := owner.grant("orders/1", 30, 4)
	other.send(proto.AppendRelease(nil, tok, "orders/1"))
	other.expect(proto.OpNotHeld, tok)
	admin.send(proto.AppendRenew(nil, 30, tok, "orders/1"))
	admin.expect(proto.OpRenew, tok)

	get := func(method, p, user string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, d.adminURL()+p, nil)
		if user != "" {
			req.SetBasicAuth(user, aclSecrets[user])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		method, path, user string
		code               int
	}{
		{"GET", "/healthz", "", 200},
		{"GET", "/metrics", "", 401},
		{"GET", "/metrics", "orders", 403},
		{"GET", "/metrics", "prom", 200},
		{"GET", "/keys/orders/1", "prom", 200},
		{"DELETE", "/keys/orders/1", "prom", 403},
	} {
		if code, body := get(c.method, c.path, c.user); code != c.code {
			t.Fatalf("%s %s as %q: %d %s, want %d", c.method, c.path, c.user, code, body, c.code)
		}
	}
	_, body := get("GET", "/keys/orders/1", "prom")
	var k struct{ Identity string }
	if err := json.Unmarshal([]byte(body), &k); err != nil || k.Identity != "orders" {
		t.Fatalf("/keys/orders/1: %s", body)
	}
	if code, body := get("DELETE", "/keys/orders/1", "ops"); code != 200 || !strings.Contains(body, `"identity": "orders"`) {
		t.Fatalf("admin release: %d %s", code, body)
	}
	owner.send(proto.AppendRelease(nil, tok, "orders/1"))
	owner.expect(proto.OpNotHeld, tok)
	if _, body := get("GET", "/metrics", "prom"); !strings.Contains(body, `lockd_other_identity_ops_total{op="release",result="refused"} 1`) ||
		!strings.Contains(body, `lockd_other_identity_ops_total{op="renew",result="forced"} 1`) ||
		!strings.Contains(body, `lockd_auth_failures_total{reason="unauthenticated"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}
	if strings.Contains(d.logs.String(), "-secret") {
		t.Fatalf("a secret in the logs:\n%s", d.logs)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestACLReloadOfTheBinary: SIGHUP re-reads the file. A removed identity's
// connection closes within a second; changed keys apply to the next
// request; a file that no longer parses is logged and the old one kept.
func TestACLReloadOfTheBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acl")
	writeACL(t, path, aclFile)
	d := startDaemon(t, t.TempDir(), "--acl", path)
	gone, changed := dial(t, d.addr), dial(t, d.addr)
	gone.login("orders-b")
	changed.login("orders")
	changed.grant("orders/1", 30, 1)

	reloads := strings.Count(d.logs.String(), `msg="SIGHUP: reloaded"`)
	writeACL(t, path, aclLine("orders", "jobs/", "client")+aclLine("ops", "*", "admin"))
	begin := time.Now()
	_ = d.Signal(syscall.SIGHUP)
	if !gone.closedWithin(time.Second) {
		t.Fatalf("the removed identity's connection is open 1 s after SIGHUP:\n%s", d.logs)
	}
	t.Logf("closed %v after SIGHUP", time.Since(begin).Round(time.Millisecond))
	changed.send(proto.AppendAcquire(nil, 0, 30, 2, "orders/2"))
	if r := changed.expect(proto.OpError, 2); r.Code != proto.CodePermissionDenied {
		t.Fatalf("old prefix after the reload: code %d", r.Code)
	}
	changed.grant("jobs/1", 30, 3)
	waitLogCount(t, d, `msg="SIGHUP: reloaded"`, reloads+1)

	// A bad file: logged, the old one stays.
	writeACL(t, path, "orders cert\n")
	_ = d.Signal(syscall.SIGHUP)
	waitLogCount(t, d, `reload failed: the one in force stays"`, 1)
	if !strings.Contains(d.logs.String(), path+":1:") {
		t.Fatalf("the failure does not name the file and line:\n%s", d.logs)
	}
	changed.grant("jobs/2", 30, 4)
	fresh := dial(t, d.addr)
	fresh.login("ops")
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// waitLogCount waits until the logs hold n lines with s.
func waitLogCount(t *testing.T, d *daemon, s string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); strings.Count(d.logs.String(), s) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("no %q (×%d) in the logs:\n%s", s, n, d.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestACLRestartKeepsIdentity: SIGTERM and a restart keep every grant's
// identity (the shutdown snapshot); a restart without --acl judges the
// restored grants by the token alone (PROTOCOL.md §4).
func TestACLRestartKeepsIdentity(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "acl"), t.TempDir()
	writeACL(t, path, aclFile)
	d := startDaemon(t, dir, "--acl", path)
	c := dial(t, d.addr)
	c.login("orders")
	tok := c.grant("orders/kept", 60, 1)
	tok2 := c.grant("orders/kept2", 60, 2)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}

	d = startDaemon(t, dir, "--acl", path)
	other, own := dial(t, d.addr), dial(t, d.addr)
	other.login("orders-b")
	own.login("orders")
	other.send(proto.AppendRelease(nil, tok, "orders/kept"))
	other.expect(proto.OpNotHeld, tok)
	own.send(proto.AppendRelease(nil, tok, "orders/kept"))
	own.expect(proto.OpRelease, tok)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}

	d = startDaemon(t, dir)
	anon := dial(t, d.addr)
	anon.send(proto.AppendRelease(nil, tok2, "orders/kept2"))
	anon.expect(proto.OpRelease, tok2)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestSIGHUPWithoutReloads: SIGHUP no longer ends a daemon that has
// nothing to reload.
func TestSIGHUPWithoutReloads(t *testing.T) {
	d := startDaemon(t, t.TempDir())
	_ = d.Signal(syscall.SIGHUP)
	waitLogCount(t, d, "SIGHUP: nothing to reload", 1)
	c := dial(t, d.addr)
	c.send(proto.AppendPing(nil, 1))
	c.expect(proto.OpPing, 1)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestACLFileModeWarning: an ACL file that group or others may read is
// warned about at start and at a SIGHUP re-read, naming its mode and
// chmod 600; one readable by lockd alone is not.
func TestACLFileModeWarning(t *testing.T) {
	const warning = "group or others may read it"
	for _, c := range []struct {
		mode os.FileMode
		warn bool
	}{{0o644, true}, {0o640, true}, {0o600, false}, {0o400, false}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "acl")
			writeACL(t, path, aclFile)
			if err := os.Chmod(path, c.mode); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, t.TempDir(), "--acl", path)
			if c.warn {
				waitLog(t, d, warning, fmt.Sprintf("%04o", c.mode), "chmod 600")
				_ = d.Signal(syscall.SIGHUP)
				waitLogCount(t, d, warning, 2)
			} else {
				_ = d.Signal(syscall.SIGHUP)
				waitLog(t, d, "reloaded")
				if strings.Contains(d.logs.String(), warning) {
					t.Fatalf("mode %04o warned about:\n%s", c.mode, d.logs)
				}
			}
		})
	}
}
