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

// follower is the member's role state as its standby side needs it; the
// node implements it under its own lock.
type follower interface {
	// follows reports whether this member is a standby that follows
	// member from.
	follows(from int) bool
	// recordReserved makes a reservation of the active's durable in this
	// member's data directory and notes it as seen (a member that
	// restarts or promotes starts above every reservation it
	// acknowledged).
	recordReserved(limit uint64) error
	// desync marks this member out of sync with its active and notes the
	// reservation a snapshot carries (0: none).
	desync(reserved uint64)
	// synced marks this member in sync, if it still follows member from.
	synced(from int)
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
	s       *standby
	from    int
	raw     []byte
	fx      shard.Out
	syncing bool // between SnapBegin and SnapEnd
	gap     bool // a gap was found: ignore batches until the next snapshot
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
	if in.gap || in.syncing || !s.node.follows(in.from) {
		return nil
	}
	raw, err := h.Raw(in.raw[:0])
	if err != nil {
		return err
	}
	if h.Codec == records.CodecS2 {
		in.raw = raw[:0] // keep the grown buffer (raw data points into the frame)
	}
	if _, err := records.CheckRecords(raw); err != nil {
		return err
	}
	now := s.clock()
	var rec shard.Record
	var it records.RecordReader
	it.Reset(raw)
	n, cancelled := 0, 0
	for it.Next(&rec) {
		if _, err := s.table.Apply(now, &rec, &in.fx); err != nil {
			if errors.Is(err, shard.ErrGap) {
				in.lost("gap in the stream")
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
	if err := it.Err(); err != nil {
		return err
	}
	in.fx.Reset()
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

func (in *replica) snapBegin(payload []byte) error {
	var h snapBegin
	if err := h.Decode(payload); err != nil {
		return err
	}
	s := in.s
	if !s.node.follows(in.from) {
		return nil
	}
	if int(h.Shards) != s.table.Shards() {
		return fmt.Errorf("priority: snapshot of %d shards, this table has %d", h.Shards, s.table.Shards())
	}
	in.syncing, in.gap, in.began, in.locks = true, false, time.Now(), 0
	s.node.desync(h.Reserved)
	s.table.Reset(&in.fx)
	in.fx.Reset()
	s.table.Tokens().Observe(h.TokenLast)
	return nil
}

func (in *replica) snapShard(payload []byte) error {
	if !in.syncing {
		return nil
	}
	s := in.s
	var h snapShard
	if err := h.Decode(payload); err != nil {
		return err
	}
	if int(h.Shard) >= s.table.Shards() {
		return fmt.Errorf("priority: snapshot shard %d of %d", h.Shard, s.table.Shards())
	}
	raw, err := h.Raw(in.raw[:0])
	if err != nil {
		return err
	}
	now := s.clock()
	var it records.SnapReader
	it.ResetIdent(raw)
	var e records.SnapEntry
	for it.Next(&e) {
		if err := s.table.RestoreAs(e.Key, e.Token, now+int64(e.Left), e.Ident); err != nil {
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
}

func (in *replica) snapEnd(payload []byte) error {
	if err := decodeSnapEnd(payload); err != nil {
		return err
	}
	if !in.syncing {
		return nil
	}
	in.syncing = false
	in.s.node.synced(in.from)
	in.s.stats.snapshots.Add(1)
	in.s.log.Info("in sync: snapshot applied", "active", in.s.names[in.from], "locks", in.locks, "took", time.Since(in.began))
	return nil
}
