package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
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
//     under load, and loses nothing it committed when it does);
//   - outside the handovers, the client of the active gets an answer to
//     every request (A, then R), never M, E or silence (raft: failures
//     counted, the client follows the new leader);
//   - every lock is held with its token by the active/leader after each
//     step, and by every member in sync at the end.
//
// Every wait is bounded, and the leases (255 s) outlast the phase.
const (
	bigLease      = 255 // seconds
	bigFillConns  = 4
	bigFillWindow = 1024 // acquires unanswered per connection (below --max-pending-grants)
	bigWithin     = 4 * time.Minute
	bigStepWithin = 30 * time.Second
	bigPollEvery  = 20 * time.Millisecond
	bigProbeEvery = 5 * time.Millisecond
	bigProbeKey   = "big/probe"
)

// bigKey is the key of the j-th lock of the phase.
func bigKey(j int) string { return fmt.Sprintf("big/%08d", j) }

// bigPhase is one large-state phase.
type bigPhase struct {
	cfg  Config
	c    *clustertest.Cluster
	logf func(string, ...any)
	rng  *rand.Rand
	res  history.Result

	tokens []uint64 // by lock index

	mu      sync.Mutex
	lead    int             // the member expected to serve
	epoch   uint64          // its epoch (term) when it became expected
	gen     int             // raised by every expect: the probe dials afresh (the member may have restarted)
	moving  bool            // a planned handover runs: a change of active is expected
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

// runBigState runs the phase and returns its checker's result.
func runBigState(cfg Config, logf func(string, ...any)) history.Result {
	b := &bigPhase{cfg: cfg, logf: logf, rng: rand.New(rand.NewPCG(cfg.Seed, 0x626967)), // "big"
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
		if b.res.Count > 0 {
			var sb strings.Builder
			c.Dump(&sb, 30)
			b.note("cluster at the end:\n%s", sb.String())
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
	if !b.leaderHoldsAll("the active/leader after a standby synced") || !b.syncedHoldsAll(s, lead, "the standby that synced") {
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
		if !b.syncedHoldsAll(m, lead, fmt.Sprintf("member %d, in sync, at the end", m)) {
			return
		}
	}
}

// stalled reports whether member m's log says that it was frozen or
// stalled, around at (an event seen then), for at least half a failover
// timeout (its ticker's gap: it sent no heartbeat meanwhile) — a stall of
// the machine (the run shares two cores with whatever else runs) after
// which the others may rightly have found it silent. The member logs a
// stall when it resumes, which may come after the event: the log is read
// again for up to five failover timeouts.
func (b *bigPhase) stalled(m int, at time.Time) (string, bool) {
	for deadline := at.Add(5 * b.cfg.BigFailover); ; {
		if why, ok := b.stallIn(m, at); ok || time.Now().After(deadline) {
			return why, ok
		}
		time.Sleep(b.cfg.BigFailover / 2)
	}
}

// stallIn is stalled on member m's log as it is now.
func (b *bigPhase) stallIn(m int, at time.Time) (string, bool) {
	for _, line := range strings.Split(b.c.Member(m).Logs(), "\n") {
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
		if gap >= b.cfg.BigFailover/2 && began.Before(at) && began.After(at.Add(-3*b.cfg.BigFailover)) {
			return fmt.Sprintf("a %v gap in its ticks at %s", gap.Round(time.Millisecond), rec.Time.Format("15:04:05.000")), true
		}
	}
	return "", false
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
	state := make([]uint8, n) // 0 to send, 1 granted, 2 taken by a lost answer
	deadline := time.Now().Add(bigWithin)
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
			if why, ok := b.stalled(prev, time.Now()); ok {
				b.note("taking the locks was interrupted after a stall of member %d (%s): %d of %d to send again, to member %d", prev, why, len(todo), n, m)
			} else if b.cfg.Mode == api.ModePriority {
				b.bad("taking the locks was interrupted: %d of %d to send again, to member %d", len(todo), n, m)
			}
		}
		if err := b.fillPass(m, todo, tokens, state); err != nil {
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

// fillPass sends the acquires of keys todo to member m, pipelined over
// bigFillConns connections, and records what comes back.
func (b *bigPhase) fillPass(m int, todo []int, tokens []uint64, state []uint8) error {
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
			return err
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
					tokens[j], state[j] = r.Token, 1
				case proto.OpTimeout:
					state[j] = 2
				default: // M, B, E: not executed; sent again
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
			switch {
			case st.Index != lead && st.Serving():
				what = fmt.Sprintf("member %d is %s at epoch %d beside member %d, the active at %d", st.Index, st.Role, st.Epoch, lead, epoch)
			case st.Index == lead && st.Epoch != epoch:
				what = fmt.Sprintf("member %d, the active at epoch %d, is %s at %d", lead, epoch, st.Role, st.Epoch)
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
			if why, ok := b.stalled(lead, time.Now()); ok && b.cfg.Mode == api.ModePriority {
				// Not heard for a failover timeout is not live (PROTOCOL.md
				// §6.1): the failover was the rules', not a snapshot's doing.
				b.mu.Lock()
				b.res.Figures["failovers_after_a_stall"]++
				b.mu.Unlock()
				b.note("after a stall of the active (%s): %s", why, what)
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
		r, err := conn.Do(proto.AppendAcquire(nil, 0, 10, i, bigProbeKey))
		if err == nil && r.Op == proto.OpAcquire {
			r, err = conn.Do(proto.AppendRelease(nil, r.Token, bigProbeKey))
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
			_, stalled := b.stalled(lead, time.Now())
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
// have elected since the phase last looked), once its table holds as many
// keys as there are locks.
func (b *bigPhase) leaderHoldsAll(who string) bool {
	l, err := b.c.WaitLeader(bigStepWithin, clustertest.Running())
	if err != nil {
		b.bad("%s: %v", who, err)
		return false
	}
	if b.cfg.Mode == api.ModeRaft {
		b.expect(l)
		known := 0
		for _, tok := range b.tokens {
			if tok != 0 {
				known++
			}
		}
		// A raft leader may still rebuild its table from the log.
		_, _ = b.c.Member(l).WaitStatus(bigStepWithin, func(st clustertest.Status) bool { return st.Keys >= known })
	}
	return b.holdsAll(l, fmt.Sprintf("%s (member %d)", who, l))
}

// holdsAll checks that member m holds every lock of the phase with its
// token.
func (b *bigPhase) holdsAll(m int, who string) bool {
	if problem := b.missing(m); problem != "" {
		b.bad("%s: %s", who, problem)
		return false
	}
	return true
}

// syncedHoldsAll is holdsAll for a standby or follower found in sync
// (waitSynced) with lead. A stall of the machine can make the active
// resync an in-sync standby right after that check (a new snapshot
// replaces its table shard by shard), and a dump read meanwhile shows the
// table half restored: when the member's log says a snapshot was applied
// after the dump began, the sync is waited for and the check made again
// (noted, at most three times; priority mode, whose standbys log it).
// Anything else missing is a violation.
func (b *bigPhase) syncedHoldsAll(m, lead int, who string) bool {
	resynced := regexp.MustCompile(`"in sync: snapshot applied"`)
	for attempt := 1; ; attempt++ {
		mark := b.c.Member(m).LogMark()
		problem := b.missing(m)
		if problem == "" {
			return true
		}
		if attempt < 3 && b.cfg.Mode == api.ModePriority {
			if _, err := b.c.Member(m).WaitLogSince(mark, resynced, bigStepWithin); err == nil {
				b.note("%s: resynced while its table was read (%s); read again once in sync", who, problem)
				if err := b.waitSynced(m, lead); err == nil {
					continue
				}
			}
		}
		b.bad("%s: %s", who, problem)
		return false
	}
}

// missing compares member m's table with the phase's locks and says what
// is lost or changed ("" when every lock is held with its token).
func (b *bigPhase) missing(m int) string {
	keys, err := dumpLocks(b.c.Member(m).AdminURL())
	if err != nil {
		return fmt.Sprintf("/debug/locks: %v", err)
	}
	lost := 0
	var first string
	for j, tok := range b.tokens {
		if tok == 0 {
			continue // taken by an acquire whose answer was lost (fill)
		}
		if got := keys[bigKey(j)]; got != tok {
			if lost++; lost == 1 {
				first = fmt.Sprintf("%s has token %d, want %d", bigKey(j), got, tok)
			}
		}
	}
	if lost == 0 {
		return ""
	}
	state := ""
	if st, err := b.c.Member(m).Status(); err == nil {
		state = fmt.Sprintf("; it is %s at epoch %d holding %d keys", st.Role, st.Epoch, st.Keys)
		if st.Raft != nil {
			state += fmt.Sprintf(", raft commit %d applied %d, %d rebuilds", st.Raft.CommitIndex, st.Raft.AppliedIndex, st.Raft.Rebuilds)
		}
	}
	return fmt.Sprintf("%d of %d locks lost or changed (first: %s)%s", lost, len(b.tokens), first, state)
}

// dumpLocks reads an admin endpoint's /debug/locks: every held key and
// its token.
func dumpLocks(url string) (map[string]uint64, error) {
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
	keys := map[string]uint64{}
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
		key, err := strconv.Unquote(f[2])
		if err != nil {
			return nil, err
		}
		keys[key] = tok
	}
	return keys, sc.Err()
}
