package raftnode

import (
	"fmt"
	"io"
	"slices"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// raftFSM is the node seen as raft's state machine.
type raftFSM node

// Apply applies a committed entry to the table; the leader skips the
// records of the entries of its own term (it executed them). It first
// waits for the entry to be durable in this member's log (a leader's
// fsync runs in parallel with replication, durable.go): until then the
// apply future, and every answer behind it, waits; an entry the log could
// not make durable, or one still waiting when the node closes, is not
// applied and its future answers the error.
func (f *raftFSM) Apply(l *raft.Log) any {
	n := (*node)(f)
	if n.dur != nil {
		if err := n.dur.await(l.Index, n.quit); err != nil {
			return err
		}
	}
	var e logEntry
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	n.applied = l.Index
	errs := n.fsmState.errs
	if err := decodeLogEntry(l.Data, &e, &n.fsmState.buf); err != nil {
		// Not skipped as if it changed nothing: the table is not the
		// committed state without it (entry.go: a newer format, or a
		// damaged log), so it counts as refused records do — rebuild,
		// stale while that fails, no snapshot over it.
		n.fsmState.refuse(fmt.Errorf("raft log entry %d: %w", l.Index, err))
	} else {
		own := n.leading != 0 && e.term == n.leading && e.proposer == n.cfg.Self && l.Term == n.leading
		n.fsmState.applyEntry(&e, n.wallAtZero, own)
		if e.kind == entryReserve {
			n.reserved.Store(n.fsmState.reserved)
		}
	}
	if n.fsmState.errs != errs {
		n.mu.Lock()
		wasDirty := n.dirty
		n.dirty = n.dirty || n.leading == 0
		n.mu.Unlock()
		if !wasDirty && n.leading == 0 {
			n.log.Error("a committed record did not apply to this table: rebuilding it", "index", l.Index, "err", n.fsmState.lastErr)
			n.poke()
		}
	}
	return nil
}

// Snapshot cuts a snapshot at the last applied command: Persist builds it
// from the previous snapshot and the log (never from the live table, which
// on the leader holds changes not committed yet).
func (f *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	n := (*node)(f)
	n.fsmMu.Lock()
	upTo := n.applied
	n.fsmMu.Unlock()
	return &raftSnapshot{n: n, upTo: upTo}, nil
}

// Restore replaces the table with a snapshot (at start, or one the leader
// sent). A snapshot it cannot read (a newer format, a damaged file) leaves
// the table part restored: the member rebuilds, and is stale while that
// fails (raft keeps sending a leader's snapshot until one is restored).
func (f *raftFSM) Restore(rc io.ReadCloser) error {
	n := (*node)(f)
	defer rc.Close()
	n.fsmMu.Lock()
	defer n.fsmMu.Unlock()
	var fx shard.Out
	n.table.Reset(&fx)
	h, err := readSnapshot(rc, n.table, n.wallAtZero)
	if err != nil {
		n.mu.Lock()
		n.dirty = true
		n.mu.Unlock()
		n.log.Error("raft snapshot this member cannot read: not restored", "err", err)
		n.poke()
		return err
	}
	n.applied = h.index
	n.fsmState.reserved = max(n.fsmState.reserved, h.reserved)
	n.reserved.Store(n.fsmState.reserved)
	n.log.Info("snapshot restored", "index", h.index, "locks", n.table.Stats().Keys, "last_token", h.last)
	return nil
}

// raftSnapshot is a snapshot being persisted.
type raftSnapshot struct {
	n    *node
	upTo uint64
}

// Persist rebuilds the committed state up to the cut in a scratch table
// and writes it.
func (s *raftSnapshot) Persist(sink raft.SnapshotSink) error {
	n := s.n
	cfg := n.tcfg
	cfg.Sink = nil
	t, err := shard.New(cfg, shard.NewTokens(0, 0))
	if err != nil {
		sink.Cancel()
		return err
	}
	st, _, err := replayInto(t, n.snaps, n.logs, s.upTo, n.wallAtZero, nil)
	if err == nil && st.errs > 0 {
		// A snapshot without what could not be applied would let raft
		// compact those entries away: the state it saves would be wrong
		// for good, even once this member runs a lockd that reads them.
		err = fmt.Errorf("raftnode: no snapshot of a log this member cannot apply whole (%d records or entries refused, the last: %w)", st.errs, st.lastErr)
	}
	if err != nil {
		sink.Cancel()
		return err
	}
	size, err := writeSnapshot(sink, t, st.reserved, s.upTo, n.clock(), n.wallAtZero)
	if err != nil {
		sink.Cancel()
		return err
	}
	if n.persistHook != nil {
		n.persistHook()
	}
	// The snapshot becomes visible here, and raft compacts the log past it
	// once Persist returns: not while a rebuild replays the log from an
	// older one (rebuild holds snapMu throughout).
	n.snapMu.Lock()
	err = sink.Close()
	n.snapMu.Unlock()
	if err != nil {
		return err
	}
	n.stats.snapshots.Add(1)
	n.stats.snapshotBytes.Store(size)
	n.log.Info("raft snapshot written", "index", s.upTo, "locks", t.Stats().Keys, "bytes", size)
	return nil
}

// Release does nothing: the snapshot holds no resource.
func (s *raftSnapshot) Release() {}

// applyState is what applying the log changes: a table and the highest
// token reservation seen. The live FSM and the rebuilds of a snapshot use
// it alike.
type applyState struct {
	table    *shard.Table
	reserved uint64
	errs     uint64 // records Table.Apply refused (a gap, another shard count)
	lastErr  error
	out      shard.Out
	buf      []byte
}

// refuse counts an entry or record that did not apply.
func (s *applyState) refuse(err error) {
	s.errs++
	s.lastErr = err
}

// applyEntry applies a decoded entry: a reservation raises reserved; the
// records are applied in order with their leases counting from the
// entry's stamp moved onto the table's clock (wallAtZero: the wall clock
// at table time 0). skipRecords leaves the table as it is (the leader
// executed them already).
func (s *applyState) applyEntry(e *logEntry, wallAtZero int64, skipRecords bool) {
	if e.kind == entryReserve {
		s.reserved = max(s.reserved, e.limit)
		return
	}
	if skipRecords {
		return
	}
	now := e.stamp - wallAtZero
	var rr records.RecordReader
	var rec shard.Record
	rr.Reset(e.raw)
	for rr.Next(&rec) {
		if _, err := s.table.Apply(now, &rec, &s.out); err != nil {
			s.errs++
			s.lastErr = err
		}
	}
	if err := rr.Err(); err != nil {
		s.errs++
		s.lastErr = err
	}
	// A table fed by the log has no waiters of its own; any effect (a
	// waiter of a key a record freed, on a deposed leader before its
	// rebuild) has no one to answer here.
	s.out.Reset()
}

// replayInto builds in t (empty) the state of the log up to index upTo:
// the newest snapshot in the store cut at or before upTo (one installed
// from the leader and not restored yet is newer), then the log's commands
// after it. It returns the highest reservation, the records it could not
// apply and the index the snapshot it started from was cut at. between,
// when set, runs after the snapshot is read and before the log is (tests).
func replayInto(t *shard.Table, snaps raft.SnapshotStore, logs raft.LogStore, upTo uint64, wallAtZero int64, between func()) (st *applyState, from uint64, err error) {
	st = &applyState{table: t}
	metas, err := snaps.List()
	if err != nil {
		return st, 0, err
	}
	metas = slices.DeleteFunc(metas, func(m *raft.SnapshotMeta) bool { return m.Index > upTo })
	next := uint64(1)
	if len(metas) > 0 {
		meta, rc, err := snaps.Open(metas[0].ID)
		if err != nil {
			return st, 0, fmt.Errorf("opening snapshot %s: %w", metas[0].ID, err)
		}
		h, err := readSnapshot(rc, t, wallAtZero)
		rc.Close()
		if err != nil {
			return st, 0, fmt.Errorf("reading snapshot %s: %w", meta.ID, err)
		}
		st.reserved = h.reserved
		from = meta.Index
		next = meta.Index + 1
	}
	if between != nil {
		between()
	}
	if next > upTo {
		return st, from, nil
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return st, from, err
	}
	if first > next {
		return st, from, fmt.Errorf("raftnode: the raft log starts at %d, after the snapshot's %d", first, next-1)
	}
	var l raft.Log
	var e logEntry
	for i := next; i <= upTo; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return st, from, fmt.Errorf("raft log entry %d: %w", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if err := decodeLogEntry(l.Data, &e, &st.buf); err != nil {
			st.refuse(fmt.Errorf("raft log entry %d: %w", i, err))
			continue
		}
		st.applyEntry(&e, wallAtZero, false)
	}
	return st, from, nil
}
