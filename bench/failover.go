package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
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

// event kinds.
const (
	evGrant uint8 = iota + 1
	evRelease
)

// event is one answered request: sent at start, answered at end
// (nanoseconds since the recorder's base), by member (-1: a library
// worker, which does not say which member answered).
type event struct {
	start, end int64
	member     int8
	kind       uint8
}

// recorder keeps the answered requests of the current trial.
type recorder struct {
	base time.Time
	mu   sync.Mutex
	ev   []event
	max  int
	over bool
}

func newRecorder(maxEvents int) *recorder {
	return &recorder{base: time.Now(), max: maxEvents}
}

func (r *recorder) now() int64 { return int64(time.Since(r.base)) }

func (r *recorder) add(e event) {
	r.mu.Lock()
	if len(r.ev) < r.max {
		r.ev = append(r.ev, e)
	} else {
		r.over = true
	}
	r.mu.Unlock()
}

// reset starts a new trial's record.
func (r *recorder) reset() {
	r.mu.Lock()
	r.ev, r.over = r.ev[:0], false
	r.mu.Unlock()
}

// snapshot returns a copy of the record so far.
func (r *recorder) snapshot() ([]event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ev), r.over
}

// longestGap is the longest interval without an answer that starts at or
// before to and ends at or after from, given the sorted answer times: an
// interval that overlaps the window counts in full. One still open at the
// last answer (nothing answered after it) lasts until now, when the record
// was taken: a lower bound. It returns the gap and where it starts.
func longestGap(ends []int64, from, to, now int64) (gap, at int64) {
	prev := from
	i, _ := slices.BinarySearch(ends, from)
	if i > 0 {
		prev = ends[i-1]
	}
	for ; i < len(ends) && prev <= to; i++ {
		if d := ends[i] - prev; d > gap {
			gap, at = d, prev
		}
		prev = ends[i]
	}
	if i == len(ends) && prev <= to && now-prev > gap {
		gap, at = now-prev, prev
	}
	return gap, at
}

// answerTimes returns the sorted answer times of the events keep selects.
func answerTimes(evs []event, keep func(event) bool) []int64 {
	var out []int64
	for _, e := range evs {
		if keep(e) {
			out = append(out, e.end)
		}
	}
	slices.Sort(out)
	return out
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

// Outcome is how often one kind of non-answer happened in a phase of a
// trial, and when the first and the last happened (ms from the phase's
// start: the signal, or the restart).
type Outcome struct {
	N     int64   `json:"n"`
	First float64 `json:"first_ms"`
	Last  float64 `json:"last_ms"`
}

// outcomes counts non-answers by kind, with when they happened
// (recorder time).
type outcomes struct {
	mu sync.Mutex
	m  map[string]*[3]int64 // count, first, last
}

func (o *outcomes) add(kind string, at int64) {
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*[3]int64{}
	}
	c := o.m[kind]
	if c == nil {
		c = &[3]int64{0, at, at}
		o.m[kind] = c
	}
	c[0]++
	c[1], c[2] = min(c[1], at), max(c[2], at)
	o.mu.Unlock()
}

// take returns the counts since the last take, times relative to since.
func (o *outcomes) take(since int64) map[string]Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.m) == 0 {
		return nil
	}
	out := make(map[string]Outcome, len(o.m))
	for k, c := range o.m {
		out[k] = Outcome{N: c[0], First: ms(c[1] - since), Last: ms(c[2] - since)}
	}
	o.m = nil
	return out
}

// Outcome names the summary counts.
const (
	outIndeterminate  = "library indeterminate"
	outProbeE4        = "probe E4"         // an acquire answered E 4
	outProbeReleaseE4 = "probe release E4" // a release answered E 4
)

// probeErrorOutcome names a probe's acquire or release answered E code.
func probeErrorOutcome(release bool, code uint8) string {
	switch {
	case code == proto.CodeShutdown && release:
		return outProbeReleaseE4
	case code == proto.CodeShutdown:
		return outProbeE4
	case release:
		return "probe release E" + strconv.Itoa(int(code))
	}
	return "probe E" + strconv.Itoa(int(code))
}

// e4Answers counts the answers E 4 (shutting down) among a phase's
// non-answers: the probes see every E; the library resends after an E 4
// without telling its caller.
func e4Answers(m map[string]Outcome) int64 {
	return m[outProbeE4].N + m[outProbeReleaseE4].N
}

// clientOutcome names a library error.
func clientOutcome(err error) string {
	var se *client.ServerError
	switch {
	case errors.Is(err, client.ErrIndeterminate):
		return outIndeterminate
	case errors.Is(err, client.ErrNoConnection):
		return "library no connection"
	case errors.Is(err, client.ErrNotHeld):
		return "library not held"
	case errors.Is(err, client.ErrTimeout):
		return "library timeout"
	case errors.Is(err, client.ErrBusy):
		return "library busy"
	case errors.As(err, &se):
		return "library E" + strconv.Itoa(int(se.Code))
	case errors.Is(err, context.Canceled):
		return ""
	}
	return "library other"
}

// loadGen is the failover mode's clients.
type loadGen struct {
	rec   *recorder
	out   *outcomes
	cl    *client.Client
	addrs []string
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	seq   atomic.Uint64
}

// startLoad starts workers library goroutines and probes raw probes
// against addrs.
func startLoad(addrs []string, workers, probes int, rec *recorder) (*loadGen, error) {
	cl, err := client.New(client.Config{Addrs: addrs})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{rec: rec, out: &outcomes{}, cl: cl, addrs: addrs, ctx: ctx, stop: cancel}
	for w := range workers {
		g.wg.Add(1)
		go g.worker(w)
	}
	for p := range probes {
		g.wg.Add(1)
		go g.probe(p)
	}
	return g, nil
}

// close stops the clients and waits for them.
func (g *loadGen) close() {
	g.stop()
	g.wg.Wait()
	g.cl.Close()
}

// pause sleeps d unless the load is stopping; it reports whether to go on.
func (g *loadGen) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// worker loops Acquire(wait 0) → Release with the library on keys of its
// own.
func (g *loadGen) worker(w int) {
	defer g.wg.Done()
	opts := client.AcquireOptions{Lease: 10 * time.Second}
	for n := 0; g.ctx.Err() == nil; n++ {
		key := "failover/w" + strconv.Itoa(w) + "/" + strconv.Itoa(n)
		s := g.rec.now()
		l, err := g.cl.Acquire(g.ctx, key, opts)
		if err != nil {
			if k := clientOutcome(err); k != "" {
				g.out.add(k, g.rec.now())
			}
			if !g.pause(time.Millisecond) {
				return
			}
			continue
		}
		g.rec.add(event{start: s, end: g.rec.now(), member: -1, kind: evGrant})
		s = g.rec.now()
		if err := g.cl.Release(g.ctx, l); err != nil {
			if k := clientOutcome(err); k != "" {
				g.out.add(k, g.rec.now())
			}
			continue
		}
		g.rec.add(event{start: s, end: g.rec.now(), member: -1, kind: evRelease})
	}
}

// probe is a raw client that knows which member answers: it sends one
// request at a time to the member it takes for the active, follows an M
// with an address at once, and moves to the next member 1 ms after a
// refused dial, a lost connection, an E or an M without an address.
func (g *loadGen) probe(id int) {
	defer g.wg.Done()
	conns := make([]*clustertest.Conn, len(g.addrs))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	cur := 0
	next := func() bool {
		cur = (cur + 1) % len(g.addrs)
		return g.pause(time.Millisecond)
	}
	drop := func() {
		conns[cur].Close()
		conns[cur] = nil
	}
	var frame []byte
	for n := uint64(0); g.ctx.Err() == nil; n++ {
		if conns[cur] == nil {
			c, err := clustertest.Dial(g.addrs[cur])
			if err != nil {
				g.out.add("probe dial refused", g.rec.now())
				if !next() {
					return
				}
				continue
			}
			c.SetTimeout(2 * time.Second)
			conns[cur] = c
		}
		c := conns[cur]
		key := "failover/p" + strconv.Itoa(id) + "/" + strconv.FormatUint(n, 10)
		owner := g.seq.Add(1)
		s := g.rec.now()
		frame = proto.AppendAcquire(frame[:0], 0, 10, owner, key)
		resp, err := c.Do(frame)
		if err != nil {
			g.out.add("probe connection lost", g.rec.now())
			drop()
			if !next() {
				return
			}
			continue
		}
		switch resp.Op {
		case proto.OpAcquire:
			g.rec.add(event{start: s, end: g.rec.now(), member: int8(cur), kind: evGrant})
			s = g.rec.now()
			frame = proto.AppendRelease(frame[:0], resp.Token, key)
			r, err := c.Do(frame)
			switch {
			case err != nil:
				g.out.add("probe connection lost", g.rec.now())
				drop()
				next()
			case r.Op == proto.OpRelease:
				g.rec.add(event{start: s, end: g.rec.now(), member: int8(cur), kind: evRelease})
			case r.Op == proto.OpError:
				g.out.add(probeErrorOutcome(true, r.Code), g.rec.now())
			default:
				g.out.add("probe release "+r.Op.String(), g.rec.now())
			}
		case proto.OpMoved:
			g.out.add("probe M", g.rec.now())
			if i := slices.Index(g.addrs, string(resp.Tail)); i >= 0 && i != cur {
				cur = i
			} else if !next() {
				return
			}
		case proto.OpError:
			g.out.add(probeErrorOutcome(false, resp.Code), g.rec.now())
			if !next() {
				return
			}
		default:
			g.out.add("probe "+resp.Op.String(), g.rec.now())
			if !g.pause(time.Millisecond) {
				return
			}
		}
	}
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

func ms(ns int64) float64 { return float64(ns) / 1e6 }

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

// servingRole names the member the trials signal in mode.
func servingRole(mode string) string {
	if mode == failoverRaft {
		return api.RoleLeader
	}
	return api.RoleActive
}

// trialLine is a progress summary of one trial of a cluster in mode.
func trialLine(tr *Trial, mode string) string {
	var s, rejoinGap string
	if mode == failoverRaft {
		s = fmt.Sprintf("leader %d %s: ", tr.Victim, tr.Kind)
		rejoinGap = "gap"
	} else {
		rejoinGap = "handover gap"
	}
	s += fmt.Sprintf("member %d served %.0f ms after the signal", tr.Successor, tr.FirstGrantMs)
	if tr.ClientGrantMs > 0 {
		s += fmt.Sprintf(" (library %.0f ms)", tr.ClientGrantMs)
	}
	s += fmt.Sprintf("; longest gap %.1f ms from %+.0f ms (library %.1f ms); rejoined in %.0f ms, %s %.1f ms (library %.1f ms); %d answers",
		tr.GapMs, tr.GapAtMs, tr.ClientGapMs, tr.RejoinMs, rejoinGap, tr.RejoinGapMs, tr.RejoinClientGapMs, tr.Answered)
	if tr.Kind == trialTerm {
		s += fmt.Sprintf("; exit %d", tr.ExitCode)
	}
	if len(tr.Outcomes) > 0 {
		s += "; failover: " + outcomeText(tr.Outcomes)
	}
	if len(tr.RejoinOutcomes) > 0 {
		s += "; rejoin: " + outcomeText(tr.RejoinOutcomes)
	}
	return s
}

// spread is the median and the worst of a figure over trials.
type spread struct {
	Median float64 `json:"median"`
	Worst  float64 `json:"worst"`
	N      int     `json:"n"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	return spread{Median: median(v), Worst: slices.Max(v), N: len(v)}
}

// failoverSummary is the spread of every figure of one kind of trial, in
// milliseconds.
type failoverSummary struct {
	Kind              string `json:"kind"`
	FirstGrant        spread `json:"first_grant_ms"`
	ClientGrant       spread `json:"client_grant_ms"`
	Gap               spread `json:"gap_ms"`
	ClientGap         spread `json:"client_gap_ms"`
	RejoinGap         spread `json:"rejoin_gap_ms"`
	RejoinClientGap   spread `json:"rejoin_client_gap_ms"`
	Rejoin            spread `json:"rejoin_ms"`
	ExitNonZero       int    `json:"exit_nonzero,omitempty"`
	LibIndeterminate  int64  `json:"library_indeterminate"`        // from the signal until the restart
	ProbeShuttingDown int64  `json:"probe_e4"`                     // acquires and releases answered E 4
	RejoinLibIndet    int64  `json:"rejoin_library_indeterminate"` // from the restart until settled
	RejoinProbeE4     int64  `json:"rejoin_probe_e4"`
}

// summarizeTrials gives one summary per kind, in the order of kinds.
func summarizeTrials(trials []*Trial, kinds []string) []failoverSummary {
	var out []failoverSummary
	for _, k := range kinds {
		s := failoverSummary{Kind: k}
		var fg, cg, gap, cgap, rg, rcg, rj []float64
		for _, tr := range trials {
			if tr.Kind != k {
				continue
			}
			fg, gap, cgap = append(fg, tr.FirstGrantMs), append(gap, tr.GapMs), append(cgap, tr.ClientGapMs)
			rg, rcg, rj = append(rg, tr.RejoinGapMs), append(rcg, tr.RejoinClientGapMs), append(rj, tr.RejoinMs)
			if tr.ClientGrantMs > 0 {
				cg = append(cg, tr.ClientGrantMs)
			}
			if tr.ExitCode != 0 {
				s.ExitNonZero++
			}
			s.LibIndeterminate += tr.Outcomes[outIndeterminate].N
			s.ProbeShuttingDown += e4Answers(tr.Outcomes)
			s.RejoinLibIndet += tr.RejoinOutcomes[outIndeterminate].N
			s.RejoinProbeE4 += e4Answers(tr.RejoinOutcomes)
		}
		if len(fg) == 0 {
			continue
		}
		s.FirstGrant, s.ClientGrant, s.Gap, s.ClientGap = spreadOf(fg), spreadOf(cg), spreadOf(gap), spreadOf(cgap)
		s.RejoinGap, s.RejoinClientGap, s.Rejoin = spreadOf(rg), spreadOf(rcg), spreadOf(rj)
		out = append(out, s)
	}
	return out
}

// failoverGoal is one failover target judged over the trials: issue 11's
// (priority) or PROTOCOL.md §6.2's (raft).
type failoverGoal struct {
	What   string  `json:"what"`
	Limit  float64 `json:"limit_ms"`
	Median float64 `json:"median_ms"`
	Worst  float64 `json:"worst_ms"`
	Met    int     `json:"trials_met"`
	Trials int     `json:"trials"`
	// Unit of Limit, Median and Worst when they are not milliseconds (the
	// JSON names keep _ms).
	Unit string `json:"unit,omitempty"`
}

// goalAnswers is the Unit of a goal that counts answers.
const goalAnswers = "answers"

// failoverGoals judges the trials of a cluster in mode. Priority (issue
// 11): kill -9, first grant by the successor ≤ 1.5 s at the default 1 s
// timeout; SIGTERM, the planned handover's longest gap ≤ 100 ms. Raft
// (PROTOCOL.md §6.2, issue 12): kill -9 of the leader, first grant by the
// new leader ≤ 3 s; SIGTERM, first grant by the successor ≤ 500 ms and no
// answer E 4.
func failoverGoals(trials []*Trial, mode string) []failoverGoal {
	var out []failoverGoal
	judge := func(what, kind, unit string, limit float64, f func(*Trial) float64) {
		g := failoverGoal{What: what, Limit: limit, Unit: unit}
		var v []float64
		for _, tr := range trials {
			if tr.Kind == kind {
				v = append(v, f(tr))
				if f(tr) <= limit {
					g.Met++
				}
			}
		}
		if len(v) == 0 {
			return
		}
		g.Trials, g.Median, g.Worst = len(v), median(v), slices.Max(v)
		out = append(out, g)
	}
	firstGrant := func(tr *Trial) float64 { return tr.FirstGrantMs }
	if mode == failoverRaft {
		judge("kill -9 of the leader: first grant by the new leader ≤ 3 s (§6.2)", trialKill, "", 3000, firstGrant)
		judge("SIGTERM of the leader: first grant by the successor ≤ 500 ms (§6.2)", trialTerm, "", 500, firstGrant)
		judge("SIGTERM of the leader: no answer E 4 (§6.2)", trialTerm, goalAnswers, 0,
			func(tr *Trial) float64 { return float64(e4Answers(tr.Outcomes)) })
		return out
	}
	judge("kill -9 of the active: first grant by the successor ≤ 1.5 s", trialKill, "", 1500, firstGrant)
	judge("SIGTERM of the active: planned handover unavailability (longest gap) ≤ 100 ms", trialTerm, "", 100,
		func(tr *Trial) float64 { return tr.GapMs })
	return out
}

// failoverTables renders the trials of a cluster in mode, their summary,
// the goals and the non-answers: per trial (withOutcomes, for the text
// output), else summed over the trials of a kind in a table of their own
// (for Markdown). Raft's tables name the victim of each trial (the leader
// then, any member) and the successor "new leader"; there is no handover
// in its rejoin.
func failoverTables(trials []*Trial, sums []failoverSummary, gs []failoverGoal, mode string, withOutcomes bool) (heads [][]string, tables [][][]string) {
	raft := mode == failoverRaft
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	sp := func(s spread) string {
		if s.N == 0 {
			return "-"
		}
		return f(s.Median) + " · " + f(s.Worst)
	}
	h := []string{"kind", "trial", "successor", "first grant ms", "library first grant ms", "longest gap ms (from)", "library gap ms",
		"rejoin ms", "rejoin gap ms", "library rejoin gap ms", "exit", "answers"}
	if raft {
		h = slices.Insert(h, 2, "leader killed/stopped")
		h[3] = "new leader"
	}
	if withOutcomes {
		h = append(h, "not answered (failover)", "not answered (rejoin)")
	}
	var rows [][]string
	for _, tr := range trials {
		cg := "-"
		if tr.ClientGrantMs > 0 {
			cg = f(tr.ClientGrantMs)
		}
		exit := "-"
		if tr.Kind == trialTerm {
			exit = strconv.Itoa(tr.ExitCode)
		}
		row := []string{tr.Kind, strconv.Itoa(tr.N), strconv.Itoa(tr.Successor), f(tr.FirstGrantMs), cg,
			fmt.Sprintf("%s (%+.0f)", f(tr.GapMs), tr.GapAtMs), f(tr.ClientGapMs), f(tr.RejoinMs), f(tr.RejoinGapMs), f(tr.RejoinClientGapMs), exit,
			strconv.Itoa(tr.Answered)}
		if raft {
			row = slices.Insert(row, 2, strconv.Itoa(tr.Victim))
		}
		if withOutcomes {
			row = append(row, outcomeText(tr.Outcomes), outcomeText(tr.RejoinOutcomes))
		}
		rows = append(rows, row)
	}
	heads, tables = append(heads, h), append(tables, rows)
	h = []string{"kind", "trials", "first grant ms (median · worst)", "library first grant", "longest gap", "library gap",
		"rejoin", "rejoin handover gap", "library rejoin gap", "library indeterminate (failover · rejoin)", "probe E4 (failover · rejoin)"}
	if raft {
		h[7] = "rejoin gap"
	}
	rows = nil
	for _, s := range sums {
		rows = append(rows, []string{s.Kind, strconv.Itoa(s.FirstGrant.N), sp(s.FirstGrant), sp(s.ClientGrant), sp(s.Gap), sp(s.ClientGap),
			sp(s.Rejoin), sp(s.RejoinGap), sp(s.RejoinClientGap), fmt.Sprintf("%d · %d", s.LibIndeterminate, s.RejoinLibIndet),
			fmt.Sprintf("%d · %d", s.ProbeShuttingDown, s.RejoinProbeE4)})
	}
	heads, tables = append(heads, h), append(tables, rows)
	h = []string{"failover target", "median ms", "worst ms", "met"}
	unit := func(string) string { return "" }
	if slices.ContainsFunc(gs, func(g failoverGoal) bool { return g.Unit != "" }) {
		h[1], h[2] = "median", "worst"
		unit = func(u string) string {
			if u == "" {
				return " ms"
			}
			return " " + u
		}
	}
	rows = nil
	for _, g := range gs {
		rows = append(rows, []string{g.What, f(g.Median) + unit(g.Unit), f(g.Worst) + unit(g.Unit), fmt.Sprintf("%d of %d trials", g.Met, g.Trials)})
	}
	heads, tables = append(heads, h), append(tables, rows)
	if !withOutcomes {
		h, rows = outcomeRows(trials)
		heads, tables = append(heads, h), append(tables, rows)
	}
	return heads, tables
}

// outcomeRows sums the non-answers over the trials of each kind and phase:
// how many, in how many trials, and the earliest and latest time after the
// phase began.
func outcomeRows(trials []*Trial) (head []string, rows [][]string) {
	head = []string{"kind", "phase", "not answered", "total", "trials", "from ms", "to ms"}
	type key struct{ kind, phase, name string }
	type agg struct {
		n, trials   int64
		first, last float64
	}
	m := map[key]*agg{}
	var order []key
	for _, tr := range trials {
		for _, ph := range []struct {
			name string
			m    map[string]Outcome
		}{{"failover", tr.Outcomes}, {"rejoin", tr.RejoinOutcomes}} {
			for name, o := range ph.m {
				k := key{tr.Kind, ph.name, name}
				a := m[k]
				if a == nil {
					a = &agg{first: o.First, last: o.Last}
					m[k] = a
					order = append(order, k)
				}
				a.n += o.N
				a.trials++
				a.first, a.last = min(a.first, o.First), max(a.last, o.Last)
			}
		}
	}
	slices.SortFunc(order, func(a, b key) int {
		return strings.Compare(a.kind+"\x00"+a.phase+"\x00"+a.name, b.kind+"\x00"+b.phase+"\x00"+b.name)
	})
	for _, k := range order {
		a := m[k]
		rows = append(rows, []string{k.kind, k.phase, k.name, strconv.FormatInt(a.n, 10), strconv.FormatInt(a.trials, 10),
			fmt.Sprintf("%.0f", a.first), fmt.Sprintf("%.0f", a.last)})
	}
	return head, rows
}

// outcomeText lists outcome counts, sorted by name, with when they
// happened.
func outcomeText(m map[string]Outcome) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		o := m[k]
		parts[i] = fmt.Sprintf("%s %d (+%.0f..%.0f ms)", k, o.N, o.First, o.Last)
	}
	return strings.Join(parts, ", ")
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
		Machine   string            `json:"machine"`
		LoadStart string            `json:"load_start"`
		LoadEnd   string            `json:"load_end"`
		Config    failoverConfig    `json:"config"`
		Trials    []*Trial          `json:"trials"`
		Summary   []failoverSummary `json:"summary"`
		Goals     []failoverGoal    `json:"goals"`
	}{machine(), o.loadStart, loadEnd, cfg, trials, sums, gs}
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
