package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

func TestQuantile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		in   []float64
		q    float64
		want float64
	}{
		{nil, .5, 0}, {[]float64{7}, .99, 7}, {ten, .5, 5}, {ten, .9, 9}, {ten, .99, 10}, {ten, 0, 1}, {ten, 1, 10},
	} {
		if got := quantile(c.in, c.q); got != c.want {
			t.Errorf("quantile(%v, %v) = %v, want %v", c.in, c.q, got, c.want)
		}
	}
}

func TestReplStats(t *testing.T) {
	t0 := time.Now()
	from, to := t0.Add(time.Second), t0.Add(2*time.Second)
	before := map[string]float64{mRecords: 1000, mBatches: 10, mRawBytes: 30000, mWireBytes: 16000, mEpoch: 3, mFailovers: 1}
	after := map[string]float64{mRecords: 3000, mBatches: 30, mRawBytes: 90000, mWireBytes: 46000, mEpoch: 3, mFailovers: 1}
	var samples []lagSample
	// Outside the window: huge lags that must not count.
	samples = append(samples, lagSample{at: t0, secs: 9}, lagSample{at: to, secs: 9, records: 1 << 20})
	// Inside: 100 samples of 0..99 µs.
	for i := range 100 {
		samples = append(samples, lagSample{at: from.Add(time.Duration(i) * time.Millisecond), secs: float64(99-i) / 1e6, records: uint64(i)})
	}
	rs := replStats(before, after, samples, nil, from, to)
	if rs.Records != 2000 || rs.Batches != 20 || rs.RawBytes != 60000 || rs.WireBytes != 30000 || rs.Failovers != 0 {
		t.Errorf("deltas %+v", rs)
	}
	if !near(rs.WirePerRecord, 15) || !near(rs.RawPerRecord, 30) || !near(rs.RecordsPerBatch, 100) {
		t.Errorf("per record %.2f wire, %.2f raw, %.2f per batch; want 15, 30, 100", rs.WirePerRecord, rs.RawPerRecord, rs.RecordsPerBatch)
	}
	if rs.LagSamples != 100 || !near(rs.LagP50, 49) || !near(rs.LagP99, 98) || !near(rs.LagMax, 99) || rs.LagRecMax != 99 {
		t.Errorf("lag: %d samples, p50 %v p99 %v max %v µs, records max %d; want 100, 49, 98, 99, 99",
			rs.LagSamples, rs.LagP50, rs.LagP99, rs.LagMax, rs.LagRecMax)
	}
	if rs.EpochFrom != 3 || rs.EpochTo != 3 {
		t.Errorf("epoch %d → %d", rs.EpochFrom, rs.EpochTo)
	}
	// A counter that went backwards (the member restarted) or a metric
	// the node does not export (raft) gives no figure, not garbage.
	rs = replStats(map[string]float64{mRecords: 500}, map[string]float64{mRecords: 100}, nil, nil, from, to)
	if rs.Records != 0 || rs.WirePerRecord != 0 || rs.RecordsPerBatch != 0 || rs.LagSamples != 0 || rs.LagP99 != 0 {
		t.Errorf("reset counters: %+v", rs)
	}
}

func TestReplStatsRaft(t *testing.T) {
	t0 := time.Now()
	from, to := t0.Add(time.Second), t0.Add(3*time.Second)
	before := map[string]float64{mRaftEntries: 100, mRaftRecords: 1000}
	after := map[string]float64{mRaftEntries: 2100, mRaftRecords: 161000}
	raft := []raftSample{
		{at: t0, entries: 0, commitP50: 9, commitP99: 9}, // before the window: ignored
		{at: from, entries: 500, commitP50: .001, commitP99: .004},
		{at: from.Add(500 * time.Millisecond), entries: 800, commitP50: .002, commitP99: .005},
		{at: from.Add(time.Second), entries: 1500, commitP50: .003, commitP99: .009},
		{at: to, entries: 9999, commitP50: 9, commitP99: 9}, // at the window's end: ignored
	}
	rs := replStats(before, after, nil, raft, from, to)
	if rs.Entries != 2000 || rs.EntryRecords != 160000 || !near(rs.RecordsPerEntry, 80) {
		t.Errorf("entries %d, records %d, per entry %.2f; want 2000, 160000, 80", rs.Entries, rs.EntryRecords, rs.RecordsPerEntry)
	}
	if rs.RaftSamples != 3 || !near(rs.EntriesPerSec, 1000) || !near(rs.CommitP50, 2000) || !near(rs.CommitP99, 5000) {
		t.Errorf("%d samples, %.1f entries/s, commit p50 %.0f p99 %.0f µs; want 3, 1000, 2000, 5000",
			rs.RaftSamples, rs.EntriesPerSec, rs.CommitP50, rs.CommitP99)
	}
	if line := replLine(rs); !strings.Contains(line, "raft 80.0 records/entry, 1.0k entries/s, commit p50 2.00ms p99 5.00ms (3 samples)") {
		t.Errorf("replLine %q", line)
	}
}

func TestGoalsRaft(t *testing.T) {
	raft := func(wl string, round int, rate, handoffs float64) *Result {
		r := fake("lockd-raft", wl, round, rate, handoffs, time.Millisecond)
		r.Repl = &ReplStats{Entries: 10, EntryRecords: 800, RecordsPerEntry: 80, EntriesPerSec: 500, CommitP50: 900, CommitP99: 3000}
		return r
	}
	rs := []*Result{
		fake("etcd", wlUncontended, 1, 2000, 0, time.Millisecond), raft(wlUncontended, 1, 30000, 0),
		fake("etcd", wlContended, 1, 300, 300, time.Millisecond), raft(wlContended, 1, 1800, 1800),
		fake("etcd", wlUncontended, 2, 2000, 0, time.Millisecond), raft(wlUncontended, 2, 50000, 0),
	}
	gs := goals(rs)
	if len(gs) != 2 {
		t.Fatalf("%d goals, want 2 (no lockd-priority results): %+v", len(gs), gs)
	}
	if g := gs[0]; g.Target != "lockd-raft" || len(g.Rounds) != 2 || !near(g.Median, 20) || g.Met != 1 {
		t.Errorf("uncontended raft goal %+v: want rounds 15, 25, median 20, met in 1", g)
	}
	if g := gs[1]; len(g.Rounds) != 1 || !near(g.Median, 6) || g.Met != 1 {
		t.Errorf("contended raft goal %+v: want 6×, met", g)
	}
	_, rows := goalRows(gs)
	if got := strings.Join(rows[0], " | "); got != "lockd-raft | uncontended pairs/s ÷ etcd ≥ 20.0× | 15.0×, 25.0× | 20.0× | 1 of 2 rounds" {
		t.Errorf("goal row %q", got)
	}
	_, crow := clusterRows(rs)
	if got := strings.Join(crow[0], " | "); !strings.Contains(got, "| 80.0 | 500 | 900µs · 3.00ms |") {
		t.Errorf("raft cluster row %q", got)
	}
}

func TestSettled(t *testing.T) {
	st := func(addr, role, active string, inSync bool) clustertest.Status {
		return clustertest.Status{Status: api.Status{Addr: addr, Role: role, Active: active, InSync: inSync}}
	}
	const a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	for _, tc := range []struct {
		name string
		mode string
		sts  []clustertest.Status
		want int // -1: not settled
	}{
		{"priority settled", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleActive, a, false), st(b, api.RoleStandby, a, true)}, 0},
		{"standby not in sync", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleActive, a, false), st(b, api.RoleStandby, a, false)}, -1},
		{"second member active", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleStandby, b, true), st(b, api.RoleActive, b, false)}, -1},
		{"standby follows another", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleActive, a, false), st(b, api.RoleStandby, c, true)}, -1},
		{"one of two standbys syncing", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleActive, a, false), st(b, api.RoleStandby, a, true), st(c, api.RoleStandby, a, false)}, -1},
		{"three settled", clustertest.ModePriority, []clustertest.Status{st(a, api.RoleActive, a, false), st(b, api.RoleStandby, a, true), st(c, api.RoleStandby, a, true)}, 0},
		{"starting", clustertest.ModePriority, []clustertest.Status{st(a, "starting", "", false), st(b, "starting", "", false)}, -1},
		{"raft leader", clustertest.ModeRaft, []clustertest.Status{st(a, api.RoleFollower, b, false), st(b, api.RoleLeader, b, false), st(c, api.RoleFollower, b, false)}, 1},
		{"raft two leaders", clustertest.ModeRaft, []clustertest.Status{st(a, api.RoleLeader, a, false), st(b, api.RoleLeader, b, false), st(c, api.RoleFollower, b, false)}, -1},
		{"raft election", clustertest.ModeRaft, []clustertest.Status{st(a, api.RoleCandidate, "", false), st(b, api.RoleFollower, "", false), st(c, api.RoleFollower, "", false)}, -1},
		{"raft no leader", clustertest.ModeRaft, []clustertest.Status{st(a, api.RoleFollower, "", false), st(b, api.RoleFollower, "", false)}, -1},
		{"single", clustertest.ModeSingle, []clustertest.Status{st(a, api.RoleActive, "", false)}, 0},
		{"single draining", clustertest.ModeSingle, []clustertest.Status{st(a, "draining", "", false)}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := settled(tc.mode, tc.sts)
			if ok != (tc.want >= 0) || ok && got != tc.want {
				t.Errorf("settled = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}

// TestRejectedFlags: a binary that exits 2 on the flags is a refusal with
// its message; one that accepts them (exit 0) is not; anything else is an
// error, not a silent skip.
func TestRejectedFlags(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refuses := script("refuses", `echo "lockd: --cluster raft: not in this build yet" >&2; exit 2`)
	accepts := script("accepts", `for a in "$@"; do [ "$a" = --version ] && { echo lockd v9; exit 0; }; done; exit 3`)
	broken := script("broken", `exit 1`)
	if why, err := rejectedFlags(refuses, "--cluster", "raft"); err != nil || why != "lockd: --cluster raft: not in this build yet" {
		t.Errorf("refusing binary: %q, %v", why, err)
	}
	if why, err := rejectedFlags(accepts, "--cluster", "raft"); err != nil || why != "" {
		t.Errorf("accepting binary: %q, %v (it must be asked with --version)", why, err)
	}
	if why, err := rejectedFlags(broken, "--cluster", "raft"); err == nil {
		t.Errorf("failing binary: %q and no error", why)
	}
}

func TestGoalsAndClusterRows(t *testing.T) {
	pri := func(wl string, round int, rate, handoffs, lagP99us float64) *Result {
		r := fake("lockd-priority", wl, round, rate, handoffs, time.Millisecond)
		r.Repl = &ReplStats{LagEveryMs: 10, LagSamples: 300, LagP50: 100, LagP99: lagP99us, LagMax: 2 * lagP99us,
			Records: 1000, Batches: 10, RawBytes: 30000, WireBytes: 15000, WirePerRecord: 15, RawPerRecord: 30, RecordsPerBatch: 100,
			EpochFrom: 1, EpochTo: 1}
		return r
	}
	rs := []*Result{
		fake("lockd", wlUncontended, 1, 1000, 0, time.Millisecond), pri(wlUncontended, 1, 900, 0, 1000),
		fake("lockd", wlContended, 1, 100, 100, time.Millisecond), pri(wlContended, 1, 70, 70, 6000),
		fake("lockd", wlUncontended, 2, 1000, 0, time.Millisecond), pri(wlUncontended, 2, 700, 0, 3000),
		fake("lockd", wlContended, 2, 100, 100, time.Millisecond), pri(wlContended, 2, 85, 85, 4000),
		fake("lockd", wlUncontended, 3, 1000, 0, time.Millisecond), pri(wlUncontended, 3, 850, 0, 2000),
		{Target: "lockd-raft", Workload: wlUncontended, Round: 1, Skipped: "no raft"},
	}
	gs := goals(rs)
	if len(gs) != 4 {
		t.Fatalf("%d goals, want 4: %+v", len(gs), gs)
	}
	up := gs[0]
	if len(up.Rounds) != 3 || !near(up.Rounds[0], .9) || !near(up.Rounds[1], .7) || !near(up.Median, .85) || up.Met != 2 {
		t.Errorf("uncontended goal %+v: want rounds .9 .7 .85, median .85, met in 2", up)
	}
	ho := gs[1]
	if len(ho.Rounds) != 2 || !near(ho.Median, .775) || ho.Met != 1 {
		t.Errorf("handoff goal %+v: want 2 rounds, median .775, met in 1", ho)
	}
	if lag := gs[2]; !lag.AtMost || len(lag.Rounds) != 3 || !near(lag.Median, 2) || lag.Met != 3 {
		t.Errorf("uncontended lag goal %+v: want median 2 ms, met in 3 of 3", lag)
	}
	if lag := gs[3]; len(lag.Rounds) != 2 || !near(lag.Median, 5) || lag.Met != 1 {
		t.Errorf("contended lag goal %+v: want median 5 ms, met in 1 of 2 (6 ms > 5 ms)", lag)
	}
	_, rows := goalRows(gs)
	if got := strings.Join(rows[0], " | "); got != "lockd-priority | uncontended pairs/s ÷ lockd ≥ 80 % | 90 %, 70 %, 85 % | 85 % | 2 of 3 rounds" {
		t.Errorf("goal row %q", got)
	}
	_, crow := clusterRows(rs)
	if len(crow) != 5 {
		t.Fatalf("%d cluster rows, want 5 (skipped runs left out)", len(crow))
	}
	if got := strings.Join(crow[1], " | "); got != "contended | lockd-priority | 1 | 70 grants/s | 70 % | 70 % | 100µs | 6.00ms | 12.00ms | 300 | 15.0 | 30.0 | 100 |  |  |  | 0 | " {
		t.Errorf("cluster row %q", got)
	}
	// No lockd-priority results: no goals.
	if gs := goals(rs[:1]); len(gs) != 0 {
		t.Errorf("goals without lockd-priority: %+v", gs)
	}
}

// clusterOpts are options for the cluster targets in tests.
func clusterOpts() *options { return &options{loops: 2, lagEvery: 5 * time.Millisecond} }

// TestPriorityTarget runs short rounds of every workload on a real active
// and standby: the driver reaches the active, the stream carries every
// change (at least one record per acquire and per release), lag is sampled
// in the window, memory and profiles come from the member processes, and
// stopping the target leaves no process behind.
func TestPriorityTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	tg, err := openTarget("lockd-priority", clusterOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer tg.stop()
	if tg.cluster == nil || len(tg.cluster.c.Members()) != 2 || tg.addr != tg.cluster.c.Member(0).Addr() {
		t.Fatalf("target not driven at the first member of a two-member cluster: %+v", tg)
	}
	cfg := smallConfig()
	cfg.Profile = filepath.Join(t.TempDir(), "p")
	r := run1(t, tg, wlUncontended, cfg)
	checkClean(t, r)
	checkRepl(t, r, 2*r.Ops)
	for _, f := range []string{"-p0.cpu.pprof", "-p0.allocs.pprof", "-p1.cpu.pprof", "-p1.allocs.pprof"} {
		if st, err := os.Stat(cfg.Profile + "-lockd-priority-uncontended-r1" + f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
	cfg.Profile = ""
	c := run1(t, tg, wlContended, cfg)
	checkContended(t, c, 0.9)
	checkRepl(t, c, c.Ops)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
	members := tg.cluster.c.Members()
	tg.stop()
	for _, m := range members {
		if m.Alive() {
			t.Errorf("member %d still running after the target stopped", m.Index())
		}
	}
}

// checkRepl asserts a priority run's replication figures are real.
func checkRepl(t *testing.T, r *Result, minRecords int64) {
	t.Helper()
	p := r.Repl
	if p == nil {
		t.Fatalf("%s %s: no replication figures", r.Target, r.Workload)
	}
	t.Logf("%s %s: %s", r.Target, r.Workload, replLine(p))
	if p.Records < uint64(minRecords) || p.Batches == 0 || p.WireBytes == 0 || p.RawBytes == 0 {
		t.Errorf("stream carried %d records (want ≥ %d) in %d batches, %d raw / %d wire bytes", p.Records, minRecords, p.Batches, p.RawBytes, p.WireBytes)
	}
	if p.RecordsPerBatch < 1 || p.WirePerRecord <= 0 {
		t.Errorf("per batch %.1f, per record %.1f", p.RecordsPerBatch, p.WirePerRecord)
	}
	// 5 ms sampling over a 400 ms window: some samples, whatever the load.
	if p.LagSamples < 5 || p.LagMax < p.LagP99 || p.LagP99 < p.LagP50 {
		t.Errorf("lag: %d samples, p50 %v p99 %v max %v", p.LagSamples, p.LagP50, p.LagP99, p.LagMax)
	}
	if p.EpochFrom == 0 || p.EpochTo != p.EpochFrom || p.Failovers != 0 {
		t.Errorf("the cluster changed hands during the run: epoch %d → %d, failovers %d", p.EpochFrom, p.EpochTo, p.Failovers)
	}
}

// TestRaftTarget: while the lockd binary refuses --cluster raft, the target
// is skipped with the binary's message and starts nothing; once it accepts
// it, a short round runs on the leader.
func TestRaftTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the lockd binary")
	}
	o := clusterOpts()
	bin, err := lockdBinary(o)
	if err != nil {
		t.Fatal(err)
	}
	why, err := rejectedFlags(bin, "--cluster", "raft", "--peers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
		"--listen", "127.0.0.1:1", "--data-dir", t.TempDir(), "--admin", "")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := openTarget("lockd-raft", o)
	if err != nil {
		t.Fatalf("lockd-raft must not fail the run (binary says %q): %v", why, err)
	}
	defer tg.stop()
	cfg := smallConfig()
	if why != "" {
		t.Logf("the binary refuses raft: %s", why)
		if tg.cluster != nil {
			t.Error("a skipped target started processes")
		}
		for _, wl := range allWorkloads {
			r := run1(t, tg, wl, cfg)
			if !strings.Contains(r.Skipped, "--cluster raft") || !strings.Contains(r.Skipped, why) {
				t.Errorf("%s skipped with %q; want the binary's message", wl, r.Skipped)
			}
		}
		return
	}
	if tg.cluster == nil || len(tg.cluster.c.Members()) != 3 {
		t.Fatal("lockd-raft is not three members")
	}
	checkClean(t, run1(t, tg, wlUncontended, cfg))
}

// TestLockdBinTarget: the lockd binary as a single node serves a run.
func TestLockdBinTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a lockd process")
	}
	tg, err := openTarget("lockd-bin", clusterOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer tg.stop()
	r := run1(t, tg, wlUncontended, smallConfig())
	checkClean(t, r)
	if r.Repl == nil || r.Repl.LagSamples != 0 || r.Repl.Records != 0 {
		t.Errorf("a single node has no stream: %+v", r.Repl)
	}
}

func TestParseCPU(t *testing.T) {
	for _, c := range []struct {
		stat string
		want float64
		ok   bool
	}{
		{"1234 (lockd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0", 3, true},
		{"77 (a) b (c) R 1 77 77 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 0 0", 0.03, true},
		{"77 (short) R 1", 0, false},
		{"no parenthesis", 0, false},
	} {
		got, ok := parseCPU(c.stat)
		if ok != c.ok || !near(got, c.want) {
			t.Errorf("parseCPU(%q) = %v, %v; want %v, %v", c.stat, got, ok, c.want, c.ok)
		}
	}
	if v := cpuTimes([]int{os.Getpid(), -5}); len(v) != 2 || v[0] < 0 || v[1] != -1 {
		t.Errorf("cpuTimes(self, bad pid) = %v", v)
	}
}

func TestRunqWaits(t *testing.T) {
	for _, c := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"1004000000 1190000000 17253\n", 1190000000, true},
		{"0 0 0", 0, true},
		{"12 34", 0, false},
		{"12 x 5", 0, false},
		{"", 0, false},
	} {
		got, ok := parseSchedstat(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("parseSchedstat(%q) = %v, %v; want %v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		before, after, want []float64
	}{
		{[]float64{1, 2}, []float64{1.5, 4}, []float64{0.5, 2}},
		{[]float64{1, -1}, []float64{2, 3}, []float64{1, -1}}, // unreadable before
		{[]float64{3}, []float64{2}, []float64{-1}},           // went down: an exited thread, a restart
		{[]float64{1}, []float64{2, 5}, []float64{1, -1}},     // a process more than before
		{[]float64{1, 1}, []float64{-1, 1}, []float64{-1, 0}}, // unreadable after
	} {
		if got := deltas(c.before, c.after); !slices.Equal(got, c.want) {
			t.Errorf("deltas(%v, %v) = %v; want %v", c.before, c.after, got, c.want)
		}
	}
	// This process, made to wait: four processors per CPU, each spinning
	// for a while, leave their threads queued for the CPUs.
	self := []int{os.Getpid(), -5}
	before := runqWaits(self)
	if before[0] < 0 || before[1] != -1 {
		t.Fatalf("runqWaits(self, bad pid) = %v", before)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4 * runtime.NumCPU()))
	var wg sync.WaitGroup
	for range 4 * runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
			}
		}()
	}
	wg.Wait()
	if d := deltas(before, runqWaits(self)); d[0] <= 0 {
		t.Errorf("threads spinning on more than every CPU waited %v s for one; want > 0", d[0])
	}
}

// TestRunKeepsTheLockdBinary: a finished run leaves the lockd binary that
// clustertest built in place for the rest of the process (the command
// removes it in main, once). Before the fix, run removed it on return,
// and every later cluster target or failover run in the same process
// failed with "no lockd binary: removed by RemoveBuild".
func TestRunKeepsTheLockdBinary(t *testing.T) {
	bin, err := lockdBinary(clusterOpts())
	if err != nil {
		t.Fatal(err)
	}
	srv := openTest(t, "lockd")
	var out, errb bytes.Buffer
	if code := run([]string{"-addr", srv.addr, "-targets", "lockd", "-workloads", "uncontended", "-dur", "200ms",
		"-conns", "1", "-depth", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(bin); err != nil {
		t.Errorf("the lockd binary is gone after a run: %v", err)
	}
	if again, err := lockdBinary(clusterOpts()); err != nil || again != bin {
		t.Errorf("lockd binary after a run: %q, %v; want %q", again, err, bin)
	}
}

// TestLockdBaseTarget: lockd-base runs the -base-bin binary (here the one
// lockd-bin would build), and refuses to start without one.
func TestLockdBaseTarget(t *testing.T) {
	for _, name := range []string{"lockd-base", "lockd-priority-base", "lockd-raft-base"} {
		if _, err := openTarget(name, clusterOpts()); err == nil || !strings.Contains(err.Error(), "-base-bin") {
			t.Fatalf("%s without -base-bin: %v, want an error naming -base-bin", name, err)
		}
	}
	if testing.Short() {
		t.Skip("starts a lockd process")
	}
	o := clusterOpts()
	bin, err := lockdBinary(o)
	if err != nil {
		t.Fatal(err)
	}
	o.baseBin = bin
	tg, err := openTarget("lockd-base", o)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.stop()
	checkClean(t, run1(t, tg, wlUncontended, smallConfig()))
}
