package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// TestInterleaving checks the A B A B order: within each round every
// workload visits every target in turn, and rounds repeat it.
func TestInterleaving(t *testing.T) {
	skipAll := map[string]string{wlUncontended: "test", wlContended: "test", wlFanin: "test"}
	a := &target{name: "A", skip: skipAll}
	b := &target{name: "B", skip: skipAll}
	var seen []string
	cfg := smallConfig()
	cfg.Progress = func(s string) {
		if strings.HasPrefix(s, "round") {
			f := strings.Fields(s)
			seen = append(seen, f[1]+" "+f[2]+" "+f[3])
		}
	}
	rs, err := runRounds([]*target{a, b}, []string{wlUncontended, wlContended}, 3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range []string{"1/3", "2/3", "3/3"} {
		for _, wl := range []string{wlUncontended, wlContended} {
			want = append(want, r+" "+wl+" A", r+" "+wl+" B")
		}
	}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("order\n got %v\nwant %v", seen, want)
	}
	if len(rs) != 12 || rs[11].Round != 3 || rs[11].Target != "B" || rs[11].Skipped != "test" {
		t.Fatalf("results: %d, last %+v", len(rs), rs[len(rs)-1])
	}
}

// fake builds a result with a latency histogram of constant value lat.
func fake(tg, wl string, round int, rate, handoffs float64, lat time.Duration) *Result {
	h := NewHist()
	for range 100 {
		h.Record(lat)
	}
	r := &Result{Target: tg, Workload: wl, Round: round, Unit: "pairs/s", Rate: rate, Seconds: 1, hist: h, Latency: pcts(h)}
	if wl == wlContended {
		r.Unit = "grants/s"
		r.HandoffRate = handoffs
		hp := pcts(h)
		r.Handoff, r.hand, r.Jain = &hp, h, 1
	}
	if wl == wlFanin {
		r.Unit = "renews/s"
		r.MemPerConn = &memStat{Heap: int64(rate), RSS: 2 * int64(rate)}
		r.MemPerLock = &memStat{Heap: 10, RSS: 20}
	}
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

func TestSummaryAndRatios(t *testing.T) {
	rs := []*Result{
		fake("lockd", wlUncontended, 1, 300, 0, time.Millisecond), fake("redis", wlUncontended, 1, 100, 0, 2*time.Millisecond),
		fake("lockd", wlUncontended, 2, 500, 0, time.Millisecond), fake("redis", wlUncontended, 2, 250, 0, 2*time.Millisecond),
		fake("lockd", wlUncontended, 3, 400, 0, time.Millisecond), fake("redis", wlUncontended, 3, 100, 0, 2*time.Millisecond),
		fake("lockd", wlContended, 1, 50, 40, time.Millisecond), fake("redis", wlContended, 1, 10, 4, time.Millisecond),
		fake("lockd", wlFanin, 1, 1000, 0, time.Millisecond), fake("redis", wlFanin, 1, 3000, 0, time.Millisecond),
	}
	ss := summarize(rs)
	if len(ss) != 6 {
		t.Fatalf("%d summaries, want 6", len(ss))
	}
	if ss[0].Target != "lockd" || ss[0].Workload != wlUncontended || ss[0].Rate != 400 || ss[0].Rounds != 3 {
		t.Errorf("lockd uncontended summary %+v, want median 400 over 3 rounds", ss[0])
	}
	if ss[1].Rate != 100 || !near(ss[1].P50, 2000) {
		t.Errorf("redis uncontended summary %+v, want median 100, p50 2ms", ss[1])
	}
	if ss[4].MemPerConn == nil || ss[4].MemPerConn.Heap != 1000 || ss[4].MemPerLock.RSS != 20 {
		t.Errorf("fanin memory %+v", ss[4])
	}
	rt := ratios(rs)
	// uncontended: rounds 3, 2, 4 → median 3; contended grants 5, handoffs 10; no fanin ratio.
	if len(rt) != 3 {
		t.Fatalf("%d ratios, want 3: %+v", len(rt), rt)
	}
	if rt[0].Versus != "redis" || rt[0].Metric != "pairs/s" || len(rt[0].Rounds) != 3 ||
		!near(rt[0].Rounds[0], 3) || !near(rt[0].Rounds[1], 2) || !near(rt[0].Rounds[2], 4) || !near(rt[0].Median, 3) {
		t.Errorf("uncontended ratio %+v", rt[0])
	}
	if rt[1].Metric != "grants/s" || !near(rt[1].Median, 5) || rt[2].Metric != "handoffs/s" || !near(rt[2].Median, 10) {
		t.Errorf("contended ratios %+v %+v", rt[1], rt[2])
	}
	if head, rows := ratioRows(rt); head[2] != "lockd ÷" || rows[0][2] != "redis" {
		t.Errorf("table %v %v, want lockd ÷ redis as before", head, rows[0])
	}
	// Contended ran one round of three: the others show as not measured.
	if rt[1].Rounds[1] != 0 || rt[1].Rounds[2] != 0 {
		t.Errorf("rounds without data must be 0: %v", rt[1].Rounds)
	}
}

// TestBaseRatios: a run of lockd-bin beside lockd-base (a build and its
// baseline) gives lockd-bin ÷ lockd-base per round without a lockd
// target, and the table names both sides of each ratio.
func TestBaseRatios(t *testing.T) {
	rs := []*Result{
		fake("lockd-base", wlUncontended, 1, 100, 0, time.Millisecond), fake("lockd-bin", wlUncontended, 1, 90, 0, time.Millisecond),
		fake("lockd-base", wlUncontended, 2, 100, 0, time.Millisecond), fake("lockd-bin", wlUncontended, 2, 120, 0, time.Millisecond),
		fake("lockd-base", wlUncontended, 3, 100, 0, time.Millisecond), fake("lockd-bin", wlUncontended, 3, 105, 0, time.Millisecond),
		fake("lockd-base", wlContended, 1, 50, 40, time.Millisecond), fake("lockd-bin", wlContended, 1, 25, 10, time.Millisecond),
	}
	rt := ratios(rs)
	if len(rt) != 3 {
		t.Fatalf("%d ratios, want 3 (pairs/s, grants/s, handoffs/s): %+v", len(rt), rt)
	}
	if rt[0].Of != "lockd-bin" || rt[0].Versus != "lockd-base" || !near(rt[0].Rounds[0], 0.9) ||
		!near(rt[0].Rounds[1], 1.2) || !near(rt[0].Median, 1.05) {
		t.Errorf("uncontended ratio %+v, want lockd-bin ÷ lockd-base 0.9 1.2 1.05, median 1.05", rt[0])
	}
	if !near(rt[1].Median, 0.5) || rt[2].Metric != "handoffs/s" || !near(rt[2].Median, 0.25) {
		t.Errorf("contended ratios %+v %+v", rt[1], rt[2])
	}
	head, rows := ratioRows(rt)
	if head[2] != "ratio" || rows[0][2] != "lockd-bin ÷ lockd-base" || rows[0][3] != "0.90×" {
		t.Errorf("table %v %v", head, rows[0])
	}
	// With a lockd target too, lockd's ratios keep their own header.
	rs = append(rs, fake("lockd", wlUncontended, 1, 200, 0, time.Millisecond))
	rt = ratios(rs)
	if head, rows := ratioRows(rt); head[2] != "ratio" || rows[0][2] != "lockd ÷ lockd-base" {
		t.Errorf("with lockd: %v %v", head, rows[0])
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{5}, 5}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestReportFormats(t *testing.T) {
	rs := []*Result{
		fake("lockd", wlUncontended, 1, 300000, 0, time.Millisecond), fake("echo", wlUncontended, 1, 400000, 0, time.Millisecond),
		fake("lockd", wlContended, 1, 50000, 40000, time.Millisecond),
		{Target: "echo", Workload: wlContended, Round: 1, Skipped: "no lock state"},
	}
	svgPath := t.TempDir() + "/lat.svg"
	var md, txt bytes.Buffer
	if err := report(&md, &options{markdown: true, rounds: 1, svg: svgPath, cfg: *smallConfig()}, rs); err != nil {
		t.Fatal(err)
	}
	if err := report(&txt, &options{rounds: 1}, rs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| uncontended | lockd | 1 | 300k pairs/s |", "| contended | echo | 1 | n/a: no lock state |", "| uncontended | pairs/s | echo | 0.75× | 0.75× |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.Contains(txt.String(), "uncontended  lockd   1       300k pairs/s") {
		t.Errorf("text table:\n%s", txt.String())
	}
	// The SVG is well-formed XML with one curve per target and panel:
	// uncontended (2), contended acquire (1) and hand-off (1).
	data, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" && isCurve(se) {
			lines++
		}
	}
	if lines != 4 {
		t.Errorf("SVG has %d curves, want 4", lines)
	}
}

// isCurve tells a latency curve among the SVG's paths: drawn in a target's
// colour, and with more points than the two of its legend sample.
func isCurve(se xml.StartElement) bool {
	var style, d string
	for _, a := range se.Attr {
		switch a.Name.Local {
		case "style":
			style = strings.ToLower(a.Value)
		case "d":
			d = a.Value
		}
	}
	for _, c := range palette {
		if strings.Contains(style, fmt.Sprintf("stroke:#%02x%02x%02x;", c.R, c.G, c.B)) {
			return strings.Count(d, "L") >= curvePoints-1
		}
	}
	return false
}
