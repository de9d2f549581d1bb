package ops_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// lockdBin is cmd/lockd, built once for every test (clustertest.Build,
// without -race unless LOCKD_RACE says otherwise: these tests look at what
// an operator runs).
var lockdBin string

func TestMain(m *testing.M) {
	if os.Getenv("LOCKD_RACE") == "" {
		os.Setenv("LOCKD_RACE", "0")
	}
	bin, err := clustertest.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin = bin
	goleak.VerifyTestMain(cleanup{m}, append(lockdtest.LeakOptions, // engine is linked for ShutdownGrace
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"), // idle keep-alive conns of the HTTP clients
	)...)
}

// cleanup removes the binary after the tests.
type cleanup struct{ m *testing.M }

func (c cleanup) Run() int {
	defer clustertest.RemoveBuild()
	return c.m.Run()
}

// needTool returns the path of tool, or skips the test naming the Debian
// package that has it; under CI=true a missing tool fails instead.
func needTool(t *testing.T, tool, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (apt-get install %s); CI=true requires it", tool, pkg)
		}
		t.Skipf("%s is not installed (apt-get install %s): skipped (under CI=true this fails)", tool, pkg)
	}
	return p
}

// run runs a command and returns its combined output and error.
func run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// unitSettings reads the [Service] section of a unit file: each key's
// values in order.
func unitSettings(t *testing.T, text string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("lockd.service: %q is not key=value", line)
			}
			out[k] = append(out[k], v)
		}
	}
	return out
}

// TestSystemdUnit: ops/lockd.service has the hardening and the stop,
// restart and descriptor settings lockd needs; systemd-analyze verify
// accepts it without a warning (with ExecStart pointed at a freshly built
// lockd: verify checks that the binary exists) and refuses it pointed at
// none; its offline security exposure stays at most 2.0 ("OK").
func TestSystemdUnit(t *testing.T) {
	text, err := os.ReadFile("lockd.service")
	if err != nil {
		t.Fatal(err)
	}
	set := unitSettings(t, string(text))
	want := map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"PrivateDevices": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "", "Restart": "on-failure",
		"RestartPreventExitStatus": "2", "ReadWritePaths": "/var/lib/lockd", "StateDirectory": "lockd",
		"EnvironmentFile": "/etc/lockd/lockd.env", "Environment": "LOCKD_DATA_DIR=/var/lib/lockd",
		"ExecStart": "/usr/local/bin/lockd", "KillSignal": "SIGTERM",
	}
	for k, v := range want {
		if got, ok := set[k]; !ok || got[len(got)-1] != v {
			t.Errorf("lockd.service: %s=%q, want %q", k, got, v)
		}
	}
	if n, err := strconv.Atoi(last(set["LimitNOFILE"])); err != nil || n < 65536 {
		t.Errorf("LimitNOFILE=%q: want at least 65536 (one descriptor per client connection)", set["LimitNOFILE"])
	}
	// lockd bounds its own shutdown at 2 × engine.ShutdownGrace (the
	// drain, at most 4 s, then the 5 s flush, then the snapshot); systemd
	// must not SIGKILL before, which would lose every held lock.
	stop, err := time.ParseDuration(last(set["TimeoutStopSec"]))
	if err != nil || stop < 2*engine.ShutdownGrace+5*time.Second {
		t.Errorf("TimeoutStopSec=%q: want at least %s (lockd's own shutdown bound, %s, and a slow disk)",
			set["TimeoutStopSec"], 2*engine.ShutdownGrace+5*time.Second, 2*engine.ShutdownGrace)
	}

	sa := needTool(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	unit := filepath.Join(dir, "lockd.service")
	write := func(execStart string) {
		t.Helper()
		s := strings.ReplaceAll(string(text), "ExecStart=/usr/local/bin/lockd", "ExecStart="+execStart)
		if err := os.WriteFile(unit, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(lockdBin)
	out, err := run(dir, sa, "verify", unit)
	if err != nil || strings.Contains(out, "lockd.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	write(filepath.Join(dir, "no-such-lockd"))
	if out, err := run(dir, sa, "verify", unit); err == nil {
		t.Fatalf("systemd-analyze verify accepted a unit whose binary does not exist:\n%s", out)
	}
	write(lockdBin)
	out, err = run(dir, sa, "security", "--offline=true", unit)
	m := regexp.MustCompile(`Overall exposure level for lockd\.service: ([0-9.]+)`).FindStringSubmatch(out)
	switch {
	case m == nil && strings.Contains(out, "offline"):
		t.Logf("systemd-analyze security --offline is not supported here (systemd < 250): exposure not checked\n%s", out)
	case m == nil:
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	default:
		if e, _ := strconv.ParseFloat(m[1], 64); e > 2.0 {
			t.Fatalf("security exposure %s, want at most 2.0:\n%s", m[1], out)
		}
		t.Logf("systemd-analyze security: exposure %s", m[1])
	}
}

func last(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

var envLine = regexp.MustCompile(`^#?(LOCKD_[A-Z_]+)=(.*)$`)

// TestEnvironmentFile: every variable ops/lockd.env sets or shows
// (commented) is one of lockd's (its --help lists them), and lockd starts
// with the file's settings in its environment (the unit's flags: none; the
// test's own --listen, --admin and --data-dir win over the file's, as a
// flag wins over its variable).
func TestEnvironmentFile(t *testing.T) {
	text, err := os.ReadFile("lockd.env")
	if err != nil {
		t.Fatal(err)
	}
	var help bytes.Buffer
	cmd := exec.Command(lockdBin, "--help")
	cmd.Stderr = &help
	if err := cmd.Run(); err != nil {
		t.Fatalf("lockd --help: %v", err)
	}
	var env []string
	for _, line := range strings.Split(string(text), "\n") {
		m := envLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		if !strings.Contains(help.String(), "[$"+m[1]+"]") {
			t.Errorf("lockd.env names %s, which is no lockd flag's variable", m[1])
		}
		if !strings.HasPrefix(line, "#") {
			env = append(env, m[1]+"="+m[2])
		}
	}
	if len(env) == 0 {
		t.Fatal("lockd.env sets nothing")
	}
	d := startLockd(t, env, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", t.TempDir())
	if code := d.term(); code != 0 {
		t.Fatalf("lockd with lockd.env: exit %d\n%s", code, d.logs())
	}
}

// TestPrometheusRules: promtool accepts the rules and their unit tests
// pass.
func TestPrometheusRules(t *testing.T) {
	pt := needTool(t, "promtool", "prometheus")
	if out, err := run("prometheus", pt, "check", "rules", "lockd-rules.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err := run("prometheus", pt, "test", "rules", "lockd-rules.test.yml")
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
}
