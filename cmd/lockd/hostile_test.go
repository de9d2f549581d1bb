package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/freeport"
	"github.com/lockd-dev/lockd/proto"
)

// needSetup skips a test whose environment cannot be made here, or fails
// it under CI=true, where the environment must allow it.
func needSetup(t *testing.T, why string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v (CI=true: this test must run)", why, err)
	}
	t.Skipf("%s: %v", why, err)
}

// TestFDLimitKeepsServing runs a real binary
// under a small open-file limit: a flood of idle client connections and
// of admin connections beyond the limit must not make lockd exit or stop
// serving the connections it has, and a SIGTERM afterwards still writes
// the held locks. Before the fix, gnet's accept hit EMFILE and tore the
// engine down: exit 1, no snapshot.
func TestFDLimitKeepsServing(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		needSetup(t, "prlimit (util-linux) not found", err)
	}
	const limit = 400 // soft = hard: lockd cannot raise it
	dir := t.TempDir()
	d := startCommand(t, []string{prlimit, fmt.Sprintf("--nofile=%d:%d", limit, limit), "--"},
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", dir, "--loops", "2", "--drain", "300ms")
	if !strings.Contains(d.logs.String(), "--max-conns lowered") {
		t.Fatalf("no log line saying --max-conns was lowered:\n%s", d.logs)
	}
	holder := dial(t, d.addr)
	tokens := map[string]uint64{}
	for i := range 50 {
		key := fmt.Sprintf("held%d", i)
		tokens[key] = holder.grant(key, 120, uint64(i+1))
	}

	// Ten times the limit in idle client connections from 8 goroutines at
	// once (a burst: with gnet's acceptor, refused connections piled up as
	// open descriptors faster than the loops closed them), and twice the
	// limit in admin connections.
	var (
		mu   sync.Mutex
		open []net.Conn
		wg   sync.WaitGroup
	)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	adminAddr := strings.TrimPrefix(d.adminURL(), "http://")
	began := time.Now()
	for g := range 8 {
		wg.Go(func() {
			for i := range 10 * limit / 8 {
				addr := d.addr
				if i%5 == 0 && g%2 == 0 {
					addr = adminAddr
				}
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					continue // the admin backlog may fill: that is fine
				}
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	refusedAt := time.Since(began)
	// lockd is still serving the connection it had.
	holder.send(proto.AppendPing(nil, 77))
	holder.expect(proto.OpPing, 77)
	if nt := holder.grant("after-flood", 10, 99); nt == 0 {
		t.Fatal("no token after the flood")
	}
	select {
	case <-d.Exited():
		t.Fatalf("lockd exited during the connection flood:\n%s", d.logs)
	default:
	}
	if strings.Contains(d.logs.String(), "Accept() failed") {
		t.Fatalf("accept failed during the flood:\n%s", d.logs)
	}
	t.Logf("%d connections opened in %v", len(open), refusedAt)
	for _, c := range open {
		c.Close()
	}
	open = nil
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.logs)
	}
	d2 := startDaemon(t, dir)
	c := dial(t, d2.addr)
	for key, tok := range tokens {
		c.send(proto.AppendRelease(nil, tok, key))
		c.expect(proto.OpRelease, tok)
	}
}

// tmpfs mounts a tmpfs of size bytes at a new directory and unmounts it
// when the test ends.
func tmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		needSetup(t, "cannot mount a tmpfs (needs root)", fmt.Errorf("%v: %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// filler is a file that keeps a tmpfs full.
type filler struct {
	t    *testing.T
	path string
	f    *os.File
}

// fill writes a file until the file system is full. The file stays open
// so that top can take back any page freed later: the daemon's own
// atomic writes free the old file's page after the rename, and a fill
// that lands between a write and its rename leaves one page free for
// good, which every later write-then-rename reuses.
func fill(t *testing.T, dir string) *filler {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // a second Close after free is harmless
	fl := &filler{t: t, path: p, f: f}
	fl.top()
	return fl
}

// top writes to the filler until the file system refuses.
func (fl *filler) top() {
	chunk := make([]byte, 4096)
	for {
		if _, err := fl.f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				fl.t.Errorf("filling %s: %v", fl.path, err)
			}
			break
		}
	}
	// Fill the last partial page too.
	for {
		if _, err := fl.f.Write(chunk[:1]); err != nil {
			break
		}
	}
}

// free closes and removes the filler: an open file's pages stay taken.
func (fl *filler) free() {
	fl.t.Helper()
	if err := fl.f.Close(); err != nil {
		fl.t.Fatal(err)
	}
	if err := os.Remove(fl.path); err != nil {
		fl.t.Fatal(err)
	}
}

// keepFull tops the filler up every millisecond until the returned
// function is called, or the test ends (before the filler is closed).
func (fl *filler) keepFull() (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-exited }) }
	fl.t.Cleanup(stop)
	go func() {
		defer close(exited)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fl.top()
			}
		}
	}()
	return stop
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var lostRE = regexp.MustCompile(`snapshot not written.* locks_lost=(\d+)`)

// TestFullDiskAnswersBusy runs a real binary
// with its data dir on a tiny tmpfs that fills up: once the reserved
// tokens are used, acquires of new keys get B at once (nothing granted,
// nothing queued) while releases, renews and pings keep working, /healthz
// turns 503 and the metric says why; freeing space lets grants resume; a
// SIGTERM on a full disk completes within its bound and logs how many held
// locks the unwritable snapshot lost. Before the fix the event loop waited
// for the disk under a shard lock: pings timed out and SIGTERM failed.
func TestFullDiskAnswersBusy(t *testing.T) {
	dir := tmpfs(t, 256<<10)
	d := startCommand(t, nil, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", dir,
		"--loops", "2", "--drain", "300ms", "--token-block", "32")
	c := dial(t, d.addr)
	held := map[string]uint64{}
	for i := range 20 {
		key := fmt.Sprintf("h%d", i)
		held[key] = c.grant(key, 120, uint64(i+1))
	}
	full := fill(t, dir)

	// Grant new keys until the reserved range is used up: B, at once.
	var owner uint64 = 1000
	busy := false
	for i := 0; i < 200 && !busy; i++ {
		owner++
		full.top()
		began := time.Now()
		c.send(proto.AppendAcquire(nil, 5, 30, owner, fmt.Sprintf("n%d", i)))
		r := c.read()
		if d := time.Since(began); d > 2*time.Second {
			t.Fatalf("acquire took %v on a full disk", d)
		}
		switch r.Op {
		case proto.OpBusy:
			busy = true
		case proto.OpAcquire:
			c.send(proto.AppendRelease(nil, r.Token, fmt.Sprintf("n%d", i)))
			c.expect(proto.OpRelease, r.Token)
		default:
			t.Fatalf("acquire on a full disk: %c", r.Op)
		}
	}
	if !busy {
		t.Fatal("no B after 200 grants on a full disk with 32-token blocks")
	}
	// Nothing was queued for the busy acquire, and held locks still work.
	c.send(proto.AppendPing(nil, 5))
	c.expect(proto.OpPing, 5)
	c.send(proto.AppendRenew(nil, 60, held["h0"], "h0"))
	c.expect(proto.OpRenew, held["h0"])
	c.send(proto.AppendRelease(nil, held["h1"], "h1"))
	c.expect(proto.OpRelease, held["h1"])
	delete(held, "h1")
	code, body := httpGet(t, d.adminURL()+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "token reservation") {
		t.Fatalf("/healthz on a full disk: %d %q", code, body)
	}
	_, metrics := httpGet(t, d.adminURL()+"/metrics")
	for _, want := range []string{"lockd_token_reserve_failing 1", "lockd_busy_no_token_total "} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(d.logs.String(), "reserving tokens failed") {
		t.Fatalf("no log line about the failing reservation:\n%s", d.logs)
	}

	// Free the space: the reserver's back-off retries, grants resume.
	full.free()
	deadline := time.Now().Add(10 * time.Second)
	for {
		owner++
		c.send(proto.AppendAcquire(nil, 0, 30, owner, "resumed"))
		if r := c.read(); r.Op == proto.OpAcquire {
			held["resumed"] = r.Token
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("grants did not resume after the disk had room again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := httpGet(t, d.adminURL()+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz after recovery: %d", code)
	}

	// Full again, then SIGTERM: the shutdown completes in its bound and
	// says how many held locks the snapshot could not keep.
	stopFilling := fill(t, dir).keepFull()
	began := time.Now()
	exit := d.stop(syscall.SIGTERM)
	took := time.Since(began)
	stopFilling()
	if took > 10*time.Second {
		t.Fatalf("shutdown on a full disk took %v", took)
	}
	m := lostRE.FindStringSubmatch(d.logs.String())
	if m == nil {
		t.Fatalf("no log line counting the lost locks (exit %d):\n%s", exit, d.logs)
	}
	if n, _ := strconv.Atoi(m[1]); n != len(held) {
		t.Fatalf("log says %s locks lost, %d were held", m[1], len(held))
	}
	if exit != 1 {
		t.Fatalf("exit %d after a shutdown that lost its snapshot, want 1", exit)
	}
	t.Logf("shutdown on a full disk: %v, exit %d", took, exit)
}

// freePortPair returns a port p such that p and p+1 were free a moment
// ago, below the kernel's ephemeral range (which other tests' outgoing
// connections keep using).
func freePortPair(t *testing.T) int {
	t.Helper()
	ps, err := freeport.Pick(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// TestTwoInstancesNeedOnlyListen: two lockd processes on one host start
// with nothing but their own --listen and --data-dir (the admin endpoint
// follows --listen: its host, port + 1), and each serves its admin there.
func TestTwoInstancesNeedOnlyListen(t *testing.T) {
	for range 2 {
		p := freePortPair(t)
		listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		d := startCommand(t, nil, "--listen", listen, "--data-dir", t.TempDir())
		if want := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)); d.adminURL() != want {
			t.Fatalf("admin at %s, want %s", d.adminURL(), want)
		}
		if code, _ := httpGet(t, d.adminURL()+"/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz of the instance on %s: %d", listen, code)
		}
	}
}

// TestFailedStartLeavesNoDataDir: a start that fails on a taken port does
// not leave the data directory it created behind.
func TestFailedStartLeavesNoDataDir(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "fresh")
	cmd := exec.Command(binary, "--listen", ln.Addr().String(), "--admin", "", "--data-dir", dir)
	if err := cmd.Run(); err == nil {
		t.Fatal("lockd started on a taken port")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed start left %s behind (%v)", dir, err)
	}
}
