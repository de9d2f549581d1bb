package raftnode

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
	"github.com/lockd-dev/lockd/internal/wait"
)

var errInjected = errors.New("injected fsync failure")

// testFS is raft-wal's real file system with its fsyncs counted, and
// blocked or failed on demand.
type testFS struct {
	types.VFS
	syncs atomic.Int64
	gate  atomic.Pointer[chan struct{}] // set: every fsync waits for it to close
	fail  atomic.Bool
}

type testFile struct {
	types.WritableFile
	fs *testFS
}

func (f *testFile) Sync() error {
	if g := f.fs.gate.Load(); g != nil {
		<-*g
	}
	if f.fs.fail.Load() {
		return errInjected
	}
	f.fs.syncs.Add(1)
	return f.WritableFile.Sync()
}

func (t *testFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := t.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &testFile{WritableFile: f, fs: t}, nil
}

func (t *testFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := t.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &testFile{WritableFile: f, fs: t}, nil
}

// block makes every fsync wait until the returned func is called.
func (t *testFS) block() (release func()) {
	g := make(chan struct{})
	t.gate.Store(&g)
	var once sync.Once
	return func() { once.Do(func() { t.gate.Store(nil); close(g) }) }
}

// testDurable is one raft-wal log through a durability, leading while
// leads is set.
type testDurable struct {
	d      *durability
	fs     *testFS
	w      *wal.WAL
	log    *parallelLog
	leads  atomic.Bool
	fails  atomic.Int64
	quit   chan struct{}
	wg     sync.WaitGroup
	closed bool
}

// openTestDurable opens the log; with syncer, the syncer goroutine runs
// (without it, deferred writes stay dirty until something flushes).
func openTestDurable(t *testing.T, syncer bool, segSize int, meta func(*durability) types.MetaStore) *testDurable {
	t.Helper()
	td := &testDurable{fs: &testFS{VFS: fs.New()}, quit: make(chan struct{})}
	td.d = newDurability(func(error) { td.fails.Add(1) })
	td.d.leadsHook = td.leads.Load
	var m types.MetaStore
	if meta != nil {
		m = meta(td.d)
	}
	w, err := openWAL(t.TempDir(), testLog(), td.d, td.fs, segSize, m)
	if err != nil {
		t.Fatal(err)
	}
	td.w = w
	td.log = &parallelLog{LogStore: w, d: td.d}
	if syncer {
		td.wg.Add(1)
		go td.d.syncer(td.quit, td.wg.Done)
	}
	t.Cleanup(func() { td.close(t) })
	return td
}

func (td *testDurable) close(t *testing.T) {
	if td.closed {
		return
	}
	td.closed = true
	close(td.quit)
	td.wg.Wait()
	if err := td.w.Close(); err != nil && !td.fs.fail.Load() {
		t.Errorf("close: %v", err)
	}
}

func commands(from, to uint64) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d", i)})
	}
	return logs
}

// marks fails t unless written and durable are w and d.
func (td *testDurable) marks(t *testing.T, when string, w, d uint64) {
	t.Helper()
	if gw, gd := td.d.written.Load(), td.d.durable.Load(); gw != w || gd != d {
		t.Fatalf("%s: written %d durable %d, want %d and %d", when, gw, gd, w, d)
	}
}

func (td *testDurable) dirty() int {
	td.d.mu.Lock()
	defer td.d.mu.Unlock()
	return len(td.d.dirty)
}

// TestParallelLogLeaderAppendsWithoutWaiting: a leader's append of commands
// returns while its fsync cannot run, the entries are readable at once,
// and await waits for the fsync.
func TestParallelLogLeaderAppendsWithoutWaiting(t *testing.T) {
	td := openTestDurable(t, true, 0, nil)
	td.leads.Store(true)
	release := td.fs.block()
	defer release()
	done := make(chan error, 1)
	go func() { done <- td.log.StoreLogs(commands(1, 3)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the leader's append waited for its fsync")
	}
	td.marks(t, "while the fsync is blocked", 3, 0)
	var l raft.Log
	if err := td.log.GetLog(2, &l); err != nil || string(l.Data) != "entry 2" {
		t.Fatalf("GetLog(2) before the fsync: %v %q", err, l.Data)
	}
	waited := make(chan error, 1)
	go func() { waited <- td.d.await(3, td.quit) }()
	select {
	case err := <-waited:
		t.Fatalf("await(3) returned %v before the fsync", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await(3) did not return after the fsync")
	}
	if d := td.d.durable.Load(); d != 3 {
		t.Fatalf("durable %d, want 3", d)
	}
}

// TestParallelLogSynchronousPaths: everything but a leader's commands is
// durable when the call returns, and makes the deferred writes before it
// durable too (no syncer runs here: only the call itself can sync).
func TestParallelLogSynchronousPaths(t *testing.T) {
	cases := []struct {
		name string
		// after 1..3 appended deferred by the leader, as this member:
		leads bool
		call  func(td *testDurable) error
		want  uint64 // durable afterwards
	}{
		{"a follower's append", false, func(td *testDurable) error { return td.log.StoreLogs(commands(4, 5)) }, 5},
		{"a follower reading an entry it holds", false, func(td *testDurable) error {
			var l raft.Log
			return td.log.GetLog(2, &l)
		}, 3},
		{"the leader's configuration change", true, func(td *testDurable) error {
			return td.log.StoreLogs([]*raft.Log{{Index: 4, Term: 1, Type: raft.LogConfiguration}})
		}, 4},
		{"the leader's no-op and a command in one batch", true, func(td *testDurable) error {
			return td.log.StoreLogs([]*raft.Log{{Index: 4, Term: 1, Type: raft.LogNoop}, commands(5, 5)[0]})
		}, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			td := openTestDurable(t, false, 0, nil)
			td.leads.Store(true)
			if err := td.log.StoreLogs(commands(1, 3)); err != nil {
				t.Fatal(err)
			}
			if d, n := td.d.durable.Load(), td.dirty(); d != 0 || n != 1 {
				t.Fatalf("after the leader's append: durable %d, %d dirty files; want 0 and 1", d, n)
			}
			before := td.fs.syncs.Load()
			td.leads.Store(c.leads)
			if err := c.call(td); err != nil {
				t.Fatal(err)
			}
			if d, n := td.d.durable.Load(), td.dirty(); d != c.want || n != 0 {
				t.Fatalf("durable %d, %d dirty files; want %d and 0", d, n, c.want)
			}
			if td.fs.syncs.Load() == before {
				t.Fatal("no fsync ran")
			}
		})
	}
}

// TestParallelLogTruncation: a tail deletion takes the indexes back (new
// entries take them, to be made durable again); a prefix does not.
func TestParallelLogTruncation(t *testing.T) {
	td := openTestDurable(t, false, 0, nil)
	if err := td.log.StoreLogs(commands(1, 5)); err != nil {
		t.Fatal(err)
	}
	if err := td.log.DeleteRange(4, 5); err != nil {
		t.Fatal(err)
	}
	td.marks(t, "after the tail's deletion", 3, 3)
	td.leads.Store(true)
	if err := td.log.StoreLogs(commands(4, 4)); err != nil {
		t.Fatal(err)
	}
	if err := td.log.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	// The prefix's deletion commits raft-wal's metadata, which flushes
	// first (flushingMeta): everything is durable, nothing went back.
	td.marks(t, "after the prefix's deletion", 4, 4)
	if first, err := td.log.FirstIndex(); err != nil || first != 3 {
		t.Fatalf("first index %d %v, want 3", first, err)
	}
}

// TestParallelLogFsyncFails: a failed deferred fsync fails the log: await
// answers errLogNotDurable, every later append fails, onFail runs once.
func TestParallelLogFsyncFails(t *testing.T) {
	td := openTestDurable(t, true, 0, nil)
	td.leads.Store(true)
	td.fs.fail.Store(true)
	if err := td.log.StoreLogs(commands(1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := td.d.await(1, td.quit); !errors.Is(err, errLogNotDurable) {
		t.Fatalf("await: %v, want errLogNotDurable", err)
	}
	for _, leads := range []bool{true, false} {
		td.leads.Store(leads)
		if err := td.log.StoreLogs(commands(2, 2)); !errors.Is(err, errInjected) {
			t.Fatalf("append (leading %v) after the failure: %v, want the fsync's error", leads, err)
		}
	}
	wait.For(t, "onFail", func() bool { return td.fails.Load() == 1 })
	if d := td.d.durable.Load(); d != 0 {
		t.Fatalf("durable %d after a failed fsync, want 0", d)
	}
}

// TestParallelLogCloseSyncs: closing the log syncs what a leader deferred.
func TestParallelLogCloseSyncs(t *testing.T) {
	td := openTestDurable(t, false, 0, nil)
	td.leads.Store(true)
	if err := td.log.StoreLogs(commands(1, 2)); err != nil {
		t.Fatal(err)
	}
	before := td.fs.syncs.Load()
	td.close(t)
	if td.fs.syncs.Load() == before {
		t.Fatal("closing the log did not sync the deferred write")
	}
}

// recordingMeta notes, at each metadata commit, how many deferred writes
// were not durable.
type recordingMeta struct {
	types.MetaStore
	d       *durability
	commits atomic.Int64
	unsafe  atomic.Int64
}

func (m *recordingMeta) CommitState(s types.PersistentState) error {
	m.commits.Add(1)
	m.d.mu.Lock()
	if len(m.d.dirty) > 0 {
		m.unsafe.Add(1)
	}
	m.d.mu.Unlock()
	return m.MetaStore.CommitState(s)
}

// TestParallelLogSealedSegmentDurableFirst: when a leader's deferred append
// seals a segment, the segment is synced before raft-wal's metadata names
// it sealed (flushingMeta).
func TestParallelLogSealedSegmentDurableFirst(t *testing.T) {
	var rm *recordingMeta
	td := openTestDurable(t, false, 64<<10, func(d *durability) types.MetaStore {
		rm = &recordingMeta{MetaStore: &metadb.BoltMetaDB{}, d: d}
		return rm
	})
	td.leads.Store(true)
	start := rm.commits.Load()
	big := make([]byte, 8<<10)
	for i := uint64(1); i <= 40; i++ {
		if err := td.log.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: big}}); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "a segment rotation", func() bool { return rm.commits.Load() > start })
	if n := rm.unsafe.Load(); n != 0 {
		t.Fatalf("%d metadata commits while a deferred write was not durable", n)
	}
}

// TestRaftLeaderWritesItsLogInParallel: three members; while the leader's
// fsync of a new entry cannot run, the entry still replicates to both
// followers, and nothing applies it: the engine hears no Committed for it
// and no follower's table holds the lock. Once the fsync runs, the entry
// commits and applies everywhere.
func TestRaftLeaderWritesItsLogInParallel(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	c.settle(l)
	held := make(chan struct{})
	hold := func() { <-held }
	var once sync.Once
	release := func() {
		once.Do(func() {
			lm.n.dur.hold.Store(nil)
			close(held)
		})
	}
	lm.n.dur.hold.Store(&hold)
	defer release()

	const key = "parallel/key"
	lm.grant(t, key, 10)
	seq := lm.n.Barrier()
	for i, m := range c.ms {
		if i != l {
			wait.For(t, fmt.Sprintf("follower %d's log to hold the entry while the leader's fsync waits", i),
				func() bool { return entryHasRecord(m, l, seq) })
		}
	}
	// A majority holds the entry: without the leader's own fsync raft
	// counts it committed. Give the commit index a few commit timeouts to
	// travel, then look.
	time.Sleep(200 * time.Millisecond)
	if got := lm.host.lastCommit(); got >= seq {
		t.Fatalf("the engine heard Committed(%d) for record %d before the leader's fsync", got, seq)
	}
	for i, m := range c.ms {
		if _, ok := dumpTable(m.table)[key]; ok && i != l {
			t.Fatalf("follower %d applied the entry before the leader's fsync", i)
		}
	}
	release()
	c.settle(l)
	if got := lm.host.lastCommit(); got < seq {
		t.Fatalf("lastCommit %d after the fsync, want >= %d", got, seq)
	}
}

// TestRaftLeaderWhoseFsyncFails: the leader's disk starts failing its
// fsyncs. The entry it appended then is never answered on it (no
// Committed), it stops serving and another member takes over, and its
// health check names the failure.
func TestRaftLeaderWhoseFsyncFails(t *testing.T) {
	var mu sync.Mutex
	fss := map[int]*testFS{}
	c := &raftCluster{t: t, T: 400 * time.Millisecond, vfs: func(i int) types.VFS {
		mu.Lock()
		defer mu.Unlock()
		fss[i] = &testFS{VFS: fs.New()}
		return fss[i]
	}}
	c.startAll(3)
	l := c.leader()
	lm := c.ms[l]
	c.settle(l)
	mu.Lock()
	fss[l].fail.Store(true)
	mu.Unlock()
	lm.grant(t, "failing/key", 10)
	seq := lm.n.Barrier()
	wait.For(t, "another member to serve", func() bool {
		for i, m := range c.ms {
			if i != l && m.serving() {
				return true
			}
		}
		return false
	})
	if lm.serving() {
		t.Fatal("the member whose log failed still serves")
	}
	if got := lm.host.lastCommit(); got >= seq {
		t.Fatalf("the engine heard Committed(%d) for record %d the failed log never made durable", got, seq)
	}
	wait.For(t, "the engine told to abandon what did not commit", func() bool {
		lm.host.mu.Lock()
		defer lm.host.mu.Unlock()
		return len(lm.host.abandoned) > 0
	})
	if err := lm.n.Health(); err == nil || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("Health: %v, want the fsync failure", err)
	}
}
