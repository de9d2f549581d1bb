package priority

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// The inbound direction of the stream: what a standby does with what its
// active sends (batches, snapshots, reservations), and its answers. The
// outbound direction is stream.go.

// follower is the member's role state as its standby side needs it: the
// node answers from its machine's published view, and passes what the
// standby side learns to the machine.
type follower interface {
	// follows reports whether this member is a standby that follows
	// member from.
	follows(from int) bool
	// apply runs fn if this member is a standby that follows member from
	// at epoch, and reports whether it did. fn runs under the node's apply
	// lock, which every change of role away from that standby waits for:
	// nothing from an active reaches the table of a member that promoted,
	// or that follows another active or another epoch, however late it
	// arrives.
	apply(from int, epoch uint64, fn func() error) (bool, error)
	// recordReserved makes a reservation of the active's durable in this
	// member's data directory and notes it as seen (a member that
	// restarts or promotes starts above every reservation it
	// acknowledged).
	recordReserved(limit uint64) error
	// desync marks this member out of sync with its active and notes the
	// reservation a snapshot carries (0: none).
	desync(reserved uint64)
	// synced marks this member in sync, if it still follows member from at
	// epoch.
	synced(from int, epoch uint64)
}

// standby applies what the followed active sends to the member's table.
type standby struct {
	table *shard.Table
	clock func() int64
	log   *slog.Logger
	names []string // the members' client addresses, for logs
	links []*peer  // for the answers
	node  follower
	stats flow // what was applied
}

// replica is one inbound connection's state: what arrived on it so far.
type replica struct {
	s    *standby
	from int
	raw  []byte
	fx   shard.Out
	// epoch is the sender's epoch as the active in the snapshot this
	// connection last began (0: none yet). Batches apply only after a
	// snapshot, and only while this member follows the sender at it.
	epoch   uint64
	snapID  uint64 // that snapshot's ID
	frames  uint64 // its SnapShard frames received (acknowledged, applied or not)
	syncing bool   // between SnapBegin and SnapEnd, and applying it
	gap     bool   // a gap was found: ignore batches until the next snapshot
	began   time.Time
	locks   int
}

// from returns the state of a new connection from member from.
func (s *standby) from(from int) *replica { return &replica{s: s, from: from} }

// answer sends frame back to the member this replica follows.
func (in *replica) answer(frame []byte) {
	if pe := in.s.links[in.from]; pe != nil {
		pe.send(frame)
	}
}

// reserve records the active's token reservation, then acknowledges it.
func (in *replica) reserve(payload []byte) error {
	var r reserve
	if err := r.Decode(payload); err != nil {
		return err
	}
	if !in.s.node.follows(in.from) {
		return nil
	}
	if err := in.s.node.recordReserved(r.Limit); err != nil {
		in.s.log.Error("recording the active's token reservation failed", "err", err)
		return nil
	}
	in.answer(appendAck(nil, ackReserve, r.ID))
	return nil
}

// batch applies a batch of the followed active's records.
func (in *replica) batch(payload []byte) error {
	s := in.s
	var h batch
	if err := h.Decode(payload); err != nil {
		return err
	}
	if in.gap || in.syncing || in.epoch == 0 {
		return nil
	}
	raw, err := h.Raw(in.raw[:0])
	if err != nil {
		return err
	}
	if h.Codec == records.CodecS2 {
		in.raw = raw[:0] // keep the grown buffer (raw data points into the frame)
	}
	// One pass decodes, validates and applies (the records are not
	// checked whole first): a malformed record stops the batch after the
	// records before it, a prefix of the stream, which a standby may hold
	// as it may hold any batch boundary; it is not acknowledged, the
	// standby leaves sync and the connection closes, so the next
	// connection begins with a snapshot (malformed below).
	n, cancelled := 0, 0
	gap, malformed := false, false
	applied, err := s.node.apply(in.from, in.epoch, func() error {
		now := s.clock()
		var rec shard.Record
		var it records.RecordReader
		it.Reset(raw)
		for it.Next(&rec) {
			if _, err := s.table.Apply(now, &rec, &in.fx); err != nil {
				if errors.Is(err, shard.ErrGap) {
					gap = true
					return nil
				}
				return err
			}
			if rec.Kind == shard.RecordSkip {
				c := int(rec.Seq - rec.From + 1)
				n, cancelled = n+c, cancelled+c
				continue
			}
			n++
		}
		in.fx.Reset()
		if err := it.Err(); err != nil {
			malformed = true
			return err
		}
		return nil
	})
	switch {
	case malformed:
		in.gap = true
		s.node.desync(0)
		return err
	case err != nil:
		return err
	case !applied:
		return nil
	case gap:
		in.lost("gap in the stream")
		return nil
	}
	s.stats.batches.Add(1)
	s.stats.records.Add(uint64(n))
	s.stats.cancelled.Add(uint64(cancelled))
	s.stats.rawBytes.Add(uint64(len(raw)))
	in.answer(appendAck(nil, ackBatch, h.Seq))
	return nil
}

// lost marks this standby out of sync and asks for a snapshot.
func (in *replica) lost(why string) {
	in.gap = true
	in.s.node.desync(0)
	in.s.log.Warn("replication stream broken: asking for a snapshot", "why", why)
	in.answer(appendNeedSnapshot(nil, snapGap))
}

// discard stops applying the snapshot in progress: its sender is no longer
// this member's active at the snapshot's epoch (it stepped down, another
// member became active, this one promoted). What it restored stays out of
// sync; the next snapshot replaces it.
func (in *replica) discard() {
	if in.syncing {
		in.s.log.Warn("snapshot discarded: its sender is no longer the active this member follows at that epoch",
			"from", in.s.names[in.from], "epoch", in.epoch, "locks_applied", in.locks)
	}
	in.syncing, in.epoch = false, 0
}

func (in *replica) snapBegin(payload []byte) error {
	var h snapBegin
	if err := h.Decode(payload); err != nil {
		return err
	}
	s := in.s
	if int(h.Shards) != s.table.Shards() {
		return fmt.Errorf("priority: snapshot of %d shards, this table has %d", h.Shards, s.table.Shards())
	}
	in.snapID, in.frames = h.ID, 0
	in.syncing, in.epoch = false, 0
	applied, err := s.node.apply(in.from, h.Epoch, func() error {
		in.syncing, in.gap, in.epoch, in.began, in.locks = true, false, h.Epoch, time.Now(), 0
		s.node.desync(h.Reserved)
		s.table.Reset(&in.fx)
		in.fx.Reset()
		s.table.Tokens().Observe(h.TokenLast)
		return nil
	})
	if err == nil && !applied {
		s.log.Warn("snapshot refused: its sender is not the active this member follows at that epoch",
			"from", s.names[in.from], "epoch", h.Epoch)
	}
	return err
}

func (in *replica) snapShard(payload []byte) error {
	s := in.s
	var h snapShard
	if err := h.Decode(payload); err != nil {
		return err
	}
	if int(h.Shard) >= s.table.Shards() {
		return fmt.Errorf("priority: snapshot shard %d of %d", h.Shard, s.table.Shards())
	}
	// Every frame is acknowledged, applied or not: the sender's window
	// moves on, and it learns soon enough from the heartbeats that this
	// member does not want the rest.
	in.frames++
	defer in.answer(appendSnapAck(nil, in.snapID, in.frames))
	if !in.syncing {
		return nil
	}
	raw, err := h.Raw(in.raw[:0])
	if err != nil {
		return err
	}
	if h.Codec == records.CodecS2 {
		in.raw = raw[:0]
	}
	applied, err := s.node.apply(in.from, in.epoch, func() error {
		now := s.clock()
		var it records.SnapReader
		it.ResetVersion(raw, recordsVersion)
		var e records.SnapEntry
		for it.Next(&e) {
			// Holder by holder: a shared key's holders arrive one entry
			// each, with the key's limit, in any order.
			h := shard.HeldLock{Key: e.Key, Token: e.Token, Deadline: now + int64(e.Left), Ident: e.Ident, Limit: e.Limit}
			if err := s.table.RestoreHolder(&h); err != nil {
				return err
			}
			s.table.Tokens().Observe(e.Token)
			in.locks++
		}
		if err := it.Err(); err != nil {
			return err
		}
		if h.Last {
			s.table.SetSeq(int(h.Shard), h.Seq)
		}
		return nil
	})
	if err == nil && !applied {
		in.discard()
	}
	return err
}

func (in *replica) snapEnd(payload []byte) error {
	var h snapEnd
	if err := h.Decode(payload); err != nil {
		return err
	}
	if !in.syncing || h.ID != in.snapID {
		return nil
	}
	s := in.s
	// The reservation mark first, durably: once in sync, this member may be
	// promoted, and it must start above every token range the active uses
	// (DESIGN.md, "Tokens across a failover").
	applied, err := s.node.apply(in.from, in.epoch, func() error {
		s.table.Tokens().Observe(h.TokenLast)
		return s.node.recordReserved(h.Reserved)
	})
	if err != nil {
		s.log.Error("recording the active's token reservation at the snapshot's end failed: not in sync", "err", err)
		in.discard()
		return nil
	}
	if !applied {
		in.discard()
		return nil
	}
	in.syncing = false
	s.node.synced(in.from, in.epoch)
	s.stats.snapshots.Add(1)
	in.answer(appendAck(nil, ackSnapshot, h.ID))
	s.log.Info("in sync: snapshot applied", "active", s.names[in.from], "locks", in.locks, "took", time.Since(in.began))
	return nil
}
