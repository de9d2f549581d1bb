package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/freeport"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/tlsconf"
)

// serveEnv names the environment variable that turns the harness binary
// (or the test binary) into a server child: "lockd", "lockd-acl",
// "lockd-tls", "lockd-http", "lockd-gw" or "echo".
const serveEnv = "LOCKD_BENCH_SERVE"

// memStat is a server's memory as the harness sees it.
type memStat struct {
	Heap int64 `json:"heap"` // live bytes: Go heap + stacks after a GC (lockd, echo); used_memory (Redis)
	RSS  int64 `json:"rss"`  // resident set size of the server process
}

// raiseNoFile lifts the soft open-files limit to the hard one (fanin needs
// 10,000 sockets on each side).
func raiseNoFile() {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}

// serveChild runs a server in this process for the parent harness: it prints
// "addr HOST:PORT", then answers commands read from stdin, one a line:
// "mem" (a memStat as JSON), "cpu FILE" / "cpustop" (CPU profile),
// "allocs FILE" (allocation profile). EOF on stdin stops it.
func serveChild(kind string, loops int, in io.Reader, out io.Writer) error {
	raiseNoFile()
	var (
		addr string
		stop func()
	)
	switch kind {
	case "lockd", "lockd-tls", "lockd-acl", "lockd-http", "lockd-gw":
		dir, err := os.MkdirTemp("", "lockd-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg := engine.DefaultConfig()
		cfg.Listen = "127.0.0.1:0"
		cfg.DataDir = dir
		if loops > 0 {
			cfg.Loops = loops
		}
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		switch kind {
		case "lockd-tls":
			// The daemon's path: tlsconf reading the files, reloadable.
			st, err := tlsconf.Load(tlsFiles(os.Getenv(tlsDirEnv)))
			if err != nil {
				return err
			}
			cfg.TLS = st.ServerConfig()
		case "lockd-acl":
			if cfg.ACL, err = benchACL(); err != nil {
				return err
			}
		}
		srv, err := engine.New(cfg)
		if err != nil {
			return err
		}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve() }()
		select {
		case <-srv.Ready():
		case err := <-errc:
			return err
		}
		addr = srv.Addr()
		stop = func() { srv.Close() }
		switch kind {
		case "lockd-http":
			// The HTTP API in front of this engine (httpapi, as --http
			// serves it): the target's address is the front's.
			if addr, stop, err = serveHTTPFront(srv); err != nil {
				srv.Close()
				return err
			}
		case "lockd-gw":
			// The alternative httpapi did not take: the same routes over
			// the bundled client, through the client port (gateway.go).
			if addr, stop, err = serveGateway(srv); err != nil {
				srv.Close()
				return err
			}
		}
	case "echo":
		var (
			e   *echoServer
			err error
		)
		for range 3 { // the free port may be taken before gnet binds it
			if e, err = startEcho(loops); err == nil {
				break
			}
		}
		if err != nil {
			return err
		}
		addr = e.addr
		stop = e.stop
	default:
		return fmt.Errorf("unknown server %q", kind)
	}
	defer stop()
	fmt.Fprintf(out, "addr %s\n", addr)
	sc := bufio.NewScanner(in)
	var cpu *os.File
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		reply := "ok"
		switch cmd {
		case "mem":
			b, _ := json.Marshal(selfMem())
			reply = string(b)
		case "cpu":
			f, err := os.Create(arg)
			if err == nil {
				err = pprof.StartCPUProfile(f)
			}
			if err != nil {
				reply = "error " + err.Error()
			} else {
				cpu = f
				// The contention of the same span: every contended
				// mutex (its unlocker's stack) and blocking event.
				runtime.SetMutexProfileFraction(mutexFraction)
				runtime.SetBlockProfileRate(blockRate)
			}
		case "cpustop":
			if cpu != nil {
				pprof.StopCPUProfile()
				cpu.Close()
				cpu = nil
				runtime.SetMutexProfileFraction(0)
				runtime.SetBlockProfileRate(0)
			}
		case "allocs":
			// arg is PREFIX.allocs.pprof: the mutex and block profiles go
			// beside it.
			var errs []error
			base := strings.TrimSuffix(arg, ".allocs.pprof")
			for _, p := range []struct{ name, file string }{{"allocs", arg}, {"mutex", base + ".mutex.pprof"}, {"block", base + ".block.pprof"}} {
				f, err := os.Create(p.file)
				if err == nil {
					err = pprof.Lookup(p.name).WriteTo(f, 0)
					f.Close()
				}
				errs = append(errs, err)
			}
			if err := errors.Join(errs...); err != nil {
				reply = "error " + err.Error()
			}
		default:
			reply = "error unknown command"
		}
		fmt.Fprintln(out, reply)
	}
	if cpu != nil {
		pprof.StopCPUProfile()
		cpu.Close()
	}
	return nil
}

// The rates of the contention profiles that the child records beside its
// CPU profile (-cpuprofile): every contended mutex, and one blocking event
// per 10 µs spent blocked (a sampling as coarse as the CPU profile's is
// enough to rank where goroutines wait).
const (
	mutexFraction = 1
	blockRate     = 10_000
)

// selfMem measures this process after two GCs.
func selfMem() memStat {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memStat{Heap: int64(ms.HeapAlloc + ms.StackInuse), RSS: rssOf(os.Getpid())}
}

// rssOf returns a process's VmRSS in bytes, 0 if unknown.
func rssOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

// clockTicks is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux this runs on).
const clockTicks = 100

// cpuTimes returns each process's CPU time so far (user + system, seconds;
// -1 for a process it cannot read).
func cpuTimes(pids []int) []float64 {
	out := make([]float64, len(pids))
	for i, pid := range pids {
		out[i] = -1
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		if v, ok := parseCPU(string(b)); ok {
			out[i] = v
		}
	}
	return out
}

// runqWaits returns the time each process's threads have spent runnable,
// waiting for a CPU, so far (seconds; -1 for a process it cannot read):
// the second field of /proc/PID/task/TID/schedstat, summed over the
// threads. A thread that exits takes its share with it, so a later sum can
// be smaller; the caller reports such a difference as unknown.
func runqWaits(pids []int) []float64 {
	out := make([]float64, len(pids))
	for i, pid := range pids {
		out[i] = -1
		dir := "/proc/" + strconv.Itoa(pid) + "/task"
		tasks, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		var sum uint64
		n := 0
		for _, t := range tasks {
			b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
			if err != nil {
				continue // the thread exited meanwhile
			}
			if w, ok := parseSchedstat(string(b)); ok {
				sum += w
				n++
			}
		}
		if n > 0 {
			out[i] = float64(sum) / 1e9
		}
	}
	return out
}

// parseSchedstat reads the run-queue wait (nanoseconds) from a schedstat
// line: time on a CPU, time runnable and waiting for one, and the number of
// times the thread ran.
func parseSchedstat(line string) (uint64, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return 0, false
	}
	w, err := strconv.ParseUint(f[1], 10, 64)
	return w, err == nil
}

// deltas returns after[i] - before[i] for each process, -1 where either
// reading failed or the value went down (a restarted process, an exited
// thread).
func deltas(before, after []float64) []float64 {
	out := make([]float64, len(after))
	for i, a := range after {
		out[i] = -1
		if i < len(before) && before[i] >= 0 && a >= before[i] {
			out[i] = a - before[i]
		}
	}
	return out
}

// parseCPU reads utime + stime from a /proc/PID/stat line: the fields
// after the command, which is in parentheses and may hold anything.
func parseCPU(stat string) (float64, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is the state (field 3); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return float64(u+s) / clockTicks, true
}

// child is a server child process started by the harness.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string
	mu   sync.Mutex
}

// startChild re-executes this binary as a server child of the given kind,
// with env added to its environment.
func startChild(kind string, loops int, env ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), serveEnv+"="+kind, "LOCKD_BENCH_LOOPS="+strconv.Itoa(loops)), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	line, err := c.readLine(10 * time.Second)
	if err != nil || !strings.HasPrefix(line, "addr ") {
		c.stop()
		return nil, fmt.Errorf("%s server child did not start: %q %v", kind, line, err)
	}
	c.addr = strings.TrimPrefix(line, "addr ")
	return c, nil
}

func (c *child) readLine(timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := c.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(timeout):
		return "", errors.New("no answer from the server child")
	}
}

// do sends one command and returns its answer.
func (c *child) do(cmd string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.in, cmd+"\n"); err != nil {
		return "", err
	}
	s, err := c.readLine(30 * time.Second)
	if err == nil && strings.HasPrefix(s, "error ") {
		err = errors.New(strings.TrimPrefix(s, "error "))
	}
	return s, err
}

func (c *child) mem() (memStat, error) {
	s, err := c.do("mem")
	if err != nil {
		return memStat{}, err
	}
	var m memStat
	err = json.Unmarshal([]byte(s), &m)
	return m, err
}

// stop closes the child's stdin and waits for it (killing it after 10 s).
func (c *child) stop() {
	c.in.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// echoServer answers every lockd request frame at once with a frame of the
// size lockd would send (A with a fake token for an acquire, R for a
// release, K for a renew, P for a ping): the ceiling of any gnet server
// speaking this protocol on this machine.
type echoServer struct {
	gnet.BuiltinEventEngine
	addr  string
	eng   gnet.Engine
	ready chan struct{}
	done  chan error
}

type echoConn struct {
	token uint64
	out   []byte
	req   proto.Request
}

func startEcho(loops int) (*echoServer, error) {
	e := &echoServer{ready: make(chan struct{}), done: make(chan error, 1)}
	// Find a free port first: gnet does not report the one it bound.
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	e.addr = addr
	go func() {
		e.done <- gnet.Run(e, "tcp://"+addr, gnet.WithMulticore(true), gnet.WithNumEventLoop(loops),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay), gnet.WithReuseAddr(true), gnet.WithLogger(nopLogger{}))
	}()
	select {
	case <-e.ready:
		return e, nil
	case err := <-e.done:
		return nil, fmt.Errorf("echo server: %w", err)
	case <-time.After(10 * time.Second):
		return nil, errors.New("echo server did not start")
	}
}

func (e *echoServer) OnBoot(eng gnet.Engine) gnet.Action {
	e.eng = eng
	close(e.ready)
	return gnet.None
}

func (e *echoServer) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	c.SetContext(&echoConn{token: 1})
	return nil, gnet.None
}

func (e *echoServer) OnTraffic(c gnet.Conn) gnet.Action {
	ec := c.Context().(*echoConn)
	buf, _ := c.Peek(-1)
	n := 0
	ec.out = ec.out[:0]
	for n < len(buf) {
		m, err := proto.ParseRequest(buf[n:], proto.MaxKey, &ec.req)
		if err == proto.ErrIncomplete {
			break
		}
		if err != nil {
			return gnet.Close
		}
		n += m
		r := &ec.req
		switch r.Op {
		case proto.OpAcquire:
			ec.token++
			ec.out = proto.AppendAcquired(ec.out, r.ID, ec.token, r.Key)
		case proto.OpRelease:
			ec.out = proto.AppendReleased(ec.out, r.ID, r.Key)
		case proto.OpRenew:
			ec.out = proto.AppendRenewed(ec.out, r.ID, r.Key)
		case proto.OpPing:
			ec.out = proto.AppendPong(ec.out, r.ID)
		}
	}
	c.Discard(n)
	if len(ec.out) > 0 {
		c.Write(ec.out)
	}
	return gnet.None
}

func (e *echoServer) stop() {
	e.eng.Stop(context.Background())
	<-e.done
}

// nopLogger silences gnet.
type nopLogger struct{}

func (nopLogger) Debugf(string, ...any) {}
func (nopLogger) Infof(string, ...any)  {}
func (nopLogger) Warnf(string, ...any)  {}
func (nopLogger) Errorf(string, ...any) {}
func (nopLogger) Fatalf(string, ...any) {}

// freeAddr returns a loopback address with a port that was free a moment
// ago, outside the ephemeral range (where the bench's own outgoing
// connections take ports) and never handed out before in this process.
func freeAddr() (string, error) {
	ps, err := freeport.Process().Ports(1)
	if err != nil {
		return "", err
	}
	return freeport.HostPort(ps[0]), nil
}
