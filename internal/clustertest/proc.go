package clustertest

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProcOptions describe one lockd process started with exactly the command
// line a test gives it (NewProc, StartProc): a single node whose flags,
// environment or binary are what the test is about, where a Cluster would
// add its own.
type ProcOptions struct {
	// Binary is the lockd binary; default Build().
	Binary string
	// Args is the whole command line after the binary: the harness adds
	// nothing (no --listen, --data-dir or --admin of its own).
	Args []string
	// Env is added to the environment.
	Env []string
	// Prefix is a command that runs the rest by exec, such as
	// {"prlimit", "--nofile=64:64", "--"}: its pid becomes lockd's.
	Prefix []string
	// StartTimeout bounds the wait for the ready line (default 30s).
	StartTimeout time.Duration
	// StopTimeout bounds Term's wait for the exit (default 20s).
	StopTimeout time.Duration
}

// Proc is one lockd process and its output, in a process group of its
// own. It is ready once it logs msg=ready with an address (text or json
// logs alike). Its methods are safe for concurrent use.
type Proc struct {
	opts ProcOptions
	logs *logBuf
	p    *proc
}

// NewProc starts lockd as opts says and waits for its ready line. On an
// error the process is killed and the error carries its log. The caller
// ends a Proc it got (Kill, Term, or Wait for an exit of its own).
func NewProc(opts ProcOptions) (*Proc, error) {
	if opts.Binary == "" {
		bin, err := Build()
		if err != nil {
			return nil, err
		}
		opts.Binary = bin
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	x := &Proc{opts: opts, logs: newLogBuf()}
	p, err := spawn(command{bin: opts.Binary, prefix: opts.Prefix, args: opts.Args, env: opts.Env, logs: x.logs, who: "lockd"})
	if err != nil {
		return nil, fmt.Errorf("clustertest: starting %s: %w", opts.Binary, err)
	}
	x.p = p
	if err := p.waitReady(opts.StartTimeout); err != nil {
		_ = p.kill()
		return nil, err
	}
	return x, nil
}

// StartProc is NewProc for a test: a failure to start fails tb, and the
// process is killed when the test ends (its log shown if the test
// failed).
func StartProc(tb testing.TB, opts ProcOptions) *Proc {
	tb.Helper()
	x, err := NewProc(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := x.Kill(); err != nil {
			tb.Error(err)
		}
		if tb.Failed() {
			tb.Logf("the log of lockd %s (last %d lines):\n%s", x.Addr(), dumpLines, strings.Join(x.logs.tail(dumpLines), "\n"))
		}
	})
	return x
}

// Addr is the client address its ready line named.
func (x *Proc) Addr() string {
	x.p.mu.Lock()
	defer x.p.mu.Unlock()
	return x.p.addr
}

// AdminAddr is the admin endpoint's address its log named ("host:port"),
// "" if none so far (--admin "", or not logged yet).
func (x *Proc) AdminAddr() string {
	x.p.mu.Lock()
	defer x.p.mu.Unlock()
	return x.p.admin
}

// PID is the process's id.
func (x *Proc) PID() int { return x.p.pid }

// Alive reports whether the process runs (a stopped process runs).
func (x *Proc) Alive() bool { return !x.p.done() }

// Exited is closed once the process has ended and is reaped.
func (x *Proc) Exited() <-chan struct{} { return x.p.exited }

// Signal sends sig to the process's group.
func (x *Proc) Signal(sig syscall.Signal) error { return x.p.signal(sig) }

// Wait waits up to timeout for the process to end by itself and returns
// its exit code (-1 when a signal ended it).
func (x *Proc) Wait(timeout time.Duration) (int, error) { return x.p.waitExit(timeout) }

// Term sends SIGTERM and returns the exit code once the process ends; if
// it does not within StopTimeout, it is killed and Term returns
// ErrTimeout.
func (x *Proc) Term() (int, error) { return x.p.term(x.opts.StopTimeout) }

// Kill sends SIGKILL and returns once the process is reaped (nil if it
// had ended).
func (x *Proc) Kill() error { return x.p.kill() }

// Stop freezes the process with SIGSTOP and returns once the kernel
// reports it stopped; Cont resumes it.
func (x *Proc) Stop() error { return x.p.freeze(syscall.SIGSTOP, true) }

// Cont resumes a stopped process with SIGCONT and returns once it runs.
func (x *Proc) Cont() error { return x.p.freeze(syscall.SIGCONT, false) }

// Logs returns everything the process wrote so far (stdout and stderr,
// line by line), and nothing else.
func (x *Proc) Logs() string { return strings.Join(x.logs.since(0), "\n") }

// LogMark returns a mark for WaitLogSince: the lines written from now on.
func (x *Proc) LogMark() int { return x.logs.mark() }

// WaitLog returns the first line of the output that re matches, waiting
// up to timeout for it.
func (x *Proc) WaitLog(re *regexp.Regexp, timeout time.Duration) (string, error) {
	return x.logs.wait(0, re, timeout)
}

// WaitLogSince is WaitLog over the lines written since mark (LogMark).
func (x *Proc) WaitLogSince(mark int, re *regexp.Regexp, timeout time.Duration) (string, error) {
	return x.logs.wait(mark, re, timeout)
}
