package raftnode

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"
	"github.com/lockd-dev/lockd/internal/wait"
)

var errPowerLost = errors.New("the machine lost power")

// lossFS is raft-wal's real file system that can lose power: it remembers
// the ranges of each file written since that file's last fsync, and
// powerLoss zeroes them — what a machine that lost power reads back of
// writes still in its page cache (raft-wal writes in place into
// preallocated segments that read as zeros past what it wrote). From the
// loss on, nothing reaches the disk: writes are dropped and every fsync
// fails. A kill -9 cannot test this: the kernel keeps the page cache.
type lossFS struct {
	types.VFS
	mu    sync.Mutex
	dirty map[string][][2]int64 // path → unsynced [off, end) ranges
	dead  bool
}

func newLossFS() *lossFS { return &lossFS{VFS: fs.New(), dirty: map[string][][2]int64{}} }

type lossFile struct {
	types.WritableFile
	fs   *lossFS
	path string
}

func (l *lossFS) wrap(dir, name string, f types.WritableFile, err error) (types.WritableFile, error) {
	if err != nil {
		return nil, err
	}
	return &lossFile{WritableFile: f, fs: l, path: filepath.Join(dir, name)}, nil
}

func (l *lossFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := l.VFS.Create(dir, name, size)
	return l.wrap(dir, name, f, err)
}

func (l *lossFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := l.VFS.OpenWriter(dir, name)
	return l.wrap(dir, name, f, err)
}

func (f *lossFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.dead {
		return len(p), nil
	}
	n, err := f.WritableFile.WriteAt(p, off)
	if n > 0 {
		f.fs.dirty[f.path] = append(f.fs.dirty[f.path], [2]int64{off, off + int64(n)})
	}
	return n, err
}

func (f *lossFile) Sync() error {
	f.fs.mu.Lock()
	if f.fs.dead {
		f.fs.mu.Unlock()
		return errPowerLost
	}
	covered := len(f.fs.dirty[f.path]) // writes after this point may miss the fsync
	f.fs.mu.Unlock()
	if err := f.WritableFile.Sync(); err != nil {
		return err
	}
	f.fs.mu.Lock()
	f.fs.dirty[f.path] = f.fs.dirty[f.path][covered:]
	f.fs.mu.Unlock()
	return nil
}

// powerLoss stops everything from reaching the disk.
func (l *lossFS) powerLoss() {
	l.mu.Lock()
	l.dead = true
	l.mu.Unlock()
}

// forget zeroes what was written and never synced before the power loss,
// once the member is gone; it returns the bytes it zeroed.
func (l *lossFS) forget(t *testing.T) int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost int64
	for path, ranges := range l.dirty {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ranges {
			if _, err := f.WriteAt(make([]byte, r[1]-r[0]), r[0]); err != nil {
				t.Fatal(err)
			}
			lost += r[1] - r[0]
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	l.dirty = map[string][][2]int64{}
	return lost
}

// TestRaftLeaderPowerLoss: the leader loses power while an entry is
// durable on one follower only and not yet on the leader itself — the
// window the leader's parallel log write opens (durable.go). Raft counted
// the entry committed (the leader's own copy and the follower's). The
// power loss takes the leader's copy; the follower that holds the only
// other copy is cut off while the leader restarts and, with the third
// member, elects a leader that never had the entry and writes past it.
// When the follower is back, its copy is overwritten. Whatever the engine
// answered must survive that, and no table may keep what was lost: an
// entry applied before the leader's fsync (no apply gate) is an answered
// grant lost; a follower that applied it (no clamped commit index) keeps a
// lock nobody holds.
func TestRaftLeaderPowerLoss(t *testing.T) {
	var mu sync.Mutex
	fss := map[int]*lossFS{}
	c := &raftCluster{t: t, T: 400 * time.Millisecond, vfs: func(i int) types.VFS {
		mu.Lock()
		defer mu.Unlock()
		fss[i] = newLossFS()
		return fss[i]
	}}
	c.startAll(3)
	l := c.leader()
	lm := c.ms[l]
	a, b := (l+1)%3, (l+2)%3
	const before, window, after = "power/before", "power/window", "power/after"
	tok := lm.grant(t, before, 30)
	c.settle(l)

	// b is down: the entry can only reach a. The leader's fsync waits.
	c.kill(b)
	held := make(chan struct{})
	hold := func() { <-held }
	lm.n.dur.hold.Store(&hold)
	wtok := lm.grant(t, window, 30)
	seq := lm.n.Barrier()
	wait.For(t, "the entry in a's log while the leader's fsync waits",
		func() bool { return entryHasRecord(c.ms[a], l, seq) })
	time.Sleep(200 * time.Millisecond) // a few commit timeouts for the commit index to travel

	// The leader loses power; its syncer then finds a dead disk.
	mu.Lock()
	lfs := fss[l]
	mu.Unlock()
	lfs.powerLoss()
	lm.n.dur.hold.Store(nil)
	close(held)
	time.Sleep(50 * time.Millisecond)
	answered := lm.host.lastCommit() >= seq
	c.kill(l)
	if lost := lfs.forget(t); lost == 0 {
		t.Fatal("the power loss took nothing: the test did not open the window it is about")
	}

	// a, the only other copy, is cut off; the old leader and b elect and
	// write past the lost entry.
	c.ms[a].n.stream.setCut(true)
	c.start(l)
	c.start(b)
	nl := c.leader()
	nm := c.ms[nl]
	nm.grant(t, after, 30)
	other := 3 - a - nl
	wait.For(t, "the new leader's grant to commit", func() bool { return nm.host.lastCommit() == nm.n.Barrier() })
	wait.For(t, "the new leader's locks on the other member without a", func() bool {
		return maps2Equal(dumpTable(c.ms[other].table), dumpTable(nm.table))
	})

	c.ms[a].n.stream.setCut(false)
	wait.For(t, "a to catch up with the new leader", func() bool { return entryHasRecord(c.ms[a], nl, nm.n.Barrier()) })
	time.Sleep(200 * time.Millisecond) // a's apply of what it caught up on
	for i, m := range c.ms {
		got := dumpTable(m.table)
		if s, ok := got[before]; !ok || s.token != tok {
			t.Errorf("member %d: %s = %+v, %v; want token %d", i, before, s, ok, tok)
		}
		s, ok := got[window]
		switch {
		case answered && (!ok || s.token != wtok):
			t.Errorf("member %d: %s, answered with token %d before the leader's fsync, is lost (%+v, %v)", i, window, wtok, s, ok)
		case !answered && ok:
			t.Errorf("member %d holds %s, whose entry a majority never made durable", i, window)
		}
		if _, ok := got[after]; !ok {
			t.Errorf("member %d lacks %s", i, after)
		}
	}
}
