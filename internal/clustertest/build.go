package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Package is the import path Build compiles.
const Package = "github.com/lockd-dev/lockd/cmd/lockd"

// buildTimeout bounds `go build`.
const buildTimeout = 10 * time.Minute

var built struct {
	once sync.Once
	mu   sync.Mutex
	path string
	dir  string // the temporary directory Build made, "" if none
	err  error
}

// ErrBuild is returned when the lockd binary cannot be built or found.
var ErrBuild = errors.New("clustertest: no lockd binary")

// Build returns the path of the lockd binary, building it once per process:
// the path in $LOCKD_BIN if set (it must exist), else `go build -race` of
// Package into a temporary directory ($LOCKD_RACE=0, or -race failing for
// want of cgo, builds without the race detector). It runs `go` in the
// current directory, which must be inside the module (as in any test of
// it, or `go run ./chaos` from the root). Start calls it; a TestMain calls
// it through Main so the binary is built before the first test and removed
// after the last. A build also removes the directories of earlier builds
// whose process is gone without removing them (killed by -timeout).
func Build() (string, error) {
	built.once.Do(func() {
		built.mu.Lock()
		defer built.mu.Unlock()
		if p := os.Getenv("LOCKD_BIN"); p != "" {
			abs, err := filepath.Abs(p)
			if err == nil {
				var fi os.FileInfo
				if fi, err = os.Stat(abs); err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
					err = errors.New("not an executable file")
				}
			}
			if err != nil {
				built.err = fmt.Errorf("%w: LOCKD_BIN=%s: %v", ErrBuild, p, err)
				return
			}
			built.path = abs
			return
		}
		removeStale()
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", buildPrefix, os.Getpid()))
		if err != nil {
			built.err = fmt.Errorf("%w: %v", ErrBuild, err)
			return
		}
		out := filepath.Join(dir, "lockd")
		var msgs []byte
		for _, race := range []bool{os.Getenv("LOCKD_RACE") != "0", false} {
			args := []string{"build", "-o", out}
			if race {
				args = append(args, "-race")
			}
			ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
			b, err := exec.CommandContext(ctx, "go", append(args, Package)...).CombinedOutput()
			cancel()
			if err == nil {
				built.path, built.dir = out, dir
				return
			}
			msgs = append(msgs, fmt.Sprintf("go %v: %v\n%s", args, err, b)...)
			if !race {
				break
			}
		}
		os.RemoveAll(dir)
		built.err = fmt.Errorf("%w: %s", ErrBuild, msgs)
	})
	built.mu.Lock()
	defer built.mu.Unlock()
	return built.path, built.err
}

// buildPrefix starts the name of Build's directory, followed by the
// building process's id.
const buildPrefix = "lockd-clustertest-"

// removeStale deletes the build directories of processes that are gone
// without removing theirs (a test binary killed by its -timeout, say).
func removeStale() {
	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), buildPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// RemoveBuild deletes the binary Build compiled (not one named by
// $LOCKD_BIN). Clusters started afterwards cannot find it: call it once
// every cluster is closed, as Main does.
func RemoveBuild() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir = ""
		built.err = fmt.Errorf("%w: removed by RemoveBuild", ErrBuild)
		built.path = ""
	}
}

type mainM struct{ m *testing.M }

// Run builds the binary (a failure is printed and the run fails), runs the
// tests, and removes the binary.
func (x mainM) Run() int {
	if _, err := Build(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer RemoveBuild()
	return x.m.Run()
}

// Main wraps m so that its Run builds the lockd binary before the tests and
// removes it after them. In a TestMain:
//
//	os.Exit(clustertest.Main(m).Run())
//
// or, with goleak:
//
//	goleak.VerifyTestMain(clustertest.Main(m))
func Main(m *testing.M) interface{ Run() int } { return mainM{m} }
