package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/shard"
)

// DefaultTokenBlock is how many tokens one reservation covers by default.
const DefaultTokenBlock = 1 << 22

// LocalConfig configures a Local node.
type LocalConfig struct {
	// DataDir holds the token mark and the shutdown snapshot.
	DataDir string
	// TokenBlock is how many tokens one durable reservation covers (≥ 2,
	// default DefaultTokenBlock). The node keeps up to two blocks reserved
	// ahead of the last token, so a slow disk has a block's worth of
	// grants to catch up before acquires are answered busy.
	TokenBlock uint64
}

// Local is the node of a lockd without peers: always serving, durable
// through its data directory (DataDir). Tokens are reserved in the data
// directory before they are handed out, in a goroutine of its own with
// back-off when the disk fails; a graceful shutdown writes the held locks
// to a snapshot that the next start reloads and consumes.
type Local struct {
	cfg   LocalConfig
	log   *slog.Logger
	dir   *DataDir
	table *shard.Table
	clock func() int64
	self  atomic.Value // string, set by Start
	gate  Gate

	restored   int  // locks reloaded from the snapshot
	snapLoaded bool // the snapshot was read; Start removes it

	res Reserver
}

// NewLocal returns a node for the data directory cfg.DataDir.
func NewLocal(cfg LocalConfig) *Local {
	if cfg.TokenBlock == 0 {
		cfg.TokenBlock = DefaultTokenBlock
	}
	return &Local{cfg: cfg, gate: Gate{State: Serve}}
}

// Open takes the data directory, reserves the first block of tokens above
// max(the reserved mark, the snapshot's mark, the wall clock in ns) and
// reloads the snapshot's locks whose lease has not ended.
func (n *Local) Open(cfg shard.Config, clock func() int64, log *slog.Logger) (*shard.Table, error) {
	if n.cfg.TokenBlock < 2 {
		return nil, &FieldError{Field: "TokenBlock", Value: n.cfg.TokenBlock, Want: "must be at least 2"}
	}
	n.log, n.clock = log, clock
	dir, err := OpenDataDir(n.cfg.DataDir, log)
	if err != nil {
		return nil, err
	}
	n.dir = dir
	if err := n.load(cfg); err != nil {
		dir.Release(FailedStart)
		n.dir = nil
		return nil, err
	}
	n.res.Start(n.table.Tokens(), n.cfg.TokenBlock, dir.Reserve, log)
	return n.table, nil
}

// load computes the first token, reserves a block and restores the snapshot.
func (n *Local) load(cfg shard.Config) error {
	start, snap, err := n.dir.Load(true)
	if err != nil {
		return err
	}
	limit := start + n.cfg.TokenBlock
	if err := n.dir.Reserve(limit); err != nil {
		return fmt.Errorf("reserving tokens in %s: %w", n.dir.Path(), err)
	}
	n.table, err = shard.New(cfg, shard.NewTokens(start, limit))
	if err != nil {
		return err
	}
	if snap != nil {
		if n.restored, err = n.dir.Restore(n.table, snap, n.clock()); err != nil {
			return err
		}
		n.snapLoaded = true
	}
	n.log.Info("tokens", "start", start, "reserved", limit)
	return nil
}

// Start consumes the snapshot: from here on a crash must not bring back
// the locks it held (they may be released before the crash).
func (n *Local) Start(addr string, _ Host) error {
	n.self.Store(addr)
	if n.snapLoaded {
		if err := n.dir.RemoveSnapshot(); err != nil {
			return fmt.Errorf("removing the snapshot it reloaded from %s: %w", n.dir.Path(), err)
		}
		n.snapLoaded = false
	}
	return nil
}

// Gate always serves.
func (n *Local) Gate() *Gate { return &n.gate }

// Stop hands nothing over: a single node shuts down as PROTOCOL.md §4 says.
func (n *Local) Stop(context.Context) string { return "" }

// Close stops the reserver and, after a shutdown or a crash of the engine,
// writes the held locks and the token mark to the snapshot, within ctx.
// When the snapshot cannot be written the log says how many held locks are
// lost. After a failed start it leaves the data directory as it found it
// (a directory this start created is removed).
func (n *Local) Close(ctx context.Context, why CloseReason) error {
	if n.dir == nil {
		return nil
	}
	n.res.Stop(ctx)
	defer func() { n.dir = nil }()
	if why == FailedStart || why == Discard {
		return n.dir.Release(why)
	}
	err := n.dir.Save(ctx, n.table, n.clock(), why)
	return errors.Join(err, n.dir.Release(why))
}

// Status reports a single active node.
func (n *Local) Status() Status {
	self, _ := n.self.Load().(string)
	st := Status{Mode: api.ModeSingle, Role: api.RoleActive, Self: self, Active: self}
	n.res.Status(&st)
	return st
}

// Health is the reservation's state.
func (n *Local) Health() error { return n.res.Health() }
