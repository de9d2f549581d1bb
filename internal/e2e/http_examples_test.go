package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
)

// The HTTP API from outside Go, as a user drives it: README's curl session
// in bash, and docs/HTTP.md's Python (urllib), Node (fetch) and Java
// (java.net.http) sessions, each run as written — only LOCKD is set —
// against the lockd binary. A language whose tool this machine lacks is
// skipped, naming it.

// codeBlock returns the first fenced block of lang after heading in the
// file at path.
func codeBlock(t *testing.T, path, heading, lang string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, heading)
	if i < 0 {
		t.Fatalf("%s has no %q", path, heading)
	}
	m := regexp.MustCompile("(?s)\n```" + lang + "\n(.*?)\n```\n").FindStringSubmatch(s[i:])
	if m == nil {
		t.Fatalf("%s has no %s block after %q", path, lang, heading)
	}
	return m[1] + "\n"
}

func startSingleHTTP(t *testing.T) (*clustertest.Cluster, string) {
	t.Helper()
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModeSingle, Members: 1, HTTPOffset: httpOffset})
	return c, c.Member(0).HTTPAddr()
}

// run runs a command with LOCKD set to base and returns its output.
func run(t *testing.T, base string, name string, args ...string) (string, time.Duration) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed here", name)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LOCKD="+base)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	begin := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out.String())
	}
	return out.String(), time.Since(begin)
}

var workLine = regexp.MustCompile(`running with fencing token ([0-9]+)|working with token ([0-9]+)`)

// worked checks that out says it worked with a token, returns it, and
// that the key is free again (the session released it).
func worked(t *testing.T, w *web, addr, out string) uint64 {
	t.Helper()
	m := workLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no work line in:\n%s", out)
	}
	tok := tokenOf(t, m[1]+m[2])
	if r := w.must(addr, "/v1/inspect", `{"key":"jobs/nightly"}`, 200); r.num("holders") != 0 {
		t.Fatalf("after the session: %s\n%s", r.raw, out)
	}
	return tok
}

// TestHTTPCurl: README's bash session with curl and sed: acquire, work,
// release; then again while the key is held by another client with a
// 2-second lease, which the session waits out.
func TestHTTPCurl(t *testing.T) {
	short(t)
	c, addr := startSingleHTTP(t)
	w := newWeb(t, c)
	dir := t.TempDir()
	script := filepath.Join(dir, "nightly.sh")
	if err := os.WriteFile(script, []byte(codeBlock(t, "../../README.md", "## From anything: curl", "bash")), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed here")
	}
	out, _ := run(t, "http://"+addr, "bash", script)
	first := worked(t, w, addr, out)
	if !strings.Contains(out, `{"key":"jobs/nightly","token":"`+strconv.FormatUint(first, 10)+`"}`) {
		t.Fatalf("the release's answer is not in the output:\n%s", out)
	}

	held := tokenOf(t, w.must(addr, "/v1/acquire", `{"key":"jobs/nightly","lease_ms":2000}`, 200).str("token"))
	out, took := run(t, "http://"+addr, "bash", script)
	if second := worked(t, w, addr, out); second <= held || took < 1500*time.Millisecond {
		t.Fatalf("after waiting %v for a lease of 2 s: token %d (the holder's %d)\n%s", took, second, held, out)
	}
}

// TestHTTPExamples: docs/HTTP.md's Python, Node and Java sessions.
func TestHTTPExamples(t *testing.T) {
	short(t)
	c, addr := startSingleHTTP(t)
	w := newWeb(t, c)
	base := "http://" + addr
	const doc, heading = "../../docs/HTTP.md", "## From Python, Node and Java"
	dir := t.TempDir()
	write := func(name, lang string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(codeBlock(t, doc, heading, lang)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("python urllib", func(t *testing.T) {
		out, _ := run(t, base, "python3", write("lock.py", "python"))
		worked(t, w, addr, out)
	})
	t.Run("node fetch", func(t *testing.T) {
		out, _ := run(t, base, "node", write("lock.mjs", "js"))
		worked(t, w, addr, out)
	})
	t.Run("java java.net.http", func(t *testing.T) {
		out, _ := run(t, base, "java", write("Lock.java", "java"))
		worked(t, w, addr, out)
	})
}

// TestHTTPWatchOfTheBinary: a watch on the binary ends with the reason of
// the grant's end: the admin endpoint's DELETE (forced, 3) and an expiry
// (2).
func TestHTTPWatchOfTheBinary(t *testing.T) {
	short(t)
	c, addr := startSingleHTTP(t)
	w := newWeb(t, c)
	for _, tc := range []struct {
		name, reason string
		lease        string
		end          func(tok string)
	}{
		{"forced by the admin endpoint", "forced", "60000", func(tok string) {
			if err := c.Member(0).Admin(http.MethodDelete, "/keys/jobs/x?token="+tok, nil, nil, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}},
		{"expired", "expired", "1000", func(string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := w.must(addr, "/v1/acquire", `{"key":"jobs/x","lease_ms":`+tc.lease+`}`, 200).str("token")
			resp, err := w.c.Get("http://" + addr + "/v1/watch?key=jobs%2Fx&token=" + tok)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("watch: %v %v", err, resp)
			}
			defer resp.Body.Close()
			events := readEvents(resp.Body)
			if ev := <-events; ev[0] != "watching" {
				t.Fatalf("first event %v", ev)
			}
			tc.end(tok)
			select {
			case ev := <-events:
				if ev[0] != "lost" || !strings.Contains(ev[1], `"reason_name":"`+tc.reason+`"`) {
					t.Fatalf("event %v, want lost %s", ev, tc.reason)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no lost event")
			}
			if _, open := <-events; open {
				t.Fatal("an event after lost")
			}
		})
	}
}
