package client

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
)

// The benchmarks load a lockd in its own process, as in production: this
// test binary re-executes itself as that server (benchServerEnv set). An
// in-process server's gnet event loops keep their Ps while they wait in
// epoll_wait, which throttles any client in the same process
// (BENCHMARKS.md). LOCKD_BENCH_ADDR names a running lockd instead;
// LOCKD_BENCH_INPROCESS=1 uses the shared in-process one.
const benchServerEnv = "LOCKD_CLIENT_BENCH_SERVER"

// benchServerChild is the server process: it serves on loopback, prints
// "addr A" and stops when its stdin closes. It returns the exit code.
func benchServerChild() int {
	dir, err := os.MkdirTemp("", "lockd-client-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cfg := engine.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := engine.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() { _ = srv.Serve() }()
	select {
	case <-srv.Ready():
	case <-srv.Done():
		fmt.Fprintln(os.Stderr, "bench server did not start")
		return 1
	}
	fmt.Printf("addr %s\n", srv.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	<-srv.Done()
	return 0
}

var (
	benchChildMu   sync.Mutex
	benchChild     *exec.Cmd
	benchChildIn   io.Closer
	benchChildAddr string
)

// benchAddr is the server the benchmarks load (see benchServerEnv).
func benchAddr(b *testing.B) string {
	if a := os.Getenv("LOCKD_BENCH_ADDR"); a != "" {
		return a
	}
	if os.Getenv("LOCKD_BENCH_INPROCESS") == "1" {
		return sharedServer(b).Addr()
	}
	benchChildMu.Lock()
	defer benchChildMu.Unlock()
	if benchChild != nil {
		return benchChildAddr
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), benchServerEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case s := <-line:
		if !strings.HasPrefix(s, "addr ") {
			_ = in.Close()
			_ = cmd.Wait()
			b.Fatalf("bench server child: %q", s)
		}
		benchChild, benchChildIn, benchChildAddr = cmd, in, strings.TrimPrefix(s, "addr ")
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatal("bench server child did not start in 20 s")
	}
	return benchChildAddr
}

// stopBenchChild ends the server child, if one was started.
func stopBenchChild() {
	benchChildMu.Lock()
	defer benchChildMu.Unlock()
	if benchChild == nil {
		return
	}
	_ = benchChildIn.Close()
	done := make(chan struct{})
	go func() { _ = benchChild.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = benchChild.Process.Kill()
		<-done
	}
	benchChild = nil
}
