package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

// The failover mode (-failover N): a cluster of lockd processes under
// load, the member that serves killed (kill -9) or stopped (SIGTERM) N
// times each; after each trial the victim is restarted and the harness
// waits until the cluster has settled again.
//
//   - priority (-failover-mode priority, the default): the victim is the
//     active, always the first member once settled; settled means it has
//     taken over again by a planned handover and every standby is in sync;
//   - raft (-failover-mode raft): the victim is the current leader, found
//     from /status (any member); settled means one leader, every other
//     member a follower on its term, naming it and caught up with what it
//     had committed: no handover back, so the next trial's victim may be
//     another member.
//
// The load comes from two kinds of clients, both given every member's
// address:
//
//   - workers: goroutines of one client.Client (the library, its default
//     configuration) looping Acquire(wait 0) → Release on keys of their
//     own; what an application sees;
//   - probes: raw protocol connections, one request in flight, that follow
//     M at once and retry another member 1 ms after a refused dial, a lost
//     connection, an E or an M without an address; they know which member
//     answered each request, so "the first grant answered by the
//     successor" is exact to about a millisecond.
//
// Every answered request (a grant or a release) is recorded with the time
// it was sent and answered; the figures of a trial come from that record.

// Cluster modes of the failover mode.
const (
	failoverPriority = clustertest.ModePriority
	failoverRaft     = clustertest.ModeRaft
)

// Kinds of trial.
const (
	trialKill = "kill" // SIGKILL of the active
	trialTerm = "term" // SIGTERM of the active: a planned handover
)

// Sentinel errors of the failover mode.
var (
	errNoSuccessor = errors.New("bench: failover: no member granted after the active went")
	errTooMany     = errors.New("bench: failover: too many answers recorded in one trial (raise recorder capacity)")
)

// failoverConfig is the failover mode's command line.
type failoverConfig struct {
	Trials   int           `json:"trials"`  // per kind
	Mode     string        `json:"mode"`    // failoverPriority or failoverRaft
	Members  int           `json:"members"` // priority 2..7, raft 3..7
	Kinds    []string      `json:"kinds"`
	Workers  int           `json:"workers"` // library goroutines
	Probes   int           `json:"probes"`  // raw probe connections
	Timeout  time.Duration `json:"failover_timeout"`
	Steady   time.Duration `json:"steady"` // load before each signal
	After    time.Duration `json:"after"`  // load recorded after the first successor grant
	MaxWait  time.Duration `json:"max_wait"`
	Progress func(string)  `json:"-"`
}

func defaultFailover() failoverConfig {
	return failoverConfig{Mode: failoverPriority, Members: 2, Kinds: []string{trialKill, trialTerm}, Workers: 16, Probes: 2,
		Timeout: time.Second, Steady: 500 * time.Millisecond, After: 300 * time.Millisecond, MaxWait: 15 * time.Second}
}

// Trial is one failover.
type Trial struct {
	Kind   string `json:"kind"`
	N      int    `json:"trial"`
	Victim int    `json:"victim"`
	// Successor is the member whose grant came first after the signal.
	Successor int `json:"successor"`
	// FirstGrantMs: from the signal until the first grant the successor
	// answered, to a request a probe sent after the victim was gone
	// (kill: reaped; term: signalled).
	FirstGrantMs float64 `json:"first_grant_ms"`
	// ClientGrantMs (kill): from the signal until the first grant a library
	// worker received for an acquire it started after the victim was reaped.
	ClientGrantMs float64 `json:"client_grant_ms,omitempty"`
	// GapMs: the longest time without any answered request (probes and
	// library) from the signal to just after the successor's first grant;
	// ClientGapMs the same over the library's answers only.
	GapMs       float64 `json:"gap_ms"`
	GapAtMs     float64 `json:"gap_at_ms"` // where the longest gap began, from the signal
	ClientGapMs float64 `json:"client_gap_ms"`
	// Rejoin: the victim restarted (same data dir) until the cluster is
	// settled with it active again (a planned handover back), and the
	// longest gap without answers meanwhile (all clients; library only).
	RejoinMs          float64 `json:"rejoin_ms"`
	RejoinGapMs       float64 `json:"rejoin_gap_ms"`
	RejoinClientGapMs float64 `json:"rejoin_client_gap_ms"`
	ExitCode          int     `json:"exit_code,omitempty"` // term: the victim's exit code
	Answered          int     `json:"answered"`            // answers recorded in the trial
	// Outcomes counts what was not a plain answer from the signal until
	// the restart (RejoinOutcomes: from the restart until the cluster
	// settled): the library's errors by kind, and the probes' M, E (E4
	// separately), refused dials and lost connections (a probe finds its
	// connection to a restarted member dead when it next uses it).
	Outcomes       map[string]Outcome `json:"outcomes,omitempty"`
	RejoinOutcomes map[string]Outcome `json:"rejoin_outcomes,omitempty"`
}

// failoverRun is one run of the failover mode.
type failoverRun struct {
	cfg *failoverConfig
	c   *clustertest.Cluster
	rec *recorder
	g   *loadGen
}

// waitSettled waits until the cluster is settled — priority: the first
// member active and every other one a standby in sync; raft: raftSettled —
// and returns the member that serves (the next trial's victim).
func (f *failoverRun) waitSettled(timeout time.Duration) (int, error) {
	ok := func(sts []clustertest.Status) (int, bool) { return settled(f.cfg.Mode, sts) }
	if f.cfg.Mode == failoverRaft {
		ok = newRaftSettled().ok
	}
	member, _, err := waitSettled(f.c, f.cfg.Mode, timeout, ok)
	return member, err
}

// raftOf is a member's raft section, zero when its /status has none.
func raftOf(st clustertest.Status) api.RaftStatus {
	if st.Raft == nil {
		return api.RaftStatus{}
	}
	return *st.Raft
}

// raftSettled judges successive polls of a raft cluster's /status for the
// failover mode. Settled is more than settled's "one leader, the others
// followers": every follower names the leader, is on its term and has
// applied every entry the leader had committed at the previous poll, with
// the same leader and term — so a member restarted after a trial has
// caught up before the next trial begins.
type raftSettled struct {
	leader int
	term   uint64
	commit uint64
}

func newRaftSettled() *raftSettled { return &raftSettled{leader: -1} }

// ok is a waitSettled predicate: it returns the leader once settled.
func (r *raftSettled) ok(sts []clustertest.Status) (int, bool) {
	l, ok := settled(failoverRaft, sts)
	if !ok {
		r.leader = -1
		return -1, false
	}
	term, commit := raftOf(sts[l]).Term, raftOf(sts[l]).CommitIndex
	prevLeader, prevTerm, prevCommit := r.leader, r.term, r.commit
	r.leader, r.term, r.commit = l, term, commit
	if prevLeader != l || prevTerm != term {
		return -1, false
	}
	for i, st := range sts {
		if i != l && (st.Active != sts[l].Addr || raftOf(st).Term != term || raftOf(st).AppliedIndex < prevCommit) {
			return -1, false
		}
	}
	return l, true
}

// waitFor waits until the record holds an event ok accepts, for up to
// MaxWait; it returns the earliest-answered one.
func (f *failoverRun) waitFor(ok func(event) bool) (event, bool) {
	deadline := time.Now().Add(f.cfg.MaxWait)
	for {
		evs, _ := f.rec.snapshot()
		var best event
		found := false
		for _, e := range evs {
			if ok(e) && (!found || e.end < best.end) {
				best, found = e, true
			}
		}
		if found || time.Now().After(deadline) {
			return best, found
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gaps waits until the library has answered after resumed (so that a gap
// it is in is closed, bounded by MaxWait), lets the load run After more,
// and returns the longest gaps without an answer, over every client and
// over the library alone, that start at or before to and end at or after
// from (ns).
func (f *failoverRun) gaps(from, to, resumed int64) (all, at, lib int64, n int, err error) {
	if _, ok := f.waitFor(func(e event) bool { return e.member < 0 && e.end > resumed }); !ok && f.cfg.Workers > 0 {
		f.g.out.add("library silent for the whole wait", f.rec.now())
	}
	time.Sleep(f.cfg.After)
	evs, over := f.rec.snapshot()
	now := f.rec.now()
	if over {
		return 0, 0, 0, 0, errTooMany
	}
	all, at = longestGap(answerTimes(evs, func(event) bool { return true }), from, to, now)
	if f.cfg.Workers > 0 {
		lib, _ = longestGap(answerTimes(evs, func(e event) bool { return e.member < 0 }), from, to, now)
	}
	return all, at - from, lib, len(evs), nil
}

// trial runs one failover of kind and the victim's rejoin.
func (f *failoverRun) trial(kind string, n int) (*Trial, error) {
	victim, err := f.waitSettled(settleTimeout)
	if err != nil {
		return nil, err
	}
	m := f.c.Member(victim)
	f.rec.reset()
	time.Sleep(f.cfg.Steady)
	tr := &Trial{Kind: kind, N: n, Victim: victim}
	t0 := f.rec.now()
	f.g.out.take(t0)
	gone := t0
	var termDone chan error
	switch kind {
	case trialKill:
		if err := m.Kill(); err != nil {
			return nil, err
		}
		gone = f.rec.now()
	case trialTerm:
		termDone = make(chan error, 1)
		go func() {
			code, err := m.Term()
			tr.ExitCode = code
			termDone <- err
		}()
	}
	// The successor's first grant, to a probe request sent once the victim
	// was gone.
	first, ok := f.waitFor(func(e event) bool {
		return e.kind == evGrant && e.member >= 0 && int(e.member) != victim && e.start >= gone
	})
	if !ok {
		if termDone != nil {
			<-termDone
		}
		return nil, fmt.Errorf("%w within %v", errNoSuccessor, f.cfg.MaxWait)
	}
	tr.Successor, tr.FirstGrantMs = int(first.member), ms(first.end-t0)
	if kind == trialKill {
		if e, ok := f.waitFor(func(e event) bool { return e.kind == evGrant && e.member < 0 && e.start >= gone }); ok {
			tr.ClientGrantMs = ms(e.end - t0)
		}
	}
	all, at, lib, _, err := f.gaps(t0, first.end+int64(100*time.Millisecond), first.end)
	if termDone != nil {
		if terr := <-termDone; err == nil {
			err = terr
		}
	}
	if err != nil {
		return nil, err
	}
	tr.GapMs, tr.GapAtMs, tr.ClientGapMs = ms(all), ms(at), ms(lib)
	// The rejoin: restart the victim, wait until the cluster is settled
	// (priority: the victim active again; raft: it follows, caught up).
	r0 := f.rec.now()
	tr.Outcomes = f.g.out.take(t0)
	if err := m.Restart(); err != nil {
		return nil, err
	}
	if _, err := f.waitSettled(settleTimeout); err != nil {
		return nil, err
	}
	r1 := f.rec.now()
	tr.RejoinMs = ms(r1 - r0)
	all, _, lib, answered, err := f.gaps(r0, r1+int64(100*time.Millisecond), r1)
	if err != nil {
		return nil, err
	}
	tr.RejoinGapMs, tr.RejoinClientGapMs, tr.Answered = ms(all), ms(lib), answered
	tr.RejoinOutcomes = f.g.out.take(r0)
	return tr, nil
}

// runFailover starts the cluster and the load and runs every trial,
// alternating the kinds (kill, term, kill, term, …).
func runFailover(cfg *failoverConfig, bin string) ([]*Trial, error) {
	c, err := clustertest.New(clustertest.Options{Mode: cfg.Mode, Members: cfg.Members,
		FailoverTimeout: cfg.Timeout, Binary: bin})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	f := &failoverRun{cfg: cfg, c: c, rec: newRecorder(4 << 20)}
	if _, err := f.waitSettled(settleTimeout); err != nil {
		return nil, err
	}
	if f.g, err = startLoad(c.Addrs(), cfg.Workers, cfg.Probes, f.rec); err != nil {
		return nil, err
	}
	defer f.g.close()
	var out []*Trial
	for n := 1; n <= cfg.Trials; n++ {
		for _, kind := range cfg.Kinds {
			if cfg.Progress != nil {
				cfg.Progress(fmt.Sprintf("trial %d/%d  %s of the %s ...", n, cfg.Trials, kind, servingRole(cfg.Mode)))
			}
			tr, err := f.trial(kind, n)
			if err != nil {
				var b strings.Builder
				c.Dump(&b, 30)
				return out, fmt.Errorf("trial %d %s: %w\n%s", n, kind, err, b.String())
			}
			if cfg.Progress != nil {
				cfg.Progress("    " + trialLine(tr, cfg.Mode))
			}
			out = append(out, tr)
		}
	}
	return out, nil
}

// failoverCmd is the failover mode of the command; it returns the exit
// code.
func failoverCmd(o *options, stdout, stderr io.Writer) int {
	cfg := o.failover
	cfg.Progress = o.cfg.Progress
	bin, err := lockdBinary(o)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	trials, err := runFailover(&cfg, bin)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	sums, gs, loadEnd := summarizeTrials(trials, cfg.Kinds), failoverGoals(trials, cfg.Mode), loadAvg()
	doc := struct {
		runHead
		Config  failoverConfig    `json:"config"`
		Trials  []*Trial          `json:"trials"`
		Summary []failoverSummary `json:"summary"`
		Goals   []failoverGoal    `json:"goals"`
	}{runHead{machine(), o.loadStart, loadEnd}, cfg, trials, sums, gs}
	if err := writeDoc(o, stdout, doc); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if o.jsonOut {
		return 0
	}
	write := writeText
	if o.markdown {
		write = writeMarkdown
		cluster := "Priority cluster"
		if cfg.Mode == failoverRaft {
			cluster = "Raft cluster (fsync on)"
		}
		fmt.Fprintf(stdout, "Machine: %s. %s of %d members, --failover-timeout %v; %d library workers, %d probes.\n",
			machine(), cluster, cfg.Members, cfg.Timeout, cfg.Workers, cfg.Probes)
	}
	fmt.Fprintf(stdout, "Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n", o.loadStart, loadEnd)
	heads, tables := failoverTables(trials, sums, gs, cfg.Mode, !o.markdown)
	for i := range heads {
		write(stdout, heads[i], tables[i])
		fmt.Fprintln(stdout)
	}
	return 0
}
