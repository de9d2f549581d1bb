package clustertest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/faultproxy"
	"github.com/lockd-dev/lockd/proto"
)

// fakeBin is testdata/fakelockd, built by TestMain: lockd's cluster flags
// and a member link of its own (see its doc), for the cluster paths of the
// harness until lockd has cluster modes.
var fakeBin string

type withFake struct{ inner interface{ Run() int } }

func (w withFake) Run() int {
	dir, err := os.MkdirTemp("", "fakelockd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	fakeBin = filepath.Join(dir, "fakelockd")
	if out, err := exec.Command("go", "build", "-o", fakeBin, "./testdata/fakelockd").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fakelockd: %v\n%s", err, out)
		return 1
	}
	return w.inner.Run()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(withFake{Main(m)}) }

func dialT(t *testing.T, addr string) *Conn {
	t.Helper()
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ping(t *testing.T, c *Conn, nonce uint64) {
	t.Helper()
	r, err := c.Ping(nonce)
	if err != nil {
		t.Fatal(err)
	}
	if r.Op != proto.OpPing || r.ID != nonce {
		t.Fatalf("ping %d: got %c id=%d", nonce, r.Op, r.ID)
	}
}

func grant(t *testing.T, c *Conn, key string, lease uint8, owner uint64) uint64 {
	t.Helper()
	r, err := c.Do(proto.AppendAcquire(nil, 0, lease, owner, key))
	if err != nil {
		t.Fatal(err)
	}
	if r.Op != proto.OpAcquire || r.ID != owner {
		t.Fatalf("acquire %q: got %c id=%d", key, r.Op, r.ID)
	}
	return r.Token
}

func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// TestSingleNodes: three independent lockd processes, each on its own
// address and data dir, each serving on its own.
func TestSingleNodes(t *testing.T) {
	c := Start(t, Options{Members: 3})
	addrs := c.Addrs()
	if len(addrs) != 3 || len(slices.Compact(slices.Sorted(slices.Values(addrs)))) != 3 {
		t.Fatalf("addresses %v", addrs)
	}
	if c.Peers(0) != nil || c.Proxied() || c.Partition([]int{0}) != ErrNotProxied || c.Cut(0, 1) != ErrNotProxied {
		t.Fatal("a single-node set has peers or proxies")
	}
	for i, m := range c.Members() {
		if m.Index() != i || m.Addr() != addrs[i] || !m.Alive() || m.PID() == 0 {
			t.Fatalf("member %d: %d %s %v %d", i, m.Index(), m.Addr(), m.Alive(), m.PID())
		}
		if slices.Contains(m.Args(), "--cluster") {
			t.Fatalf("single node with cluster flags: %v", m.Args())
		}
		conn := dialT(t, m.Addr())
		ping(t, conn, uint64(i))
		grant(t, conn, "same-key", 30, 1) // independent: each grants it
		st, err := m.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Role != "active" || st.Addr != m.Addr() || st.Keys != 1 || st.TokenLast == 0 {
			t.Fatalf("member %d status %+v", i, st)
		}
		if !strings.Contains(m.Logs(), `"msg":"ready"`) {
			t.Fatalf("no json ready line:\n%s", m.Logs())
		}
		if entries, _ := os.ReadDir(m.DataDir()); len(entries) == 0 {
			t.Fatalf("member %d wrote nothing in its data dir %s", i, m.DataDir())
		}
	}
}

// TestKillAndRestart: kill -9 ends the process at once (a crash loses the
// lock, not the token order); Restart brings it back on the same address
// and data dir; WaitLog sees only the new process's lines.
func TestKillAndRestart(t *testing.T) {
	c := Start(t, Options{Members: 1})
	m := c.Member(0)
	conn := dialT(t, m.Addr())
	tok := grant(t, conn, "job", 60, 1)
	pid := m.PID()
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if m.Alive() || !gone(pid) {
		t.Fatalf("pid %d still there after Kill", pid)
	}
	if err := m.Kill(); err != nil {
		t.Fatalf("a second Kill: %v", err)
	}
	if _, err := conn.Ping(2); err == nil {
		t.Fatal("a ping answered by a killed member")
	}
	if err := m.Stop(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Stop of a dead member: %v", err)
	}
	mark := m.LogMark()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if m.PID() == pid || !m.Alive() {
		t.Fatal("no new process")
	}
	if err := m.Restart(); !errors.Is(err, ErrRunning) {
		t.Fatalf("Restart of a running member: %v", err)
	}
	if err := m.WipeData(); !errors.Is(err, ErrRunning) {
		t.Fatalf("WipeData of a running member: %v", err)
	}
	conn2 := dialT(t, m.Addr())
	if nt := grant(t, conn2, "job", 60, 2); nt <= tok {
		t.Fatalf("token %d after kill -9 not above %d", nt, tok)
	}
	ready := regexp.MustCompile(`"msg":"ready"`)
	if _, err := m.WaitLogSince(mark, ready, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitLog(regexp.MustCompile(`start 1:`), 50*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("WaitLog matched a line of the previous process: %v", err)
	}
	if n := strings.Count(m.Logs(), "=== clustertest: member 0, start"); n != 2 {
		t.Fatalf("%d start lines in the log, want 2", n)
	}
	if !strings.Contains(m.Logs(), "signal: killed") {
		t.Fatalf("the kill is not in the log:\n%s", m.Logs())
	}
}

// TestDeferred: a deferred member is not started by New, and starts later.
func TestDeferred(t *testing.T) {
	c := Start(t, Options{Members: 2, Deferred: []int{1}})
	m := c.Member(1)
	if m.Alive() || m.PID() != 0 || m.AdminURL() != "" {
		t.Fatal("a deferred member runs")
	}
	if _, err := m.Status(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Status of a deferred member: %v", err)
	}
	ping(t, dialT(t, c.Member(0).Addr()), 1)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	ping(t, dialT(t, m.Addr()), 2)
}

// TestTermRestartKeepsLocks: SIGTERM exits 0 and writes the held locks;
// the restart on the same data dir reloads them, so the old token releases.
func TestTermRestartKeepsLocks(t *testing.T) {
	c := Start(t, Options{Members: 1, ExtraArgs: []string{"--drain", "100ms"}})
	m := c.Member(0)
	conn := dialT(t, m.Addr())
	tok := grant(t, conn, "held", 60, 1)
	conn.Close()
	code, err := m.Term()
	if err != nil || code != 0 {
		t.Fatalf("Term: %d, %v\n%s", code, err, m.Logs())
	}
	if _, err := m.Term(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Term of an exited member: %v", err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	conn = dialT(t, m.Addr())
	r, err := conn.Do(proto.AppendRelease(nil, tok, "held"))
	if err != nil || r.Op != proto.OpRelease || r.ID != tok {
		t.Fatalf("release with the old token after a SIGTERM restart: %c %d %v", r.Op, r.ID, err)
	}
	// WipeData: a member that lost its disk starts empty.
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := m.WipeData(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(m.DataDir()); len(entries) != 0 {
		t.Fatalf("data dir not empty after WipeData: %v", entries)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
}

// TestStopCont: a stopped member answers nothing (pings time out, the
// connection stays open); once continued it answers what waited, and more.
func TestStopCont(t *testing.T) {
	c := Start(t, Options{Members: 1})
	m := c.Member(0)
	conn := dialT(t, m.Addr())
	ping(t, conn, 1)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if st, err := procState(m.PID()); err == nil && st != 'T' {
		t.Fatalf("state %q after Stop", st)
	}
	if !m.Alive() {
		t.Fatal("a stopped member is not alive")
	}
	conn.SetTimeout(300 * time.Millisecond)
	_, err := conn.Ping(2)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("ping to a stopped member: %v, want a timeout", err)
	}
	if err := m.Cont(); err != nil {
		t.Fatal(err)
	}
	conn.SetTimeout(5 * time.Second)
	r, err := conn.Read() // the ping sent while stopped
	if err != nil || r.Op != proto.OpPing || r.ID != 2 {
		t.Fatalf("after Cont: %c %d %v", r.Op, r.ID, err)
	}
	ping(t, conn, 3)
}

// TestTermIsBounded: a member that does not exit on SIGTERM (here: it is
// stopped) is killed after StopTimeout, and reaped.
func TestTermIsBounded(t *testing.T) {
	c := Start(t, Options{Members: 1, StopTimeout: 300 * time.Millisecond})
	m := c.Member(0)
	pid := m.PID()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Term(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Term of a stopped member: %v, want ErrTimeout", err)
	}
	if m.Alive() || !gone(pid) {
		t.Fatal("the member survived a timed-out Term")
	}
	// Wait on a member that does not exit by itself is bounded too.
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(50 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait: %v", err)
	}
	if err := m.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, err := m.Wait(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit after SIGINT: %d %v", code, err)
	}
}

// TestCloseLeavesNoProcess: Close kills and reaps every member (no process,
// no zombie), is idempotent, and removes the directory New made.
func TestCloseLeavesNoProcess(t *testing.T) {
	c, err := New(Options{Members: 2})
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{c.Member(0).PID(), c.Member(1).PID()}
	if err := c.Member(1).Stop(); err != nil { // a stopped one dies too
		t.Fatal(err)
	}
	dir := filepath.Dir(c.Member(0).DataDir())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !gone(pid) {
			t.Fatalf("pid %d left after Close", pid)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cluster's directory is still there: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Member(0).Restart(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Restart after Close: %v", err)
	}
}

// fakeTB records what Start's cleanup does on a failed test.
type fakeTB struct {
	testing.TB
	cleanups []func()
	logs     strings.Builder
}

func (f *fakeTB) Helper()                    {}
func (f *fakeTB) Failed() bool               { return true }
func (f *fakeTB) Cleanup(fn func())          { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(s string, args ...any) { fmt.Fprintf(&f.logs, s, args...) }
func (f *fakeTB) Errorf(s string, args ...any) {
	f.TB.Errorf(s, args...)
}

// TestFailedTestDumpsLogsAndCleansUp: when the test failed, Start's cleanup
// logs every member's log tail, then leaves no process.
func TestFailedTestDumpsLogsAndCleansUp(t *testing.T) {
	f := &fakeTB{TB: t}
	c := Start(f, Options{Members: 2, Dir: t.TempDir()})
	pids := []int{c.Member(0).PID(), c.Member(1).PID()}
	if len(f.cleanups) != 1 {
		t.Fatalf("%d cleanups registered", len(f.cleanups))
	}
	f.cleanups[0]()
	dump := f.logs.String()
	for i, m := range c.Members() {
		if !strings.Contains(dump, fmt.Sprintf("--- member %d %s (pid %d running)", i, m.Addr(), pids[i])) {
			t.Errorf("no header for member %d in the dump:\n%s", i, dump)
		}
	}
	if strings.Count(dump, `"msg":"ready"`) != 2 {
		t.Errorf("the dump lacks the members' log lines:\n%s", dump)
	}
	for _, pid := range pids {
		if !gone(pid) {
			t.Fatalf("pid %d left after the cleanup", pid)
		}
	}
}

// TestStartFailureReportsTheLog: a member that exits at start fails New
// with its log, and nothing is left running.
func TestStartFailureReportsTheLog(t *testing.T) {
	_, err := New(Options{Members: 2, ExtraArgs: []string{"--max-key", "0"}})
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "--max-key") {
		t.Fatalf("New with a bad flag: %v", err)
	}
	_, err = New(Options{Members: 1, Binary: "/nonexistent/lockd"})
	if err == nil {
		t.Fatal("New with a missing binary")
	}
}

func TestBuild(t *testing.T) {
	p, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "lockd ") {
		t.Fatalf("%s --version: %q %v", p, out, err)
	}
}

// --- the cluster paths, on fakelockd ---

// waitHeard waits until every member hears exactly whom want says.
func waitHeard(t *testing.T, c *Cluster, want func(from, to int) bool) {
	t.Helper()
	for _, m := range c.Members() {
		_, err := m.WaitStatus(10*time.Second, func(s Status) bool {
			raw, _ := s.Raw["heard"].([]any)
			for k, v := range raw {
				if b, _ := v.(bool); k != m.Index() && b != want(k, m.Index()) {
					return false
				}
			}
			return len(raw) == len(c.Members())
		})
		if err != nil {
			t.Fatalf("member %d: %v", m.Index(), err)
		}
	}
}

// TestProxiedCluster runs a proxied 3-member cluster of fakelockd processes
// with the harness's real flags: every member's --self is its own entry
// and the others are proxies; the client proxies reach the right member
// (an M names it); the member links carry heartbeats; Partition cuts
// exactly the links between groups and Heal restores them.
func TestProxiedCluster(t *testing.T) {
	c := Start(t, Options{Mode: ModePriority, Proxied: true, Binary: fakeBin, FailoverTimeout: 500 * time.Millisecond})
	if !c.Proxied() || len(c.Proxies()) != 12 {
		t.Fatalf("%d proxies", len(c.Proxies()))
	}
	for j := range 3 {
		peers := c.Peers(j)
		if peers[j] != c.Addrs()[j] {
			t.Fatalf("member %d: own entry %s, address %s", j, peers[j], c.Addrs()[j])
		}
		for k := range 3 {
			if k != j && (peers[k] == c.Addrs()[k] || c.Link(j, k).Client.Addr() != peers[k]) {
				t.Fatalf("member %d reaches %d at %s, not through its proxy", j, k, peers[k])
			}
			// The entry reaches member k: its M names k's own --self.
			conn := dialT(t, peers[k])
			r, err := conn.Ping(uint64(10*j + k))
			if err != nil || r.Op != proto.OpMoved || string(r.Tail) != c.Addrs()[k] {
				t.Fatalf("%d's entry for %d (%s): %c %q %v", j, k, peers[k], r.Op, r.Tail, err)
			}
		}
	}
	if st, err := c.Member(0).Status(); err != nil || st.Role != "fake" || st.Epoch != 7 {
		t.Fatalf("status %+v %v", st, err)
	}
	all := func(from, to int) bool { return true }
	waitHeard(t, c, all)

	if err := c.Partition([]int{0}); err != nil { // {0} | {1, 2}
		t.Fatal(err)
	}
	waitHeard(t, c, func(from, to int) bool { return (from == 0) == (to == 0) })
	// The client paths are not part of the partition.
	conn := dialT(t, c.Peers(1)[0])
	if r, err := conn.Ping(1); err != nil || r.Op != proto.OpMoved {
		t.Fatalf("client proxy across the partition: %c %v", r.Op, err)
	}
	// A new partition replaces the old one.
	if err := c.Partition([]int{0, 1}, []int{2}); err != nil {
		t.Fatal(err)
	}
	waitHeard(t, c, func(from, to int) bool { return (from == 2) == (to == 2) })
	// One way: 2 stops hearing 1 on both links between them (fakelockd
	// beats both ways on every link); 1 still hears 2.
	c.Heal()
	if err := c.Cut(1, 2); err != nil {
		t.Fatal(err)
	}
	waitHeard(t, c, func(from, to int) bool { return !(from == 1 && to == 2) })
	// Blackholing one proxy's Tx is not enough for that: 2's own link
	// to 1 still carries 1's beats back.
	c.Heal()
	c.Link(1, 2).Member.Blackhole(faultproxy.Tx)
	time.Sleep(400 * time.Millisecond) // longer than fakelockd's 300 ms "heard" window
	waitHeard(t, c, all)
	c.Heal()
	waitHeard(t, c, all)

	for _, bad := range [][][]int{{{3}}, {{0}, {0, 1}}, {{-1}}} {
		if err := c.Partition(bad...); !errors.Is(err, ErrBadOptions) {
			t.Errorf("Partition(%v): %v", bad, err)
		}
	}
	for _, bad := range [][2]int{{0, 0}, {0, 3}, {-1, 1}} {
		if err := c.Cut(bad[0], bad[1]); !errors.Is(err, ErrBadOptions) {
			t.Errorf("Cut(%v): %v", bad, err)
		}
	}
	var dump strings.Builder
	c.Dump(&dump, 5)
	if strings.Count(dump.String(), "--- proxy ") != 12 {
		t.Fatalf("dump:\n%s", dump.String())
	}
}

// TestClusterFlagsChecked: a member given --self outside --peers exits 2,
// as §6.1 says lockd must; the harness reports it.
func TestClusterFlagsChecked(t *testing.T) {
	_, err := New(Options{Mode: ModeRaft, Members: 1, Binary: fakeBin, ExtraArgs: []string{"--self", "127.0.0.1:1"}})
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("New: %v", err)
	}
}

// TestRemoveStale: the build directory of a process that is gone is
// removed; a live process's is kept.
func TestRemoveStale(t *testing.T) {
	const dead = 1<<22 + 1 // above Linux's largest pid_max: never a process
	if !gone(dead) {
		t.Fatalf("pid %d exists", dead)
	}
	stale := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", buildPrefix, dead))
	live := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", buildPrefix, os.Getpid()))
	for _, d := range []string{stale, live} {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(live)
	defer os.RemoveAll(stale)
	removeStale()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale %s kept: %v", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live %s removed: %v", live, err)
	}
}
