package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/proto"
)

// TestEnvironmentSetsFlags: LOCKD_<FLAG> variables configure the real
// binary as the flags do, and a flag on the command line wins over its
// variable.
func TestEnvironmentSetsFlags(t *testing.T) {
	dir := t.TempDir()
	env := []string{"LOCKD_LISTEN=127.0.0.1:0", "LOCKD_ADMIN=127.0.0.1:0", "LOCKD_DATA_DIR=" + dir,
		"LOCKD_LOOPS=1", "LOCKD_MAX_KEY=8", "LOCKD_MAX_CONNS=50", "LOCKD_DRAIN=100ms"}
	d := startCommandBin(t, binary, env, nil, "--max-conns", "40")
	var st api.Status
	code, body := httpGet(t, d.adminURL()+api.PathStatus)
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("/status: %d %v %s", code, err, body)
	}
	if st.Limits.MaxKey != 8 || st.Limits.Loops != 1 {
		t.Fatalf("limits %+v: LOCKD_MAX_KEY=8 and LOCKD_LOOPS=1 not in force", st.Limits)
	}
	if st.Limits.MaxConns != 40 {
		t.Fatalf("max_conns %d: --max-conns 40 on the command line must win over LOCKD_MAX_CONNS=50", st.Limits.MaxConns)
	}
	c := dial(t, d.addr)
	c.send(proto.AppendAcquire(nil, 0, 10, 7, "nine-byte"))
	if r := c.expect(proto.OpError, 7); r.Code != proto.CodeBadKey {
		t.Fatalf("a 9-byte key under LOCKD_MAX_KEY=8: code %d", r.Code)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if _, err := os.Stat(dir + "/locks.snap"); err != nil {
		t.Fatalf("LOCKD_DATA_DIR: no snapshot in %s: %v", dir, err)
	}
}

// TestEnvironmentBadValue: a bad value in a variable is a bad flag (exit
// 2) whose message names the variable, whether the flag package refuses
// it or the validation after it does.
func TestEnvironmentBadValue(t *testing.T) {
	cases := []struct {
		env  string
		want []string
	}{
		{"LOCKD_MAX_KEY=abc", []string{"LOCKD_MAX_KEY", "--max-key"}},
		{"LOCKD_MAX_KEY=0", []string{"LOCKD_MAX_KEY", "--max-key 0"}},
		{"LOCKD_DRAIN=10s", []string{"LOCKD_DRAIN", "--drain"}},
		{"LOCKD_LISTEN=nonsense", []string{"LOCKD_LISTEN", "--listen"}},
		{"LOCKD_LOG_LEVEL=loud", []string{"LOCKD_LOG_LEVEL", "--log-level"}},
		{"LOCKD_CLUSTER=paxos", []string{"LOCKD_CLUSTER", "--cluster"}},
		{"LOCKD_PEERS=127.0.0.1:7070", []string{"LOCKD_PEERS", "--peers"}},
		{"LOCKD_TLS_CERT=/nonexistent/cert.pem", []string{"LOCKD_TLS_CERT", "--tls-cert"}},
		{"LOCKD_ACL=/nonexistent/acl", []string{"LOCKD_ACL", "--acl"}},
		{"LOCKD_ADMIN=nocolon", []string{"LOCKD_ADMIN", "--admin"}},
	}
	for _, tc := range cases {
		t.Run(tc.env, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
			if strings.HasPrefix(tc.env, "LOCKD_LISTEN=") {
				cmd.Args = []string{binary, "--data-dir", t.TempDir(), "--admin", ""}
			}
			cmd.Env = append(os.Environ(), tc.env)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want 2; stderr: %s", err, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Fatalf("stderr does not name %q: %s", w, stderr.String())
				}
			}
		})
	}
}

// TestEnvironmentNotForVersion: LOCKD_VERSION (a deployment's own
// variable, say) does not turn the daemon into `lockd --version`, and a
// LOCKD_ variable that names no flag is warned about, by name.
func TestEnvironmentNotForVersion(t *testing.T) {
	env := []string{"LOCKD_VERSION=true", "LOCKD_DATADIR=/tmp/misspelt", "LOCKD_ADDRS=127.0.0.1:1"}
	d := startCommandBin(t, binary, env, nil, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", t.TempDir())
	waitLog(t, d, "name no lockd flag", "LOCKD_DATADIR,LOCKD_VERSION")
	if strings.Contains(d.logs.String(), "LOCKD_ADDRS") {
		t.Fatalf("lockctl's LOCKD_ADDRS reported as unknown:\n%s", d.logs)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

var helpFlagRE = regexp.MustCompile(`(?m)^  -([a-z-]+)`)

// helpFlags runs lockd --help and returns its flags and the text.
func helpFlags(t *testing.T) ([]string, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(binary, "--help")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("lockd --help: %v", err)
	}
	var names []string
	for _, m := range helpFlagRE.FindAllStringSubmatch(stderr.String(), -1) {
		names = append(names, m[1])
	}
	if len(names) < 25 {
		t.Fatalf("only %d flags in --help:\n%s", len(names), stderr.String())
	}
	return names, stderr.String()
}

// TestEveryFlagDocumentedOnce: --help shows every flag's variable but
// --version's; docs/OPERATING.md, the operators' page, has exactly one
// row for every flag, with its variable ("(none)" for --version), and no
// row for a flag lockd does not have; and no other page (README.md,
// docs/*.md) has a flag's row of its own: they link to OPERATING.md, so a
// flag is described in one place. PROTOCOL.md, the contract, keeps the
// table of §6.1.
func TestEveryFlagDocumentedOnce(t *testing.T) {
	names, help := helpFlags(t)
	page, err := os.ReadFile("../../docs/OPERATING.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, name := range names {
		known[name] = true
		v := envName(name)
		if name == "version" {
			if strings.Contains(help, "[$"+v+"]") {
				t.Errorf("--help gives --version a variable")
			}
			v = "(none)"
		} else if !strings.Contains(help, "[$"+v+"]") {
			t.Errorf("--help does not show %s for --%s", v, name)
		}
		cell := "`" + v + "`"
		if name == "version" {
			cell = regexp.QuoteMeta(v)
		}
		row := regexp.MustCompile("(?m)^\\| `--" + name + "` \\| " + cell + " \\|")
		if n := len(row.FindAll(page, -1)); n != 1 {
			t.Errorf("docs/OPERATING.md has %d rows for --%s with %s in its flags tables, want 1", n, name, v)
		}
	}
	// Rows whose second cell is a variable (or none) are lockd's flags;
	// lockctl's table has no such cell.
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| (?:`LOCKD_[A-Z0-9_]+`|\\(none\\)) \\|").FindAllSubmatch(page, -1) {
		if !known[string(m[1])] {
			t.Errorf("docs/OPERATING.md has a row for --%s, which lockd --help does not list", m[1])
		}
	}
	others, _ := filepath.Glob("../../docs/*.md")
	others = append(others, "../../README.md")
	for _, f := range others {
		if base := filepath.Base(f); base == "OPERATING.md" || base == "PROTOCOL.md" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?m)^\\| *`--([a-z0-9-]+)` *\\|").FindAllSubmatch(b, -1) {
			if known[string(m[1])] {
				t.Errorf("%s describes --%s in a table row of its own: link to docs/OPERATING.md instead", strings.TrimPrefix(f, "../../"), m[1])
			}
		}
	}
}

// TestNoFlagTakesASecret: a secret on a command line shows in ps, and in
// the environment in /proc/PID/environ: every flag whose name suggests a
// secret must take something else (a file, a size), as listed here. A
// flag added later that looks like one fails until it is listed with
// what it takes.
func TestNoFlagTakesASecret(t *testing.T) {
	notSecret := map[string]string{
		"tls-key":             "a PEM file's path",
		"max-key":             "a length",
		"max-keys":            "a count",
		"max-waiters-per-key": "a count",
		"token-block":         "a count",
		"cluster-secret":      "a file's path (PROTOCOL.md §8.4)",
	}
	secretish := regexp.MustCompile(`(^|-)(secret|password|passwd|pass|token|key|keys|cred|credentials|auth|hmac|psk)(-|$)`)
	names, _ := helpFlags(t)
	for _, name := range names {
		if secretish.MatchString(name) {
			if _, ok := notSecret[name]; !ok {
				t.Errorf("--%s looks like a secret: lockd takes secrets only from files; list it here with what it takes", name)
			}
		}
	}
}
