package main

import (
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

// The large-state phase's steps: which member is expected to lead, a
// standby restarted, waits until a member is in sync or the cluster has
// settled on one active.

// expectLeader expects, after a failover the rules allowed, the member
// every running one agrees on (left as it is while they do not agree).
func (b *bigPhase) expectLeader() {
	if l, err := b.c.WaitLeader(bigStepWithin, clustertest.Running()); err == nil {
		b.expect(l)
	}
}

// others lists the members but m.
func (b *bigPhase) others(m int) []int {
	var out []int
	for i := range b.c.Members() {
		if i != m {
			out = append(out, i)
		}
	}
	return out
}

func (b *bigPhase) expect(lead int) {
	st, _ := b.c.Member(lead).Status()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lead, b.epoch, b.seen = lead, st.Epoch, map[string]bool{}
	b.gen++
}

func (b *bigPhase) current() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lead
}

func (b *bigPhase) setMoving(v bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.moving = v
}

// restartStandby kills member s, restarts it and waits until it has the
// whole table (in sync with the active; raft: it has applied what the
// leader had committed).
func (b *bigPhase) restartStandby(s int) bool {
	lead := b.current()
	b.logf("large-state: kill -9 of member %d, then a restart next to member %d", s, lead)
	if err := b.c.Member(s).Kill(); err != nil {
		b.bad("kill of member %d: %v", s, err)
		return false
	}
	began := time.Now()
	if err := b.c.Member(s).Restart(); err != nil {
		b.bad("restart of member %d: %v", s, err)
		return false
	}
	if err := b.waitSynced(s, lead); err != nil {
		b.bad("member %d not in sync with %d locks: %v", s, b.cfg.BigLocks, err)
		return false
	}
	b.res.Figures["standby_sync_seconds"] = time.Since(began).Seconds()
	b.logf("large-state: member %d in sync %v after its restart", s, time.Since(began).Round(time.Millisecond))
	return true
}

// waitSynced waits until member s follows lead with the whole table.
func (b *bigPhase) waitSynced(s, lead int) error {
	var commit uint64
	if b.cfg.Mode == api.ModeRaft {
		// What the leader — the one serving now: raft may have elected —
		// has committed, every lock of the phase included.
		l, err := b.c.WaitLeader(bigStepWithin, clustertest.Running())
		if err != nil {
			return err
		}
		st, err := b.c.Member(l).Status()
		if err != nil || st.Raft == nil {
			return fmt.Errorf("the leader's /status: %v", err)
		}
		commit = st.Raft.CommitIndex
	}
	known := 0
	for _, tok := range b.tokens {
		if tok != 0 {
			known++
		}
	}
	_, err := b.c.Member(s).WaitStatus(bigWithin, func(st clustertest.Status) bool {
		if !st.InSync || st.Role != api.RoleStandby && st.Role != api.RoleFollower || st.Keys < known {
			return false
		}
		return b.cfg.Mode != api.ModeRaft || st.Raft != nil && st.Raft.AppliedIndex >= commit
	})
	return err
}

// waitSettled waits, after member old restarted next to the active next,
// until it is in sync and (priority) the active is the first member again.
func (b *bigPhase) waitSettled(old, next int) (int, error) {
	if b.cfg.Mode != api.ModePriority || old != 0 {
		return next, b.waitSynced(old, next)
	}
	// The first member syncs, then takes over by a planned handover.
	var lead int
	_, err := b.c.WaitStatuses(bigWithin, clustertest.Every, func(sts []clustertest.Status) error {
		var err error
		if lead, err = b.c.Agreed(sts); err == nil && lead != 0 {
			err = fmt.Errorf("member %d serves, not the first member", lead)
		}
		return err
	})
	return lead, err
}
