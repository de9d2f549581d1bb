package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// TestMain lets the test binary double as the server child (startChild
// re-executes os.Executable, which is this binary under go test).
func TestMain(m *testing.M) {
	if kind := os.Getenv(serveEnv); kind != "" {
		if err := serveChild(kind, runtime.NumCPU(), os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString("bench server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every goroutine a test starts — connection readers, etcd clients,
	// sessions, lag samplers — must be gone when the tests end; the lockd
	// binary the cluster targets built is removed after the last test.
	goleak.VerifyTestMain(removingBuild{m}, lockdtest.LeakOptions...)
}

// removingBuild runs the tests, then removes the lockd binary that
// clustertest.Build made for them (if any).
type removingBuild struct{ m *testing.M }

func (r removingBuild) Run() int {
	defer clustertest.RemoveBuild()
	return r.m.Run()
}

// smallConfig is a suite small enough for the race detector: every run
// takes about a second.
func smallConfig() *config {
	return &config{
		Dur: 400 * time.Millisecond, Conns: 2, Depth: 4, Keys: 1000,
		Hot: 2, Waiters: 8, Wait: 5 * time.Second, Retry: time.Millisecond,
		Fanin: 50, Lease: 2 * time.Second, Renew: 200 * time.Millisecond, Drain: 8 * time.Second,
	}
}

// needPeer finds a peer server binary. In CI (CI=true, where .ci/run
// installs redis-server and etcd-server) a missing binary fails the test;
// on a developer machine without it the test is skipped.
func needPeer(t *testing.T, bin string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed: .ci/run must apt-get install redis-server etcd-server (%v)", bin, err)
		}
		t.Skipf("%s not installed (apt-get install -y redis-server etcd-server); CI runs this test", bin)
	}
}

func openTest(t *testing.T, name string) *target {
	t.Helper()
	tg, err := openTarget(name, &options{loops: 2})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(tg.stop)
	return tg
}

func run1(t *testing.T, tg *target, wl string, cfg *config) *Result {
	t.Helper()
	r, err := runWorkload(tg, wl, cfg, 1)
	if err != nil {
		t.Fatalf("%s %s: %v", tg.name, wl, err)
	}
	t.Logf("%s %s: %s", tg.name, wl, oneLine(r))
	return r
}

// TestTargetOfSeveralProcesses: a target may start several server
// processes and drive one of them (as a standby or Raft target will): each
// is profiled on its own, and stopping the target stops them all.
func TestTargetOfSeveralProcesses(t *testing.T) {
	tg := &target{name: "pair", skip: map[string]string{}, stop: func() {}}
	for range 2 {
		ch, err := startChild("echo", 1)
		if err != nil {
			tg.stop()
			t.Fatal(err)
		}
		tg.own(ch)
	}
	tg.addr, tg.newCodec = tg.children[0].addr, func(int) codec { return newLockdCodec() }
	cfg := smallConfig()
	cfg.Profile = filepath.Join(t.TempDir(), "p")
	r := run1(t, tg, wlUncontended, cfg)
	tg.stop()
	checkClean(t, r)
	for _, f := range []string{"-p0.cpu.pprof", "-p0.allocs.pprof", "-p1.cpu.pprof", "-p1.allocs.pprof"} {
		if st, err := os.Stat(cfg.Profile + "-pair-uncontended-r1" + f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
	for i, ch := range tg.children {
		if ch.cmd.ProcessState == nil || !ch.cmd.ProcessState.Exited() {
			t.Errorf("server process %d still running after the target stopped", i)
		}
	}
}
