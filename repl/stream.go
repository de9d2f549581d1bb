package repl

import (
	"bufio"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// A batch is cut batchEvery after its first record, or at once when one
// shard has buffered batchBytes/4 (issue 11 asks ≤ 1 ms or 64 KiB); it
// carries every shard's buffered records, so a burst on many shards at
// once can make one larger than batchBytes.
const (
	batchEvery = time.Millisecond
	batchBytes = 64 << 10
	snapChunk  = 64 << 10
)

// outStream collects the active's records (the table's Sink, under each
// shard's lock) into one buffer per shard, and cuts them into compressed
// batches for the streaming standbys.
type outStream struct {
	p       *Priority
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
	swapped   []int     // records taken from each shard by swap
	mayCut    []bool    // whether swap found shard i's records free to cancel out
	holdFn    func(int) // o.hold and o.unhold, bound once
	unholdFn  func(int)
	canceller records.Canceller
}

// shardBuf is one shard's buffered records. w is written by the Sink
// under the table's shard lock and swapped with spare by the flusher under
// the same lock (Table.Locked): the Sink takes no lock of its own. w
// indexes its records for the canceller. The padding keeps neighbouring
// shards' buffers, written by different event loops, off each other's
// cache lines.
type shardBuf struct {
	w, spare records.Indexed
	holds    int // snapshot dumps of this shard in progress
	dumped   bool
	_        [256 - 2*unsafe.Sizeof(records.Indexed{}) - 16]byte
}

func newOutStream(p *Priority) *outStream {
	o := &outStream{p: p, bufs: make([]shardBuf, p.table.Shards()), kick: make(chan struct{}, 1), done: make(chan struct{}),
		swapped: make([]int, p.table.Shards()), mayCut: make([]bool, p.table.Shards())}
	o.swapFn, o.holdFn, o.unholdFn = o.swap, o.hold, o.unhold
	return o
}

// sink is the table's Sink (the record's shard lock is held): keep the
// record if anyone will get it, and wake the flusher when the first record
// of a batch arrives (an idle member's flusher sleeps) or a buffer fills.
func (p *Priority) sink(r shard.Record) {
	o := p.out
	if o == nil || !o.active.Load() || o.targets.Load() == 0 {
		return
	}
	b := &o.bufs[r.Shard]
	if b.w.Add(&r) != nil {
		return
	}
	if b.w.Len() >= batchBytes/4 || (!o.pending.Load() && o.pending.CompareAndSwap(false, true)) {
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
}

// swap takes shard i's buffered records (under its lock). Records may
// cancel out only when no snapshot of the shard was cut while they were
// buffered: a grant before a cut and its release after it must both reach
// a standby that joined with that snapshot.
func (o *outStream) swap(i int) {
	b := &o.bufs[i]
	o.swapped[i] = b.w.Count()
	o.mayCut[i] = b.holds == 0 && !b.dumped
	b.dumped = false
	if o.swapped[i] > 0 {
		b.w, b.spare = b.spare, b.w
	}
}

// dumpShard dumps shard i for a snapshot (Table.DumpShard), bracketed by
// hold and unhold (under the shard's lock): the records buffered across
// the dump are sent as they are, none cancelled.
func (o *outStream) dumpShard(i int, fn func(key []byte, token uint64, deadline int64, lease uint8)) uint64 {
	o.p.table.Locked(i, o.holdFn)
	defer o.p.table.Locked(i, o.unholdFn)
	return o.p.table.DumpShard(i, fn)
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
		for _, pe := range o.p.peers {
			if pe != nil {
				pe.unstream()
			}
		}
	}
	o.retarget()
}

// retarget recounts the standbys in the stream.
func (o *outStream) retarget() {
	n := int32(0)
	for _, pe := range o.p.peers {
		if pe != nil && pe.streaming() {
			n++
		}
	}
	o.targets.Store(n)
}

// flusher cuts a batch batchEvery after the first record of a batch
// arrived, or sooner when a buffer fills; it sleeps while nothing comes.
func (o *outStream) flusher() {
	defer o.p.wg.Done()
	t := time.NewTimer(batchEvery)
	t.Stop()
	for {
		select {
		case <-o.done:
			return
		case <-o.kick:
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
		o.flushNow()
	}
}

// flushNow cuts one batch of everything buffered and queues it for every
// streaming standby.
func (o *outStream) flushNow() {
	o.flushMu.Lock()
	defer o.flushMu.Unlock()
	o.raw.Reset()
	o.canceller.Reset()
	records, cancelled := 0, 0
	for i := range o.bufs {
		o.p.table.Locked(i, o.swapFn)
		if n := o.swapped[i]; n > 0 {
			b := &o.bufs[i]
			if o.mayCut[i] {
				cancelled += o.canceller.Cut(&o.raw, uint32(i), &b.spare)
			} else {
				b.spare.AppendTo(&o.raw)
			}
			records += n
			b.spare.Reset()
		}
	}
	if records == 0 {
		return
	}
	o.seq++
	raw := o.raw.Bytes()
	frame := AppendBatch(nil, o.seq, raw)
	st := &o.p.stats
	st.batches.Add(1)
	st.records.Add(uint64(records))
	st.cancelled.Add(uint64(cancelled))
	st.rawBytes.Add(uint64(len(raw)))
	st.wireBytes.Add(uint64(len(frame)))
	for _, pe := range o.p.peers {
		if pe != nil {
			pe.enqueueBatch(frame, o.seq, records, len(raw))
		}
	}
}

func (o *outStream) close() {
	select {
	case <-o.done:
	default:
		close(o.done)
	}
}

// writeSnapshot sends the whole table to pe, shard by shard: each shard is
// dumped under its lock with the Seq it was cut at, after pe joined the
// stream, so the batches queued meanwhile continue it exactly.
func (o *outStream) writeSnapshot(w *bufio.Writer, pe *peer, deadline func()) error {
	p := o.p
	began := time.Now()
	tokens := p.table.Tokens()
	st := p.table.Stats()
	p.mu.Lock()
	epoch := p.roles.epoch
	p.mu.Unlock()
	begin := SnapBegin{Epoch: epoch, Shards: uint32(p.table.Shards()), TokenLast: tokens.Last(),
		Reserved: tokens.Limit(), Locks: uint64(st.Keys)}
	if _, err := w.Write(begin.Append(nil)); err != nil {
		return err
	}
	var (
		buf   []byte
		frame []byte
		n     int
		bad   error
	)
	for i := range p.table.Shards() {
		now := p.clock()
		buf = buf[:0]
		var chunks [][]byte
		seq := o.dumpShard(i, func(key []byte, token uint64, dl int64, lease uint8) {
			var err error
			buf, err = records.AppendSnapEntry(buf, &records.SnapEntry{Key: key, Token: token, Left: time.Duration(max(dl-now, 0)), Lease: lease})
			if err != nil && bad == nil {
				bad = err
			}
			n++
			if len(buf) >= snapChunk {
				chunks = append(chunks, append([]byte(nil), buf...))
				buf = buf[:0]
			}
		})
		if bad != nil {
			return fmt.Errorf("repl: snapshot of shard %d: %w", i, bad)
		}
		chunks = append(chunks, append([]byte(nil), buf...))
		for k, raw := range chunks {
			frame = AppendSnapShard(frame[:0], uint32(i), seq, k == len(chunks)-1, raw)
			deadline()
			if _, err := w.Write(frame); err != nil {
				return err
			}
		}
	}
	if _, err := w.Write(AppendSnapEnd(nil)); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	p.stats.snapshotsSent.Add(1)
	pe.mu.Lock()
	pe.snaps++
	pe.mu.Unlock()
	p.log.Info("snapshot sent", "member", p.cfg.Peers[pe.i], "locks", n, "took", time.Since(began))
	return nil
}

// inbound is the state of one member's link to us.
type inbound struct {
	p       *Priority
	from    int
	raw     []byte
	fx      shard.Out
	syncing bool // between SnapBegin and SnapEnd
	gap     bool // a gap was found: ignore batches until the next snapshot
	began   time.Time
	locks   int
}

// handle processes one message from member from.
func (in *inbound) handle(t MsgType, payload []byte) error {
	p := in.p
	switch t {
	case MsgHeartbeat:
		var hb Heartbeat
		if err := hb.Decode(payload); err != nil {
			return err
		}
		p.echoMu.Lock()
		p.echoes[in.from] = max(p.echoes[in.from], hb.Probe)
		p.echoMu.Unlock()
		p.heardHeartbeat(in.from, &hb)
	case MsgBatch:
		return in.batch(payload)
	case MsgReserve:
		var r Reserve
		if err := r.Decode(payload); err != nil {
			return err
		}
		if !in.fromActive() {
			return nil
		}
		// Durable here before it is acknowledged: a member that restarts
		// starts above every reservation it acknowledged.
		if err := p.dir.Reserve(r.Limit); err != nil {
			p.log.Error("recording the active's token reservation failed", "err", err)
			return nil
		}
		p.mu.Lock()
		p.reservedSeen = max(p.reservedSeen, r.Limit)
		p.mu.Unlock()
		if pe := p.peers[in.from]; pe != nil {
			pe.send(appendAck(nil, AckReserve, r.ID))
		}
	case MsgAck:
		var a Ack
		if err := a.Decode(payload); err != nil {
			return err
		}
		pe := p.peers[in.from]
		switch a.Kind {
		case AckBatch:
			pe.acked(a.Value)
		case AckReserve:
			pe.reserveAcked(a.Value)
		case AckHandoff:
			p.mu.Lock()
			if p.handoverDone != nil {
				select {
				case p.handoverDone <- a.Value:
				default:
				}
			}
			p.mu.Unlock()
		}
	case MsgNeedSnapshot:
		p.mu.Lock()
		ok := p.roles.role == RoleActive
		p.mu.Unlock()
		if ok {
			if pe := p.peers[in.from]; pe != nil {
				pe.resync()
			}
		}
	case MsgSnapBegin:
		return in.snapBegin(payload)
	case MsgSnapShard:
		return in.snapShard(payload)
	case MsgSnapEnd:
		if err := DecodeSnapEnd(payload); err != nil {
			return err
		}
		return in.snapEnd()
	case MsgHandoff:
		var h Handoff
		if err := h.Decode(payload); err != nil {
			return err
		}
		p.takeOver(in.from, &h)
	default:
		return fmt.Errorf("repl: unexpected %s", t)
	}
	return nil
}

// fromActive reports whether from is the active this member follows.
func (in *inbound) fromActive() bool {
	p := in.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roles.role == RoleStandby && p.roles.active == in.from
}

// batch applies a batch of the followed active's records.
func (in *inbound) batch(payload []byte) error {
	p := in.p
	var h Batch
	if err := h.Decode(payload); err != nil {
		return err
	}
	if in.gap || in.syncing || !in.fromActive() {
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
	now := p.clock()
	var rec shard.Record
	var it records.RecordReader
	it.Reset(raw)
	n, cancelled := 0, 0
	for it.Next(&rec) {
		if _, err := p.table.Apply(now, &rec, &in.fx); err != nil {
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
	p.stats.batches.Add(1)
	p.stats.records.Add(uint64(n))
	p.stats.cancelled.Add(uint64(cancelled))
	p.stats.rawBytes.Add(uint64(len(raw)))
	if pe := p.peers[in.from]; pe != nil {
		pe.send(appendAck(nil, AckBatch, h.Seq))
	}
	return nil
}

// lost marks this standby out of sync and asks for a snapshot.
func (in *inbound) lost(why string) {
	p := in.p
	in.gap = true
	p.mu.Lock()
	p.roles.inSync = false
	p.mu.Unlock()
	p.log.Warn("replication stream broken: asking for a snapshot", "why", why)
	if pe := p.peers[in.from]; pe != nil {
		pe.send(appendNeedSnapshot(nil, SnapGap))
	}
}

func (in *inbound) snapBegin(payload []byte) error {
	var h SnapBegin
	if err := h.Decode(payload); err != nil {
		return err
	}
	p := in.p
	if !in.fromActive() {
		return nil
	}
	if int(h.Shards) != p.table.Shards() {
		return fmt.Errorf("repl: snapshot of %d shards, this table has %d", h.Shards, p.table.Shards())
	}
	in.syncing, in.gap, in.began, in.locks = true, false, time.Now(), 0
	p.mu.Lock()
	p.roles.inSync = false
	p.reservedSeen = max(p.reservedSeen, h.Reserved)
	p.mu.Unlock()
	p.table.Reset(&in.fx)
	in.fx.Reset()
	p.table.Tokens().Observe(h.TokenLast)
	return nil
}

func (in *inbound) snapShard(payload []byte) error {
	if !in.syncing {
		return nil
	}
	p := in.p
	var h SnapShard
	if err := h.Decode(payload); err != nil {
		return err
	}
	if int(h.Shard) >= p.table.Shards() {
		return fmt.Errorf("repl: snapshot shard %d of %d", h.Shard, p.table.Shards())
	}
	raw, err := h.Raw(in.raw[:0])
	if err != nil {
		return err
	}
	now := p.clock()
	var it records.SnapReader
	it.Reset(raw)
	var e records.SnapEntry
	for it.Next(&e) {
		if err := p.table.Restore(e.Key, e.Token, now+int64(e.Left)); err != nil {
			return err
		}
		p.table.Tokens().Observe(e.Token)
		in.locks++
	}
	if err := it.Err(); err != nil {
		return err
	}
	if h.Last {
		p.table.SetSeq(int(h.Shard), h.Seq)
	}
	return nil
}

func (in *inbound) snapEnd() error {
	if !in.syncing {
		return nil
	}
	p := in.p
	in.syncing = false
	p.mu.Lock()
	if p.roles.role == RoleStandby && p.roles.active == in.from {
		p.roles.inSync = true
	}
	p.mu.Unlock()
	p.stats.snapshotsReceived.Add(1)
	p.log.Info("in sync: snapshot applied", "active", p.cfg.Peers[in.from], "locks", in.locks, "took", time.Since(in.began))
	return nil
}

// appendNeedSnapshot, appendReserve, appendHandoff and appendAck build
// control frames.
func appendNeedSnapshot(dst []byte, reason SnapReason) []byte {
	m := NeedSnapshot{Reason: reason}
	return m.Append(dst)
}

func appendReserve(dst []byte, id, limit uint64) []byte {
	m := Reserve{ID: id, Limit: limit}
	return m.Append(dst)
}

func appendHandoff(dst []byte, epoch, token, reserved uint64) []byte {
	m := Handoff{Epoch: epoch, TokenLast: token, Reserved: reserved}
	return m.Append(dst)
}

func appendAck(dst []byte, kind AckKind, v uint64) []byte {
	m := Ack{Kind: kind, Value: v}
	return m.Append(dst)
}
