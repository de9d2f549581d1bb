package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
)

// These tests build and run the real binary, as an operator would.

// binary is cmd/lockd, built once for every test (clustertest.Build: with
// the race detector when it can, or $LOCKD_BIN).
var binary string

func TestMain(m *testing.M) {
	bin, err := clustertest.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = bin
	code := m.Run()
	clustertest.RemoveBuild()
	os.Exit(code)
}

func TestFlagErrorsNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--max-key", "0"}, "--max-key"},
		{[]string{"--max-key", "2000"}, "--max-key"},
		{[]string{"--max-keys", "-1"}, "--max-keys"},
		{[]string{"--max-waiters-per-key", "0"}, "--max-waiters-per-key"},
		{[]string{"--max-waiters", "0"}, "--max-waiters"},
		{[]string{"--max-waiters-per-conn", "0"}, "--max-waiters-per-conn"},
		{[]string{"--max-holders", "0"}, "--max-holders"},
		{[]string{"--max-holders", "-1"}, "--max-holders"},
		{[]string{"--max-watches-per-conn", "0"}, "--max-watches-per-conn"},
		{[]string{"--max-watches-per-conn", "2000000000"}, "--max-watches-per-conn"},
		{[]string{"--max-watches-per-conn", "many"}, "max-watches-per-conn"},
		{[]string{"--max-pending-grants", "-5"}, "--max-pending-grants"},
		{[]string{"--frame-timeout", "0"}, "--frame-timeout"},
		{[]string{"--frame-timeout", "10ms"}, "--frame-timeout"},
		{[]string{"--frame-timeout", "2h"}, "--frame-timeout"},
		{[]string{"--max-conns", "0"}, "--max-conns"},
		{[]string{"--loops", "0"}, "--loops"},
		{[]string{"--listen", "nonsense"}, "--listen"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--drain", "10s"}, "--drain"},
		{[]string{"--data-dir", ""}, "--data-dir"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--max-key", "abc"}, "max-key"},
		{[]string{"stray"}, "stray"},
		{[]string{"--admin", "nocolon"}, "--admin"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(binary, tc.args...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2; stderr: %s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not name %q: %s", tc.want, stderr.String())
			}
		})
	}
}

// TestAddressFlagsCheckedFirst: an address flag whose port is not a
// number 0..65535 is a bad flag — exit 2, naming it — before anything is
// started or reserved: no data dir, no admin endpoint.
func TestAddressFlagsCheckedFirst(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:99999"},
		{"--listen", "127.0.0.1:x"},
		{"--listen", "127.0.0.1:-1"},
		{"--listen", "127.0.0.1:http"},
		{"--admin", "127.0.0.1:70000"},
		{"--admin", "127.0.0.1:x"},
		{"--peers", "127.0.0.1:7070,127.0.0.1:99999", "--cluster", "raft", "--listen", "127.0.0.1:7070"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			var stderr bytes.Buffer
			cmd := exec.Command(binary, append(args, "--data-dir", dir)...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2; stderr: %s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), args[0]) {
				t.Fatalf("stderr does not name %s: %s", args[0], stderr.String())
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the data dir was made (%v): something started; stderr: %s", err, stderr.String())
			}
		})
	}
}

// TestVersion: --version prints the version line of internal/version —
// the module version (here a release build's -ldflags override) and the
// VCS revision when the build stamped one — and lockd_build_info carries
// both as labels. The binary is built with -buildvcs=true, as make build
// does (this machine's go env turns stamping off); Go stamps only in a
// clone whose .git is a directory, not in a git worktree.
func TestVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "lockd")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X main.version=v9.8.7", "-o", bin, ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := ""
	if m := regexp.MustCompile(`vcs\.revision=([0-9a-f]+)`).FindSubmatch(info); m != nil {
		rev = string(m[1])
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(out))
	if !strings.HasPrefix(line, "lockd v9.8.7 ") || !strings.Contains(line, " go1.") {
		t.Fatalf("--version printed %q", line)
	}
	if rev != "" && !strings.Contains(line, "(rev "+rev[:12]) {
		t.Fatalf("--version %q does not show the stamped revision %s", line, rev)
	}
	if rev == "" && strings.Contains(line, "(rev ") {
		t.Fatalf("--version %q shows a revision the build did not stamp", line)
	}
	t.Logf("--version: %s", line)

	d := startCommandBin(t, bin, nil, nil, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", t.TempDir(), "--loops", "1")
	code, body := httpGet(t, d.adminURL()+"/metrics")
	want := `lockd_build_info{revision="` + rev + `",version="v9.8.7"} 1`
	if code != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("/metrics: %d, no %s in:\n%s", code, want, grepLines(body, "lockd_build_info"))
	}
	var st struct{ Version string }
	code, body = httpGet(t, d.adminURL()+"/status")
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil || st.Version != line {
		t.Fatalf("/status version %q (%d, %v), want the --version line %q", st.Version, code, err, line)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// daemon is a running lockd process (clustertest.Proc) of a test.
type daemon struct {
	*clustertest.Proc
	t    *testing.T
	addr string   // its client address, from its ready line
	logs procLogs // its output so far, for failure messages
}

// procLogs prints a process's output so far.
type procLogs struct{ p *clustertest.Proc }

func (l procLogs) String() string { return l.p.Logs() }

// adminURL is the admin endpoint's base URL, once the daemon has logged
// it (within 5 s).
func (d *daemon) adminURL() string {
	d.t.Helper()
	if wait.Until(5*time.Second, 10*time.Millisecond, func() error {
		if d.AdminAddr() == "" {
			return errors.New("no admin endpoint logged")
		}
		return nil
	}) != nil {
		d.t.Fatalf("no admin endpoint logged:\n%s", d.logs)
	}
	return "http://" + d.AdminAddr()
}

func startDaemon(t *testing.T, dataDir string, extra ...string) *daemon {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:0", "--admin", "", "--data-dir", dataDir, "--loops", "2", "--drain", "300ms"}, extra...)
	return startCommand(t, nil, args...)
}

// startCommand runs the binary with args, behind prefix (a command such as
// prlimit that execs the rest), and returns once it logs ready.
func startCommand(t *testing.T, prefix []string, args ...string) *daemon {
	t.Helper()
	return startCommandBin(t, binary, nil, prefix, args...)
}

// startCommandBin is startCommand with another build of lockd, and env
// added to the environment.
func startCommandBin(t *testing.T, bin string, env, prefix []string, args ...string) *daemon {
	t.Helper()
	p := clustertest.StartProc(t, clustertest.ProcOptions{Binary: bin, Args: args, Env: env, Prefix: prefix})
	return &daemon{Proc: p, t: t, addr: p.Addr(), logs: procLogs{p}}
}

// stop sends sig and returns the exit code.
func (d *daemon) stop(sig syscall.Signal) int {
	d.t.Helper()
	_ = d.Signal(sig)
	return d.wait()
}

// wait returns the exit code once the process ends (-1 for a signal).
func (d *daemon) wait() int {
	d.t.Helper()
	code, err := d.Wait(15 * time.Second)
	if err != nil {
		d.t.Fatalf("lockd: %v\n%s", err, d.logs)
	}
	return code
}

// conn is a minimal raw client.
type conn struct {
	t   *testing.T
	c   net.Conn
	buf []byte
}

func dial(t *testing.T, addr string) *conn {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{t: t, c: c}
}

func (c *conn) send(b []byte) {
	c.t.Helper()
	if _, err := c.c.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *conn) read() proto.Response {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var r proto.Response
		if n, err := proto.ParseResponse(c.buf, &r); err == nil {
			r.Tail = append([]byte(nil), r.Tail...)
			c.buf = c.buf[n:]
			return r
		}
		var tmp [512]byte
		n, err := c.c.Read(tmp[:])
		if n == 0 && err != nil {
			c.t.Fatalf("read: %v", err)
		}
		c.buf = append(c.buf, tmp[:n]...)
	}
}

func (c *conn) grant(key string, lease uint8, owner uint64) uint64 {
	c.t.Helper()
	c.send(proto.AppendAcquire(nil, 0, lease, owner, key))
	r := c.read()
	if r.Op != proto.OpAcquire || r.ID != owner {
		c.t.Fatalf("acquire %q: got %c id=%d", key, r.Op, r.ID)
	}
	return r.Token
}

func (c *conn) expect(op proto.Op, id uint64) proto.Response {
	c.t.Helper()
	r := c.read()
	if r.Op != op || r.ID != id {
		c.t.Fatalf("got %c id=%d code=%d, want %c id=%d", r.Op, r.ID, r.Code, op, id)
	}
	return r
}

func TestSIGTERMKeepsLocksAndTokens(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	a, b := dial(t, d.addr), dial(t, d.addr)
	tok := a.grant("job", 60, 1)
	b.send(proto.AppendAcquire(nil, 30, 10, 2, "job"))
	b.send(proto.AppendPing(nil, 3))
	b.expect(proto.OpPing, 3)
	_ = d.Signal(syscall.SIGTERM)
	if r := b.expect(proto.OpError, 2); r.Code != proto.CodeShutdown {
		t.Fatalf("queued acquire: code %d", r.Code)
	}
	// New requests are answered E 4 while the connection drains.
	a.send(proto.AppendPing(nil, 9))
	a.expect(proto.OpPing, 9)
	a.send(proto.AppendRelease(nil, tok, "job"))
	if r := a.expect(proto.OpError, tok); r.Code != proto.CodeShutdown {
		t.Fatalf("release during shutdown: code %d", r.Code)
	}
	if code := d.wait(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; logs:\n%s", code, d.logs)
	}
	d2 := startDaemon(t, dir)
	c := dial(t, d2.addr)
	c.send(proto.AppendAcquire(nil, 0, 10, 4, "job"))
	c.expect(proto.OpTimeout, 4) // still held after the restart
	if nt := c.grant("other", 10, 5); nt <= tok {
		t.Fatalf("token %d after restart not above %d", nt, tok)
	}
	c.send(proto.AppendRelease(nil, tok, "job"))
	c.expect(proto.OpRelease, tok) // same token
	if code := d2.stop(syscall.SIGINT); code != 0 {
		t.Fatalf("exit code %d after SIGINT", code)
	}
}

func TestKill9NeverReusesTokens(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	c := dial(t, d.addr)
	var last uint64
	for i := 0; i < 200; i++ {
		last = c.grant(fmt.Sprintf("k%d", i), 60, uint64(i))
	}
	d.stop(syscall.SIGKILL)
	d2 := startDaemon(t, dir)
	c2 := dial(t, d2.addr)
	tok := c2.grant("k0", 10, 1) // the crash lost the lock, not the token order
	if tok <= last {
		t.Fatalf("token %d after kill -9 not above %d", tok, last)
	}
	d2.stop(syscall.SIGKILL)
	// An empty data dir still starts above: tokens never start below the
	// wall clock in microseconds.
	d3 := startDaemon(t, t.TempDir())
	c3 := dial(t, d3.addr)
	if tok3 := c3.grant("k0", 10, 1); tok3 <= tok {
		t.Fatalf("token %d with an empty data dir not above %d", tok3, tok)
	}
}

func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	startDaemon(t, dir)
	var stderr bytes.Buffer
	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", dir)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "in use") {
		t.Fatalf("second daemon on one data dir: %v; %s", err, stderr.String())
	}
}

func TestAdminEndpointOfTheBinary(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--admin", "127.0.0.1:0")
	resp, err := http.Get(d.adminURL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestListenAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(binary, "--listen", ln.Addr().String(), "--admin", "", "--data-dir", t.TempDir())
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "--listen") {
		t.Fatalf("lockd on a taken port: %v; %s", err, stderr.String())
	}
}

// TestFailedStartKeepsSnapshot: a start that fails after reading the
// shutdown snapshot — its address taken, or --max-keys below the
// snapshot's locks — keeps the snapshot, so the next good start still
// reloads the locks with their tokens (PROTOCOL.md §4); that start
// consumes it.
func TestFailedStartKeepsSnapshot(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	c := dial(t, d.addr)
	keys := []string{"a", "b", "c"}
	toks := make([]uint64, len(keys))
	for i, k := range keys {
		toks[i] = c.grant(k, 60, uint64(i+1))
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	snap := filepath.Join(dir, "locks.snap")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, args := range [][]string{
		{"--listen", ln.Addr().String()},
		{"--listen", "127.0.0.1:0", "--max-keys", "2"},
	} {
		var stderr bytes.Buffer
		cmd := exec.Command(binary, append(args, "--admin", "", "--data-dir", dir)...)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("lockd %v: %v, want exit 1; %s", args, err, stderr.String())
		}
		if _, err := os.Stat(snap); err != nil {
			t.Fatalf("snapshot gone after the failed start %v: %v", args, err)
		}
	}
	d2 := startDaemon(t, dir)
	if _, err := os.Stat(snap); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("snapshot not consumed by the good start: %v", err)
	}
	c2 := dial(t, d2.addr)
	for i, k := range keys {
		c2.send(proto.AppendRelease(nil, toks[i], k))
		c2.expect(proto.OpRelease, toks[i]) // reloaded, same token
	}
	d2.stop(syscall.SIGKILL)
}
