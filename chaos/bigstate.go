package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/history"
	"github.com/lockd-dev/lockd/proto"
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

// keepLogs writes every member's whole log (its state and the proxies',
// as Dump writes them) to bigstate-members.log in the artifacts directory:
// the phase's cluster is closed when it ends, and its logs with it.
func (b *bigPhase) keepLogs() {
	if b.out == "" {
		return
	}
	path := filepath.Join(b.out, "bigstate-members.log")
	f, err := os.Create(path)
	if err == nil {
		b.c.Dump(f, 1<<30)
		err = f.Close()
	}
	if err != nil {
		b.note("the members' logs: %v", err)
		return
	}
	b.note("the members' logs: %s", path)
}

// stalledAny reports whether a member's log says that it was frozen or
// stalled, around at (an event seen then), for at least half a failover
// timeout (its ticker's gap: it sent no heartbeat meanwhile) — a stall of
// the machine (the run shares two cores with whatever else runs) after
// which the others may rightly have found it silent. A member logs a stall
// when it resumes, which may come after the event: the logs are read again
// for up to five failover timeouts. Any member's counts: a change of
// active follows the stall of whichever member was found silent — the
// active, or a standby that then took its own stall for the active's
// silence — and the rules that resolve two actives follow that.
func (b *bigPhase) stalledAny(at time.Time) (string, bool) {
	for deadline := at.Add(5 * b.cfg.BigFailover); ; {
		for m := range b.c.Members() {
			if why, ok := b.stallIn(m, at); ok {
				return fmt.Sprintf("member %d: %s", m, why), true
			}
		}
		if time.Now().After(deadline) {
			return "", false
		}
		time.Sleep(b.cfg.BigFailover / 2)
	}
}

// calm waits until no stall has changed the active for five failover
// timeouts (bounded by bigStepWithin): two actives resolve within two, so
// a table read after it is the one that stays.
func (b *bigPhase) calm() {
	for deadline := time.Now().Add(bigStepWithin); time.Now().Before(deadline); {
		b.mu.Lock()
		since := time.Since(b.changed)
		b.mu.Unlock()
		if since >= 5*b.cfg.BigFailover {
			return
		}
		time.Sleep(b.cfg.BigFailover)
	}
}

// stallIn is stalled on member m's log as it is now.
func (b *bigPhase) stallIn(m int, at time.Time) (string, bool) {
	return stallInLog(b.c.Member(m).Logs(), at, b.cfg.BigFailover)
}

// stallInLog finds, in a member's log, a stall of at least half the
// failover timeout that began within ten failover timeouts before at: the
// line the member logs when it notices its ticks stopped, at its time and
// with the gap. (Ten: a promotion follows a failover timeout of silence,
// then a reservation, and the stalls of a loaded machine come in runs.)
func stallInLog(logs string, at time.Time, failover time.Duration) (string, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "frozen or stalled") {
			continue
		}
		var rec struct {
			Time time.Time `json:"time"`
			Gap  int64     `json:"gap"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		gap := time.Duration(rec.Gap)
		began := rec.Time.Add(-gap) // the stall's start
		if gap >= failover/2 && began.Before(at) && began.After(at.Add(-10*failover)) {
			return fmt.Sprintf("a %v gap in its ticks at %s", gap.Round(time.Millisecond), rec.Time.Format("15:04:05.000")), true
		}
	}
	return "", false
}

// promotedAt is when member m logged that it serves as the active at
// epoch (its promotion's end: the line "active" with that epoch), or
// seen when its log does not say (yet).
func (b *bigPhase) promotedAt(m int, epoch uint64, seen time.Time) time.Time {
	if t, ok := activeLineAt(b.c.Member(m).Logs(), epoch); ok {
		return t
	}
	return seen
}

// activeLineAt finds, in a member's log, the time of its line "active" at
// epoch.
func activeLineAt(logs string, epoch uint64) (time.Time, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"msg":"active"`) {
			continue
		}
		var rec struct {
			Time  time.Time `json:"time"`
			Epoch uint64    `json:"epoch"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Epoch == epoch {
			return rec.Time, true
		}
	}
	return time.Time{}, false
}

// contestLines counts, in the members' logs, the step-downs that resolved
// two actives by what each would lose: the later active yielding to an
// earlier one that held more (an empty or partial promotion after a
// stall), and an earlier one yielding to a later one that had served
// since.
func contestLines(logs string) (laterYielded, earlierYielded int) {
	for _, line := range strings.Split(logs, "\n") {
		switch {
		case strings.Contains(line, "stepping down: another member became active earlier and would lose more"):
			laterYielded++
		case strings.Contains(line, "stepping down: another member became active later and would lose more"):
			earlierYielded++
		}
	}
	return laterYielded, earlierYielded
}

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

// fill takes BigLocks locks over pipelined raw connections to the
// active/leader and returns their tokens (0: unknown). A key whose
// acquire got no answer — the connection closed (raft: a proposal that
// could not commit), M (an election), B — is sent again in a next pass,
// to the member that serves then; a key answered T then was taken by an
// acquire whose answer was lost: its token is unknown, and the checks skip
// it. In priority mode every pass after the first is a violation (nothing
// should have interrupted the active); in raft mode they are counted.
func (b *bigPhase) fill(m int) ([]uint64, error) {
	n := b.cfg.BigLocks
	tokens := make([]uint64, n)
	b.sentAt = make([]int64, n)
	state := make([]uint8, n) // 0 to send, 1 granted, 2 taken by a lost answer
	deadline := time.Now().Add(bigWithin)
	var missed atomicTime // when the last pass first got no grant
	for pass := 0; ; pass++ {
		var todo []int
		for j, st := range state {
			if st == 0 {
				todo = append(todo, j)
			}
		}
		if len(todo) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %d of %d locks not taken in %v", clustertest.ErrTimeout, len(todo), n, bigWithin)
		}
		if pass > 0 {
			prev := m
			lead, err := b.c.WaitLeader(bigStepWithin, clustertest.Every)
			if err != nil {
				return nil, err
			}
			m = lead
			b.mu.Lock()
			b.res.Figures["fill_passes"] = float64(pass + 1)
			b.mu.Unlock()
			at := missed.get()
			if at.IsZero() {
				at = time.Now()
			}
			if why, ok := b.stalledAny(at); ok {
				b.note("taking the locks was interrupted after a stall (%s): %d of %d to send again, to member %d from member %d", why, len(todo), n, m, prev)
			} else if b.cfg.Mode == api.ModePriority {
				b.bad("taking the locks was interrupted: %d of %d to send again, to member %d", len(todo), n, m)
			}
		}
		missed.set(time.Time{})
		if err := b.fillPass(m, todo, tokens, state, time.Now().UnixNano(), &missed); err != nil {
			b.logf("large-state: fill pass %d on member %d: %v", pass, m, err)
		}
	}
	unknown := 0
	for _, st := range state {
		if st == 2 {
			unknown++
		}
	}
	b.res.Figures["fill_unknown"] = float64(unknown)
	return tokens, nil
}

// atomicTime is a time shared by goroutines: the first one set since
// the last reset.
type atomicTime struct {
	mu sync.Mutex
	t  time.Time
}

func (a *atomicTime) get() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.t
}

func (a *atomicTime) set(t time.Time) {
	a.mu.Lock()
	a.t = t
	a.mu.Unlock()
}

// first sets t if no time is set.
func (a *atomicTime) first(t time.Time) {
	a.mu.Lock()
	if a.t.IsZero() {
		a.t = t
	}
	a.mu.Unlock()
}

// fillPass sends the acquires of keys todo to member m, pipelined over
// bigFillConns connections, and records what comes back.
func (b *bigPhase) fillPass(m int, todo []int, tokens []uint64, state []uint8, began int64, missed *atomicTime) error {
	errs := make(chan error, 2*bigFillConns)
	var wg sync.WaitGroup
	per := (len(todo) + bigFillConns - 1) / bigFillConns
	for k := range bigFillConns {
		part := todo[min(k*per, len(todo)):min((k+1)*per, len(todo))]
		if len(part) == 0 {
			break
		}
		conn, err := clustertest.Dial(b.c.Member(m).Addr())
		if err != nil {
			// The connections already made finish first: their readers
			// must not record answers once the next pass has begun.
			errs <- err
			break
		}
		defer conn.Close()
		conn.SetTimeout(bigStepWithin)
		window := make(chan struct{}, bigFillWindow)
		failed := make(chan struct{})
		wg.Go(func() {
			var out []byte
			for i, j := range part {
				select {
				case window <- struct{}{}:
				case <-failed:
					return
				}
				out = proto.AppendAcquire(out, 0, bigLease, uint64(j+1), bigKey(j))
				if len(out) >= 16<<10 || i == len(part)-1 || len(window) == cap(window) {
					if err := conn.Send(out); err != nil {
						errs <- err
						return
					}
					out = out[:0]
				}
			}
		})
		wg.Go(func() {
			defer close(failed)
			for range part {
				r, err := conn.Read()
				if err != nil {
					missed.first(time.Now())
					b.mu.Lock()
					b.res.Figures["fill_connections_lost"]++
					b.mu.Unlock()
					errs <- err
					return
				}
				<-window
				j := int(r.ID - 1)
				if j < 0 || j >= len(state) {
					errs <- fmt.Errorf("an answer for owner %d", r.ID)
					return
				}
				switch r.Op {
				case proto.OpAcquire:
					tokens[j], state[j], b.sentAt[j] = r.Token, 1, began
				case proto.OpTimeout:
					state[j] = 2
				default: // M, B, E: not executed; sent again
					missed.first(time.Now())
					b.mu.Lock()
					b.res.Figures[fmt.Sprintf("fill_answers_%c", r.Op)]++
					b.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
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

// leaderHoldsAll checks holdsAll on the member that serves now (raft may
// have elected since the phase last looked).
func (b *bigPhase) leaderHoldsAll(who string) bool {
	b.calm()
	l := -1
	pick := func() (int, error) {
		m, err := b.c.WaitLeader(bigStepWithin, clustertest.Running())
		if err == nil && m != l && b.cfg.Mode == api.ModeRaft {
			b.expect(m) // the probe follows it
		}
		l = m
		return m, err
	}
	if m, problem := b.checkTable(pick, true, who); problem != "" {
		if m >= 0 {
			who = fmt.Sprintf("%s (member %d)", who, m)
		}
		b.bad("%s: %s", who, problem)
		return false
	}
	return true
}

// syncedHoldsAll checks that member m, a standby or follower found in
// sync, holds every lock of the phase with its token, on a settled
// reading (checkTable: a resync during the reading is read again).
func (b *bigPhase) syncedHoldsAll(m int, who string) bool {
	b.calm()
	if _, problem := b.missing(m, who); problem != "" {
		b.bad("%s: %s", who, problem)
		return false
	}
	return true
}

// missing compares member m's table, on a settled reading (checkTable),
// with the phase's locks and says what is lost or changed ("" when every
// lock is held with its token).
func (b *bigPhase) missing(m int, who string) (int, string) {
	return b.checkTable(func() (int, error) { return m, nil }, false, who)
}

// checkTable compares the table of the member pick names with the phase's
// locks, on a settled reading of it (readTable, unsettled), and returns
// the member and what is lost or changed ("" when every lock is held with
// its token). A raft member's table is not the committed state while it
// rebuilds it from the log (after each lost leadership, seconds at this
// size) or restores a snapshot, and raft may elect it meanwhile: it then
// reports itself leader, and does not serve until its table is rebuilt.
// A reading of such a table once made short runs report committed locks
// lost (issue 18's chaos runs). Until a reading settles, within
// bigWithin (as long as a member may take to sync: under load, raft may
// elect again and again, each lost leadership a rebuild), pick is asked
// again (the member that serves may have changed); who names the check
// in the note of the first reading taken again. serving: only a member
// that serves throughout the reading will do.
func (b *bigPhase) checkTable(pick func() (int, error), serving bool, who string) (int, string) {
	within := bigWithin
	if b.settleWithin > 0 {
		within = b.settleWithin
	}
	deadline := time.Now().Add(within)
	for {
		m, err := pick()
		if err != nil {
			return -1, err.Error()
		}
		var src tableSource
		if b.source != nil {
			src = b.source(m)
		} else {
			src = memberTable{b.c.Member(m)}
		}
		r, err := readTable(src)
		why := ""
		if err != nil {
			why = err.Error()
		} else if why = r.unsettled(serving); why == "" {
			return m, b.compare(r)
		}
		if time.Now().After(deadline) {
			return m, fmt.Sprintf("no settled reading of member %d's table in %v: the last: %s", m, within, why)
		}
		b.mu.Lock()
		if b.res.Figures["unsettled_readings"]++; b.res.Figures["unsettled_readings"] == 1 {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("%s: member %d's table read again (the first unsettled reading: %s)", who, m, why))
		}
		b.mu.Unlock()
		time.Sleep(bigPollEvery)
	}
}

// compare checks reading r of a member against the tokens of the phase
// and says what is lost or changed ("" when nothing is): the locks not
// held, and the keys the member holds that no lock of the phase is (what
// it holds instead).
func (b *bigPhase) compare(r tableReading) string {
	lost, expired := 0, 0
	defer func() {
		if expired > 0 {
			b.mu.Lock()
			b.res.Figures["expired_unchecked"] = max(b.res.Figures["expired_unchecked"], float64(expired))
			b.mu.Unlock()
		}
	}()
	var first string
	var missing []string
	for j, tok := range b.tokens {
		if tok == 0 {
			continue // taken by an acquire whose answer was lost (fill)
		}
		if b.sentAt != nil && r.at >= b.sentAt[j]+int64(bigLease*time.Second) {
			expired++ // its lease may have ended: free or held, both are right
			continue
		}
		if got := r.keys[bigKey(j)]; got.token != tok {
			if lost++; lost == 1 {
				first = fmt.Sprintf("%s has token %d, want %d", bigKey(j), got.token, tok)
			}
			if len(missing) < 10 {
				missing = append(missing, fmt.Sprintf("%s (token %d)", bigKey(j), got.token))
			}
		}
	}
	if lost == 0 {
		return ""
	}
	st := r.after
	state := fmt.Sprintf("; it is %s at epoch %d holding %d keys", st.Role, st.Epoch, st.Keys)
	if st.Raft != nil {
		state += fmt.Sprintf(", raft commit %d applied %d, %d rebuilds", st.Raft.CommitIndex, st.Raft.AppliedIndex, st.Raft.Rebuilds)
	}
	var extra []string
	for k, l := range r.keys {
		if j, err := strconv.Atoi(strings.TrimPrefix(k, "big/")); err == nil && j >= 0 && j < len(b.tokens) && k == bigKey(j) {
			continue
		}
		if len(extra) < 10 {
			extra = append(extra, fmt.Sprintf("%q (token %d, %v left)", k, l.token, l.left))
		}
	}
	return fmt.Sprintf("%d of %d locks lost or changed (first: %s)%s; /debug/locks lists %d keys; lost: %s; held, no lock of the phase: %s",
		lost, len(b.tokens), first, state, len(r.keys), strings.Join(missing, ", "), strings.Join(extra, ", "))
}

// tableSource is what readTable reads of a member.
type tableSource interface {
	Status() (clustertest.Status, error)
	Ready() bool
	Locks() (map[string]heldLock, error)
	// LogMark marks the member's log now; ResyncedSince reports whether
	// it applied a snapshot after mark (priority standbys log each): one
	// applied during a reading replaced the table while it was read.
	LogMark() int
	ResyncedSince(mark int) bool
}

// memberTable is a member of the phase's cluster as a tableSource.
type memberTable struct{ m *clustertest.Member }

func (t memberTable) Status() (clustertest.Status, error) { return t.m.Status() }

func (t memberTable) Locks() (map[string]heldLock, error) { return dumpLocks(t.m.AdminURL()) }

// snapshotApplied is a priority standby's log line for an applied snapshot.
var snapshotApplied = regexp.MustCompile(`"in sync: snapshot applied"`)

func (t memberTable) LogMark() int { return t.m.LogMark() }

func (t memberTable) ResyncedSince(mark int) bool {
	_, err := t.m.WaitLogSince(mark, snapshotApplied, 0)
	return err == nil
}

// Ready reports whether the member's /readyz answers 200: for a raft
// leader, that it serves (it has applied the log and rebuilt its table).
func (t memberTable) Ready() bool {
	url := t.m.AdminURL()
	if url == "" {
		return false
	}
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tableReading is one look at a member's table: its /debug/locks between
// two readings of its /status and /readyz.
type tableReading struct {
	before, after           clustertest.Status
	readyBefore, readyAfter bool
	resynced                bool // the member applied a snapshot during the reading
	keys                    map[string]heldLock
	at                      int64 // when the locks were read (unix ns, once read)
}

// readTable reads src's status, its table, and its status again.
func readTable(src tableSource) (tableReading, error) {
	var r tableReading
	var err error
	if r.before, err = src.Status(); err != nil {
		return r, err
	}
	r.readyBefore = src.Ready()
	mark := src.LogMark()
	if r.keys, err = src.Locks(); err != nil {
		return r, fmt.Errorf("/debug/locks: %w", err)
	}
	r.at = time.Now().UnixNano()
	r.readyAfter = src.Ready()
	if r.after, err = src.Status(); err != nil {
		return r, err
	}
	r.resynced = src.ResyncedSince(mark)
	return r, nil
}

// unsettled says why r may not show the member's table as the state it
// serves or follows ("" when it does). A raft member must not have
// rebuilt its table during the reading; a member that serves must be
// ready on both sides of it (a raft leader that is not ready may still
// rebuild its table or apply the log); a priority standby must be in
// sync; the table of a member that does not serve must not have moved by
// more than a lock (the probe's) meanwhile — a rebuild or a snapshot being
// restored moves it by thousands. Elections do not change a raft
// follower's or candidate's table: they are no reason to read again.
// serving: only a member that serves, at one epoch, will do.
func (r *tableReading) unsettled(serving bool) string {
	b, a := &r.before, &r.after
	switch {
	case (b.Raft == nil) != (a.Raft == nil) || b.Raft != nil && b.Raft.Rebuilds != a.Raft.Rebuilds:
		return "it rebuilt its table meanwhile"
	case serving && (b.Role != a.Role || b.Epoch != a.Epoch):
		return fmt.Sprintf("it was %s at epoch %d, then %s at %d", b.Role, b.Epoch, a.Role, a.Epoch)
	case serving && !b.Serving():
		return fmt.Sprintf("%s at epoch %d: it does not serve", b.Role, b.Epoch)
	case r.resynced:
		// A stall of the machine can make the active resync an in-sync
		// standby: the new snapshot replaces its table shard by shard.
		return "a snapshot replaced its table during the reading"
	}
	for _, side := range []struct {
		st    *clustertest.Status
		ready bool
	}{{b, r.readyBefore}, {a, r.readyAfter}} {
		st := side.st
		switch {
		case st.Serving() && !side.ready:
			return fmt.Sprintf("%s at epoch %d, not ready (it does not serve yet: it applies the log or rebuilds its table)", st.Role, st.Epoch)
		case !st.Serving() && st.Raft == nil && (st.Role != api.RoleStandby || !st.InSync):
			return fmt.Sprintf("%s at epoch %d, in sync %v: neither serving nor a standby in sync", st.Role, st.Epoch, st.InSync)
		}
	}
	if !serving && (a.Keys-b.Keys > 1 || b.Keys-a.Keys > 1) {
		return fmt.Sprintf("its table went from %d to %d keys during the reading", b.Keys, a.Keys)
	}
	return ""
}

// dumpLocks reads an admin endpoint's /debug/locks: every held key, its
// token and the lease it has left.
func dumpLocks(url string) (map[string]heldLock, error) {
	if url == "" {
		return nil, errors.New("no admin endpoint")
	}
	hc := http.Client{Timeout: 2 * time.Minute}
	resp, err := hc.Get(url + "/debug/locks")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	keys := map[string]heldLock{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("bad line %q", sc.Text())
		}
		tok, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, err
		}
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, err
		}
		key, err := strconv.Unquote(f[2])
		if err != nil {
			return nil, err
		}
		keys[key] = heldLock{token: tok, left: time.Duration(ms) * time.Millisecond}
	}
	return keys, sc.Err()
}

// heldLock is a line of /debug/locks.
type heldLock struct {
	token uint64
	left  time.Duration
}
