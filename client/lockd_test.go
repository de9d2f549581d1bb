package client

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests that need a real lockd run the lockd binary. They import
// nothing of the server, nor anything outside the standard library and
// lockd's library modules: a test's import is recorded in client/go.mod,
// and every program that imports the client would inherit it (a consumer's
// `go mod tidy` loads the tests of the packages it imports). So the
// building and starting of lockd below, and waitFor, are this module's own
// copies of the root module's one helper for each (internal/clustertest's
// Build and Proc, internal/wait's For), which every test of the root
// module uses: keep them in step.

// lockdPackage is what lockdBinary builds.
const lockdPackage = "github.com/lockd-dev/lockd/cmd/lockd"

var lockdBuild struct {
	once sync.Once
	mu   sync.Mutex
	path string
	dir  string // the directory built into, "" if none (removeLockdBuild)
	err  error
	skip bool // err says there is no lockd to build here
}

// lockdBinary returns the lockd binary's path: $LOCKD_BIN if set, else
// cmd/lockd built once (without the race detector: these tests examine the
// client) by `go build` in this package's directory, where the
// repository's go.work provides the root module. Without it — the client
// module alone, from the module cache or with GOWORK=off — there is no
// lockd to build: the test is skipped with the reason, except under
// CI=true, where it fails.
func lockdBinary(t testing.TB) string {
	t.Helper()
	bin, skip, err := buildLockd()
	if err != nil {
		if skip && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	return bin
}

// buildLockd is lockdBinary's work: the binary, or why there is none (skip:
// none can be built here).
func buildLockd() (bin string, skip bool, err error) {
	lockdBuild.once.Do(func() {
		lockdBuild.mu.Lock()
		defer lockdBuild.mu.Unlock()
		if p := os.Getenv("LOCKD_BIN"); p != "" {
			lockdBuild.path, lockdBuild.err = filepath.Abs(p)
			return
		}
		root := strings.TrimSuffix(lockdPackage, "/cmd/lockd")
		if out, err := exec.Command("go", "list", "-m", root).CombinedOutput(); err != nil {
			lockdBuild.skip = true
			lockdBuild.err = fmt.Errorf("no lockd to run: %s is not in this build (outside the repository's go.work); "+
				"set LOCKD_BIN to a lockd binary (go list -m: %s)", root, strings.TrimSpace(string(out)))
			return
		}
		dir, err := os.MkdirTemp("", "lockd-client-test-bin-")
		if err != nil {
			lockdBuild.err = err
			return
		}
		bin := filepath.Join(dir, "lockd")
		if out, err := exec.Command("go", "build", "-o", bin, lockdPackage).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			lockdBuild.err = fmt.Errorf("go build %s: %v\n%s", lockdPackage, err, out)
			return
		}
		lockdBuild.path, lockdBuild.dir = bin, dir
	})
	lockdBuild.mu.Lock()
	defer lockdBuild.mu.Unlock()
	return lockdBuild.path, lockdBuild.skip, lockdBuild.err
}

// removeLockdBuild deletes the binary lockdBinary built (TestMain, after
// every test).
func removeLockdBuild() {
	lockdBuild.mu.Lock()
	defer lockdBuild.mu.Unlock()
	if lockdBuild.dir != "" {
		os.RemoveAll(lockdBuild.dir)
		lockdBuild.dir, lockdBuild.path = "", ""
		lockdBuild.err = errors.New("the lockd binary was removed after the tests")
	}
}

// lockdProc is a lockd process a test started (startLockd).
type lockdProc struct {
	addr, admin string
	cmd         *exec.Cmd
	exited      chan struct{}

	mu   sync.Mutex
	logs []string // its output, for failure messages
}

var (
	readyRE = regexp.MustCompile(`msg=ready addr=(\S+)`)
	adminRE = regexp.MustCompile(`msg="admin endpoint" addr=(\S+)`)
)

// startLockd runs lockd on 127.0.0.1 (its client and admin ports chosen by
// the system) with the data directory dataDir, a 100 ms drain on shutdown,
// and args (flags that change those come after them and win); it returns
// once lockd logs that it is ready. The caller stops it (Close).
func startLockd(t testing.TB, dataDir string, args ...string) *lockdProc {
	t.Helper()
	p, err := runLockd(lockdBinary(t), dataDir, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runLockd is startLockd's work, with the binary bin.
func runLockd(bin, dataDir string, args ...string) (*lockdProc, error) {
	args = append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", dataDir,
		"--drain", "100ms", "--log-format", "text"}, args...)
	p := &lockdProc{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start lockd: %w", err)
	}
	w.Close()
	ready, admin := make(chan string, 1), make(chan string, 1)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs = append(p.logs, line)
			p.mu.Unlock()
			if m := readyRE.FindStringSubmatch(line); m != nil {
				select {
				case ready <- m[1]:
				default:
				}
			}
			if m := adminRE.FindStringSubmatch(line); m != nil {
				select {
				case admin <- m[1]:
				default:
				}
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	timeout := time.After(20 * time.Second)
	for p.addr == "" || p.admin == "" {
		select {
		case p.addr = <-ready:
		case p.admin = <-admin:
		case <-p.exited:
			return nil, fmt.Errorf("lockd %v exited before it was ready (%v):\n%s", args, p.cmd.ProcessState, p.output())
		case <-timeout:
			_ = p.Close()
			return nil, fmt.Errorf("lockd %v not ready in 20 s:\n%s", args, p.output())
		}
	}
	return p, nil
}

// LockdForExamples starts a lockd for the package's examples (package
// client_test sees this name of the package's tests) and returns its
// address and what stops it. Where there is no lockd to run (lockdBinary)
// it panics with the reason: an example cannot be skipped.
func LockdForExamples() (addr string, stop func()) {
	bin, _, err := buildLockd()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "lockd-example-")
	if err != nil {
		panic(err)
	}
	p, err := runLockd(bin, dir, "--loops", "1")
	if err != nil {
		os.RemoveAll(dir)
		panic(err)
	}
	return p.Addr(), func() { _ = p.Close(); _ = os.RemoveAll(dir) }
}

// Addr is the address lockd serves clients on.
func (p *lockdProc) Addr() string { return p.addr }

// Done is closed once the process has exited.
func (p *lockdProc) Done() <-chan struct{} { return p.exited }

// Close stops lockd with SIGTERM (a graceful shutdown), or SIGKILL when it
// has not exited 10 s later, and waits for it. It reports a shutdown that
// did not end with exit status 0.
func (p *lockdProc) Close() error {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("lockd %s did not stop within 10 s of SIGTERM; killed:\n%s", p.addr, p.output())
		}
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("lockd %s ended with %v:\n%s", p.addr, p.cmd.ProcessState, p.output())
	}
	return nil
}

func (p *lockdProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs, "\n")
}

// keyState is what lockd holds for a key.
type keyState struct {
	Held    bool
	Token   uint64
	Waiters int
}

// adminHTTP asks lockds' admin endpoints; TestMain closes its idle
// connections.
var adminHTTP = &http.Client{Timeout: 5 * time.Second}

// lookup returns lockd's state of key, read from its admin endpoint (GET
// /keys/{key}: the document api.Key describes). A failure is reported on t
// (from any goroutine) and returns the zero keyState.
func (p *lockdProc) lookup(t testing.TB, key string) keyState {
	// The key escaped as the admin endpoint's router needs (api.KeyPath).
	u := "http://" + p.admin + "/keys/" + strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
	resp, err := adminHTTP.Get(u)
	if err != nil {
		t.Errorf("GET %s: %v", u, err)
		return keyState{}
	}
	defer resp.Body.Close()
	var doc struct {
		Held    bool   `json:"held"`
		Token   string `json:"token"`
		Waiters int    `json:"waiters"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", u, resp.Status)
		return keyState{}
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Errorf("GET %s: %v", u, err)
		return keyState{}
	}
	ks := keyState{Held: doc.Held, Waiters: doc.Waiters}
	if doc.Token != "" {
		if ks.Token, err = strconv.ParseUint(doc.Token, 10, 64); err != nil {
			t.Errorf("GET %s: token %q: %v", u, doc.Token, err)
		}
	}
	return ks
}

// waitFor polls cond every 2 ms until it holds, failing t after 5 s with
// what (the condition awaited): the client module's copy of the root
// module's internal/wait.For (see the comment at the top of this file).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// leakedGoroutines waits up to 5 s for every goroutine that runs or was
// started by this package's code (the client's, and the tests' fakes and
// proxies) to end, and returns the stacks of those that did not (TestMain
// fails on them).
func leakedGoroutines() string {
	const pkg = "github.com/lockd-dev/lockd/client."
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		// The first stack is this goroutine's (TestMain's).
		stacks := strings.Split(string(buf), "\n\n")[1:]
		var leaked []string
		for _, s := range stacks {
			if strings.Contains(s, pkg) {
				leaked = append(leaked, s)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
