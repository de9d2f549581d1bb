package repl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/shard"
	"github.com/lockd-dev/lockd/store"
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
// through its data directory (store.Dir). Tokens are reserved in the data
// directory before they are handed out, in a goroutine of its own with
// back-off when the disk fails; a graceful shutdown writes the held locks
// to a snapshot that the next start reloads and consumes.
type Local struct {
	cfg   LocalConfig
	log   *slog.Logger
	dir   *store.Dir
	table *shard.Table
	clock func() int64
	self  atomic.Value // string, set by Start
	gate  Gate

	restored   int  // locks reloaded from the snapshot
	snapLoaded bool // the snapshot was read; Start removes it
	created    bool // Open created the data directory

	res reserver
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
		return nil, errors.New("repl: token block must be at least 2")
	}
	n.log, n.clock = log, clock
	if _, err := os.Stat(n.cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		n.created = true
	}
	dir, err := store.Open(n.cfg.DataDir)
	if err != nil {
		n.removeCreated()
		return nil, fmt.Errorf("--data-dir %s: %w", n.cfg.DataDir, err)
	}
	n.dir = dir
	if err := n.load(cfg); err != nil {
		dir.Close()
		n.removeCreated()
		return nil, err
	}
	n.res.start(n.table.Tokens(), n.cfg.TokenBlock, dir.Reserve, log)
	return n.table, nil
}

// load computes the first token, reserves a block and restores the snapshot.
func (n *Local) load(cfg shard.Config) error {
	mark, err := n.dir.Mark()
	if err != nil {
		return err
	}
	snap, ok, err := n.dir.ReadSnapshot()
	if errors.Is(err, store.ErrCorrupt) {
		n.log.Error("snapshot corrupt: moved aside, its locks are lost (tokens are not)", "err", err)
	} else if err != nil {
		return err
	}
	start := mark
	if ok && snap.Mark > start {
		start = snap.Mark
	}
	start = max(start, WallFloor())
	limit := start + n.cfg.TokenBlock
	if err := n.dir.Reserve(limit); err != nil {
		return fmt.Errorf("reserving tokens in %s: %w", n.dir.Path(), err)
	}
	n.table, err = shard.New(cfg, shard.NewTokens(start, limit))
	if err != nil {
		return err
	}
	if ok {
		n.restored, err = RestoreLocks(n.table, snap.Locks, n.clock())
		if err != nil {
			return fmt.Errorf("restoring snapshot: %w", err)
		}
		n.log.Info("snapshot reloaded", "locks", n.restored, "expired", len(snap.Locks)-n.restored, "mark", snap.Mark)
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
	n.res.stop(ctx)
	defer func() { n.dir = nil }()
	switch why {
	case FailedStart:
		err := n.dir.Close()
		n.removeCreated()
		return err
	case Discard:
		return n.dir.Close()
	}
	snap := TableSnapshot(n.table, n.clock())
	err := runWithin(ctx, func() error { return n.dir.WriteSnapshot(snap) })
	if err != nil {
		n.log.Error("snapshot not written: held locks are lost (tokens are not)", "locks_lost", len(snap.Locks), "err", err)
	} else {
		n.log.Info("snapshot written", "locks", len(snap.Locks), "mark", snap.Mark, "after", why.String())
	}
	return errors.Join(err, n.dir.Close())
}

// removeCreated removes the data directory if Open created it.
func (n *Local) removeCreated() {
	if n.created {
		if err := os.RemoveAll(n.cfg.DataDir); err != nil {
			n.log.Warn("could not remove the data directory this failed start created", "dir", n.cfg.DataDir, "err", err)
		}
	}
}

// Status reports a single active node.
func (n *Local) Status() Status {
	self, _ := n.self.Load().(string)
	st := Status{Mode: "single", Role: "active", Self: self, Active: self}
	n.res.status(&st)
	return st
}

// Health is the reservation's state.
func (n *Local) Health() error { return n.res.health() }

// Restored is the number of locks reloaded from the snapshot.
func (n *Local) Restored() int { return n.restored }

// Dir returns the open data directory.
func (n *Local) Dir() *store.Dir { return n.dir }

// runWithin runs f and returns its error, or ctx's error if ctx ends first
// (f then finishes on its own: a disk that hangs cannot hold a shutdown).
func runWithin(ctx context.Context, f func() error) error {
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

// TableSnapshot copies t's held locks whose lease has not ended at now (t's
// clock) into a snapshot with wall-clock deadlines and each grant's
// identity, and the last token as its mark.
func TableSnapshot(t *shard.Table, now int64) store.Snapshot {
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
			})
		})
	}
	snap.Mark = t.Tokens().Last()
	return snap
}

// RestoreLocks installs the locks whose wall-clock deadline has not passed
// into t, their deadlines moved onto t's clock (now), and returns how many.
func RestoreLocks(t *shard.Table, locks []store.Lock, now int64) (int, error) {
	wallNow := time.Now()
	n := 0
	for _, l := range locks {
		left := l.Deadline.Sub(wallNow)
		if left <= 0 {
			continue
		}
		if err := t.RestoreAs(l.Key, l.Token, now+int64(left), []byte(l.Ident)); err != nil {
			return n, err
		}
		t.Tokens().Observe(l.Token)
		n++
	}
	return n, nil
}

// reserver keeps tokens reserved ahead of use: when Want signals it makes
// last + 2 blocks safe through reserve (a disk write, a replication, a
// commit) and then extends the allocator. A failing reserve is retried
// with back-off (10 ms doubling to 1 s); meanwhile grants go on until the
// reserved range is used up and then get Busy, and health reports why.
type reserver struct {
	tokens  *shard.Tokens
	block   uint64
	reserve func(limit uint64) error
	log     *slog.Logger

	quit chan struct{}
	done chan struct{}

	mu      sync.Mutex
	failing error // the last error while reservations fail, nil when healthy
	errs    uint64
}

func (r *reserver) start(tokens *shard.Tokens, block uint64, reserve func(uint64) error, log *slog.Logger) {
	r.tokens, r.block, r.reserve, r.log = tokens, block, reserve, log
	r.quit, r.done = make(chan struct{}), make(chan struct{})
	go r.run()
}

func (r *reserver) run() {
	defer close(r.done)
	for {
		select {
		case <-r.quit:
			return
		case <-r.tokens.Want():
		}
		limit := max(r.tokens.Limit(), r.tokens.Last()) + 2*r.block
		backoff := 10 * time.Millisecond
		var lastLog time.Time
		for {
			err := r.reserve(limit)
			if err == nil {
				break
			}
			r.mu.Lock()
			r.failing = err
			r.errs++
			n := r.errs
			r.mu.Unlock()
			if time.Since(lastLog) >= 10*time.Second {
				lastLog = time.Now()
				r.log.Error("reserving tokens failed: acquires that need a new token get B once the reserved range is used up; retrying",
					"err", err, "failures", n, "last_token", r.tokens.Last(), "reserved", r.tokens.Limit())
			}
			select {
			case <-r.quit:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
		r.tokens.Extend(limit)
		r.mu.Lock()
		recovered := r.failing != nil
		r.failing = nil
		r.mu.Unlock()
		if recovered {
			r.log.Info("reserving tokens works again", "reserved", limit)
		}
	}
}

// stop ends the reserver, waiting at most until ctx ends (a reservation
// stuck in a disk write is left behind).
func (r *reserver) stop(ctx context.Context) {
	if r.quit == nil {
		return
	}
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}

func (r *reserver) health() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return fmt.Errorf("token reservation failing: %w", r.failing)
	}
	return nil
}

func (r *reserver) status(st *Status) {
	if r.tokens != nil {
		st.TokenReserved = r.tokens.Limit()
	}
	r.mu.Lock()
	st.ReserveErrors = r.errs
	if r.failing != nil {
		st.ReserveError = r.failing.Error()
	}
	r.mu.Unlock()
}
