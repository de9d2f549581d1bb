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
// (base/wal or base/raft.db), fsync on every append, and registers it for
// closing.
func (n *node) openLogStore(kind logStoreKind, base string) (logStore, error) {
	s, err := openStore(kind, base, n.log)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, s)
	return s, nil
}

func openStore(kind logStoreKind, base string, log *slog.Logger) (logStore, error) {
	switch kind {
	case logStoreBolt:
		return raftboltdb.New(raftboltdb.Options{Path: filepath.Join(base, "raft.db")})
	case logStoreWAL:
		dir := filepath.Join(base, "wal")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		return wal.Open(dir, wal.WithLogger(newHclog(log.With("component", "raft-wal"), hclog.Warn)))
	}
	return nil, fmt.Errorf("raftnode: unknown raft log store %q", kind)
}
