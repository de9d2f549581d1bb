package priority

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// The outbound direction of the stream: what the active sends its
// standbys (batches of records, snapshots) and what it keeps of each of
// them (in the stream or not, batches not acknowledged, reservation
// acks). The inbound direction is standby.go.

// A batch is cut batchEvery after its first record, or at once when one
// shard has buffered batchBytes/4 (the replication lag is to stay within
// 1 ms or 64 KiB, plus holdOver for a change that waits a cut behind a
// young grant); it carries every shard's buffered records, so a burst on
// many shards at once can make one larger than batchBytes.
const (
	batchEvery = time.Millisecond
	batchBytes = 64 << 10
	snapChunk  = 64 << 10
	// snapWindow bounds what a snapshot sends ahead of the standby's
	// SnapAck: at most snapWindow × snapChunk raw bytes (512 KiB) of a
	// snapshot are in flight, whatever the table's size. A frame counts its
	// raw bytes, at least snapMinWeight: the shards of a small table, a
	// frame each, go in one window rather than one round trip per eight
	// (on a slow link, each round trip is seconds).
	snapWindow    = 8
	snapMinWeight = 1 << 10
	// snapRecheck bounds a wait for the window: the sender looks again at
	// whether its snapshot is still wanted at least this often.
	snapRecheck = 50 * time.Millisecond
	maxQueue    = 64 << 20 // bytes queued for one standby before it is resynced instead
	maxUnacked  = 4096     // batches tracked for lag figures
	// maxHeld bounds the grants one shard holds back for the next cut
	// (shard.Config.Defer; 32 bytes each): past it grants go to the Sink
	// as they happen, and a quarter of it wakes the flusher at once, as a
	// quarter-full buffer does.
	maxHeld = 4096
	// holdOver is how young a grant still held at a cut may be and stay
	// for the next cut (Table.LockedCut): most of a pipelined client's
	// grants end within it, and each that does costs the stream no record
	// (one still held at the cut costs its grant's record and, in the next
	// batch, its end's). A change numbered after such a grant in its shard
	// waits with it, for one cut at most: a change made more than holdOver
	// before a cut goes in it (unless a renew ties it to a younger grant),
	// so the longest wait on the active goes from about batchEvery to
	// batchEvery+holdOver, and never past the next cut but one.
	holdOver = batchEvery / 2
)

// outStream collects the active's records (the table's Sink, under each
// shard's lock) into one buffer per shard, and cuts them into compressed
// batches for the streaming standbys.
type outStream struct {
	table   *shard.Table
	clock   func() int64
	log     *slog.Logger
	names   []string              // the members' client addresses, for logs
	epoch   func() (uint64, bool) // this member's epoch and whether it is the active, for a snapshot
	mark    func() uint64         // the highest token reservation made durable, for a snapshot's end
	links   []*peer               // the link to each member, nil at this one
	members []target              // by member index

	active  atomic.Bool  // this member is the active
	targets atomic.Int32 // standbys in the stream: records are kept only when > 0
	pending atomic.Bool  // records are buffered and the flusher was told
	bufs    []shardBuf
	kick    chan struct{}
	done    chan struct{}

	flushMu   sync.Mutex // one batch cut at a time (flusher, flushNow)
	seq       uint64     // batch number, guarded by flushMu
	raw       records.BatchWriter
	swapFn    func(int) // o.swap, bound once (a method value allocates)
	takeFn    func(*shard.Record)
	mayCut    []bool    // whether swap found shard i's records free to cancel out
	holdFn    func(int) // o.hold and o.unhold, bound once
	unholdFn  func(int)
	canceller records.Canceller

	stats flow // what was sent

	// carry is what each shard's last cut kept for the next one (flushMu):
	// from the Seq the table kept on (Table.LockedCut), what its Sink had
	// buffered and the skips handed over.
	carry    []carried
	keptCuts uint64 // cuts that kept anything (flushMu), for tests
}

// carried is what a cut kept of one shard for the next (flushMu held).
type carried struct {
	recs   records.Indexed
	skips  []uint64
	mayCut bool // no snapshot of the shard was cut while recs were buffered
}

// shardBuf is one shard's buffered records. w is written by the Sink
// under the table's shard lock and swapped with spare by the flusher under
// the same lock (Table.LockedTake): the Sink takes no lock of its own. d
// and skips are what the shard held back (shard.Config.Defer) and handed
// over when the flusher or a snapshot took it: the records of grants
// still held, and the Seqs of grants that ended within the batch and of
// their ends; they are swapped with dspare and skipSpare as w is. The
// padding keeps neighbouring shards' buffers, written by different event
// loops, off each other's cache lines.
type shardBuf struct {
	w, spare         records.Indexed
	d, dspare        records.Indexed
	skips, skipSpare []uint64
	holds            int // snapshot dumps of this shard in progress
	dumped           bool
	_                [320 - 4*unsafe.Sizeof(records.Indexed{}) - 2*unsafe.Sizeof([]uint64(nil)) - 16]byte
}

// target is what the active keeps of one standby (under mu; a target's
// lock is taken before its peer's, never after).
type target struct {
	mu       sync.Mutex
	stream   bool      // gets the active's batches
	pending  bool      // a snapshot is queued on the link and not begun
	snapping bool      // the link's writer is sending it a snapshot
	synced   time.Time // when the last snapshot to it ended (or a resync began)
	unacked  []sentBatch
	resAck   uint64
	resCond  chan struct{} // closed and replaced on each reserve ack

	// snapGen numbers the snapshots asked for: every resync (or link that
	// comes back) raises it, and a snapshot of an older number stops at its
	// next frame. It is the snapshot's ID on the wire.
	snapGen  uint64
	snapSent uint64        // SnapShard frames of snapshot snapGen sent
	snapAck  uint64        // … and acknowledged (SnapAck)
	snapCum  []int         // raw bytes (weighted, snapMinWeight at least) of the first k+1 frames sent
	snapCond chan struct{} // closed and replaced on each SnapAck and when snapGen moves
	// endGen is the snapshot whose SnapEnd was last sent, endEpoch the
	// epoch it was sent at: its Ack(snapshot) says the standby follows
	// this member at that epoch, in sync (snapshotEnded).
	endGen   uint64
	endEpoch uint64
}

// sentBatch is a batch sent to a standby and not yet acknowledged.
type sentBatch struct {
	seq     uint64
	records int
	bytes   int
	at      time.Time
}

// newOutStream returns a stream that is not attached to a table yet: its
// Sink keeps nothing until attach and setActive. epoch reports this
// member's epoch and whether it is the active, mark the highest token
// reservation it has made durable (both read by snapshots).
func newOutStream(names []string, log *slog.Logger, epoch func() (uint64, bool), mark func() uint64) *outStream {
	o := &outStream{names: names, log: log, epoch: epoch, mark: mark, members: make([]target, len(names)),
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	for i := range o.members {
		o.members[i].resCond = make(chan struct{})
		o.members[i].snapCond = make(chan struct{})
	}
	o.swapFn, o.holdFn, o.unholdFn, o.takeFn = o.swap, o.hold, o.unhold, o.take
	return o
}

// attach gives the stream its table and the links to the members (nil for
// a stream that sends nowhere: tests).
func (o *outStream) attach(table *shard.Table, clock func() int64, links []*peer) {
	if links == nil {
		links = make([]*peer, len(o.members))
	}
	o.table, o.clock, o.links = table, clock, links
	o.bufs = make([]shardBuf, table.Shards())
	o.mayCut = make([]bool, table.Shards())
	o.carry = make([]carried, table.Shards())
}

// sink is the table's SinkRef (the record's shard lock is held; r is the
// table's and valid only during the call): keep the
// record if anyone will get it, and wake the flusher when the first record
// of a batch arrives (an idle member's flusher sleeps) or a buffer fills.
func (o *outStream) sink(r *shard.Record) {
	if !o.active.Load() || o.targets.Load() == 0 {
		return
	}
	b := &o.bufs[r.Shard]
	if b.w.Add(r) != nil {
		return
	}
	o.wake(b.w.Len() >= batchBytes/4)
}

// wake wakes the flusher if the record just kept is the first of a batch
// (an idle member's flusher sleeps) or full says a shard has buffered
// enough to cut at once. It never blocks (a shard lock is held).
func (o *outStream) wake(full bool) {
	if full || (!o.pending.Load() && o.pending.CompareAndSwap(false, true)) {
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
}

// deferGrant is the table's Defer (under the shard's lock): whether to
// hold back an exclusive grant of shard i, which holds back pending
// already, for the next cut. Only while records are kept, and never
// across a snapshot of the shard (from its dump to the next cut): a grant
// the dump shows held and its end after the dump must both reach the
// standby that joins with it, so the end must not cancel the grant out.
func (o *outStream) deferGrant(i uint32, pending int) bool {
	if !o.active.Load() || o.targets.Load() == 0 || pending >= maxHeld {
		return false
	}
	if b := &o.bufs[i]; b.holds != 0 || b.dumped {
		return false
	}
	o.wake(pending+1 >= maxHeld/4)
	return true
}

// take receives what shard r.Shard held back (Table.LockedTake, under the
// shard's lock): a record of a grant still held, or of its renew. A record
// the format cannot carry is dropped: its Seq is a gap, and a standby that
// meets it resynchronises.
func (o *outStream) take(r *shard.Record) { _ = o.bufs[r.Shard].d.Add(r) }

// swap takes shard i's buffered records (under its lock, after the table
// handed over what it held back). Records may cancel out only when no
// snapshot of the shard was cut while they were buffered: a grant before
// a cut and its release after it must both reach a standby that joined
// with that snapshot.
func (o *outStream) swap(i int) {
	b := &o.bufs[i]
	o.mayCut[i] = b.holds == 0 && !b.dumped
	b.dumped = false
	if b.w.Count()+b.d.Count()+len(b.skips) > 0 {
		b.w, b.spare = b.spare, b.w
		b.d, b.dspare = b.dspare, b.d
		b.skips, b.skipSpare = b.skipSpare, b.skips
	}
}

// dumpShard dumps shard i for a snapshot (Table.Dump: every held key with
// its grant's identity), bracketed by hold and unhold (under the shard's
// lock): the records buffered across the dump are sent as they are, none
// cancelled, and hold first takes what the shard held back, so that no
// end after the dump cancels a grant before it.
func (o *outStream) dumpShard(i int, fn func(h *shard.HeldLock)) uint64 {
	o.table.LockedTake(i, o.takeFn, &o.bufs[i].skips, o.holdFn)
	defer o.table.Locked(i, o.unholdFn)
	return o.table.Dump(i, fn)
}

func (o *outStream) hold(i int) { o.bufs[i].holds++ }

func (o *outStream) unhold(i int) {
	b := &o.bufs[i]
	b.holds--
	b.dumped = true
}

// setActive starts or stops collecting records; a member that stops being
// the active takes every standby out of its stream.
func (o *outStream) setActive(on bool) {
	o.active.Store(on)
	if !on {
		for i := range o.members {
			if o.links[i] != nil {
				o.unstream(i)
			}
		}
	}
	o.retarget()
}

// linkChanged is the link's news of member i's connection: a standby in
// the stream whose link comes back gets a snapshot before anything else
// (what was in flight is lost); one whose link went down has nothing
// unacknowledged any more.
func (o *outStream) linkChanged(i int, up bool) {
	t := &o.members[i]
	t.mu.Lock()
	if up && t.stream {
		t.pending = true
		t.newSnapshot()
		o.links[i].putFirst(o.snapshotTo(i))
	}
	if !up {
		t.unacked = nil
	}
	t.mu.Unlock()
	o.retarget()
}

// newSnapshot starts a new snapshot generation: one in progress stops at
// its next frame (t.mu held).
func (t *target) newSnapshot() {
	t.snapGen++
	t.snapSent, t.snapAck = 0, 0
	t.snapCum = t.snapCum[:0]
	close(t.snapCond)
	t.snapCond = make(chan struct{})
}

// inSnapshot reports whether member i is being sent a snapshot (queued or
// begun): it is not in sync, and learns the reservation mark at the
// snapshot's end instead of from Reserve frames.
func (o *outStream) inSnapshot(i int) bool {
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending || t.snapping
}

// snapshotting is the set of members (a bit each) being sent a snapshot,
// queued or begun: whatever their last heartbeat says, their tables are
// being replaced, so none is a successor (a handover offered to one is
// refused, or waits behind the snapshot on the link).
func (o *outStream) snapshotting() uint64 {
	var set uint64
	for i := range o.members {
		if o.inSnapshot(i) {
			set |= 1 << i
		}
	}
	return set
}

// streaming reports whether member i gets this active's batches.
func (o *outStream) streaming(i int) bool {
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stream && o.links[i].connected()
}

// retarget recounts the standbys in the stream.
func (o *outStream) retarget() {
	n := int32(0)
	for i := range o.members {
		if o.links[i] != nil && o.streaming(i) {
			n++
		}
	}
	o.targets.Store(n)
}

// enqueue queues a batch frame for member i if it streams; a standby too
// far behind is dropped from the stream and resynced.
func (o *outStream) enqueue(i int, frame []byte, seq uint64, records, raw int) {
	t := &o.members[i]
	t.mu.Lock()
	if !t.stream {
		t.mu.Unlock()
		return
	}
	queued, full := o.links[i].sendWithin(frame, maxQueue)
	if queued && len(t.unacked) < maxUnacked {
		t.unacked = append(t.unacked, sentBatch{seq: seq, records: records, bytes: raw, at: time.Now()})
	}
	t.mu.Unlock()
	if full {
		o.log.Warn("a standby fell too far behind: resyncing it", "peer", o.names[i])
		o.resync(i)
	}
}

// resync puts member i in the stream with a fresh snapshot first:
// batches queued from here on follow the snapshot, which is cut after
// this point.
func (o *outStream) resync(i int) {
	t := &o.members[i]
	t.mu.Lock()
	t.synced = time.Now()
	t.stream, t.pending = true, true
	t.unacked = nil
	t.newSnapshot()
	o.links[i].restart(o.snapshotTo(i))
	t.mu.Unlock()
	o.retarget()
}

// resyncIfStale resyncs a standby that follows this active but is not in
// the stream, or has been out of sync for longer than after since its last
// resync began.
func (o *outStream) resyncIfStale(i int, inSync bool, after time.Duration) {
	t := &o.members[i]
	t.mu.Lock()
	stale := !t.stream || (!inSync && !t.pending && !t.snapping && time.Since(t.synced) > after)
	t.mu.Unlock()
	if stale && o.links[i].connected() {
		o.resync(i)
	}
}

// unstream takes member i out of the stream.
func (o *outStream) unstream(i int) {
	t := &o.members[i]
	t.mu.Lock()
	t.stream, t.pending = false, false
	t.unacked = nil
	t.newSnapshot()
	t.mu.Unlock()
	o.retarget()
}

// acked records member i's acknowledgement of batch seq.
func (o *outStream) acked(i int, seq uint64) {
	t := &o.members[i]
	t.mu.Lock()
	k := 0
	for k < len(t.unacked) && t.unacked[k].seq <= seq {
		k++
	}
	t.unacked = t.unacked[k:]
	t.mu.Unlock()
}

// snapshotEnded reports the epoch snapshot id was sent to member i at, when
// id is the newest snapshot of i and its SnapEnd was sent: an
// Ack(snapshot) of id means i applied all of it as a standby of this
// member at that epoch (a standby applies only the snapshot of the active
// it follows, at the epoch it follows it).
func (o *outStream) snapshotEnded(i int, id uint64) (uint64, bool) {
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	if id != t.snapGen || id != t.endGen {
		return 0, false
	}
	return t.endEpoch, true
}

// snapAcked records member i's progress through snapshot id.
func (o *outStream) snapAcked(i int, id, frames uint64) {
	t := &o.members[i]
	t.mu.Lock()
	if id == t.snapGen && frames > t.snapAck {
		t.snapAck = min(frames, t.snapSent)
		close(t.snapCond)
		t.snapCond = make(chan struct{})
	}
	t.mu.Unlock()
}

// reserveAcked records member i's acknowledgement of reservation id.
func (o *outStream) reserveAcked(i int, id uint64) {
	t := &o.members[i]
	t.mu.Lock()
	if id > t.resAck {
		t.resAck = id
		close(t.resCond)
		t.resCond = make(chan struct{})
	}
	t.mu.Unlock()
}

// waitReserveAck waits until member i acknowledged reservation id, it left
// the stream or is in a snapshot, or deadline.
func (o *outStream) waitReserveAck(i int, id uint64, deadline time.Time) bool {
	t := &o.members[i]
	for {
		t.mu.Lock()
		// A member that was sent a snapshot meanwhile learns the
		// reservation at its end (SnapEnd carries the mark).
		ok, gone, c := t.resAck >= id, !t.stream || t.pending || t.snapping || !o.links[i].connected(), t.resCond
		t.mu.Unlock()
		if ok || gone {
			return ok || gone
		}
		d := time.Until(deadline)
		if d <= 0 {
			return false
		}
		select {
		case <-c:
		case <-time.After(d):
		case <-o.done:
			return false
		}
	}
}

// lag is the age of the oldest batch member i has not acknowledged, 0
// when it does not stream or has acknowledged everything.
func (o *outStream) lag(i int) time.Duration {
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stream || len(t.unacked) == 0 {
		return 0
	}
	return time.Since(t.unacked[0].at)
}

// status fills the active's view of member i's replication lag.
func (o *outStream) status(i int, m *repl.Member) {
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stream {
		return
	}
	for _, b := range t.unacked {
		m.LagRecords += uint64(b.records)
		m.LagBytes += uint64(b.bytes)
	}
	if len(t.unacked) > 0 {
		m.LagSeconds = time.Since(t.unacked[0].at).Seconds()
	}
}

// flusher cuts a batch batchEvery after the first record of a batch
// arrived, or sooner when a buffer fills; it sleeps while nothing comes,
// unless the last cut kept changes for the next. Its cuts keep the grants
// younger than holdOver that are still held (cut). It returns once the
// stream is closed.
func (o *outStream) flusher() {
	t := time.NewTimer(batchEvery)
	t.Stop()
	kept := false
	for {
		if kept {
			// The next cut is already due: a kick now is only news of a
			// batch's first record, sent before pending was set again.
			select {
			case <-o.kick:
			default:
			}
		} else {
			select {
			case <-o.done:
				return
			case <-o.kick:
			}
		}
		t.Reset(batchEvery)
		select {
		case <-o.done:
			t.Stop()
			return
		case <-t.C:
		case <-o.kick: // a buffer filled
			t.Stop()
		}
		o.pending.Store(false) // records from here on wake the flusher again
		if kept = o.cut(o.clock() - int64(holdOver)); kept {
			// The next cut is due anyway: records from here on wake the
			// flusher only when a buffer fills.
			o.pending.Store(true)
		}
	}
}

// flushNow cuts one batch of everything buffered and held back, and
// queues it for every streaming standby.
func (o *outStream) flushNow() { o.cutBatch(0, true) }

// cut cuts one batch, keeping for the next the grants made at or after
// since that are still held, and what is numbered after them in their
// shard; it reports whether it kept anything.
func (o *outStream) cut(since int64) bool { return o.cutBatch(since, false) }

func (o *outStream) cutBatch(since int64, all bool) (kept bool) {
	o.flushMu.Lock()
	defer o.flushMu.Unlock()
	o.raw.Reset()
	records, cancelled := 0, 0
	for i := range o.bufs {
		n, c, k := o.cutShard(i, &o.raw, since, all)
		records, cancelled, kept = records+n, cancelled+c, kept || k
	}
	if kept {
		o.keptCuts++
	}
	if records == 0 {
		return kept
	}
	o.seq++
	raw := o.raw.Bytes()
	frame := appendBatch(nil, o.seq, raw)
	st := &o.stats
	st.batches.Add(1)
	st.records.Add(uint64(records))
	st.cancelled.Add(uint64(cancelled))
	st.rawBytes.Add(uint64(len(raw)))
	st.wireBytes.Add(uint64(len(frame)))
	for i := range o.members {
		if o.links[i] != nil {
			o.enqueue(i, frame, o.seq, records, len(raw))
		}
	}
	return kept
}

// cutShard appends shard i's part of a batch to dst (flushMu held): what
// the last cut kept, what the shard held back and what its Sink buffered,
// merged in Seq order and with what cancelled out as skips. Unless all,
// it keeps for the next cut what the table kept on from (Table.LockedCut:
// grants made at or after since and still held). It returns the number of
// records the part stands for, how many of them were taken out, and
// whether it kept anything.
func (o *outStream) cutShard(i int, dst *records.BatchWriter, since int64, all bool) (n, cancelled int, kept bool) {
	var keep uint64
	b, c := &o.bufs[i], &o.carry[i]
	if all {
		o.table.LockedTake(i, o.takeFn, &b.skips, o.swapFn)
	} else {
		keep = o.table.LockedCut(i, since, o.takeFn, &b.skips, o.swapFn)
	}
	// swap left the shard's records in spare, dspare and skipSpare (or
	// them empty).
	mayCut := o.mayCut[i]
	if c.recs.Count() > 0 || len(c.skips) > 0 {
		// What the last cut kept goes first: its Seqs are all below those
		// buffered since.
		mayCut = mayCut && c.mayCut
		c.recs.AppendIndexed(&b.spare)
		b.spare, c.recs = c.recs, b.spare
		c.recs.Reset()
		b.skipSpare = append(b.skipSpare, c.skips...)
		c.skips = c.skips[:0]
	}
	if keep != 0 {
		b.spare.SplitFrom(keep, &c.recs)
		k := 0
		for _, q := range b.skipSpare {
			if q >= keep {
				c.skips = append(c.skips, q)
			} else {
				b.skipSpare[k] = q
				k++
			}
		}
		b.skipSpare = b.skipSpare[:k]
		c.mayCut = mayCut
		kept = true
	}
	if n = b.spare.Count() + b.dspare.Count() + len(b.skipSpare); n > 0 {
		cancelled = o.canceller.CutMerged(dst, uint32(i), &b.spare, &b.dspare, b.skipSpare, mayCut)
	}
	b.spare.Reset()
	b.dspare.Reset()
	b.skipSpare = b.skipSpare[:0]
	return n, cancelled, kept
}

func (o *outStream) close() {
	select {
	case <-o.done:
	default:
		close(o.done)
	}
}

// snapshotTo is the snapshot for member i as its link's writer sends it:
// cut when the writer reaches it, skipped if i left the stream meanwhile.
func (o *outStream) snapshotTo(i int) outItem {
	return outItem{write: func(w *itemWriter) error {
		t := &o.members[i]
		t.mu.Lock()
		if !t.pending {
			t.mu.Unlock()
			return nil
		}
		t.pending, t.snapping = false, true
		gen := t.snapGen
		t.mu.Unlock()
		err := o.writeSnapshot(w, i, gen)
		t.mu.Lock()
		if t.snapGen == gen {
			t.snapping = false
		}
		t.mu.Unlock()
		return err
	}}
}

// snapshotWanted reports whether snapshot gen of member i should go on:
// this member is still the active at epoch and i still wants that
// snapshot. A snapshot that is no longer wanted stops where it is; the
// standby never counts one without its SnapEnd (and discards one whose
// sender is no longer its active at that epoch).
func (o *outStream) snapshotWanted(i int, gen, epoch uint64) (bool, chan struct{}, int) {
	// The role, not o.active: a member that just promoted sends snapshots
	// before its stream opens (its table changes only once it serves,
	// after setActive).
	if e, active := o.epoch(); !active || e != epoch {
		return false, nil, 0
	}
	t := &o.members[i]
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.snapGen == gen && t.stream, t.snapCond, t.inFlight()
}

// inFlight is the weight of the frames of the current snapshot sent and
// not acknowledged yet (t.mu held).
func (t *target) inFlight() int {
	at := func(k uint64) int {
		if k == 0 || int(k) > len(t.snapCum) {
			return 0
		}
		return t.snapCum[k-1]
	}
	if t.snapSent == 0 {
		return 0
	}
	return at(t.snapSent) - at(t.snapAck)
}

// snapWeight is what a SnapShard frame of raw bytes counts in the window.
func snapWeight(raw int) int { return max(raw, snapMinWeight) }

// windowOpen reports whether a SnapShard frame of raw bytes may be sent
// with inFlight unacknowledged: one frame always may.
func windowOpen(inFlight, raw int) bool {
	return inFlight == 0 || inFlight+snapWeight(raw) <= snapWindow*snapChunk
}

// snapFrameSent counts a SnapShard frame of raw bytes of the current
// snapshot as sent (t.mu held).
func (t *target) snapFrameSent(raw int) {
	prev := 0
	if len(t.snapCum) > 0 {
		prev = t.snapCum[len(t.snapCum)-1]
	}
	t.snapCum = append(t.snapCum, prev+snapWeight(raw))
	t.snapSent++
}

// writeSnapshot sends the whole table to member i as snapshot gen, shard by
// shard: each shard is dumped under its lock with the Seq it was cut at,
// after i joined the stream, so the batches queued meanwhile continue it
// exactly. It sends at most snapWindow frames ahead of i's SnapAck, and the
// heartbeats go on between its frames and while it waits (itemWriter), so
// neither its size nor the standby's speed can make this member look silent
// or fill memory: what it holds is one shard's entries (the table's size
// over its shard count) and the window. It stops, without a SnapEnd, once
// the snapshot is no longer wanted (snapshotWanted).
func (o *outStream) writeSnapshot(w *itemWriter, i int, gen uint64) error {
	began := time.Now()
	epoch, _ := o.epoch()
	if ok, _, _ := o.snapshotWanted(i, gen, epoch); !ok {
		return nil
	}
	tokens := o.table.Tokens()
	st := o.table.Stats()
	begin := snapBegin{ID: gen, Epoch: epoch, Shards: uint32(o.table.Shards()), TokenLast: tokens.Last(),
		Reserved: max(tokens.Limit(), o.mark()), Locks: uint64(st.Keys)}
	if err := w.frame(begin.Append(nil)); err != nil {
		return err
	}
	t := &o.members[i]
	var (
		buf   []byte // one shard's entries
		cuts  []int  // where its frames end in buf
		frame []byte
		n     int
		bad   error
	)
	stopped := func(why string) error {
		o.log.Info("snapshot stopped: "+why, "peer", o.names[i], "locks_sent", n, "took", time.Since(began))
		return nil
	}
	for s := range o.table.Shards() {
		if ok, _, _ := o.snapshotWanted(i, gen, epoch); !ok {
			return stopped("no longer wanted")
		}
		now := o.clock()
		buf, cuts = buf[:0], cuts[:0]
		last := 0
		// The dump runs beside the writer, which keeps the heartbeats
		// going meanwhile: a shard of any size takes its time under its
		// lock, never out of this member's liveness.
		var seq uint64
		dumped := make(chan struct{})
		go func() {
			defer close(dumped)
			seq = o.dumpShard(s, func(h *shard.HeldLock) {
				var err error
				// One entry per holder, with its key's limit: the standby
				// rebuilds a shared key holder by holder (RestoreHolder).
				buf, err = records.AppendSnapEntryVersion(buf, &records.SnapEntry{Key: h.Key, Token: h.Token,
					Left: time.Duration(max(h.Deadline-now, 0)), Lease: h.Lease, Ident: h.Ident, Limit: h.Limit}, recordsVersion)
				if err != nil && bad == nil {
					bad = err
				}
				n++
				if len(buf)-last >= snapChunk {
					last = len(buf)
					cuts = append(cuts, last)
				}
			})
		}()
		if err := w.waitFor(dumped); err != nil {
			return err
		}
		if bad != nil {
			return fmt.Errorf("priority: snapshot of shard %d: %w", s, bad)
		}
		if len(cuts) == 0 || cuts[len(cuts)-1] != len(buf) {
			cuts = append(cuts, len(buf))
		}
		from := 0
		for k, to := range cuts {
			for {
				ok, ready, inFlight := o.snapshotWanted(i, gen, epoch)
				if !ok {
					return stopped("no longer wanted")
				}
				if windowOpen(inFlight, to-from) {
					break
				}
				if err := w.wait(ready, snapRecheck); err != nil {
					return err
				}
			}
			frame = appendSnapShard(frame[:0], uint32(s), seq, k == len(cuts)-1, buf[from:to])
			t.mu.Lock()
			if t.snapGen == gen {
				t.snapFrameSent(to - from) // before the frame: its SnapAck may be back before this returns
			}
			t.mu.Unlock()
			if err := w.frame(frame); err != nil {
				return err
			}
			from = to
		}
	}
	// The end: from here on every reservation this member makes waits for
	// i's acknowledgement (reserve skips a member only while it is in a
	// snapshot), and every one made before is at most the mark read here.
	// Checked after the last dump: had this member stepped down (and reset
	// its table) before a dump, it would know it here.
	if e, active := o.epoch(); !active || e != epoch {
		return stopped("no longer the active")
	}
	t.mu.Lock()
	if t.snapGen != gen || !t.stream {
		t.mu.Unlock()
		return stopped("no longer wanted")
	}
	end := snapEnd{ID: gen, TokenLast: tokens.Last(), Reserved: max(tokens.Limit(), o.mark())}
	t.snapping, t.synced = false, time.Now()
	t.endGen, t.endEpoch = gen, epoch
	t.mu.Unlock()
	if err := w.frame(end.Append(nil)); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	o.stats.snapshots.Add(1)
	o.log.Info("snapshot sent", "peer", o.names[i], "locks", n, "took", time.Since(began))
	return nil
}

// flow counts what one direction of the stream carried: the batches an
// active sent or a standby applied, their changes (a skip record counts
// as the records it stands for), the changes that cancelled out, their
// raw and wire bytes, and the snapshots.
type flow struct {
	batches, records, cancelled, rawBytes, wireBytes, snapshots atomic.Uint64
}
