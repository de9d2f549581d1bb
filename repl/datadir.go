package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/lockd-dev/lockd/shard"
	"github.com/lockd-dev/lockd/store"
)

// DataDir is a node's data directory, taken for this process (the
// embedded store.Dir: the token mark, the epoch, the shutdown snapshot),
// and what this start did to it. Every node opens its directory here, so
// a start reads it, reports a corrupt snapshot and cleans up after a
// failed start the same way in every mode.
type DataDir struct {
	*store.Dir
	log     *slog.Logger
	path    string
	created bool // this start created it: a failed start removes it
}

// OpenDataDir takes the data directory at path for this process, creating
// it when it does not exist. Its error is a *FieldError for DataDir,
// wrapping the store's (store.ErrLocked: another process has it).
func OpenDataDir(path string, log *slog.Logger) (*DataDir, error) {
	d := &DataDir{log: log, path: path}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		d.created = true
	}
	dir, err := store.Open(path)
	if err != nil {
		d.removeCreated()
		return nil, &FieldError{Field: "DataDir", Value: path, Err: err}
	}
	d.Dir = dir
	return d, nil
}

// Load reads what a node starts from: the token mark and, when
// withSnapshot, the shutdown snapshot (nil when there is none; a corrupt
// one is moved aside and logged: its locks are lost, its tokens are not,
// the mark covers them). start is the first token the node may take:
// above the mark, the snapshot's mark and the wall clock (WallFloor).
func (d *DataDir) Load(withSnapshot bool) (start uint64, snap *store.Snapshot, err error) {
	mark, err := d.Mark()
	if err != nil {
		return 0, nil, err
	}
	start = max(mark, WallFloor())
	if !withSnapshot {
		return start, nil, nil
	}
	s, ok, err := d.ReadSnapshot()
	switch {
	case errors.Is(err, store.ErrCorrupt):
		d.log.Error("snapshot corrupt: moved aside, its locks are lost (tokens are not)", "err", err)
	case err != nil:
		return 0, nil, err
	case ok:
		snap = &s
		start = max(start, s.Mark)
	}
	return start, snap, nil
}

// Restore installs the locks of snap whose lease has not ended into t
// (deadlines onto t's clock, of which now is the present), logs it and
// returns how many it restored.
func (d *DataDir) Restore(t *shard.Table, snap *store.Snapshot, now int64) (int, error) {
	n, err := restoreLocks(t, snap.Locks, now)
	if err != nil {
		return n, fmt.Errorf("restoring snapshot: %w", err)
	}
	d.log.Info("snapshot reloaded", "locks", n, "expired", len(snap.Locks)-n, "mark", snap.Mark)
	return n, nil
}

// Save writes t's held locks (their leases from now on t's clock) and its
// last token as the shutdown snapshot, giving up at ctx's end whatever
// the disk does, and logs what it wrote or how many held locks are lost.
func (d *DataDir) Save(ctx context.Context, t *shard.Table, now int64, why CloseReason) error {
	snap := tableSnapshot(t, now)
	err := RunWithin(ctx, func() error { return d.WriteSnapshot(snap) })
	if err != nil {
		d.log.Error("snapshot not written: held locks are lost (tokens are not)", "locks_lost", len(snap.Locks), "err", err)
	} else {
		d.log.Info("snapshot written", "locks", len(snap.Locks), "mark", snap.Mark, "after", why.String())
	}
	return err
}

// Release closes the directory (why: the node's close reason); after a
// failed start it removes a directory this start created, and keeps one
// that existed as it was.
func (d *DataDir) Release(why CloseReason) error {
	err := d.Dir.Close()
	if why == FailedStart {
		d.removeCreated()
	}
	return err
}

// removeCreated removes the data directory if this start created it.
func (d *DataDir) removeCreated() {
	if d.created {
		if err := os.RemoveAll(d.path); err != nil {
			d.log.Warn("could not remove the data directory this failed start created", "dir", d.path, "err", err)
		}
	}
}

// RunWithin runs f and returns its error, or ctx's error if ctx ends first
// (f then finishes on its own: a disk that hangs cannot hold a shutdown).
func RunWithin(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("gave up waiting for the disk: %w", ctx.Err())
	}
}

// WallFloor is the wall clock in nanoseconds: no node starts its tokens
// below it (PROTOCOL.md §5), so a lost data directory cannot make tokens go
// back while the clock does not.
func WallFloor() uint64 { return uint64(time.Now().UnixNano()) }

// tableSnapshot copies t's held locks whose lease has not ended at now (t's
// clock) into a snapshot with wall-clock deadlines, each grant's identity
// (PROTOCOL.md §8.3) and, for a shared key, every holder with the key's
// limit (§9.2), and the last token as its mark.
func tableSnapshot(t *shard.Table, now int64) store.Snapshot {
	wallNow := time.Now()
	var snap store.Snapshot
	for i := range t.Shards() {
		t.Dump(i, func(h *shard.HeldLock) {
			if h.Deadline <= now {
				return
			}
			snap.Locks = append(snap.Locks, store.Lock{
				Key:      append([]byte(nil), h.Key...),
				Token:    h.Token,
				Deadline: wallNow.Add(time.Duration(h.Deadline - now)),
				Ident:    string(h.Ident),
				Limit:    h.Limit,
			})
		})
	}
	snap.Mark = t.Tokens().Last()
	return snap
}

// restoreLocks installs the locks whose wall-clock deadline has not passed
// into t, their deadlines moved onto t's clock (now), each granted to its
// identity, a shared key's holders one by one with its limit
// (shard.Table.RestoreHolder), and returns how many.
func restoreLocks(t *shard.Table, locks []store.Lock, now int64) (int, error) {
	wallNow := time.Now()
	n := 0
	for _, l := range locks {
		left := l.Deadline.Sub(wallNow)
		if left <= 0 {
			continue
		}
		h := shard.HeldLock{Key: l.Key, Token: l.Token, Deadline: now + int64(left), Ident: []byte(l.Ident), Limit: l.Limit}
		if err := t.RestoreHolder(&h); err != nil {
			return n, err
		}
		t.Tokens().Observe(l.Token)
		n++
	}
	return n, nil
}
