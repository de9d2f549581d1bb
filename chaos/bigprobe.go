package main

import (
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// The large-state phase's watchers while the state moves: every member's
// /status (who is active, and whether that changed without a planned
// handover or a stall) and a probe client that takes and releases a lock
// on the active every few milliseconds.

// watch reads /status of the running members until stop, and counts a
// change of active that no step asked for.
func (b *bigPhase) watch(stop <-chan struct{}) {
	elections := 0
	for {
		select {
		case <-stop:
			b.mu.Lock()
			b.res.Figures["unasked_elections"] = float64(elections)
			b.mu.Unlock()
			return
		case <-time.After(bigPollEvery):
		}
		sts, err := b.c.Statuses(clustertest.Running())
		if err != nil {
			continue // a member starting: no admin endpoint yet
		}
		b.mu.Lock()
		lead, epoch, moving := b.lead, b.epoch, b.moving
		b.mu.Unlock()
		if moving {
			continue
		}
		for _, st := range sts {
			var what string
			at := time.Now() // when the change happened: its promotion, when the log has it
			switch {
			case st.Index != lead && st.Serving():
				what = fmt.Sprintf("member %d is %s at epoch %d beside member %d, the active at %d", st.Index, st.Role, st.Epoch, lead, epoch)
				at = b.promotedAt(st.Index, st.Epoch, at)
			case st.Index == lead && st.Epoch != epoch:
				what = fmt.Sprintf("member %d, the active at epoch %d, is %s at %d", lead, epoch, st.Role, st.Epoch)
				at = b.promotedAt(st.Index, st.Epoch, at)
			case st.Index == lead && !st.Serving() && st.Role != api.RoleActiveChecking:
				what = fmt.Sprintf("member %d, the active at epoch %d, became %s", lead, epoch, st.Role)
			default:
				continue
			}
			b.mu.Lock()
			repeat := b.seen[what]
			b.seen[what] = true
			b.mu.Unlock()
			if repeat {
				continue
			}
			if why, ok := b.stalledAny(at); ok && b.cfg.Mode == api.ModePriority {
				// Not heard for a failover timeout is not live (PROTOCOL.md
				// §6.1): the failover, and the step-down that resolves the
				// two actives it made, were the rules', not a snapshot's
				// doing. What it may not cost — a replicated table — the
				// table checks judge once the cluster is calm again.
				b.mu.Lock()
				b.res.Figures["changes_after_a_stall"]++
				b.changed = time.Now()
				b.mu.Unlock()
				b.note("after a stall (%s): %s", why, what)
				b.expectLeader()
				continue
			}
			if b.cfg.Mode == api.ModeRaft {
				elections++
				b.note("while no step asked for it: %s", what)
				if st.Serving() && st.Index != lead {
					b.mu.Lock()
					b.lead, b.epoch, b.gen = st.Index, st.Epoch, b.gen+1 // follow the new leader
					b.mu.Unlock()
				}
				continue
			}
			b.bad("a false promotion while the state moved: %s", what)
		}
	}
}

// probe takes and releases bigProbeKey on the active every few
// milliseconds until stop; outside the handovers every answer must be A,
// then R.
func (b *bigPhase) probe(stop <-chan struct{}) {
	var conn *clustertest.Conn
	at := -1 // the gen conn was dialled for
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for i := uint64(1); ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(bigProbeEvery):
		}
		b.mu.Lock()
		lead, moving, gen := b.lead, b.moving, b.gen
		b.mu.Unlock()
		if moving {
			continue
		}
		if conn == nil || at != gen {
			if conn != nil {
				conn.Close()
			}
			var err error
			if conn, err = clustertest.Dial(b.c.Member(lead).Addr()); err != nil {
				b.bad("a client of member %d, the active: %v", lead, err)
				return
			}
			conn.SetTimeout(bigStepWithin)
			at = gen
		}
		began := time.Now()
		key := bigProbeKey(i)
		r, err := conn.Do(proto.AppendAcquire(nil, 0, 10, i, key))
		if err == nil && r.Op == proto.OpAcquire {
			r, err = conn.Do(proto.AppendRelease(nil, r.Token, key))
			if err == nil && r.Op != proto.OpRelease {
				err = fmt.Errorf("release answered %c %q", r.Op, r.Tail)
			}
		} else if err == nil {
			err = fmt.Errorf("acquire answered %c (code %d) %q", r.Op, r.Code, r.Tail)
		}
		b.mu.Lock()
		moved := b.moving || b.gen != gen
		if err == nil {
			b.answers++
			b.slowest = max(b.slowest, time.Since(began))
		}
		b.mu.Unlock()
		if err != nil && !moved {
			_, stalled := b.stalledAny(time.Now())
			if b.cfg.Mode == api.ModeRaft || stalled {
				// raft may elect under load (counted by watch): the
				// probe goes on with the member that serves then.
				b.mu.Lock()
				b.res.Figures["probe_failures"]++
				if l, err := b.c.Leader(clustertest.Running()); err == nil && l != b.lead {
					b.lead, b.gen = l, b.gen+1
				}
				b.mu.Unlock()
				conn.Close()
				conn = nil
				continue
			}
			b.bad("a client of member %d, the active, while the state moved: %v", lead, err)
			return
		}
		if err != nil {
			conn.Close()
			conn = nil
		}
	}
}
