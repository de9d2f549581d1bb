package priority

import (
	"fmt"

	"github.com/lockd-dev/lockd/repl/priority/machine"
)

// What arrives on the member link: a reader goroutine per inbound
// connection decodes each frame and hands it to the part of this member
// it is for — the standby side (batches, snapshots, reservations: applied
// on the reader, under applyMu), the outbound stream (acknowledgements),
// or the machine (everything that decides, through run's inbox). The
// standby side reads the machine's published view; it never decides.

// accepted is the handler of a connection from member from (linkEvents):
// every message it carries goes to the part of this member it is for. The
// machine learns the member's own entry and whether its --peers differs
// from this member's (peers.go).
func (p *node) accepted(from int, pm peerMap) func(t msgType, payload []byte) error {
	p.tell(machine.Msg{Kind: machine.MsgJoined, From: from, Name: pm.name, Differs: pm.differs})
	in := p.standby.from(from)
	return func(t msgType, payload []byte) error { return p.receive(in, from, &pm, t, payload) }
}

// receive processes one message from member from, on its connection's
// reader goroutine.
func (p *node) receive(in *replica, from int, pm *peerMap, t msgType, payload []byte) error {
	now := p.clock()
	p.busySince[from].Store(now)
	defer p.busySince[from].Store(0)
	if last := p.heardAt[from].Load(); t != msgHeartbeat && (last == 0 || now-last >= p.timeout()/20) {
		// Any frame shows the sender is live (PROTOCOL.md §6.1: heard from
		// within the failover timeout), whatever is queued before its next
		// heartbeat: a snapshot's size must not decide liveness. Once every
		// twentieth of the timeout is enough for that, and keeps run's
		// inbox free of a message per batch and per acknowledgement.
		p.heardAt[from].Store(now)
		p.tell(machine.Msg{Kind: machine.MsgHeard, From: from})
	}
	switch t {
	case msgHeartbeat:
		var hb heartbeat
		if err := hb.Decode(payload); err != nil {
			return err
		}
		p.tell(machine.Msg{Kind: machine.MsgHeartbeat, From: from, HB: machine.Heartbeat{Epoch: hb.Epoch, Role: hb.Role,
			Active: pm.index(hb.Active), InSync: hb.InSync, Held: hb.Held, Serving: hb.Serving, Probe: hb.Probe, Echo: hb.Echo,
			TokenLast: hb.TokenLast, Reserved: hb.Reserved, StoredEpoch: hb.StoredEpoch, LagNS: hb.LagNS, Mark: hb.Mark,
			Pos: hb.Pos, Verdict: hb.Verdict, Lineage: machineLineage(&hb.Lineage, pm), Root: hb.Root}})
	case msgBatch:
		return in.batch(payload)
	case msgReserve:
		return in.reserve(payload)
	case msgSnapBegin:
		return in.snapBegin(payload)
	case msgSnapShard:
		return in.snapShard(payload)
	case msgSnapEnd:
		return in.snapEnd(payload)
	case msgAck:
		var a ack
		if err := a.Decode(payload); err != nil {
			return err
		}
		switch a.Kind {
		case ackBatch:
			p.out.acked(from, a.Value)
		case ackReserve:
			p.out.reserveAcked(from, a.Value)
		case ackSnapshot:
			// The standby applied the snapshot: in sync from now, before
			// its next heartbeat says so (a SIGTERM meanwhile hands over
			// to it rather than shutting down as a single node).
			if e, ok := p.out.snapshotEnded(from, a.Value); ok {
				p.tell(machine.Msg{Kind: machine.MsgSnapshotAcked, From: from, Epoch: e})
			}
		case ackHandoff, ackRefused:
			p.tell(machine.Msg{Kind: machine.MsgAnswer, From: from, Epoch: a.Value, Taken: a.Kind == ackHandoff})
		}
	case msgSnapAck:
		var a snapAck
		if err := a.Decode(payload); err != nil {
			return err
		}
		p.out.snapAcked(from, a.ID, a.Frames)
	case msgNeedSnapshot:
		var n needSnapshot
		if err := n.Decode(payload); err != nil {
			return err
		}
		p.tell(machine.Msg{Kind: machine.MsgNeedSnapshot, From: from})
	case msgHandoff:
		var h handoff
		if err := h.Decode(payload); err != nil {
			return err
		}
		p.tell(machine.Msg{Kind: machine.MsgHandoff, From: from, Epoch: h.Epoch, Token: h.TokenLast, Limit: h.Reserved,
			Lineage: machineLineage(&h.Lineage, pm), Root: h.Root})
	case msgHandoffAbort:
		var h handoffAbort
		if err := h.Decode(payload); err != nil {
			return err
		}
		p.tell(machine.Msg{Kind: machine.MsgHandoffAbort, From: from, Epoch: h.Epoch})
	default:
		return fmt.Errorf("priority: unexpected %s", t)
	}
	return nil
}

// The standby side's view of the member (follower).

// follows is true while this member is a standby of member from.
func (p *node) follows(from int) bool {
	v := p.view.Load()
	return v.Role == machine.RoleStandby && v.Active == from
}

// apply runs fn under the apply lock while this member is a standby that
// follows member from at epoch.
func (p *node) apply(from int, epoch uint64, fn func() error) (bool, error) {
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	v := p.view.Load()
	if v.Role != machine.RoleStandby || v.Active != from || v.Epoch != epoch {
		return false, nil
	}
	return true, fn()
}

// recordReserved makes the active's reservation durable here, then tells
// the machine.
func (p *node) recordReserved(limit uint64) error {
	if err := p.writeMark(limit); err != nil {
		return err
	}
	p.tell(machine.Msg{Kind: machine.MsgReservedSeen, Limit: limit})
	return nil
}

// desync tells the machine this member is out of sync, and of a
// reservation a snapshot carried.
func (p *node) desync(reserved uint64) {
	p.tell(machine.Msg{Kind: machine.MsgDesynced, Limit: reserved})
}

// synced tells the machine this member applied a whole snapshot of member
// from at epoch.
func (p *node) synced(from int, epoch uint64) {
	p.tell(machine.Msg{Kind: machine.MsgSynced, From: from, Epoch: epoch})
}
