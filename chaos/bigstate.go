package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/history"
)

// The large-state phase (issue 18, hole 1). A snapshot that took longer
// than the failover timeout used to starve the heartbeats: the syncing
// standby promoted beside a live active, and locks were lost. The workload
// holds a few locks at a time and never showed it. This phase runs before
// the workload, on a cluster of its own with a short failover timeout
// (Config.BigFailover), fills it with Config.BigLocks held locks and moves
// that state three ways: a standby killed and restarted (it syncs the whole
// table), the active/leader terminated (a planned handover of the whole
// table) and restarted (it rejoins and syncs; in priority mode it then
// takes over again by priority). Throughout, /status of every member is
// read, and a client of the active/leader takes and releases a lock every
// few milliseconds. It checks that
//
//   - nothing but the planned handovers changes the active (priority: a
//     second member serving, or the active's epoch moving, is a false
//     promotion; raft elections are counted, not asserted: raft may elect
//     under load, and loses nothing it committed when it does) — unless a
//     member stalled (its log says its ticks stopped for half a failover
//     timeout or more) around the change: a member not heard for a
//     failover timeout is not live (PROTOCOL.md §6.1), and the promotion
//     that follows, and the step-down that resolves the two actives, are
//     the rules' (counted, not asserted);
//   - outside the handovers, the client of the active gets an answer to
//     every request (A, then R), never M, E or silence (raft: failures
//     counted, the client follows the new leader; after a stall too);
//   - every lock is held with its token by the active/leader after each
//     step, and by every member in sync at the end — whatever changed the
//     active: a promotion a stall caused may cost the changes within the
//     lag, never a table that had been replicated (PROTOCOL.md §6.3,
//     "Whoever would lose more stays"). After a change of active the
//     check waits until the cluster has kept one active for five failover
//     timeouts (the two actives resolve within two), so it judges the
//     table that stays, not one about to step down.
//
// Every wait is bounded. The leases (255 s) outlast the phase unless the
// machine is very slow: a lock whose lease may have ended by a check (its
// fill pass began 255 s before) is not checked (expired_unchecked).
const (
	bigLease      = 255 // seconds
	bigFillConns  = 4
	bigFillWindow = 1024 // acquires unanswered per connection (below --max-pending-grants)
	bigWithin     = 4 * time.Minute
	bigStepWithin = 30 * time.Second
	bigPollEvery  = 20 * time.Millisecond
	bigProbeEvery = 5 * time.Millisecond
)

// bigProbeKey is the key of the probe's i-th acquire: a key of its own
// each time, so a grant whose release a handover or a failover cut off
// (held for its lease on the member that serves next) is no reason for a
// later probe to be answered T.
func bigProbeKey(i uint64) string { return fmt.Sprintf("big/probe/%d", i) }

// bigKey is the key of the j-th lock of the phase.
func bigKey(j int) string { return fmt.Sprintf("big/%08d", j) }

// bigPhase is one large-state phase.
type bigPhase struct {
	cfg  Config
	out  string // the run's artifacts directory: the members' logs go there when the phase fails
	c    *clustertest.Cluster
	logf func(string, ...any)
	rng  *rand.Rand
	res  history.Result

	tokens []uint64 // by lock index
	// sentAt is, by lock index, when the fill pass that took the lock
	// began (unix ns): its lease began later, so it ends no earlier than
	// sentAt + bigLease s (nil: every lock's lease outlasts the checks).
	sentAt []int64

	// source reads member i's table for the checks (nil: the cluster's
	// member), and settleWithin bounds the wait for a settled reading (0:
	// bigWithin): tests set them.
	source       func(i int) tableSource
	settleWithin time.Duration

	mu      sync.Mutex
	lead    int             // the member expected to serve
	epoch   uint64          // its epoch (term) when it became expected
	gen     int             // raised by every expect: the probe dials afresh (the member may have restarted)
	moving  bool            // a planned handover runs: a change of active is expected
	changed time.Time       // when a stall last changed the active (the table checks wait for calm)
	seen    map[string]bool // the unexpected readings so far, so one event counts once
	answers int64           // answered probes
	slowest time.Duration
}

func (b *bigPhase) bad(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.res.Count++
	if len(b.res.Violations) < history.MaxViolations {
		b.res.Violations = append(b.res.Violations, fmt.Sprintf(format, args...))
	}
}

func (b *bigPhase) note(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.res.Notes = append(b.res.Notes, fmt.Sprintf(format, args...))
}

// runBigState runs the phase and returns its checker's result; when it
// fails, the members' logs are written to bigstate-members.log in out.
func runBigState(cfg Config, out string, logf func(string, ...any)) history.Result {
	b := &bigPhase{cfg: cfg, out: out, logf: logf, rng: rand.New(rand.NewPCG(cfg.Seed, 0x626967)), // "big"
		res: history.Result{Name: "large-state", Figures: map[string]float64{}}}
	if cfg.BigLocks == 0 {
		b.res.Verdict, b.res.Summary = history.Skipped, "no large-state phase (-big-locks 0)"
		return b.res
	}
	if cfg.Mode == api.ModeSingle {
		b.res.Verdict, b.res.Summary = history.Skipped, "single mode: no standby to sync, no active to hand over to"
		return b.res
	}
	began := time.Now()
	b.run()
	b.res.Figures["phase_seconds"] = time.Since(began).Seconds()
	if b.res.Count > 0 {
		b.res.Verdict = history.Violated
	} else {
		b.res.Verdict = history.Pass
	}
	b.res.Summary = fmt.Sprintf("%d held locks, --failover-timeout %v: a standby restarted and synced, the active/leader handed over and rejoined; %d problems",
		cfg.BigLocks, cfg.BigFailover, b.res.Count)
	return b.res
}

func (b *bigPhase) run() {
	c, err := clustertest.New(clustertest.Options{Mode: b.cfg.Mode, Members: 3, FailoverTimeout: b.cfg.BigFailover, Binary: b.cfg.Binary})
	if err != nil {
		b.bad("start: %v", err)
		return
	}
	b.c = c
	defer func() {
		for m := range c.Members() {
			later, earlier := contestLines(c.Member(m).Logs())
			b.res.Figures["later_active_yielded_to_a_larger_table"] += float64(later)
			b.res.Figures["earlier_active_yielded"] += float64(earlier)
		}
		if b.res.Count > 0 {
			var sb strings.Builder
			c.Dump(&sb, 30)
			b.note("cluster at the end:\n%s", sb.String())
			b.keepLogs()
		}
		if err := c.Close(); err != nil {
			b.logf("large-state: closing the cluster: %v", err)
		}
	}()
	lead, err := c.WaitLeader(startAgreement, clustertest.Every)
	if err != nil {
		b.bad("no agreed active/leader after the start: %v", err)
		return
	}
	b.expect(lead)
	b.logf("large-state: member %d leads; taking %d locks", lead, b.cfg.BigLocks)
	fillStart := time.Now()
	if b.tokens, err = b.fill(lead); err != nil {
		b.bad("taking %d locks on member %d: %v", b.cfg.BigLocks, lead, err)
		return
	}
	b.res.Figures["fill_seconds"] = time.Since(fillStart).Seconds()
	if l, err := c.WaitLeader(bigStepWithin, clustertest.Every); err == nil && l != b.current() {
		b.expect(l) // raft elected during the fill
	}
	b.logf("large-state: %d locks taken in %v", b.cfg.BigLocks, time.Since(fillStart).Round(time.Millisecond))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { b.watch(stop) })
	wg.Go(func() { b.probe(stop) })
	defer func() {
		close(stop)
		wg.Wait()
		b.mu.Lock()
		b.res.Figures["probe_answers"] = float64(b.answers)
		b.res.Figures["probe_slowest_ms"] = float64(b.slowest.Microseconds()) / 1000
		b.mu.Unlock()
	}()

	// 1. A standby killed and restarted: it syncs the whole table.
	others := b.others(lead)
	s := others[b.rng.IntN(len(others))]
	if !b.restartStandby(s) {
		return
	}
	if !b.leaderHoldsAll("the active/leader after a standby synced") || !b.syncedHoldsAll(s, "the standby that synced") {
		return
	}
	// 2. The active/leader terminated: a planned handover of the table.
	old := b.current()
	b.setMoving(true)
	code, err := c.Member(old).Term()
	switch {
	case err != nil:
		b.bad("SIGTERM of member %d: %v", old, err)
		return
	case code != 0:
		b.bad("member %d exited %d after SIGTERM, want 0", old, code)
	}
	next, err := c.WaitLeader(bigStepWithin, clustertest.Running())
	if err != nil {
		b.bad("no active/leader after member %d's handover: %v", old, err)
		return
	}
	if !b.leaderHoldsAll(fmt.Sprintf("the active/leader after member %d handed over", old)) {
		return
	}
	// 3. It restarts and syncs; in priority mode the first member takes
	// over again by a planned handover.
	b.logf("large-state: member %d serves after the handover; restarting member %d", next, old)
	began := time.Now()
	if err := c.Member(old).Restart(); err != nil {
		b.bad("restart of member %d: %v", old, err)
		return
	}
	settled, err := b.waitSettled(old, next)
	if err != nil {
		b.bad("member %d's rejoin with %d locks: %v", old, b.cfg.BigLocks, err)
		return
	}
	b.res.Figures["rejoin_seconds"] = time.Since(began).Seconds()
	b.expect(settled)
	b.setMoving(false)
	time.Sleep(5 * b.cfg.BigFailover) // a few failover timeouts more of watching
	if !b.leaderHoldsAll("the active/leader at the end") {
		return
	}
	lead = b.current()
	for _, m := range b.others(lead) {
		if err := b.waitSynced(m, lead); err != nil {
			b.bad("member %d not in sync at the end: %v", m, err)
			continue
		}
		if !b.syncedHoldsAll(m, fmt.Sprintf("member %d, in sync, at the end", m)) {
			return
		}
	}
}
