package raftnode

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/types"
)

// The leader's log write in parallel with replication (the Raft
// thesis §10.2.1: "the leader may even commit an entry before it has been
// written to its own disk, if a majority of the other servers have written
// it").
//
// hashicorp/raft's leader calls StoreLogs, counts its own copy as written,
// and only then hands the entries to its replicators (raft.go
// dispatchLogs), so a commit took the leader's fsync, then the round trip
// and a follower's fsync, in turn. Here the leader's StoreLogs of commands
// writes the entries (into the page cache) and returns; the fsync runs on
// the syncer goroutine while the entries replicate. raft's commitment then
// counts the leader's copy before it is durable, so two things make that
// count harmless:
//
//   - nothing applies an entry before the leader's fsync covers it: the
//     leader's FSM.Apply waits for it (durability.await) and with it the
//     apply future, so no answer leaves, no token is reserved; and the
//     commit index the leader sends its followers is clamped to its
//     durable index (memberTransport), so no follower applies it either;
//   - once the leader's fsync covers an entry, every copy raft counted is
//     durable (followers append synchronously, below), so it is on a
//     durable majority, as raft's own rule requires.
//
// An entry counted committed and lost with the leader's page cache (a power
// loss before the fsync) was never applied anywhere nor answered: the next
// leader may keep it or not, as for any uncommitted entry.
//
// Everything else stays synchronous: a follower's append (its answer
// counts as a durable copy), any batch that is not only commands (a
// configuration change, the leader's first no-op, a barrier), and raft-wal's
// own metadata (a sealed segment is synced before the metadata names it
// sealed: flushingMeta). A member that stopped leading makes every deferred
// write durable before it reads or appends its log for another leader
// (parallelLog), so an acknowledgement it sends never covers a write it
// deferred. A failed fsync fails the log: every later append fails,
// waiting applies return errLogNotDurable (their answers never leave), the
// member tries to hand the leadership over, and then sends no
// AppendEntries any more (clampCommit), so a leader the transfer did not
// replace loses its lease and raft steps down within its leader lease
// timeout.

// errLogNotDurable answers an apply whose entry this member's log could not
// make durable.
var errLogNotDurable = errors.New("raftnode: the raft log's fsync failed: this member's log is not durable")

// durability tracks, for one member's raft-wal log, which entries were
// written and which of them are durable, and runs the deferred fsyncs.
type durability struct {
	raft atomic.Pointer[raft.Raft] // the member's raft, once running: who is appending
	// deferring: the StoreLogs in progress is a leader's commands: the
	// segment's Sync inside it only marks the file dirty.
	deferring atomic.Bool
	// mute: the log failed and the leadership transfer that follows was
	// tried: the member sends no AppendEntries any more (clampCommit).
	mute    atomic.Bool
	written atomic.Uint64 // the last index appended
	durable atomic.Uint64 // the last index known durable (<= written)

	syncMu sync.Mutex // serialises real fsyncs (raft-wal's file syncs its directory once, unguarded)
	mu     sync.Mutex // guards what follows, and written/durable's updates
	dirty  []*syncFile
	spare  []*syncFile
	gen    uint64 // bumped by a truncation of the log's tail
	failed error
	moved  chan struct{} // closed (and replaced) when durable moves or the log fails

	kick   chan struct{} // wakes the syncer
	onFail func(error)   // once, on the first failed fsync
	// Tests: hold runs before each of the syncer's rounds; leadsHook, when
	// set, answers leads.
	hold      atomic.Pointer[func()]
	leadsHook func() bool
}

func newDurability(onFail func(error)) *durability {
	return &durability{moved: make(chan struct{}), kick: make(chan struct{}, 1), onFail: onFail}
}

// leads reports whether the member appends as the leader. raft sets its
// state on the goroutine that calls StoreLogs and GetLog for its own
// appends, so on that goroutine this is exact.
func (d *durability) leads() bool {
	if d.leadsHook != nil {
		return d.leadsHook()
	}
	r := d.raft.Load()
	return r != nil && r.State() == raft.Leader
}

// pending reports whether some write is not durable yet.
func (d *durability) pending() bool { return d.written.Load() > d.durable.Load() }

// err is the failure of the log, if its fsync failed.
func (d *durability) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// await returns once the entry at index is durable in this member's log,
// errLogNotDurable if the log failed, errClosed once quit closes.
func (d *durability) await(index uint64, quit <-chan struct{}) error {
	for {
		if d.durable.Load() >= index {
			return nil
		}
		d.mu.Lock()
		moved, failed := d.moved, d.failed
		d.mu.Unlock()
		if d.durable.Load() >= index {
			return nil
		}
		if failed != nil {
			return errLogNotDurable
		}
		select {
		case <-moved:
		case <-quit:
			return errClosed
		}
	}
}

// movedLocked wakes the waiters of await.
func (d *durability) movedLocked() {
	close(d.moved)
	d.moved = make(chan struct{})
}

// stored records an append up to last: durable at once if it was synced.
func (d *durability) stored(last uint64, deferred bool) {
	d.mu.Lock()
	d.written.Store(last)
	if !deferred {
		d.durable.Store(last)
		d.movedLocked()
	}
	d.mu.Unlock()
	if deferred {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// truncated records a deletion of [min, max]: one that reaches the end of
// the log takes written and durable back below min (new entries may take
// those indexes); a prefix (compaction) changes nothing.
func (d *durability) truncated(min, max uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if max < d.written.Load() || min == 0 {
		return
	}
	d.gen++
	d.written.Store(min - 1)
	if d.durable.Load() > min-1 {
		d.durable.Store(min - 1)
	}
}

// markDirty records a Sync deferred on f.
func (d *durability) markDirty(f *syncFile) {
	d.mu.Lock()
	if !f.dirty {
		f.dirty = true
		d.dirty = append(d.dirty, f)
	}
	d.mu.Unlock()
}

// flush makes every write so far durable.
func (d *durability) flush() error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	return d.roundLocked()
}

// syncNow syncs f and every file with a deferred Sync (a synchronous
// append: a follower's, or a leader's that is not only commands).
func (d *durability) syncNow(f *syncFile) error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	d.markDirty(f)
	return d.roundLocked()
}

// roundLocked (under syncMu) syncs the dirty files and then moves durable
// to what was written when the round began, unless the tail was truncated
// meanwhile.
func (d *durability) roundLocked() error {
	d.mu.Lock()
	if d.failed != nil {
		d.mu.Unlock()
		return d.failed
	}
	upTo, gen := d.written.Load(), d.gen
	files := d.dirty
	d.dirty = d.spare[:0]
	for _, f := range files {
		f.dirty = false
	}
	d.mu.Unlock()
	var err error
	for _, f := range files {
		if err = f.WritableFile.Sync(); err != nil {
			break
		}
	}
	clear(files)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.spare = files[:0]
	if err != nil {
		d.failLocked(err)
		return d.failed
	}
	if gen == d.gen && upTo > d.durable.Load() {
		d.durable.Store(upTo)
		d.movedLocked()
	}
	return nil
}

// failLocked fails the log (once): appends fail from now on and waiters
// return errLogNotDurable.
func (d *durability) failLocked(err error) {
	if d.failed != nil {
		return
	}
	d.failed = fmt.Errorf("raftnode: raft log fsync: %w", err)
	d.movedLocked()
	if d.onFail != nil {
		go d.onFail(d.failed)
	}
}

// syncer runs the deferred fsyncs, one round per wake-up: every append
// that arrived during a round is covered by the next one (group commit on
// the leader's own disk).
func (d *durability) syncer(quit <-chan struct{}, done func()) {
	defer done()
	for {
		select {
		case <-quit:
			return
		case <-d.kick:
		}
		if h := d.hold.Load(); h != nil {
			(*h)()
		}
		_ = d.flush() // a failure is recorded (failLocked)
	}
}

// parallelLog is the log raft writes through: the leader's commands are
// appended without waiting for their fsync; anything else waits for every
// write before it to be durable.
type parallelLog struct {
	raft.LogStore
	d *durability
}

// raft reads whether a log is monotonic through this interface only.
var _ raft.MonotonicLogStore = (*parallelLog)(nil)

// IsMonotonic says whether the store beneath takes only consecutive
// indexes (raft-wal does: raft.MonotonicLogStore). raft asks it when it
// installs a leader's snapshot: a monotonic log is emptied then, since the
// entries after the snapshot cannot follow what the log held before (a
// follower that was down had a log ending far below the snapshot: raft-wal
// refused every append after it, and the leader sent the snapshot again,
// forever).
func (p *parallelLog) IsMonotonic() bool {
	m, ok := p.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// StoreLog appends one entry.
func (p *parallelLog) StoreLog(l *raft.Log) error { return p.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends logs: deferring their fsync if the leader appends
// commands only.
func (p *parallelLog) StoreLogs(logs []*raft.Log) error {
	d := p.d
	if err := d.err(); err != nil {
		return err
	}
	if len(logs) == 0 {
		return nil
	}
	// A synchronous append needs no flush first: raft-wal's Sync of it
	// runs syncNow, which syncs every deferred file with it.
	deferred := d.leads() && !slices.ContainsFunc(logs, func(l *raft.Log) bool { return l.Type != raft.LogCommand })
	d.deferring.Store(deferred)
	err := p.LogStore.StoreLogs(logs)
	d.deferring.Store(false)
	if err != nil {
		return err
	}
	d.stored(logs[len(logs)-1].Index, deferred)
	return nil
}

// GetLog reads an entry. A member that does not lead reads its log to
// answer a leader (an entry it holds already counts as appended, with no
// StoreLogs): its deferred writes are made durable first.
func (p *parallelLog) GetLog(index uint64, l *raft.Log) error {
	if p.d.pending() && !p.d.leads() {
		if err := p.d.flush(); err != nil {
			return err
		}
	}
	return p.LogStore.GetLog(index, l)
}

// DeleteRange deletes [min, max] (a compacted prefix, or a tail a new
// leader overwrites).
func (p *parallelLog) DeleteRange(min, max uint64) error {
	if err := p.LogStore.DeleteRange(min, max); err != nil {
		return err
	}
	p.d.truncated(min, max)
	return nil
}

// syncFS is raft-wal's file system with the leader's Sync deferred.
type syncFS struct {
	types.VFS
	d *durability
}

// Create creates a segment file.
func (s *syncFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := s.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &syncFile{WritableFile: f, d: s.d}, nil
}

// OpenWriter opens the tail segment at start; it is marked dirty, so the
// first flush syncs what a killed process left in the page cache.
func (s *syncFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := s.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	sf := &syncFile{WritableFile: f, d: s.d}
	s.d.markDirty(sf)
	return sf, nil
}

// syncFile is a segment file whose Sync the leader defers.
type syncFile struct {
	types.WritableFile
	d     *durability
	dirty bool // under d.mu: in d.dirty
}

// Sync fsyncs the file, or only marks it dirty inside a leader's append of
// commands.
func (f *syncFile) Sync() error {
	if f.d.deferring.Load() {
		f.d.markDirty(f)
		return nil
	}
	return f.d.syncNow(f)
}

// Close syncs the file first if a Sync of it was deferred.
func (f *syncFile) Close() error {
	d := f.d
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	d.mu.Lock()
	was := f.dirty
	if was {
		f.dirty = false
		d.dirty = slices.DeleteFunc(d.dirty, func(g *syncFile) bool { return g == f })
	}
	d.mu.Unlock()
	var err error
	if was {
		if err = f.WritableFile.Sync(); err != nil {
			d.mu.Lock()
			d.failLocked(err)
			d.mu.Unlock()
		}
	}
	return errors.Join(err, f.WritableFile.Close())
}

// flushingMeta is raft-wal's metadata store, made to sync every deferred
// write before it commits: a segment is durable before the metadata names
// it sealed.
type flushingMeta struct {
	types.MetaStore
	d *durability
}

// CommitState flushes, then commits the WAL's metadata.
func (m flushingMeta) CommitState(s types.PersistentState) error {
	if err := m.d.flush(); err != nil {
		return err
	}
	return m.MetaStore.CommitState(s)
}
