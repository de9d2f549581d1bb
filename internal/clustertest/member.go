package clustertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Member is one lockd process of a cluster, across its restarts: the same
// command line, address and data dir each time. Its methods are safe for
// concurrent use; Restart and WipeData exclude each other.
type Member struct {
	c          *Cluster
	index      int
	addr       string // client address (--listen, --self)
	memberAddr string // client port + offset
	dir        string
	logs       *logBuf

	op sync.Mutex // Restart, WipeData

	mu     sync.Mutex
	args   []string // the command line (SetPeers changes it)
	once   []string // added to the next start's command line only (RestartWith)
	proc   *proc    // the current or last process; nil before the first start
	starts int
	closed bool
}

// proc is one run of a lockd process: a cluster's member (across its
// restarts, a proc each) or a Proc.
type proc struct {
	cmd      *exec.Cmd
	pid      int
	who      string // "member 2", "lockd": for errors and the log
	endLine  bool   // add a line "=== clustertest: … ended" to logs at its end
	want     string // the address its ready line must name ("": any)
	format   string // "json", "text", or "" to tell each line apart
	logs     *logBuf
	mark     int           // its first log line
	ready    chan struct{} // closed on its ready line
	readDone chan struct{} // closed once its output is read to the end
	exited   chan struct{} // closed once it is reaped and its output read

	readyOnce sync.Once
	mu        sync.Mutex
	addr      string // from its ready line
	admin     string // from its "admin endpoint" line
	state     *os.ProcessState
	waitErr   error
}

func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// signal sends sig to p's process group (and to p if that fails).
func (p *proc) signal(sig syscall.Signal) error {
	if p.done() {
		return ErrNotRunning
	}
	// p is not reaped yet (reaping closes exited only after Wait), so its
	// pid, which is its group's id, is not reused: barring the instant
	// between Wait and done.
	if err := syscall.Kill(-p.pid, sig); err != nil {
		if err := p.cmd.Process.Signal(sig); err != nil {
			return fmt.Errorf("clustertest: signal %v to pid %d: %w", sig, p.pid, err)
		}
	}
	return nil
}

// waitExit waits up to timeout for p to end and returns its exit code (-1
// when a signal ended it).
func (p *proc) waitExit(timeout time.Duration) (int, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		return -1, fmt.Errorf("%w: pid %d did not exit in %v", ErrTimeout, p.pid, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return -1, fmt.Errorf("clustertest: pid %d: %w", p.pid, p.waitErr)
	}
	return p.state.ExitCode(), nil
}

// exitText describes how p ended ("" while it runs).
func (p *proc) exitText() string {
	if !p.done() {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != nil {
		return p.state.String()
	}
	return fmt.Sprint(p.waitErr)
}

// command is what spawn runs.
type command struct {
	bin     string
	prefix  []string // a command that execs the rest (prlimit … --)
	args    []string
	env     []string // added to the environment
	logs    *logBuf
	format  string // proc.format
	addr    string // proc.want
	who     string
	endLine bool // proc.endLine
}

// spawn starts c in a process group of its own (killed with the thread
// that started it, on Linux) and collects its output, stdout and stderr,
// line by line into c.logs, watching for its ready and admin endpoint
// lines.
func spawn(c command) (*proc, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	argv := append(append(append([]string(nil), c.prefix...), c.bin), c.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = w, w // an *os.File: Wait does not wait for the reader
	cmd.Env = append(os.Environ(), c.env...)
	cmd.SysProcAttr = sysProcAttr()
	mark := c.logs.mark()
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close()
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, who: c.who, endLine: c.endLine, want: c.addr, format: c.format, logs: c.logs, mark: mark,
		ready: make(chan struct{}), readDone: make(chan struct{}), exited: make(chan struct{})}
	go p.read(r)
	go p.reap(r)
	return p, nil
}

// start runs the member's command once more. The caller holds m.op (or
// owns m, during the cluster's start).
func (m *Member) start() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if m.proc != nil && !m.proc.done() {
		m.mu.Unlock()
		return fmt.Errorf("%w: member %d (pid %d)", ErrRunning, m.index, m.proc.pid)
	}
	m.starts++
	n := m.starts
	args := append(append([]string(nil), m.args...), m.once...)
	m.once = nil
	m.mu.Unlock()

	m.logs.add(fmt.Sprintf("=== clustertest: member %d, start %d: %s %s", m.index, n, m.c.bin, strings.Join(args, " ")))
	p, err := spawn(command{bin: m.c.bin, args: args, env: m.c.opts.Env, logs: m.logs,
		format: m.c.opts.LogFormat, addr: m.addr, who: fmt.Sprintf("member %d", m.index), endLine: true})
	if err != nil {
		return fmt.Errorf("clustertest: member %d: %w", m.index, err)
	}
	m.mu.Lock()
	closed := m.closed
	if !closed {
		m.proc = p
	}
	m.mu.Unlock()
	if closed { // Close ran meanwhile: it did not see p
		_ = p.signal(syscall.SIGKILL)
		_, _ = p.waitExit(killTimeout)
		return ErrClosed
	}
	return nil
}

// read collects p's output line by line and watches for its ready and
// admin endpoint lines.
func (p *proc) read(r *os.File) {
	defer close(p.readDone)
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line = strings.TrimSuffix(line, "\n"); line != "" {
			p.logs.add(line)
			switch msg, addr := logFields(p.format, line); msg {
			case "ready":
				if p.want != "" && (addr == "" || addr == p.want) || p.want == "" && addr != "" {
					p.readyOnce.Do(func() {
						p.mu.Lock()
						p.addr = addr
						p.mu.Unlock()
						close(p.ready)
					})
				}
			case "admin endpoint":
				p.mu.Lock()
				p.admin = addr
				p.mu.Unlock()
			}
		}
		if err != nil {
			return
		}
	}
}

// reap waits for p, then for the rest of its output (bounded: a process
// it left behind may hold the pipe), and records how it ended.
func (p *proc) reap(r *os.File) {
	err := p.cmd.Wait()
	select {
	case <-p.readDone:
	case <-time.After(2 * time.Second):
	}
	r.Close() // ends the reader if it still waits
	<-p.readDone
	p.mu.Lock()
	p.state, p.waitErr = p.cmd.ProcessState, err
	p.mu.Unlock()
	if p.endLine {
		desc := fmt.Sprint(err)
		if p.cmd.ProcessState != nil {
			desc = p.cmd.ProcessState.String()
		}
		p.logs.add(fmt.Sprintf("=== clustertest: %s (pid %d) ended: %s", p.who, p.pid, desc))
	}
	close(p.exited)
}

var (
	textMsgRE  = regexp.MustCompile(`(?:^| )msg=("(?:[^"\\]|\\.)*"|\S+)`)
	textAddrRE = regexp.MustCompile(` addr=("(?:[^"\\]|\\.)*"|\S+)`)
)

// logFields returns a log line's msg and addr attributes, in slog's json
// or text format ("" when absent); format "" reads a line that starts
// with "{" as json, any other as text.
func logFields(format, line string) (msg, addr string) {
	if format == "json" || format == "" && strings.HasPrefix(line, "{") {
		if !strings.HasPrefix(line, "{") {
			return "", ""
		}
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			return "", ""
		}
		return rec.Msg, rec.Addr
	}
	unquote := func(s string) string {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
		return s
	}
	if mm := textMsgRE.FindStringSubmatch(line); mm != nil {
		msg = unquote(mm[1])
	}
	if ma := textAddrRE.FindStringSubmatch(line); ma != nil {
		addr = unquote(ma[1])
	}
	return msg, addr
}

// waitReady waits up to timeout for p's ready line.
func (p *proc) waitReady(timeout time.Duration) error {
	timer := time.NewTimer(max(timeout, 0))
	defer timer.Stop()
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return fmt.Errorf("%w: %s %s before it was ready (%s); its log:\n%s",
			ErrExited, p.who, p.want, p.exitText(), strings.Join(p.logs.since(p.mark), "\n"))
	case <-timer.C:
		return fmt.Errorf("%w: %s %s not ready in %v; its log:\n%s",
			ErrTimeout, p.who, p.want, timeout, strings.Join(p.logs.tail(dumpLines), "\n"))
	}
}

// kill sends SIGKILL to p's group and returns once p is reaped; nil if p
// has ended already.
func (p *proc) kill() error {
	if p.done() {
		return nil
	}
	_ = p.signal(syscall.SIGKILL)
	if _, err := p.waitExit(killTimeout); err != nil {
		return fmt.Errorf("%s: %w", p.who, err)
	}
	return nil
}

// term sends SIGTERM and returns the exit code once p ends; if it does not
// within timeout, it is killed and term returns ErrTimeout.
func (p *proc) term(timeout time.Duration) (int, error) {
	if p.done() {
		return -1, fmt.Errorf("%w: %s", ErrNotRunning, p.who)
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return -1, fmt.Errorf("%s: %w", p.who, err)
	}
	code, err := p.waitExit(timeout)
	if errors.Is(err, ErrTimeout) {
		_ = p.kill()
		return -1, fmt.Errorf("%w: %s did not exit within %v of SIGTERM; killed", ErrTimeout, p.who, timeout)
	}
	return code, err
}

// freeze sends sig (SIGSTOP, stopped true; SIGCONT, false) and returns
// once the kernel reports the state.
func (p *proc) freeze(sig syscall.Signal, stopped bool) error {
	if p.done() {
		return fmt.Errorf("%w: %s", ErrNotRunning, p.who)
	}
	if err := p.signal(sig); err != nil {
		return fmt.Errorf("%s: %w", p.who, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procState(p.pid)
		if errors.Is(err, errors.ErrUnsupported) || (err == nil && (st == 'T') == stopped) {
			return nil
		}
		if p.done() {
			if stopped {
				return fmt.Errorf("%w: %s ended instead of stopping (%s)", ErrExited, p.who, p.exitText())
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: state %q 5 s after %v", ErrTimeout, p.who, st, sig)
		}
		time.Sleep(time.Millisecond)
	}
}

func (m *Member) current() *proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

// waitReady waits up to timeout for the current process's ready line.
func (m *Member) waitReady(timeout time.Duration) error {
	p := m.current()
	if p == nil {
		return fmt.Errorf("%w: member %d never started", ErrNotRunning, m.index)
	}
	return p.waitReady(timeout)
}

// close kills the member for good (Cluster.Close).
func (m *Member) close() error {
	m.mu.Lock()
	m.closed = true
	p := m.proc
	m.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.kill()
}

// describe is the member's state for Dump.
func (m *Member) describe() string {
	p := m.current()
	switch {
	case p == nil:
		return "never started"
	case p.done():
		return fmt.Sprintf("pid %d ended: %s", p.pid, p.exitText())
	}
	if st, err := procState(p.pid); err == nil && st == 'T' {
		return fmt.Sprintf("pid %d stopped", p.pid)
	}
	return fmt.Sprintf("pid %d running", p.pid)
}

// Index is the member's position in --peers.
func (m *Member) Index() int { return m.index }

// Addr is the member's client address (its --listen and --self).
func (m *Member) Addr() string { return m.addr }

// HTTPAddr is the member's HTTP API address (Options.HTTPOffset), "" without
// it.
func (m *Member) HTTPAddr() string {
	if m.c.plan.http == 0 {
		return ""
	}
	_, port, _ := net.SplitHostPort(m.addr)
	p, _ := strconv.Atoi(port)
	return hostPort(p + m.c.plan.http)
}

// MemberAddr is the address the member listens on for other members: its
// client port + the peer offset (§6.1).
func (m *Member) MemberAddr() string { return m.memberAddr }

// DataDir is the member's --data-dir.
func (m *Member) DataDir() string { return m.dir }

// Args returns the member's command line, without the binary, as its next
// start will have it.
func (m *Member) Args() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.args...)
}

// PID is the current (or last) process's id, 0 before the first start.
func (m *Member) PID() int {
	if p := m.current(); p != nil {
		return p.pid
	}
	return 0
}

// Alive reports whether the member's process runs (a stopped process
// runs).
func (m *Member) Alive() bool {
	p := m.current()
	return p != nil && !p.done()
}

// AdminURL is the base URL of the current process's admin endpoint
// ("http://127.0.0.1:port", https in a Secure cluster, the port read from
// its log), "" if not known.
func (m *Member) AdminURL() string {
	p := m.current()
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.admin == "" {
		return ""
	}
	if m.c.sec != nil {
		return "https://" + p.admin
	}
	return "http://" + p.admin
}

// Signal sends sig to the member's process group.
func (m *Member) Signal(sig syscall.Signal) error {
	p := m.current()
	if p == nil {
		return fmt.Errorf("%w: member %d", ErrNotRunning, m.index)
	}
	if err := p.signal(sig); err != nil {
		return fmt.Errorf("member %d: %w", m.index, err)
	}
	return nil
}

// Wait waits up to timeout for the current process to end by itself and
// returns its exit code (-1 when a signal ended it).
func (m *Member) Wait(timeout time.Duration) (int, error) {
	p := m.current()
	if p == nil {
		return -1, fmt.Errorf("%w: member %d", ErrNotRunning, m.index)
	}
	code, err := p.waitExit(timeout)
	if err != nil {
		return code, fmt.Errorf("member %d: %w", m.index, err)
	}
	return code, nil
}

// Kill sends SIGKILL (kill -9) to the member's process group and returns
// once the process is reaped. A member that does not run is left alone.
func (m *Member) Kill() error {
	if p := m.current(); p != nil {
		return p.kill()
	}
	return nil
}

// Term sends SIGTERM and returns the exit code once the process ends. If
// it does not end within Options.StopTimeout it is killed and Term returns
// ErrTimeout.
func (m *Member) Term() (int, error) {
	p := m.current()
	if p == nil {
		return -1, fmt.Errorf("%w: member %d", ErrNotRunning, m.index)
	}
	return p.term(m.c.opts.StopTimeout)
}

// Stop freezes the member with SIGSTOP and returns once the kernel reports
// it stopped.
func (m *Member) Stop() error { return m.freeze(syscall.SIGSTOP, true) }

// Cont resumes a stopped member with SIGCONT and returns once it runs.
func (m *Member) Cont() error { return m.freeze(syscall.SIGCONT, false) }

func (m *Member) freeze(sig syscall.Signal, stopped bool) error {
	p := m.current()
	if p == nil {
		return fmt.Errorf("%w: member %d", ErrNotRunning, m.index)
	}
	return p.freeze(sig, stopped)
}

// Start starts a member of Options.Deferred (or one that ended): it is
// Restart.
func (m *Member) Start() error { return m.Restart() }

// Restart starts the member again, with the same command line and data dir,
// and waits up to Options.StartTimeout for its ready line. The member must
// not be running (Kill or Term it first). A process that started but did
// not get ready is left running (Kill it, or Close the cluster).
func (m *Member) Restart() error {
	m.op.Lock()
	defer m.op.Unlock()
	if err := m.start(); err != nil {
		return err
	}
	return m.waitReady(m.c.opts.StartTimeout)
}

// WipeData empties the member's data dir, as if its disk were lost. The
// member must not be running.
func (m *Member) WipeData() error {
	m.op.Lock()
	defer m.op.Unlock()
	if m.Alive() {
		return fmt.Errorf("%w: member %d", ErrRunning, m.index)
	}
	if err := os.RemoveAll(m.dir); err != nil {
		return fmt.Errorf("clustertest: %w", err)
	}
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return fmt.Errorf("clustertest: %w", err)
	}
	return nil
}

// Logs returns everything the member wrote so far, across its restarts
// (the harness adds a line starting with "=== clustertest:" at every start
// and end). At most the last 32 MiB are kept.
func (m *Member) Logs() string { return strings.Join(m.logs.since(0), "\n") }

// LogMark returns a mark for WaitLogSince: the lines written from now on.
func (m *Member) LogMark() int { return m.logs.mark() }

// WaitLog returns the first line of the current process's output that re
// matches, waiting up to timeout for it.
func (m *Member) WaitLog(re *regexp.Regexp, timeout time.Duration) (string, error) {
	mark := 0
	if p := m.current(); p != nil {
		mark = p.mark
	}
	return m.WaitLogSince(mark, re, timeout)
}

// WaitLogSince is WaitLog over the lines written since mark (LogMark).
func (m *Member) WaitLogSince(mark int, re *regexp.Regexp, timeout time.Duration) (string, error) {
	line, err := m.logs.wait(mark, re, timeout)
	if err != nil {
		return "", fmt.Errorf("member %d: %w", m.index, err)
	}
	return line, nil
}
