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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/freeport"
)

// These tests run the real binaries: lockd (clustertest.Build: cmd/lockd
// built without the race detector, or $LOCKD_BIN when set) and lockctl.

var lockdBin, lockctlBin string

func TestMain(m *testing.M) {
	// These tests examine lockctl: the lockd it talks to is built without
	// the race detector unless LOCKD_RACE says otherwise.
	if os.Getenv("LOCKD_RACE") == "" {
		os.Setenv("LOCKD_RACE", "0")
	}
	os.Exit(runTests(m))
}

// runTests builds both binaries, runs the tests and removes the binaries.
func runTests(m *testing.M) int {
	var err error
	if lockdBin, err = clustertest.Build(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer clustertest.RemoveBuild()
	dir, err := os.MkdirTemp("", "lockctl-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	lockctlBin = filepath.Join(dir, "lockctl")
	build := exec.Command("go", "build", "-o", lockctlBin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building lockctl:", err)
		return 1
	}
	return m.Run()
}

// server is a lockd a test started, and its addresses.
type server struct {
	*clustertest.Proc
	addr, admin string // client address; admin endpoint ("host:port", "" without one)
}

func startLockd(t *testing.T, extra ...string) *server {
	t.Helper()
	return startLockdArgs(t, append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", t.TempDir(), "--loops", "1", "--drain", "1ms"}, extra...))
}

// startLockdArgs starts lockd with exactly args and waits for its ready
// line (its admin endpoint, when it has one, is logged before).
func startLockdArgs(t *testing.T, args []string) *server {
	t.Helper()
	p := clustertest.StartProc(t, clustertest.ProcOptions{Binary: lockdBin, Args: args})
	return &server{Proc: p, addr: p.Addr(), admin: p.AdminAddr()}
}

// ctl runs lockctl and returns stdout, stderr and the exit code.
func ctl(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(lockctlBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestAcquireReleaseRenewPing(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	out, errs, code := ctl(t, env, "acquire", "job", "--lease", "30s")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	tok := strings.TrimSpace(out)
	if _, err := strconv.ParseUint(tok, 10, 64); err != nil {
		t.Fatalf("acquire printed %q", out)
	}
	if _, errs, code := ctl(t, env, "acquire", "job", "--wait", "0"); code != exitTimeout || !strings.Contains(errs, "timed out") {
		t.Fatalf("acquire of a held key: %d %s", code, errs)
	}
	if out, errs, code := ctl(t, env, "renew", "job", tok, "--lease", "10s"); code != 0 || !strings.Contains(out, "renewed") {
		t.Fatalf("renew: %d %s %s", code, out, errs)
	}
	if _, errs, code := ctl(t, nil, "--addr", s.addr, "release", "job", tok); code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, nil, "release", "job", tok, "--addr", s.addr); code != exitNotHeld || !strings.Contains(errs, "not held") {
		t.Fatalf("second release: %d %s", code, errs)
	}
	if out, errs, code := ctl(t, env, "ping"); code != 0 || !strings.Contains(out, "pong") {
		t.Fatalf("ping: %d %s %s", code, out, errs)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{
		{},
		{"frobnicate"},
		{"acquire"},
		{"acquire", "a", "b"},
		{"release", "k"},
		{"release", "k", "notanumber"},
		{"renew", "k", "0"},
		{"run", "k"},
		{"run", "k", "--"},
		{"run", "--", "true"},
		{"run", "k", "--lease", "3s", "--margin", "2s", "--grace", "2s", "--", "true"},
		{"acquire", "k", "--wait", "1000s"},
		{"acquire", "k", "--lease", "0"},
		{"renew", "k", "5", "--lease", "0"},
		{"run", "k", "--wait", "-1s", "--", "true"},
		{"acquire", "k", "--nope"},
		{"status", "a", "b"},
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, errs, code := ctl(t, []string{"LOCKD_ADDRS=127.0.0.1:1"}, args...)
			if code != exitUsage || strings.TrimSpace(errs) == "" {
				t.Fatalf("exit %d, stderr %q; want 2 and a message", code, errs)
			}
			for _, flag := range []string{"--wait", "--lease"} {
				if slices.Contains(args, flag) && !slices.Contains(args, "--margin") && !strings.Contains(errs, flag) {
					t.Fatalf("stderr %q does not name %s", errs, flag)
				}
			}
		})
	}
	for _, c := range []string{"acquire", "release", "renew", "ping", "status", "run"} {
		// Help asked for is output: on stdout, as cobra (and every
		// command built on it) prints it.
		if out, _, code := ctl(t, nil, c, "--help"); code != 0 || !strings.Contains(out, "Usage: lockctl "+c) {
			t.Fatalf("%s --help: %d %q", c, code, out)
		}
	}
	if out, _, code := ctl(t, nil, "--help"); code != 0 || !strings.Contains(out, "Exit codes") {
		t.Fatalf("--help: %d %q", code, out)
	}
}

func TestNoServer(t *testing.T) {
	addr := freeAddr(t) // nothing listens there
	_, errs, code := ctl(t, nil, "ping", "--addr", addr, "--timeout", "1s")
	if code != exitError || !strings.Contains(errs, "no connection") {
		t.Fatalf("ping without server: %d %q", code, errs)
	}
	// An acquire that never found a connection is not "held by someone
	// else" (exit 10): no connection, exit 1.
	_, errs, code = ctl(t, nil, "acquire", "k", "--addr", addr, "--wait", "1s")
	if code != exitError || !strings.Contains(errs, "no connection") {
		t.Fatalf("acquire without server: %d %q", code, errs)
	}
}

func TestRunExitCodesAndEnvironment(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	if _, errs, code := ctl(t, env, "run", "k", "--", "sh", "-c", `echo "$LOCKD_KEY $LOCKD_TOKEN" > `+envFile); code != 0 {
		t.Fatalf("run exit 0: %d %s", code, errs)
	}
	b, _ := os.ReadFile(envFile)
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] != "k" {
		t.Fatalf("command saw %q", b)
	}
	if _, err := strconv.ParseUint(f[1], 10, 64); err != nil {
		t.Fatalf("LOCKD_TOKEN %q", f[1])
	}
	if _, _, code := ctl(t, env, "run", "k", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("run exit 3: got %d", code)
	}
	if _, _, code := ctl(t, env, "run", "k", "--", "/no/such/command"); code != exitNotFound {
		t.Fatalf("run of a missing command: got %d", code)
	}
	// The lock was released each time.
	if _, errs, code := ctl(t, env, "acquire", "k", "--wait", "0"); code != 0 {
		t.Fatalf("lock not released after run: %d %s", code, errs)
	}
}

func TestRunSerializes(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	log := filepath.Join(t.TempDir(), "log")
	script := func(n string) string {
		return fmt.Sprintf("echo start%s >> %s; sleep 1; echo end%s >> %s", n, log, n, log)
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, _, codes[i] = ctl(t, env, "run", "serial", "--wait", "20s", "--", "sh", "-c", script(strconv.Itoa(i)))
		}(i)
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	b, _ := os.ReadFile(log)
	lines := strings.Fields(string(b))
	if codes[0] != 0 || codes[1] != 0 || len(lines) != 4 {
		t.Fatalf("codes %v, log %q", codes, lines)
	}
	for i := 0; i < 4; i += 2 {
		if !strings.HasPrefix(lines[i], "start") || lines[i+1] != "end"+strings.TrimPrefix(lines[i], "start") {
			t.Fatalf("runs overlapped: %q", lines)
		}
	}
}

// proxy forwards TCP to target until frozen; frozen, it moves no bytes
// either way but keeps every connection open (a network partition).
type proxy struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	closed atomic.Bool
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	var conns sync.WaitGroup
	t.Cleanup(func() { p.closed.Store(true); ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns.Add(2)
			go func() { defer conns.Done(); p.pipe(c, u) }()
			go func() { defer conns.Done(); p.pipe(u, c) }()
		}
	}()
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 4096)
	for {
		_ = src.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := src.Read(buf)
		if n > 0 {
			for p.frozen.Load() {
				time.Sleep(10 * time.Millisecond)
				if p.closed.Load() {
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if p.closed.Load() {
					return
				}
				continue
			}
			return
		}
	}
}

func TestRunKillsCommandBeforeLeaseEnds(t *testing.T) {
	s := startLockd(t)
	p := startProxy(t, s.addr)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild")
	// The command starts a grandchild (consul lock is criticised for
	// missing those) and then sleeps.
	script := "sleep 120 & echo $! > " + pidFile + "; sleep 120"
	cmd := exec.Command(lockctlBin, "run", "lost", "--addr", p.ln.Addr().String(), "--lease", "4s",
		"--renew-every", "1s", "--margin", "1s", "--grace", "500ms", "--timeout", "1s", "--", "sh", "-c", script)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(pidFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("command did not start; stderr: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // at least one renewal gets through
	p.frozen.Store(true)                // from now on renewals cannot reach lockd
	var exitCode int
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			exitCode = ee.ExitCode()
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("lockctl did not stop the command; stderr: %s", errb.String())
	}
	// The command was dead before the lease ended on the server: lockd still
	// shows the key held at the moment lockctl returned.
	var k api.Key
	resp, err := http.Get("http://" + s.admin + api.PathKeys + "lost")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&k)
	resp.Body.Close()
	if exitCode != exitLockLost {
		t.Fatalf("exit code %d, want %d; stderr: %s", exitCode, exitLockLost, errb.String())
	}
	if !k.Held || k.LeaseLeftMs <= 0 {
		t.Fatalf("lease already ended when lockctl returned: %+v; stderr: %s", k, errb.String())
	}
	// --margin 1s: dead at least that long before the lease's end, less
	// what it took to see it dead and ask lockd (100 ms of slack).
	if k.LeaseLeftMs < 900 {
		t.Fatalf("command dead only %d ms before the lease's end, --margin is 1s; stderr: %s", k.LeaseLeftMs, errb.String())
	}
	t.Logf("command stopped %d ms before the lease ended", k.LeaseLeftMs)
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		t.Fatalf("grandchild pid %q", b)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		// It may be a zombie waiting for its reaper; check its state.
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(st)); len(f) > 2 && f[2] != "Z" {
			t.Fatalf("grandchild %d still running (%s)", pid, f[2])
		}
	}
	if !strings.Contains(errb.String(), "lost") {
		t.Fatalf("stderr does not say the lock was lost: %s", errb.String())
	}
}

func TestStatus(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr, "LOCKD_ADMIN=" + s.admin}
	out, _, _ := ctl(t, env, "acquire", "held-key")
	tok := strings.TrimSpace(out)
	out, errs, code := ctl(t, env, "status")
	if code != 0 || !strings.Contains(out, "held keys:   1") || !strings.Contains(out, "active") {
		t.Fatalf("status: %d %q %s", code, out, errs)
	}
	out, errs, code = ctl(t, env, "status", "held-key")
	if code != 0 || !strings.Contains(out, "held") || !strings.Contains(out, tok) || !strings.Contains(out, "lease left") {
		t.Fatalf("status KEY: %d %q %s", code, out, errs)
	}
	out, _, code = ctl(t, env, "status", "free-key")
	if code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("status free KEY: %d %q", code, out)
	}
	// Keys that are path segments of their own.
	for _, key := range []string{".", "..", "a/../b", "./x"} {
		out, _, _ := ctl(t, env, "acquire", "--", key)
		tok := strings.TrimSpace(out)
		out, errs, code := ctl(t, env, "status", "--", key)
		if code != 0 || !strings.Contains(out, "held") || !strings.Contains(out, tok) {
			t.Fatalf("status %q: %d %q %s", key, code, out, errs)
		}
	}
	if _, errs, code := ctl(t, []string{"LOCKD_ADMIN=127.0.0.1:1"}, "status"); code != exitError || !strings.Contains(errs, "admin endpoint") {
		t.Fatalf("status without admin: %d %q", code, errs)
	}
}

// A release from elsewhere (someone used the lock's token) stops the
// command at once with exit 14: run watches its lock, so lockd's L says so
// long before the next renewal (3 s away here).
func TestRunStopsWhenReleasedElsewhere(t *testing.T) {
	s := startLockd(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	cmd := exec.Command(lockctlBin, "run", "stolen", "--addr", s.addr, "--lease", "9s", "--renew-every", "3s",
		"--margin", "1s", "--grace", "1s", "--", "sh", "-c", `echo "$LOCKD_TOKEN" > `+tokFile+`; sleep 60`)
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var tok string
	deadline := time.Now().Add(10 * time.Second)
	for tok == "" {
		if b, err := os.ReadFile(tokFile); err == nil {
			tok = strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("command did not start: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, errs, code := ctl(t, nil, "release", "stolen", tok, "--addr", s.addr); code != 0 {
		t.Fatalf("release by another client: %d %s", code, errs)
	}
	start := time.Now()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitLockLost {
			t.Fatalf("exit %v, want %d; stderr: %s", err, exitLockLost, errb.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("lockctl kept running after its lock was released; stderr: %s", errb.String())
	}
	// The sh and its sleep die on SIGTERM at once: what is left is the L's
	// way to lockctl and the group's end.
	if took := time.Since(start); took > time.Second {
		t.Fatalf("stopped %v after the lock was released (renewals 3 s apart): not by the watch", took)
	}
	if !strings.Contains(errb.String(), "released from elsewhere") {
		t.Fatalf("stderr does not say why: %s", errb.String())
	}
}

// A lock granted after a long wait has little of its conservative lease
// left (it counts from the acquire's send): run renews before starting the
// command instead of killing it at once for want of renewals.
func TestRunAfterLongWaitKeepsTheCommand(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	out, errs, code := ctl(t, env, "acquire", "slow", "--lease", "30s")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	tok := strings.TrimSpace(out)
	time.AfterFunc(5*time.Second, func() { ctl(t, env, "release", "slow", tok) })
	start := time.Now()
	_, errs, code = ctl(t, env, "run", "slow", "--wait", "15s", "--lease", "9s", "--margin", "1s", "--grace", "1s", "--", "sh", "-c", "sleep 3")
	if code != 0 {
		t.Fatalf("run after a 5 s wait: exit %d after %v; %s", code, time.Since(start), errs)
	}
}

// A signal while run waits for the lock ends the wait (exit 128+n); the
// command is never started.
func TestRunInterruptedWhileWaiting(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	if _, errs, code := ctl(t, env, "acquire", "busy-key", "--lease", "60s"); code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := exec.Command(lockctlBin, "run", "busy-key", "--wait", "30s", "--", "touch", marker)
	cmd.Env = append(os.Environ(), env...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGINT) {
		t.Fatalf("run interrupted while waiting: %v; %s", err, errb.String())
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("run ended %v after SIGINT", el)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
}

// A refused port fails at once, with the dial error, not after --timeout
// (10 s by default), and an acquire that never reached lockd is not "held
// by someone else".
func TestRefusedPortFailsFast(t *testing.T) {
	addr := freeAddr(t)
	for _, args := range [][]string{
		{"ping"},
		{"acquire", "k", "--wait", "10s"},
		{"release", "k", "5"},
		{"renew", "k", "5"},
		{"run", "k", "--", "true"},
	} {
		start := time.Now()
		_, errs, code := ctl(t, []string{"LOCKD_ADDRS=" + addr}, args...)
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("%s: took %v against a refused port", args[0], el)
		}
		if code != exitError || !strings.Contains(errs, "connection refused") || !strings.Contains(errs, addr) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and the dial error", args[0], code, errs)
		}
	}
}

// A lockd at its --max-conns accepts and closes at once: lockctl says so
// instead of "no connection", and does not leave an acquire indeterminate.
func TestServerAtMaxConns(t *testing.T) {
	s := startLockd(t, "--max-conns", "1")
	hold, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	// The held connection is served (a ping answers), so it is the one.
	_, _ = hold.Write([]byte("P\x00\x00\x00\x00\x00\x00\x00\x01\n"))
	_ = hold.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := hold.Read(make([]byte, 64)); err != nil {
		t.Fatalf("first connection not served: %v", err)
	}
	for _, args := range [][]string{{"ping"}, {"acquire", "k", "--wait", "5s"}} {
		start := time.Now()
		_, errs, code := ctl(t, []string{"LOCKD_ADDRS=" + s.addr}, args...)
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("%s: took %v", args[0], el)
		}
		if code != exitError || !strings.Contains(errs, "closed it at once") || !strings.Contains(errs, "--max-conns") {
			t.Errorf("%s: exit %d, stderr %q; want 1 and a word on the connection limit", args[0], code, errs)
		}
	}
}

// freeAddr is 127.0.0.1 with a port below the ephemeral range that is
// free now, for a lockd that must come back on the same address.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addrs(t, 1, 0)[0]
}

// adminKey reads the admin endpoint's view of key.
func adminKey(t *testing.T, admin, key string) api.Key {
	t.Helper()
	var k api.Key
	resp, err := http.Get("http://" + admin + api.PathKeys + key)
	if err != nil {
		return k // restarting
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&k)
	return k
}

// TestRunSurvivesRestart: a graceful restart of a single lockd (SIGTERM
// with the default 2 s --drain, started again on the same address and data
// dir, so the lock comes back with its token) while run holds the lock
// with --lease 15s does not stop the command. The restart begins just
// before a renewal is due, the worst moment: that renewal fails, each
// failure is reported ("renewing … failed …; retrying"), and a later one
// lands before the stop time; the command then ends by itself and run
// exits with its code.
func TestRunSurvivesRestart(t *testing.T) {
	addr := freeAddr(t)
	args := []string{"--listen", addr, "--admin", "127.0.0.1:0", "--data-dir", t.TempDir(), "--loops", "1"}
	s := startLockdArgs(t, args)
	stop := filepath.Join(t.TempDir(), "stop")
	cmd := exec.Command(lockctlBin, "run", "restart", "--addr", addr, "--lease", "15s", "--",
		"sh", "-c", "while [ ! -e "+stop+" ]; do sleep 0.05; done")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// renewal waits for the lease left to jump up (a renewal) and returns
	// when it did.
	renewal := func(admin string, within time.Duration) time.Time {
		t.Helper()
		deadline := time.Now().Add(within)
		last := int64(-1)
		for time.Now().Before(deadline) {
			select {
			case err := <-done:
				t.Fatalf("run ended: %v; stderr: %s", err, errb.String())
			default:
			}
			k := adminKey(t, admin, "restart")
			if k.Held && last >= 0 && k.LeaseLeftMs > last+200 {
				return time.Now()
			}
			if k.Held {
				last = k.LeaseLeftMs
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no renewal within %v; stderr: %s", within, errb.String())
		return time.Time{}
	}
	// The renewal interval, as run applies it: between two renewals.
	first := renewal(s.admin, 20*time.Second)
	second := renewal(s.admin, 20*time.Second)
	every := second.Sub(first)
	token := adminKey(t, s.admin, "restart").Token
	time.Sleep(every - 300*time.Millisecond)

	begin := time.Now()
	if code, err := s.Term(); code != 0 || err != nil {
		t.Fatalf("lockd on SIGTERM: exit %d, %v", code, err)
	}
	s = startLockdArgs(t, args)
	t.Logf("renewals every %v; lockd restarted in %v, %v before the next renewal was due", every, time.Since(begin), 300*time.Millisecond)
	if k := adminKey(t, s.admin, "restart"); !k.Held || k.Token != token {
		t.Fatalf("after the restart the key is %+v, want held with token %s", k, token)
	}
	renewal(s.admin, 10*time.Second) // a renewal reached the new process

	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v; stderr: %s", err, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not end; stderr: %s", errb.String())
	}
	if e := errb.String(); !strings.Contains(e, `renewing "restart" failed`) || !strings.Contains(e, "retrying") {
		t.Fatalf("stderr does not report the failed renewals: %s", e)
	}
	t.Logf("run's stderr:\n%s", errb.String())
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
