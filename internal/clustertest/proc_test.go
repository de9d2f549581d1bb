package clustertest

import (
	"errors"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestProcKill: SIGKILL ends the process and Wait says so; a second Kill
// is a no-op; Stop and Cont freeze and resume it first.
func TestProcKill(t *testing.T) {
	x := StartProc(t, ProcOptions{Args: []string{"--listen", "127.0.0.1:0", "--admin", "", "--data-dir", t.TempDir(), "--loops", "1"}})
	if err := x.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := x.Cont(); err != nil {
		t.Fatal(err)
	}
	ping(t, dialT(t, x.Addr()), 1)
	pid := x.PID()
	if err := x.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code, err := x.Wait(10 * time.Second); code != -1 || err != nil {
		t.Fatalf("Wait after SIGKILL: %d, %v", code, err)
	}
	if err := x.Kill(); err != nil || !gone(pid) {
		t.Fatalf("Kill of an ended process: %v (pid gone: %v)", err, gone(pid))
	}
	if err := x.Signal(syscall.SIGTERM); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Signal to an ended process: %v", err)
	}
}

// TestProc: a lockd started with exactly the command line a test gives,
// in either log format (a flag or the environment), with or without the
// admin endpoint, behind a prefix command; ready once it names its
// address, ended by SIGTERM with exit 0 or by SIGKILL, its log kept.
func TestProc(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		env       []string
		prefix    []string
		admin     bool
		readyLine string
	}{
		{"text logs, no admin endpoint", []string{"--admin", ""}, nil, nil, false, "msg=ready"},
		{"json logs by flag", []string{"--log-format", "json", "--admin", "127.0.0.1:0"}, nil, nil, true, `"msg":"ready"`},
		{"json logs by the environment", []string{"--admin", "127.0.0.1:0"}, []string{"LOCKD_LOG_FORMAT=json"}, nil, true, `"msg":"ready"`},
		{"behind a prefix command", []string{"--admin", ""}, nil, []string{"env", "LOCKD_LOG_FORMAT=text"}, false, "msg=ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--loops", "1", "--drain", "1ms"}, tc.args...)
			x := StartProc(t, ProcOptions{Args: args, Env: tc.env, Prefix: tc.prefix})
			if !strings.HasPrefix(x.Addr(), "127.0.0.1:") || strings.HasSuffix(x.Addr(), ":0") || !x.Alive() || x.PID() == 0 {
				t.Fatalf("ready: addr %q, alive %v, pid %d", x.Addr(), x.Alive(), x.PID())
			}
			ping(t, dialT(t, x.Addr()), 7)
			if got := x.AdminAddr() != ""; got != tc.admin {
				t.Fatalf("admin endpoint %q, want one: %v", x.AdminAddr(), tc.admin)
			}
			if _, err := x.WaitLog(regexp.MustCompile(regexp.QuoteMeta(tc.readyLine)), time.Second); err != nil {
				t.Fatalf("%v:\n%s", err, x.Logs())
			}
			if code, err := x.Term(); code != 0 || err != nil {
				t.Fatalf("Term: exit %d, %v\n%s", code, err, x.Logs())
			}
			select {
			case <-x.Exited():
			default:
				t.Fatal("Exited is open after Term")
			}
			if x.Alive() || strings.Contains(x.Logs(), "=== clustertest") || !strings.Contains(x.Logs(), "stopped") {
				t.Fatalf("after Term: alive %v; log:\n%s", x.Alive(), x.Logs())
			}
		})
	}
}

// TestProcStartFailure: a lockd that exits before it is ready (a bad
// flag, a prefix that is not a command) is an error that carries its log,
// and nothing is left running.
func TestProcStartFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   ProcOptions
		want   error // nil: any error
		inText string
	}{
		{"a bad flag", ProcOptions{Args: []string{"--max-key", "0"}}, ErrExited, "--max-key"},
		{"a data dir that is a file", ProcOptions{Args: []string{"--listen", "127.0.0.1:0", "--admin", "", "--data-dir", "/dev/null"}}, ErrExited, "exit status"},
		{"a prefix that is no command", ProcOptions{Prefix: []string{"/nonexistent/prefix"}}, nil, "/nonexistent/prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := NewProc(tc.opts)
			if err == nil {
				x.Kill()
				t.Fatal("started")
			}
			if tc.want != nil && !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.inText) {
				t.Fatalf("%v: want %v naming %q", err, tc.want, tc.inText)
			}
		})
	}
}
