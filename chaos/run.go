package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/faultproxy"
	"github.com/lockd-dev/lockd/internal/history"
)

// ErrModeUnavailable: the lockd binary does not have the mode asked for
// (exit status 2).
var ErrModeUnavailable = errors.New("chaos: this lockd binary does not have the mode")

// Bounds of a run's phases.
const (
	startAgreement = 20 * time.Second // the first active/leader after the start
	// LivenessWithin is how soon after the final heal (every member
	// running again) every member must agree on one active/leader.
	LivenessWithin = 3 * time.Second
	// livenessPatience keeps polling past LivenessWithin, to report how
	// long agreement took when it was late.
	livenessPatience = 20 * time.Second
	// splitSlack is added to 2 × the failover timeout after a partition
	// heals, for the member that became active earlier to step down on a
	// loaded 2-core machine (docs/PROTOCOL.md §6.3 says within 2 × the
	// timeout).
	splitSlack = time.Second
)

// Run runs one chaos test and returns its report. It returns an error
// without a report when the run could not start (a bad configuration, no
// lockd binary, a mode the binary lacks: ErrModeUnavailable); once
// started, what goes wrong goes into the report (Errors) and fails it.
// logw receives a line at the start and the end, and with Config.Verbose
// every fault and phase.
func Run(ctx context.Context, cfg Config, logw io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for cfg.Seed == 0 {
		cfg.Seed = rand.Uint64() % 1_000_000_000_000
	}
	r := &runner{cfg: cfg, logw: logw, rep: newReport(cfg)}
	if err := r.prepare(); err != nil {
		r.cleanup()
		return nil, err
	}
	r.rep.Phases["start"] = time.Since(r.began).Seconds()
	r.run(ctx)
	r.cleanup()
	return r.rep, nil
}

// Recheck runs the history checkers again on the history saved by an
// earlier run (Config.Recheck), with that run's mode and failover timeout:
// a checker's verdict can be reproduced exactly, without a cluster.
func Recheck(cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(cfg.Recheck)
	if err != nil {
		return nil, fmt.Errorf("%w: -recheck: %v", ErrUsage, err)
	}
	defer f.Close()
	h, err := history.ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("chaos: -recheck %s: %w", cfg.Recheck, err)
	}
	rep := newReport(cfg)
	rep.Recheck = cfg.Recheck
	rep.Command = "go run ./chaos -mode " + cfg.Mode + " -failover-timeout " + cfg.FailoverTimeout.String() + " -recheck " + cfg.Recheck
	for _, o := range h.Ops {
		rep.WorkloadEnd = max(rep.WorkloadEnd, o.Return)
	}
	rep.addHistory(h, cfg)
	rep.Checkers = checkHistory(h, cfg, filepath.Dir(cfg.Recheck))
	rep.finish(0)
	return rep, nil
}

// runner is one run's state.
type runner struct {
	cfg  Config
	logw io.Writer
	rep  *Report

	out    string // the artifacts' directory
	ownOut bool   // made here: removed unless the run fails
	began  time.Time
	c      *clustertest.Cluster
	ms     *members
	rec    *history.Recorder
	prox   [][]*faultproxy.Proxy // the clients' proxies: [location][member]
	logMu  sync.Mutex
}

func (r *runner) logf(format string, args ...any) {
	if !r.cfg.Verbose {
		return
	}
	r.say(format, args...)
}

// say writes one line to logw, stamped with the run's time.
func (r *runner) say(format string, args ...any) {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	at := time.Duration(0)
	if !r.began.IsZero() {
		at = time.Since(r.began)
	}
	fmt.Fprintf(r.logw, "chaos [%7.2fs] %s\n", at.Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.rep.Errors = append(r.rep.Errors, msg)
	r.say("error: %s", msg)
}

// prepare makes the output directory, builds lockd and starts the
// cluster, its proxies and the recorder.
func (r *runner) prepare() error {
	r.began = time.Now()
	if r.out = r.cfg.Out; r.out == "" {
		dir, err := os.MkdirTemp("", "lockd-chaos-")
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		r.out, r.ownOut = dir, true
	} else if err := os.MkdirAll(r.out, 0o755); err != nil {
		return fmt.Errorf("chaos: -out: %w", err)
	}
	r.say("mode %s, seed %d, duration %v; artifacts in %s", r.cfg.Mode, r.cfg.Seed, r.cfg.Duration, r.out)
	single := r.cfg.Mode == api.ModeSingle
	mode := r.cfg.Mode
	if single {
		mode = clustertest.ModeSingle
	}
	c, err := clustertest.New(clustertest.Options{ // builds lockd when Binary is empty
		Mode: mode, Members: r.cfg.members(), FailoverTimeout: r.cfg.FailoverTimeout, Proxied: !single, Binary: r.cfg.Binary,
		Secure: r.cfg.Secure,
	})
	if err != nil {
		if strings.Contains(err.Error(), "not in this build") {
			return fmt.Errorf("%w: --cluster %s: %v", ErrModeUnavailable, r.cfg.Mode, firstLine(err.Error(), "not in this build"))
		}
		return err
	}
	r.c = c
	r.cfg.clientTLS = c.ClientTLS()
	lead, took, why := waitAgreement(c, startAgreement)
	if lead < 0 {
		return fmt.Errorf("chaos: no agreed active/leader %v after the start: %s", took, why)
	}
	r.logf("cluster up: member %d leads (%v)", lead, took.Round(time.Millisecond))
	// A client at location L reaches member k through its own proxy
	// prox[L][k], so a partition can cut it off from the members of the
	// other side.
	for range clientLocations {
		var row []*faultproxy.Proxy
		for _, m := range c.Members() {
			p, err := faultproxy.New("127.0.0.1:0", m.Addr())
			if err != nil {
				for _, p := range row {
					p.Close()
				}
				return err
			}
			row = append(row, p)
		}
		r.prox = append(r.prox, row)
	}
	return nil
}

// firstLine returns the line of s that contains sub (s if none does).
func firstLine(s, sub string) string {
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return s
}

// run is the run proper: the workload and the nemesis for the duration,
// the final heal, the liveness check, the checkers.
func (r *runner) run(ctx context.Context) {
	bigStart := time.Now()
	if r.cfg.BigLocks > 0 && r.cfg.Mode != api.ModeSingle {
		r.logf("large-state phase: %d locks, --failover-timeout %v, on a cluster of its own", r.cfg.BigLocks, r.cfg.BigFailover)
	}
	big := runBigState(r.cfg, r.out, r.logf)
	r.rep.Phases["bigstate"] = time.Since(bigStart).Seconds()
	r.rec = history.NewRecorder(time.Now()) // the workload's clock starts after the large-state phase
	r.ms = newMembers(r.c, r.rec)
	raw := newRawChecks(r.cfg, r.c, r.logf)
	res := newResource(r.rec)
	wl := newWorkload(r.cfg, r.rec, res, r.addrs)

	stopWorkers := make(chan struct{})
	var workers sync.WaitGroup
	var clients []*client.Client
	// Workers 0..Workers-1 take the mutex keys; the next SemWorkers take
	// permits of the semaphore keys.
	for i := range r.cfg.Workers + r.cfg.SemWorkers {
		cl, err := wl.newClient(i % len(r.prox))
		if err != nil {
			r.fail("worker %d: client: %v", i, err)
			continue
		}
		clients = append(clients, cl)
		k := &worker{w: wl, id: i, cl: cl, rng: rand.New(rand.NewPCG(r.cfg.Seed, uint64(i)))}
		if i < r.cfg.Workers {
			workers.Go(func() { k.run(stopWorkers, wl.keys, 0) })
		} else {
			workers.Go(func() { k.run(stopWorkers, wl.sem, r.cfg.SemLimit) })
		}
	}
	stopWatch := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() { r.ms.watch(stopWatch, r.logf) })
	nem := newNemesis(r.cfg, r.c, r.ms, r.rec, r.prox, raw, r.logf)
	stopNemesis := make(chan struct{})
	var nemDone sync.WaitGroup
	nemDone.Go(func() { nem.run(stopNemesis) })

	timer := time.NewTimer(r.cfg.Duration)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
		r.fail("interrupted after %v: %v", r.rec.Now().Round(time.Millisecond), context.Cause(ctx))
	}
	r.rep.Phases["load"] = r.rec.Now().Seconds()
	r.logf("stopping the nemesis: every fault reverted")
	close(stopNemesis)
	nemDone.Wait()
	r.logf("stopping the workers: each ends its current operation")
	close(stopWorkers)
	workers.Wait()
	for _, cl := range clients {
		cl.Close()
	}
	r.rep.WorkloadEnd = r.rec.Now()
	r.rep.Phases["stop"] = r.rep.WorkloadEnd.Seconds() - r.rep.Phases["load"]

	// The final heal: every fault lifted, every member running.
	healStart := r.rec.Now()
	for _, e := range r.ms.heal(toProxies(r.prox)) {
		r.fail("final heal: %s", e)
	}
	close(stopWatch)
	watcher.Wait()
	healed := r.rec.Now()
	r.logf("healed in %v", (healed - healStart).Round(time.Millisecond))
	r.rep.Phases["heal"] = (healed - healStart).Seconds()

	live := r.liveness(res, healed)
	r.rep.Phases["liveness"] = (r.rec.Now() - healed).Seconds()
	checking := time.Now()
	r.ms.logProblems()
	members := r.membersResult()
	clientErrs := clientErrors(wl)

	h := r.rec.History()
	r.rep.addHistory(h, r.cfg)
	r.rep.Checkers = append(r.rep.Checkers, checkHistory(h, r.cfg, r.out)...)
	r.rep.Checkers = append(r.rep.Checkers, live, members, clientErrs)
	r.rep.Checkers = append(r.rep.Checkers, raw.results()...)
	r.rep.Checkers = append(r.rep.Checkers, big)
	r.rep.Phases["check"] = time.Since(checking).Seconds()
	r.rep.finish(time.Since(r.began))
	r.keepArtifacts(h)
	r.say("%s in %v", map[bool]string{true: "passed", false: "FAILED"}[r.rep.Passed], time.Since(r.began).Round(time.Second))
}

func toProxies(rows [][]*faultproxy.Proxy) []proxy {
	var out []proxy
	for _, row := range rows {
		for _, p := range row {
			out = append(out, p)
		}
	}
	return out
}

// addrs lists, for each location, the addresses of its proxies to every
// member.
func (r *runner) addrs(loc int) []string {
	var out []string
	for _, p := range r.prox[loc] {
		out = append(out, p.Addr())
	}
	return out
}

// splitWindows are the spans of a priority run in which two members may
// both be active: from each partition's start until 2 × the failover
// timeout (and splitSlack) after its heal (docs/PROTOCOL.md §6.3,
// automatic demotion). Windows that overlap are merged: a partition that
// starts before the demotion after the previous one continues the same
// split.
func splitWindows(h history.History, failover time.Duration) []history.Window {
	var ws []history.Window
	for _, f := range h.Faults {
		if f.Kind == FaultPartition {
			ws = append(ws, history.Window{Start: f.Start, End: f.End + 2*failover + splitSlack, Why: f.Target})
		}
	}
	slices.SortFunc(ws, func(a, b history.Window) int { return cmp.Compare(a.Start, b.Start) })
	var out []history.Window
	for _, w := range ws {
		if n := len(out); n > 0 && w.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, w.End)
			out[n-1].Why += "; " + w.Why
			continue
		}
		out = append(out, w)
	}
	return out
}

// checkHistory runs the checkers that need only the history. On the
// mutex keys: fenced safety; linearizability (raft, and single mode when
// no crash happened) and mutual exclusion (asserted in raft and single
// modes, measured in priority mode). Over every grant: tokens (priority:
// split windows excused). On the semaphore keys: the counted fence and
// the holders beyond the limit (asserted, but in priority mode, where the
// overlap is measured and only the fence's rule is asserted). In single
// mode the grants a crash (kill -9) may have lost are excused, and only
// those (crashWindows; PROTOCOL.md §4).
func checkHistory(h history.History, cfg Config, visualizeDir string) []history.Result {
	shared := history.SharedKeys(h)
	mutex := h.Select(func(k string) bool { return !shared[k] })
	sem := h.Select(func(k string) bool { return shared[k] })
	var windows, crashes []history.Window
	assert := true
	switch cfg.Mode {
	case api.ModePriority:
		windows, assert = splitWindows(h, cfg.FailoverTimeout), false
	case api.ModeSingle:
		crashes = crashWindows(h)
	}
	out := []history.Result{history.CheckFenced(mutex), history.CheckTokens(h, windows)}
	switch {
	case cfg.Mode == api.ModePriority:
		out = append(out, history.Result{Name: "linearizability", Verdict: history.Skipped,
			Summary: "priority mode is not linearizable by design: a crash or a split brain can lose grants (docs/PROTOCOL.md §6.3); see unfenced-overlap"})
	case len(crashes) > 0:
		out = append(out, history.Result{Name: "linearizability", Verdict: history.Skipped,
			Summary: fmt.Sprintf("a single node loses its held locks in a crash by design (docs/PROTOCOL.md §4), and this run had %d; see mutual-exclusion, which excuses those grants and no others", len(crashes))})
	default:
		out = append(out, history.CheckLinearizable(mutex, history.LinOptions{Timeout: cfg.CheckTimeout, Dir: visualizeDir}))
	}
	return append(out,
		history.CheckOverlap(mutex, assert, crashes),
		history.CheckCountedFenced(sem, assert, crashes),
		history.CheckCountedOverlap(sem, assert, crashes))
}

// crashWindows are the spans of a single-node run in which the node may
// have lost its held locks: each kill -9 (and unexpected exit), from the
// fault's start — before the signal, or when the exit was seen — to its
// end, once the node runs again. An acquire invoked in such a span may
// have been served before the kill, so the span reaches the restart: a
// grant made after the restart but invoked during the downtime is excused
// too (sound, a little generous).
func crashWindows(h history.History) []history.Window {
	var out []history.Window
	for _, f := range h.Faults {
		if f.Kind == FaultKill || f.Kind == faultCrash {
			end := f.End
			if end < f.Start { // never ended: the node was not restarted before the history was read
				end = math.MaxInt64
			}
			out = append(out, history.Window{Start: f.Start, End: end, Why: f.Kind + " " + f.Target})
		}
	}
	return out
}

// liveness checks, after the final heal, that every member agrees on one
// active/leader within LivenessWithin, that a fresh client acquires,
// writes under and releases every key (waiting out leases left by
// indeterminate grants), and that no lock is left held.
func (r *runner) liveness(res *resource, healed time.Duration) history.Result {
	lr := history.Result{Name: "liveness", Figures: map[string]float64{}}
	bad := func(format string, args ...any) {
		lr.Count++
		lr.Violations = append(lr.Violations, fmt.Sprintf(format, args...))
	}
	lead, took, why := waitAgreement(r.c, livenessPatience)
	lr.Figures["agreement_seconds"] = took.Seconds()
	switch {
	case lead < 0:
		bad("no agreed active/leader %v after the final heal: %s", took.Round(time.Millisecond), why)
	case took > LivenessWithin:
		bad("every member agreed on member %d only %v after the final heal (want ≤ %v)", lead, took.Round(time.Millisecond), LivenessWithin)
	}
	r.logf("agreement on member %d after %v", lead, took.Round(time.Millisecond))
	if r.cfg.Mode == api.ModePriority {
		// A split may end with the final heal, and a member of its other
		// side may have been restarted by it: until the demotion bound
		// (§6.3, 2 × the failover timeout) the active may not have heard
		// every member, nor raised its tokens above what they issued
		// (DESIGN.md, "A healed partition"). The final acquires come after.
		time.Sleep(healed + 2*r.cfg.FailoverTimeout + splitSlack - r.rec.Now())
	}

	wl := newWorkload(r.cfg, r.rec, res, r.addrs)
	cl, err := wl.newClient(0)
	if err != nil {
		bad("client: %v", err)
	} else {
		k := &worker{w: wl, id: r.cfg.Workers + r.cfg.SemWorkers, cl: cl}
		wait := min(r.cfg.Lease+2*r.cfg.FailoverTimeout+5*time.Second, 255*time.Second)
		acquired := 0
		final := func(key string, limit int) {
			g, l := k.acquire(key, wait, limit)
			if l.Token == 0 {
				o := r.rec.History().Ops[g]
				bad("final acquire of %q: %s", key, o.Detail)
				return
			}
			acquired++
			if !k.put(g, l, limit, false) {
				bad("final write to %q under token %d rejected as stale", key, l.Token)
			}
			if limit > 0 {
				res.leave(k.id, g, key, l.Token)
			}
			if out := k.release(g, l); out != history.OK {
				bad("final release of %q: %s", key, r.rec.History().Ops[len(r.rec.History().Ops)-1].Detail)
			}
		}
		for _, key := range wl.keys {
			final(key, 0)
		}
		if r.cfg.SemWorkers > 0 {
			for _, key := range wl.sem {
				final(key, r.cfg.SemLimit)
			}
		}
		cl.Close()
		lr.Figures["final_acquires"] = float64(acquired)
		for _, a := range wl.anomalies {
			bad("%s", a)
		}
	}
	if lead, _, _ = waitAgreement(r.c, livenessPatience); lead >= 0 {
		st, err := r.c.Member(lead).Status()
		switch {
		case err != nil:
			bad("member %d's /status: %v", lead, err)
		case st.Keys != 0:
			// The raw probes' keys (rawChecks) may still run out their
			// short leases; every other key must be free once the leases
			// of indeterminate grants have run out. The final acquire of
			// an exclusive key waited for those; a semaphore's took a free
			// permit beside one, so its lease is waited for here.
			var left []string
			for deadline := time.Now().Add(r.cfg.Lease + time.Second); ; {
				keys, err := dumpLocks(r.c.Member(lead).AdminURL())
				if err != nil {
					bad("member %d's /debug/locks: %v", lead, err)
					break
				}
				left = left[:0]
				for k := range keys {
					if !strings.HasPrefix(k, "raw/") {
						left = append(left, k)
					}
				}
				if len(left) == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if len(left) > 0 {
				slices.Sort(left)
				bad("member %d still holds %d locks after the final releases: %s", lead, len(left), strings.Join(left[:min(len(left), 5)], ", "))
			}
		}
	}
	lr.Figures["after_heal_seconds"] = (r.rec.Now() - healed).Seconds()
	if lr.Count > 0 {
		lr.Verdict = history.Violated
	} else {
		lr.Verdict = history.Pass
	}
	keys := r.cfg.Keys
	if r.cfg.SemWorkers > 0 {
		keys += r.cfg.SemKeys
	}
	lr.Summary = fmt.Sprintf("one active/leader agreed %v after the final heal; %d/%d keys acquired, written and released",
		took.Round(time.Millisecond), int(lr.Figures["final_acquires"]), keys)
	return lr
}

// membersResult reports the members' problems: unexpected exits, failed
// restarts, unclean SIGTERM exits, race reports and panics in their logs.
func (r *runner) membersResult() history.Result {
	res := history.Result{Name: "members"}
	r.ms.mu.Lock()
	problems := append([]string(nil), r.ms.problems...)
	r.ms.mu.Unlock()
	res.Count = len(problems)
	res.Violations = problems[:min(len(problems), history.MaxViolations)]
	res.Verdict = history.Pass
	if res.Count > 0 {
		res.Verdict = history.Violated
	}
	res.Summary = fmt.Sprintf("%d problems: unexpected exits, failed restarts, unclean SIGTERM exits, races or panics in the logs", res.Count)
	return res
}

// clientErrors reports answers the protocol does not allow under faults
// (a server error, an unknown error).
func clientErrors(wl *workload) history.Result {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	res := history.Result{Name: "client-errors", Count: wl.anomalyN, Verdict: history.Pass}
	res.Violations = append(res.Violations, wl.anomalies...)
	if res.Count > 0 {
		res.Verdict = history.Violated
	}
	res.Summary = fmt.Sprintf("%d answers outside what the protocol allows under faults", res.Count)
	return res
}

// keepArtifacts writes the history (and, when the run failed, every
// member's log) to the output directory; a temporary directory of a run
// that passed is removed.
func (r *runner) keepArtifacts(h history.History) {
	if r.rep.Passed && r.ownOut {
		return // cleanup removes it
	}
	write := func(name string, fn func(io.Writer) error) {
		path := filepath.Join(r.out, name)
		f, err := os.Create(path)
		if err == nil {
			err = fn(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			r.fail("writing %s: %v", path, err)
			return
		}
		r.rep.Artifacts = append(r.rep.Artifacts, path)
	}
	write("history.json", h.WriteJSON)
	write("report.json", r.rep.WriteJSON)
	// The members' logs are kept when the run failed, and whenever -out
	// named the directory: a passing run's lost grants (measured, not
	// failed) are read against them.
	if (!r.rep.Passed || r.cfg.Out != "") && r.c != nil {
		write("members.log", func(w io.Writer) error {
			r.c.Dump(w, 1<<20)
			return nil
		})
	}
	r.rep.Out = r.out
}

// cleanup closes the proxies and the cluster, and removes a temporary
// output directory of a run that passed (or never ran).
func (r *runner) cleanup() {
	for _, row := range r.prox {
		for _, p := range row {
			p.Close()
		}
	}
	if r.c != nil {
		if err := r.c.Close(); err != nil {
			r.say("closing the cluster: %v", err)
		}
	}
	if r.ownOut && (r.rep == nil || r.rep.Passed || r.rep.Out == "") {
		os.RemoveAll(r.out)
	}
}
