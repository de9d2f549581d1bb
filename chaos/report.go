package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/history"
)

// Report is what a run found: its configuration, the faults injected, the
// operations by kind and outcome, availability, and every checker's
// verdict.
type Report struct {
	Mode    string `json:"mode"`
	Seed    uint64 `json:"seed"`
	Command string `json:"command"` // reruns the same schedule
	Passed  bool   `json:"passed"`
	Recheck string `json:"recheck,omitempty"` // the saved history checked again, when that is what this is

	Duration        float64  `json:"duration_seconds"` // the workload's and the nemesis's
	Elapsed         float64  `json:"elapsed_seconds"`  // the whole run
	Members         int      `json:"members"`
	Workers         int      `json:"workers"`
	Keys            int      `json:"keys"`
	SemWorkers      int      `json:"sem_workers"` // the semaphore workers, beside Workers
	SemKeys         int      `json:"sem_keys"`
	SemLimit        int      `json:"sem_limit"` // each semaphore key's permits
	Lease           float64  `json:"lease_seconds"`
	FailoverTimeout float64  `json:"failover_timeout_seconds"`
	FaultKinds      []string `json:"fault_kinds"`

	// Faults counts the faults injected by kind (crashes: members that
	// exited without a fault).
	Faults      map[string]int `json:"faults"`
	FaultsTotal int            `json:"faults_total"`
	// Operations counts operations by kind, then outcome ("ok",
	// "unknown", "fail: timeout", ...).
	Operations   map[string]map[string]int `json:"operations"`
	Availability Availability              `json:"availability"`
	Checkers     []history.Result          `json:"checkers"`
	Errors       []string                  `json:"errors,omitempty"` // what the run itself could not do
	Out          string                    `json:"out,omitempty"`    // the directory kept
	Artifacts    []string                  `json:"artifacts,omitempty"`
	Timeline     []history.Fault           `json:"timeline,omitempty"`
	// Phases is how long each phase of the run took, in seconds: start,
	// bigstate (the large-state phase, on a cluster of its own), load (the
	// workload and the nemesis), stop (the nemesis's reverts and the
	// workers' last operations), heal, liveness, check.
	Phases map[string]float64 `json:"phase_seconds"`

	WorkloadEnd time.Duration `json:"-"`
}

// Availability summarizes how the workload fared while the nemesis ran.
type Availability struct {
	Acquires       int     `json:"acquires"`
	Granted        int     `json:"granted"`
	GrantsPerSec   float64 `json:"grants_per_second"`
	LongestGapSecs float64 `json:"longest_gap_seconds"` // the longest stretch without a grant completing
}

func newReport(cfg Config) *Report {
	return &Report{
		Mode: cfg.Mode, Seed: cfg.Seed, Command: cfg.Command(),
		Duration: cfg.Duration.Seconds(), Members: cfg.members(), Workers: cfg.Workers, Keys: cfg.Keys,
		SemWorkers: cfg.SemWorkers, SemKeys: cfg.SemKeys, SemLimit: cfg.SemLimit,
		Lease: cfg.Lease.Seconds(), FailoverTimeout: cfg.FailoverTimeout.Seconds(), FaultKinds: cfg.Faults,
		Faults: map[string]int{}, Operations: map[string]map[string]int{}, Phases: map[string]float64{},
	}
}

// addHistory fills the counts from h.
func (rep *Report) addHistory(h history.History, cfg Config) {
	for _, f := range h.Faults {
		rep.Faults[f.Kind]++
		if slices.Contains(AllFaults, f.Kind) {
			rep.FaultsTotal++
		}
	}
	rep.Timeline = h.Faults
	var grants []time.Duration
	for _, o := range h.Ops {
		kind := o.Kind.String()
		if rep.Operations[kind] == nil {
			rep.Operations[kind] = map[string]int{}
		}
		out := o.Outcome.String()
		if o.Outcome == history.Fail {
			out += ": " + shortDetail(o.Detail)
		}
		rep.Operations[kind][out]++
		if o.Kind == history.Acquire && o.Worker < cfg.Workers && o.Call < rep.WorkloadEnd {
			rep.Availability.Acquires++
			if o.Outcome == history.OK {
				rep.Availability.Granted++
				grants = append(grants, o.Return)
			}
		}
	}
	slices.Sort(grants)
	prev := time.Duration(0)
	var gap time.Duration
	for _, g := range grants {
		gap = max(gap, g-prev)
		prev = g
	}
	gap = max(gap, rep.WorkloadEnd-prev)
	rep.Availability.LongestGapSecs = gap.Seconds()
	if rep.WorkloadEnd > 0 {
		rep.Availability.GrantsPerSec = float64(rep.Availability.Granted) / rep.WorkloadEnd.Seconds()
	}
}

// shortDetail keeps a failure's detail short enough to count by.
func shortDetail(d string) string {
	if i := strings.IndexByte(d, ':'); i > 0 && strings.HasPrefix(d, "not sent") {
		return d[:i]
	}
	if len(d) > 40 {
		return d[:40] + "…"
	}
	return d
}

// finish settles the verdict: passed when every checker is OK and the run
// had no error.
func (rep *Report) finish(elapsed time.Duration) {
	rep.Elapsed = elapsed.Seconds()
	rep.Passed = len(rep.Errors) == 0
	for _, c := range rep.Checkers {
		if !c.OK() {
			rep.Passed = false
		}
	}
}

// WriteJSON writes the report as one JSON document.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Text renders the report for a person.
func (rep *Report) Text() string {
	var b strings.Builder
	if rep.Recheck != "" {
		fmt.Fprintf(&b, "chaos: the history in %s checked again, mode %s, failover timeout %vs\n", rep.Recheck, rep.Mode, rep.FailoverTimeout)
	} else {
		fmt.Fprintf(&b, "chaos: mode %s, seed %d, %v of faults and load, %d members, %d workers on %d keys, lease %vs, failover timeout %vs\n",
			rep.Mode, rep.Seed, time.Duration(rep.Duration*float64(time.Second)), rep.Members, rep.Workers, rep.Keys, rep.Lease, rep.FailoverTimeout)
		if rep.SemWorkers > 0 {
			fmt.Fprintf(&b, "semaphore: %d workers on %d keys of %d permits each\n", rep.SemWorkers, rep.SemKeys, rep.SemLimit)
		}
	}
	fmt.Fprintf(&b, "faults injected: %d (%s)\n", rep.FaultsTotal, countList(rep.Faults))
	fmt.Fprintf(&b, "operations:\n")
	for _, kind := range []string{"acquire", "renew", "release", "write", "leave"} {
		outs := rep.Operations[kind]
		if len(outs) == 0 {
			continue
		}
		total := 0
		for _, n := range outs {
			total += n
		}
		fmt.Fprintf(&b, "    %-8s %7d: %s\n", kind, total, countList(outs))
	}
	a := rep.Availability
	fmt.Fprintf(&b, "availability: %d of %d acquires granted, %.1f grants/s, longest stretch without a grant %.2fs\n",
		a.Granted, a.Acquires, a.GrantsPerSec, a.LongestGapSecs)
	fmt.Fprintf(&b, "checkers:\n")
	for _, c := range rep.Checkers {
		for l := range strings.SplitSeq(strings.TrimRight(c.String(), "\n"), "\n") {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	if rep.Recheck == "" {
		fmt.Fprintf(&b, "phases:")
		for _, p := range []string{"start", "bigstate", "load", "stop", "heal", "liveness", "check"} {
			fmt.Fprintf(&b, " %s %.1fs", p, rep.Phases[p])
		}
		fmt.Fprintf(&b, "\n")
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(&b, "error: %s\n", e)
	}
	switch {
	case rep.Recheck != "" && rep.Passed:
		fmt.Fprintf(&b, "PASSED\n")
	case rep.Recheck != "":
		fmt.Fprintf(&b, "FAILED; check again with:\n    %s\n", rep.Command)
	case rep.Passed:
		fmt.Fprintf(&b, "PASSED (seed %d)\n", rep.Seed)
	default:
		fmt.Fprintf(&b, "FAILED (seed %d); rerun with:\n    %s\n", rep.Seed, rep.Command)
	}
	if rep.Out != "" {
		fmt.Fprintf(&b, "artifacts in %s\n", rep.Out)
	}
	return b.String()
}

// countList renders counts as "a 3, b 2", largest first.
func countList(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range m {
		kvs = append(kvs, kv{k, v})
	}
	slices.SortFunc(kvs, func(a, b kv) int {
		if c := cmp.Compare(b.v, a.v); c != 0 {
			return c
		}
		return cmp.Compare(a.k, b.k)
	})
	var parts []string
	for _, e := range kvs {
		parts = append(parts, fmt.Sprintf("%s %d", e.k, e.v))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
