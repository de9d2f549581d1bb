package priority

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/priority/machine"
)

// The executor carries out the machine's reservations (machine.Reserve)
// in order, off run's goroutine: a promotion's barrier, its epoch and the
// reservation are disk writes and, on an active, the standbys'
// acknowledgements, up to a failover timeout — run keeps ticking and
// sending heartbeats meanwhile. Each result goes back to the machine
// (MsgReserved), which extends the allocator and opens the gate.

// queue is an unbounded FIFO: its producer never waits (run must not wait
// for the executor, which waits for run's inbox).
type queue[T any] struct {
	mu    sync.Mutex
	items []T
	ready chan struct{} // capacity 1: something was pushed
}

func (q *queue[T]) init() { q.ready = make(chan struct{}, 1) }

func (q *queue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop takes the first item, if any.
func (q *queue[T]) pop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var v T
	if len(q.items) == 0 {
		return v, false
	}
	v = q.items[0]
	q.items = q.items[1:]
	return v, true
}

// executor carries out reservations until Close.
func (p *node) executor() {
	defer p.wg.Done()
	for {
		r, ok := p.reserves.pop()
		if !ok {
			select {
			case <-p.quit:
				return
			case <-p.reserves.ready:
			}
			continue
		}
		if !p.tell(p.carryReserve(r)) {
			return
		}
	}
}

// carryReserve makes tokens safe as r asks: after the barrier and the
// epoch, the counter goes above r's floors, and tokens up to the counter
// (or the limit) plus r.Block are reserved.
func (p *node) carryReserve(r machine.Reserve) machine.Msg {
	if r.Barrier {
		p.applyBarrier() // nothing from the former active lands in the table from here on
	}
	if r.Epoch != 0 {
		if err := p.dir.SetEpoch(r.Epoch); err != nil {
			p.log.Error("recording the epoch failed", "epoch", r.Epoch, "err", err)
		}
	}
	tokens := p.table.Tokens()
	start := r.Start
	if r.Floor > 0 {
		start = max(start, repl.WallFloor()+uint64(r.Floor))
	}
	tokens.Observe(start)
	limit := max(tokens.Limit(), tokens.Last()) + r.Block
	msg := machine.Msg{Kind: machine.MsgReserved, Op: r.Op, Limit: limit}
	// The machine hears of the limit before any standby can report it
	// back as its mark (the inbox is one FIFO): its own reservation must
	// not move its counter (tokensHeard).
	if !p.tell(machine.Msg{Kind: machine.MsgReserving, Op: r.Op, Limit: limit}) {
		msg.Err = "stopped"
		return msg
	}
	if err := p.reserve(limit, r.Replicate); err != nil {
		msg.Err = err.Error()
	}
	msg.Token, msg.Pos = tokens.Last(), p.position()
	return msg
}

// applyBarrier waits until no frame of an active is being applied (apply):
// a promotion calls it after the machine changed the role (and run
// published it), so every later apply sees the change and refuses.
func (p *node) applyBarrier() {
	p.applyMu.Lock()
	//lint:ignore SA2001 a barrier: what it orders is the role change made before it
	p.applyMu.Unlock()
}

// writeMark makes limit durable as the data dir's reservation mark. The
// executor and a standby's reader both reserve: one write at a time, and
// never one below the mark already written (a lower limit is durable
// already).
func (p *node) writeMark(limit uint64) error {
	p.markMu.Lock()
	defer p.markMu.Unlock()
	if limit <= p.diskMark.Load() {
		return nil
	}
	if err := p.dir.Reserve(limit); err != nil {
		return err
	}
	p.diskMark.Store(limit)
	return nil
}

// reserve makes tokens up to limit safe: durable in this member's data
// dir, then, when replicate (an active), acknowledged by every standby in
// the stream (PROTOCOL.md §6.2: a promoted standby starts above every
// reservation it acknowledged). A standby that does not acknowledge within
// the failover timeout is sent a new snapshot: until then it is not in
// sync.
func (p *node) reserve(limit uint64, replicate bool) error {
	if err := p.writeMark(limit); err != nil {
		return err
	}
	if !replicate {
		return nil
	}
	// From here a snapshot that ends carries limit (its SnapEnd reads the
	// mark after this): a standby in a snapshot is not waited for.
	raise(&p.resMark, limit)
	id := p.resID.Add(1)
	var waits []int
	for i, pe := range p.link.peers {
		if pe != nil && p.out.streaming(i) && !p.out.inSnapshot(i) {
			pe.send(appendReserve(nil, id, limit))
			waits = append(waits, i)
		}
	}
	deadline := time.Now().Add(p.cfg.FailoverTimeout)
	for _, i := range waits {
		if !p.out.waitReserveAck(i, id, deadline) {
			p.log.Warn("a standby did not acknowledge a token reservation: resyncing it", "peer", p.cfg.Peers[i])
			p.out.resync(i)
		}
	}
	return nil
}

// raise makes v at least x.
func raise(v *atomic.Uint64, x uint64) {
	for m := v.Load(); m < x && !v.CompareAndSwap(m, x); m = v.Load() {
	}
}
