package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// summary is the median over rounds of one workload on one target.
type summary struct {
	Workload    string   `json:"workload"`
	Target      string   `json:"target"`
	Rounds      int      `json:"rounds"`
	Unit        string   `json:"unit"`
	Rate        float64  `json:"rate"`
	P50         float64  `json:"p50_us"`
	P99         float64  `json:"p99_us"`
	P999        float64  `json:"p999_us"`
	HandoffRate float64  `json:"handoff_rate,omitempty"`
	HandoffP50  float64  `json:"handoff_p50_us,omitempty"`
	HandoffP99  float64  `json:"handoff_p99_us,omitempty"`
	Jain        float64  `json:"jain,omitempty"`
	MemPerConn  *memStat `json:"mem_per_conn,omitempty"`
	MemPerLock  *memStat `json:"mem_per_lock,omitempty"`
	MemHeld     *memStat `json:"mem_held,omitempty"`
	Errors      int64    `json:"errors,omitempty"`
	Skipped     string   `json:"skipped,omitempty"`
}

// ratio compares lockd with another target on one metric, round by round.
type ratio struct {
	Workload string `json:"workload"`
	Metric   string `json:"metric"`
	// Of is the target divided: lockd, or lockd-bin against lockd-base (a
	// before/after run of two builds).
	Of     string    `json:"of"`
	Versus string    `json:"versus"`
	Rounds []float64 `json:"rounds"` // of / versus in each round (0: not measured)
	Median float64   `json:"median"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianInt(v []int64) int64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return int64(median(f))
}

// order returns the distinct values of key(r) in first-seen order.
func order(rs []*Result, key func(*Result) string) []string {
	var out []string
	for _, r := range rs {
		if k := key(r); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// summarize takes the median of every figure over the rounds.
func summarize(rs []*Result) []summary {
	var out []summary
	for _, wl := range order(rs, func(r *Result) string { return r.Workload }) {
		for _, tg := range order(rs, func(r *Result) string { return r.Target }) {
			var sel []*Result
			for _, r := range rs {
				if r.Workload == wl && r.Target == tg {
					sel = append(sel, r)
				}
			}
			if len(sel) == 0 {
				continue
			}
			s := summary{Workload: wl, Target: tg, Rounds: len(sel), Unit: sel[0].Unit, Skipped: sel[0].Skipped}
			if s.Skipped != "" {
				out = append(out, s)
				continue
			}
			med := func(f func(*Result) float64) float64 {
				v := make([]float64, len(sel))
				for i, r := range sel {
					v[i] = f(r)
				}
				return median(v)
			}
			s.Rate = med(func(r *Result) float64 { return r.Rate })
			s.P50 = med(func(r *Result) float64 { return r.Latency.P50 })
			s.P99 = med(func(r *Result) float64 { return r.Latency.P99 })
			s.P999 = med(func(r *Result) float64 { return r.Latency.P999 })
			for _, r := range sel {
				s.Errors += r.Errors
			}
			if sel[0].Handoff != nil {
				s.HandoffRate = med(func(r *Result) float64 { return r.HandoffRate })
				s.HandoffP50 = med(func(r *Result) float64 { return r.Handoff.P50 })
				s.HandoffP99 = med(func(r *Result) float64 { return r.Handoff.P99 })
				s.Jain = med(func(r *Result) float64 { return r.Jain })
			}
			if sel[0].MemPerConn != nil {
				var hc, rc, hl, rl []int64
				for _, r := range sel {
					if r.MemPerConn != nil {
						hc, rc = append(hc, r.MemPerConn.Heap), append(rc, r.MemPerConn.RSS)
						hl, rl = append(hl, r.MemPerLock.Heap), append(rl, r.MemPerLock.RSS)
					}
				}
				s.MemPerConn = &memStat{Heap: medianInt(hc), RSS: medianInt(rc)}
				s.MemPerLock = &memStat{Heap: medianInt(hl), RSS: medianInt(rl)}
			} else if sel[0].MemHeld != nil {
				var hl, rl, ht, rt []int64
				for _, r := range sel {
					if r.MemHeld != nil {
						hl, rl = append(hl, r.MemPerLock.Heap), append(rl, r.MemPerLock.RSS)
						ht, rt = append(ht, r.MemHeld.Heap), append(rt, r.MemHeld.RSS)
					}
				}
				s.MemPerLock = &memStat{Heap: medianInt(hl), RSS: medianInt(rl)}
				s.MemHeld = &memStat{Heap: medianInt(ht), RSS: medianInt(rt)}
			}
			out = append(out, s)
		}
	}
	return out
}

// find returns the result of workload wl on target tg in round (nil if
// it was not run or was skipped).
func find(rs []*Result, wl, tg string, round int) *Result {
	for _, r := range rs {
		if r.Workload == wl && r.Target == tg && r.Round == round && r.Skipped == "" {
			return r
		}
	}
	return nil
}

// maxRound is the number of rounds in rs.
func maxRound(rs []*Result) int {
	n := 0
	for _, r := range rs {
		n = max(n, r.Round)
	}
	return n
}

// perRound is f(a) ÷ f(b) in every round of workload wl (0 where either was
// not measured), and the median of the measured ones (0 if none).
func perRound(rs []*Result, wl, a, b string, f func(*Result) float64) (rounds []float64, med float64) {
	var got []float64
	for round := 1; round <= maxRound(rs); round++ {
		x, y := find(rs, wl, a, round), find(rs, wl, b, round)
		v := 0.0
		if x != nil && y != nil && f(y) > 0 {
			v = f(x) / f(y)
			got = append(got, v)
		}
		rounds = append(rounds, v)
	}
	return rounds, median(got)
}

// ratios compares lockd with every other target, per round, on each
// workload's throughput metric (and, for contended, real handoffs/s); and
// lockd-bin with lockd-base when both ran: a build against its baseline in
// one interleaved run, which needs no lockd target beside them.
func ratios(rs []*Result) []ratio {
	var out []ratio
	type metric struct {
		name string
		f    func(*Result) float64
	}
	for _, wl := range order(rs, func(r *Result) string { return r.Workload }) {
		if wl == wlFanin {
			continue // renews/s is set by the renew interval, not by the server
		}
		ms := []metric{{"", func(r *Result) float64 { return r.Rate }}}
		if wl == wlContended {
			ms = append(ms, metric{"handoffs/s", func(r *Result) float64 { return r.HandoffRate }})
		}
		add := func(m metric, of, versus string) {
			rounds, med := perRound(rs, wl, of, versus, m.f)
			if med == 0 {
				return
			}
			rt := ratio{Workload: wl, Metric: m.name, Of: of, Versus: versus, Rounds: rounds, Median: med}
			if rt.Metric == "" {
				rt.Metric = find(rs, wl, of, 1+slices.IndexFunc(rounds, func(v float64) bool { return v > 0 })).Unit
			}
			out = append(out, rt)
		}
		for _, m := range ms {
			for _, tg := range order(rs, func(r *Result) string { return r.Target }) {
				if tg != "lockd" {
					add(m, "lockd", tg)
				}
			}
			add(m, "lockd-bin", "lockd-base")
		}
	}
	return out
}

// goal is one of the cluster issues' targets (11: lockd-priority against
// lockd; 12: lockd-raft against etcd), judged per round.
type goal struct {
	Target string    `json:"target"`
	What   string    `json:"what"`
	Rounds []float64 `json:"rounds"` // the figure in each round where it was measured
	Median float64   `json:"median"`
	Limit  float64   `json:"limit"`
	AtMost bool      `json:"at_most"` // the figure must be ≤ Limit (else ≥)
	Times  bool      `json:"times"`   // a ratio shown as "20×" rather than a percentage
	Met    int       `json:"rounds_met"`
}

// clusterTargets are the targets whose results carry replication figures
// and are compared with lockd.
var clusterTargets = []string{"lockd-priority", "lockd-raft", "lockd-bin", "lockd-base", "lockd-priority-base", "lockd-raft-base"}

// goals judges issue 11's targets for lockd-priority — uncontended pairs/s
// and contended real handoffs/s each ≥ 80 % of lockd's in the same round,
// and the replication lag p99 ≤ 5 ms during those runs — and issue 12's for
// lockd-raft: uncontended pairs/s ≥ 20× etcd's and contended real handoffs/s
// ≥ 5× etcd's concurrency.Mutex in the same round; and issue 19's for
// lockd-tls: uncontended pairs/s ≥ 70 % of lockd's and ≥ 2.5× redis-tls's.
func goals(rs []*Result) []goal {
	const tg = "lockd-priority"
	var out []goal
	target, times := tg, false
	add := func(what string, limit float64, atMost bool, vals []float64) {
		g := goal{Target: target, What: what, Limit: limit, AtMost: atMost, Times: times}
		for _, v := range vals {
			if v < 0 {
				continue // not measured
			}
			g.Rounds = append(g.Rounds, v)
			if atMost && v <= limit || !atMost && v >= limit {
				g.Met++
			}
		}
		if len(g.Rounds) > 0 {
			g.Median = median(g.Rounds)
			out = append(out, g)
		}
	}
	measured := func(vals []float64) []float64 {
		for i, v := range vals {
			if v == 0 {
				vals[i] = -1
			}
		}
		return vals
	}
	up, _ := perRound(rs, wlUncontended, tg, "lockd", func(r *Result) float64 { return r.Rate })
	add("uncontended pairs/s ÷ lockd", 0.8, false, measured(up))
	hp, _ := perRound(rs, wlContended, tg, "lockd", func(r *Result) float64 { return r.HandoffRate })
	add("contended handoffs/s ÷ lockd", 0.8, false, measured(hp))
	for _, wl := range []string{wlUncontended, wlContended} {
		var lag []float64
		for round := 1; round <= maxRound(rs); round++ {
			if r := find(rs, wl, tg, round); r != nil && r.Repl != nil && r.Repl.LagSamples > 0 {
				lag = append(lag, r.Repl.LagP99/1e3)
			}
		}
		add(wl+": replication lag p99, ms", 5, true, lag)
	}
	target, times = "lockd-raft", true
	up, _ = perRound(rs, wlUncontended, target, "etcd", func(r *Result) float64 { return r.Rate })
	add("uncontended pairs/s ÷ etcd", 20, false, measured(up))
	hp, _ = perRound(rs, wlContended, target, "etcd", func(r *Result) float64 { return r.HandoffRate })
	add("contended handoffs/s ÷ etcd concurrency.Mutex", 5, false, measured(hp))
	// Issue 19: TLS costs lockd at most 30 % and keeps it 2.5× Redis over TLS.
	target, times = "lockd-tls", false
	up, _ = perRound(rs, wlUncontended, target, "lockd", func(r *Result) float64 { return r.Rate })
	add("uncontended pairs/s ÷ lockd", 0.7, false, measured(up))
	times = true
	up, _ = perRound(rs, wlUncontended, target, "redis-tls", func(r *Result) float64 { return r.Rate })
	add("uncontended pairs/s ÷ redis-tls", 2.5, false, measured(up))
	// Issue 32: the HTTP API at least 10× etcd's JSON gateway
	// uncontended, and one acquire's p50 over HTTP within 250 µs of the
	// same acquire over the binary protocol.
	target, times = "lockd-http", true
	up, _ = perRound(rs, wlUncontended, target, "etcd-gw", func(r *Result) float64 { return r.Rate })
	add("uncontended pairs/s ÷ etcd-gw", 10, false, measured(up))
	times = false
	var gap []float64
	for round := 1; round <= maxRound(rs); round++ {
		h, b := find(rs, wlSingle, target, round), find(rs, wlSingle, "lockd", round)
		if h != nil && b != nil && h.Skipped == "" && b.Skipped == "" && h.Latency.N > 0 && b.Latency.N > 0 {
			gap = append(gap, h.Latency.P50-b.Latency.P50)
		}
	}
	add("single: acquire p50 − lockd's, µs", 250, true, gap)
	return out
}

// clusterRows is one row per run of a cluster target: its rate, its ratio to
// lockd's in the same round and its replication figures.
func clusterRows(rs []*Result) (head []string, rows [][]string) {
	head = []string{"workload", "target", "round", "rate", "÷ lockd", "handoffs/s ÷ lockd", "lag p50", "lag p99", "lag max",
		"lag samples", "wire B/record", "raw B/record", "records/batch", "raft records/entry", "raft entries/s",
		"raft commit p50 · p99", "failovers", "CPU s: lockd · this target's processes"}
	for _, r := range rs {
		if r.Skipped != "" || !slices.Contains(clusterTargets, r.Target) {
			continue
		}
		base := find(rs, r.Workload, "lockd", r.Round)
		vs := func(f func(*Result) float64) string {
			if base == nil || f(base) <= 0 || f(r) <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f %%", 100*f(r)/f(base))
		}
		row := []string{r.Workload, r.Target, fmt.Sprint(r.Round), si(r.Rate) + " " + r.Unit, "-", "-"}
		if r.Workload != wlFanin {
			row[4] = vs(func(x *Result) float64 { return x.Rate })
		}
		if r.Workload == wlContended {
			row[5] = vs(func(x *Result) float64 { return x.HandoffRate })
		}
		p := r.Repl
		if p != nil && p.LagSamples > 0 {
			row = append(row, durOr0(p.LagP50), durOr0(p.LagP99), durOr0(p.LagMax), fmt.Sprint(p.LagSamples))
		} else {
			row = append(row, "", "", "", "")
		}
		if p != nil && p.Records > 0 {
			row = append(row, fmt.Sprintf("%.1f", p.WirePerRecord), fmt.Sprintf("%.1f", p.RawPerRecord), fmt.Sprintf("%.0f", p.RecordsPerBatch))
		} else {
			row = append(row, "", "", "")
		}
		if p != nil && p.Entries > 0 {
			row = append(row, fmt.Sprintf("%.1f", p.RecordsPerEntry), si(p.EntriesPerSec), durOr0(p.CommitP50)+" · "+durOr0(p.CommitP99))
		} else {
			row = append(row, "", "", "")
		}
		switch {
		case p == nil:
			row = append(row, "")
		case p.Failovers > 0 || p.EpochTo != p.EpochFrom:
			row = append(row, fmt.Sprintf("%d (epoch %d → %d)", p.Failovers, p.EpochFrom, p.EpochTo))
		default:
			row = append(row, "0")
		}
		if base != nil && len(base.ServerCPU) > 0 && len(r.ServerCPU) > 0 {
			row = append(row, cpuText(base.ServerCPU)+" · "+cpuText(r.ServerCPU))
		} else {
			row = append(row, "")
		}
		rows = append(rows, row)
	}
	return head, rows
}

// durOr0 formats microseconds, "0" for zero (a lag of nothing unacknowledged).
func durOr0(us float64) string {
	if us == 0 {
		return "0"
	}
	return dur(us)
}

// goalRows renders the goals.
func goalRows(gs []goal) (head []string, rows [][]string) {
	head = []string{"target", "goal", "per round", "median", "met"}
	for _, g := range gs {
		f := func(v float64) string { return fmt.Sprintf("%.0f %%", 100*v) }
		if g.Times {
			f = func(v float64) string { return fmt.Sprintf("%.1f×", v) }
		}
		limit := "≥ " + f(g.Limit)
		if g.AtMost {
			f = func(v float64) string { return fmt.Sprintf("%.2f", v) }
			limit = "≤ " + f(g.Limit)
		}
		per := make([]string, len(g.Rounds))
		for i, v := range g.Rounds {
			per[i] = f(v)
		}
		rows = append(rows, []string{g.Target, g.What + " " + limit, strings.Join(per, ", "), f(g.Median),
			fmt.Sprintf("%d of %d rounds", g.Met, len(g.Rounds))})
	}
	return head, rows
}

// si formats a rate with a k/M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// dur formats microseconds.
func dur(us float64) string {
	switch {
	case us == 0:
		return "-"
	case us >= 1e6:
		return fmt.Sprintf("%.2fs", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.2fms", us/1e3)
	}
	return fmt.Sprintf("%.0fµs", us)
}

func bytesStr(b int64) string {
	switch {
	case b >= 1<<20 || b <= -1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 10<<10 || b <= -10<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// tableRows renders the summaries and ratios as rows of cells.
func tableRows(ss []summary) (head []string, rows [][]string) {
	head = []string{"workload", "target", "rounds", "rate (median)", "p50", "p99", "p99.9", "handoffs/s", "handoff p50", "handoff p99", "Jain", "mem/conn heap·rss", "mem/lock heap·rss", "locks held: heap·rss", "errors"}
	for _, s := range ss {
		if s.Skipped != "" {
			rows = append(rows, []string{s.Workload, s.Target, fmt.Sprint(s.Rounds), "n/a: " + s.Skipped, "", "", "", "", "", "", "", "", "", "", ""})
			continue
		}
		row := []string{s.Workload, s.Target, fmt.Sprint(s.Rounds), si(s.Rate) + " " + s.Unit, dur(s.P50), dur(s.P99), dur(s.P999)}
		if s.Workload == wlContended {
			row = append(row, si(s.HandoffRate), dur(s.HandoffP50), dur(s.HandoffP99), fmt.Sprintf("%.3f", s.Jain))
		} else {
			row = append(row, "", "", "", "")
		}
		switch {
		case s.MemPerConn != nil:
			row = append(row, bytesStr(s.MemPerConn.Heap)+" · "+bytesStr(s.MemPerConn.RSS), bytesStr(s.MemPerLock.Heap)+" · "+bytesStr(s.MemPerLock.RSS), "")
		case s.MemHeld != nil:
			row = append(row, "", bytesStr(s.MemPerLock.Heap)+" · "+bytesStr(s.MemPerLock.RSS), bytesStr(s.MemHeld.Heap)+" · "+bytesStr(s.MemHeld.RSS))
		default:
			row = append(row, "", "", "")
		}
		row = append(row, fmt.Sprint(s.Errors))
		rows = append(rows, row)
	}
	return head, rows
}

func ratioRows(rs []ratio) (head []string, rows [][]string) {
	n := 0
	for _, r := range rs {
		n = max(n, len(r.Rounds))
	}
	head = []string{"workload", "metric", "lockd ÷"}
	other := slices.ContainsFunc(rs, func(r ratio) bool { return r.Of != "lockd" })
	if other {
		head[2] = "ratio"
	}
	for i := 1; i <= n; i++ {
		head = append(head, fmt.Sprintf("round %d", i))
	}
	head = append(head, "median")
	for _, r := range rs {
		row := []string{r.Workload, r.Metric, r.Versus}
		if other {
			row[2] = r.Of + " ÷ " + r.Versus
		}
		for i := 0; i < n; i++ {
			if i < len(r.Rounds) && r.Rounds[i] > 0 {
				row = append(row, ratioStr(r.Rounds[i]))
			} else {
				row = append(row, "-")
			}
		}
		row = append(row, ratioStr(r.Median))
		rows = append(rows, row)
	}
	return head, rows
}

func ratioStr(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f×", v)
	case v >= 10:
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// writeText prints an aligned plain-text table.
func writeText(w io.Writer, head []string, rows [][]string) {
	width := make([]int, len(head))
	for i, h := range head {
		width[i] = len([]rune(h))
	}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(c)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-len([]rune(c))))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(head)
	for _, r := range rows {
		line(r)
	}
}

// writeMarkdown prints a GitHub-flavoured Markdown table.
func writeMarkdown(w io.Writer, head []string, rows [][]string) {
	fmt.Fprintln(w, "| "+strings.Join(head, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat("---|", len(head)))
	for _, r := range rows {
		fmt.Fprintln(w, "| "+strings.Join(r, " | ")+" |")
	}
}

// byWorkload splits rows (whose first cell is the workload) into one table
// per workload and drops the columns that are empty in all of its rows.
func byWorkload(head []string, rows [][]string) (heads [][]string, tables [][][]string) {
	var wls []string
	for _, r := range rows {
		if !slices.Contains(wls, r[0]) {
			wls = append(wls, r[0])
		}
	}
	for _, wl := range wls {
		var sel [][]string
		for _, r := range rows {
			if r[0] == wl {
				sel = append(sel, r)
			}
		}
		var keep []int
		for i := range head {
			for _, r := range sel {
				if i < len(r) && r[i] != "" {
					keep = append(keep, i)
					break
				}
			}
		}
		h := make([]string, 0, len(keep))
		for _, i := range keep {
			h = append(h, head[i])
		}
		t := make([][]string, len(sel))
		for j, r := range sel {
			for _, i := range keep {
				t[j] = append(t[j], r[i])
			}
		}
		heads, tables = append(heads, h), append(tables, t)
	}
	return heads, tables
}
