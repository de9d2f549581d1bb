package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// holdLocks takes n locks with a 60 s lease on one connection, which it
// keeps open (so that the shutdown's drain runs its whole window), and
// returns their tokens by key.
func holdLocks(t *testing.T, d *daemon, n int) map[string]uint64 {
	t.Helper()
	c := dial(t, d.addr)
	held := map[string]uint64{}
	for i := range n {
		key := fmt.Sprintf("held/%d", i)
		held[key] = c.grant(key, 60, uint64(i+1))
	}
	return held
}

// TestSecondSignalStillWritesTheSnapshot: a second SIGINT/SIGTERM during
// the drain ends the drain at once, and lockd still writes the held
// locks: a double Ctrl-C loses nothing. The restart on the same data dir
// has every lock with its token. (Before, the second signal exited 1
// without the snapshot and the restart had none of them.)
func TestSecondSignalStillWritesTheSnapshot(t *testing.T) {
	dir := t.TempDir()
	d := startCommand(t, nil, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", dir, "--loops", "2", "--drain", "4s")
	held := holdLocks(t, d, 5)
	began := time.Now()
	_ = d.Signal(syscall.SIGINT)
	waitLog(t, d, "signal received")
	_ = d.Signal(syscall.SIGINT)
	if code := d.wait(); code != 0 {
		t.Fatalf("exit %d after two signals, want 0; logs:\n%s", code, d.logs)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("two signals took %s to exit: the second did not cut the 4 s drain short", took)
	}
	waitLog(t, d, "second signal", "still written")
	waitLog(t, d, "snapshot written", "locks=5")

	d2 := startDaemon(t, dir)
	c := dial(t, d2.addr)
	for key, tok := range held {
		c.send(proto.AppendRelease(nil, tok, key))
		c.expect(proto.OpRelease, tok) // reloaded with its token
	}
	if code := d2.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

var lostOnExitRE = regexp.MustCompile(`third signal.* held_locks_lost=(\d+)`)

// TestThirdSignalExitsAtOnce: a third signal exits at once (exit 1)
// without the snapshot, and its log line says how many held locks that
// loses; the restart has none of them (and tokens still go up).
func TestThirdSignalExitsAtOnce(t *testing.T) {
	dir := t.TempDir()
	d := startCommand(t, nil, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", dir, "--loops", "2", "--drain", "4s")
	held := holdLocks(t, d, 3)
	_ = d.Signal(syscall.SIGTERM)
	waitLog(t, d, "signal received")
	// Two different signals, so the kernel cannot merge them into one
	// pending signal.
	_ = d.Signal(syscall.SIGINT)
	_ = d.Signal(syscall.SIGTERM)
	if code := d.wait(); code != 1 {
		t.Fatalf("exit %d after three signals, want 1; logs:\n%s", code, d.logs)
	}
	m := lostOnExitRE.FindStringSubmatch(d.logs.String())
	if m == nil {
		t.Fatalf("no third-signal line with held_locks_lost:\n%s", d.logs)
	}
	if n, _ := strconv.Atoi(m[1]); n != len(held) {
		t.Fatalf("held_locks_lost=%d, want %d:\n%s", n, len(held), d.logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "locks.snap")); err == nil {
		t.Fatalf("a snapshot was written although the third signal came first:\n%s", d.logs)
	}
	var top uint64
	for _, tok := range held {
		top = max(top, tok)
	}
	d2 := startDaemon(t, dir)
	c := dial(t, d2.addr)
	for key := range held {
		if tok := c.grant(key, 10, 99); tok <= top { // free again: the locks were lost, not the tokens
			t.Fatalf("%s granted with token %d, not above %d", key, tok, top)
		}
	}
	if code := d2.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
