package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lockd-dev/lockd/api"
)

// The failover mode's report: a progress line per trial, the spread of each
// figure over the trials, the goals judged, and the tables of the text and
// Markdown output.

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
