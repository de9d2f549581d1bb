package raftnode

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// logStoreKind names a raft log store.
type logStoreKind string

// Raft log stores lockd can use: raft-wal, chosen by BenchmarkRaftLogStore
// (BENCHMARKS.md, "The raft log store").
const (
	// logStoreWAL is github.com/hashicorp/raft-wal (the default).
	logStoreWAL logStoreKind = "wal"
	// logStoreBolt is github.com/hashicorp/raft-boltdb/v2 (for comparison).
	logStoreBolt logStoreKind = "bolt"
)

// logStore is a raft log store that is also its stable store and closes.
type logStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// openLogStore opens the raft log and stable store of kind under base
// (base/wal or base/raft.db) and registers it for closing. raft-wal's
// appends are durable when they return except a leader's, whose fsync d
// runs in parallel with replication (durable.go); bolt's are always
// synchronous (d unused).
func (n *node) openLogStore(kind logStoreKind, base string, d *durability, vfs types.VFS, segSize int) (logStore, error) {
	s, err := openStore(kind, base, n.log, d, vfs, segSize)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, s)
	return s, nil
}

// openStore opens the store of kind under base; with d, raft-wal's file
// system (vfs, nil: the real one) and metadata go through d (durable.go),
// its segments are segSize bytes (0: raft-wal's default), and everything
// it holds is made durable before it returns.
func openStore(kind logStoreKind, base string, log *slog.Logger, d *durability, vfs types.VFS, segSize int) (logStore, error) {
	switch kind {
	case logStoreBolt:
		return raftboltdb.New(raftboltdb.Options{Path: filepath.Join(base, "raft.db")})
	case logStoreWAL:
		dir := filepath.Join(base, "wal")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if d == nil {
			return wal.Open(dir, wal.WithLogger(newHclog(log.With("component", "raft-wal"), hclog.Warn, nil)))
		}
		if vfs == nil {
			vfs = fs.New()
		}
		w, err := openWAL(dir, log, d, vfs, segSize, nil)
		if err != nil {
			return nil, err
		}
		return w, nil
	}
	return nil, fmt.Errorf("raftnode: unknown raft log store %q", kind)
}

// openWAL opens raft-wal in dir on vfs through d (segments of segSize
// bytes, 0: raft-wal's default; its metadata in meta, nil: raft-wal's
// bolt file) and makes everything it holds durable before it returns:
// what a killed process left in the page cache was never synced.
func openWAL(dir string, log *slog.Logger, d *durability, vfs types.VFS, segSize int, meta types.MetaStore) (*wal.WAL, error) {
	if meta == nil {
		meta = &metadb.BoltMetaDB{}
	}
	w, err := wal.Open(dir, wal.WithLogger(newHclog(log.With("component", "raft-wal"), hclog.Warn, nil)),
		wal.WithSegmentFiler(segment.NewFiler(dir, &syncFS{VFS: vfs, d: d})),
		wal.WithMetaStore(flushingMeta{MetaStore: meta, d: d}),
		wal.WithSegmentSize(segSize))
	if err != nil {
		return nil, err
	}
	last, err := w.LastIndex()
	if err == nil {
		d.written.Store(last)
		err = d.flush()
	}
	if err != nil {
		_ = w.Close()
		return nil, err
	}
	return w, nil
}
