package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/client"
)

func TestLongestGap(t *testing.T) {
	for _, c := range []struct {
		name            string
		ends            []int64
		from, to, now   int64
		wantGap, wantAt int64
	}{
		{"steady", []int64{0, 10, 20, 30, 40, 50}, 15, 35, 60, 10, 10},
		{"hole in the window", []int64{0, 10, 20, 90, 100}, 15, 95, 200, 70, 20},
		{"hole that began before from counts in full", []int64{0, 10, 80, 90}, 50, 85, 200, 70, 10},
		{"hole that runs past to counts in full", []int64{0, 10, 20, 500}, 0, 25, 600, 480, 20},
		{"hole starting after to is left out", []int64{0, 10, 20, 30, 500}, 0, 25, 600, 10, 0},
		{"still open: lasts until now", []int64{0, 10, 20}, 15, 30, 100, 80, 20},
		{"nothing answered", nil, 5, 30, 100, 95, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			gap, at := longestGap(c.ends, c.from, c.to, c.now)
			if gap != c.wantGap || at != c.wantAt {
				t.Errorf("longestGap = %d at %d, want %d at %d", gap, at, c.wantGap, c.wantAt)
			}
		})
	}
}

func TestRecorderAndOutcomes(t *testing.T) {
	r := newRecorder(3)
	for i := range 4 {
		r.add(event{start: int64(i), end: int64(i + 1), kind: evGrant})
	}
	evs, over := r.snapshot()
	if len(evs) != 3 || !over {
		t.Errorf("capacity 3: %d events, over %v; want 3 and over", len(evs), over)
	}
	r.reset()
	if evs, over := r.snapshot(); len(evs) != 0 || over {
		t.Errorf("after reset: %d events, over %v", len(evs), over)
	}
	var o outcomes
	o.add("x", int64(30*time.Millisecond))
	o.add("x", int64(10*time.Millisecond))
	o.add("y", int64(20*time.Millisecond))
	got := o.take(int64(5 * time.Millisecond))
	if x := got["x"]; x.N != 2 || !near(x.First, 5) || !near(x.Last, 25) || got["y"].N != 1 {
		t.Errorf("outcomes %+v", got)
	}
	if o.take(0) != nil {
		t.Error("take must empty the counts")
	}
}

func TestClientOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{client.ErrIndeterminate, outIndeterminate},
		{fmt.Errorf("acquire: %w", client.ErrNoConnection), "library no connection"},
		{client.ErrNotHeld, "library not held"},
		{client.ErrTimeout, "library timeout"},
		{&client.ServerError{Code: 7}, "library E7"},
		{context.Canceled, ""},
		{errors.New("strange"), "library other"},
	} {
		if got := clientOutcome(c.err); got != c.want {
			t.Errorf("clientOutcome(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestFailoverSummaryAndGoals(t *testing.T) {
	trials := []*Trial{
		{Kind: trialKill, N: 1, FirstGrantMs: 1000, ClientGrantMs: 1100, GapMs: 1000, RejoinGapMs: 20,
			Outcomes: map[string]Outcome{outIndeterminate: {N: 3}}},
		{Kind: trialTerm, N: 1, FirstGrantMs: 20, GapMs: 30, ExitCode: 0, RejoinOutcomes: map[string]Outcome{outIndeterminate: {N: 1}}},
		{Kind: trialKill, N: 2, FirstGrantMs: 1600, ClientGrantMs: 1700, GapMs: 1600, RejoinGapMs: 40},
		{Kind: trialTerm, N: 2, FirstGrantMs: 50, GapMs: 150, ExitCode: 1, Outcomes: map[string]Outcome{outProbeE4: {N: 2}}},
		{Kind: trialKill, N: 3, FirstGrantMs: 900, GapMs: 900, RejoinGapMs: 30},
	}
	sums := summarizeTrials(trials, []string{trialKill, trialTerm})
	if len(sums) != 2 {
		t.Fatalf("%d summaries", len(sums))
	}
	k, m := sums[0], sums[1]
	if k.FirstGrant != (spread{Median: 1000, Worst: 1600, N: 3}) || k.ClientGrant != (spread{Median: 1400, Worst: 1700, N: 2}) ||
		k.RejoinGap.Median != 30 || k.LibIndeterminate != 3 {
		t.Errorf("kill summary %+v", k)
	}
	if m.Gap != (spread{Median: 90, Worst: 150, N: 2}) || m.ExitNonZero != 1 || m.ProbeShuttingDown != 2 || m.RejoinLibIndet != 1 {
		t.Errorf("term summary %+v", m)
	}
	gs := failoverGoals(trials)
	if len(gs) != 2 || gs[0].Met != 2 || gs[0].Trials != 3 || gs[0].Median != 1000 || gs[0].Worst != 1600 ||
		gs[1].Met != 1 || gs[1].Trials != 2 || gs[1].Worst != 150 {
		t.Errorf("goals %+v", gs)
	}
	heads, tables := failoverTables(trials, sums, gs, true)
	if len(heads) != 3 || len(tables[0]) != 5 || len(tables[1]) != 2 || len(tables[2]) != 2 {
		t.Fatalf("tables: %d, rows %d %d %d", len(heads), len(tables[0]), len(tables[1]), len(tables[2]))
	}
	if got := strings.Join(tables[2][0], " | "); !strings.Contains(got, "1000.0 | 1600.0 | 2 of 3 trials") {
		t.Errorf("goal row %q", got)
	}
	if got := strings.Join(tables[0][0], " | "); !strings.HasSuffix(got, "library indeterminate 3 (+0..0 ms) | -") {
		t.Errorf("trial row with outcomes %q", got)
	}
	// Markdown: outcomes summed per kind and phase in a fourth table.
	heads, tables = failoverTables(trials, sums, gs, false)
	if len(heads) != 4 || len(tables[3]) != 3 {
		t.Fatalf("tables without per-trial outcomes: %d, outcome rows %v", len(heads), tables[len(tables)-1])
	}
	want := [][]string{
		{trialKill, "failover", outIndeterminate, "3", "1", "0", "0"},
		{trialTerm, "failover", outProbeE4, "2", "1", "0", "0"},
		{trialTerm, "rejoin", outIndeterminate, "1", "1", "0", "0"},
	}
	for i, w := range want {
		if strings.Join(tables[3][i], "|") != strings.Join(w, "|") {
			t.Errorf("outcome row %d: %v, want %v", i, tables[3][i], w)
		}
	}
}

func TestFailoverFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-failover", "-1"}, "-failover must be"},
		{[]string{"-failover", "3", "-failover-members", "1"}, "-failover-members"},
		{[]string{"-failover", "3", "-failover-kinds", "kill,nap"}, "-failover-kinds"},
		{[]string{"-failover", "3", "-failover-timeout", "10ms"}, "-failover-timeout"},
		{[]string{"-failover", "3", "-failover-probes", "0"}, "-failover-probes"},
		{[]string{"-lag-every", "2s"}, "-lag-every"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestFailoverShort runs one trial of each kind on a real two-member
// cluster under load: the successor is the second member, a kill is
// answered only after the failover timeout has mostly passed (the standby
// cannot promote sooner), a SIGTERM hands over with exit code 0, the gaps
// and the rejoin are measured, and nothing is left running.
func TestFailoverShort(t *testing.T) {
	if testing.Short() {
		t.Skip("kills lockd processes")
	}
	bin, err := lockdBinary(clusterOpts())
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultFailover()
	cfg.Trials, cfg.Workers, cfg.Probes = 1, 4, 1
	cfg.Steady, cfg.After = 200*time.Millisecond, 100*time.Millisecond
	cfg.Progress = func(s string) { t.Log(s) }
	trials, err := runFailover(&cfg, bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(trials) != 2 || trials[0].Kind != trialKill || trials[1].Kind != trialTerm {
		t.Fatalf("trials %+v", trials)
	}
	for _, tr := range trials {
		if tr.Successor != 1 || tr.FirstGrantMs <= 0 || tr.FirstGrantMs > 10000 || tr.GapMs <= 0 || tr.ClientGapMs <= 0 ||
			tr.RejoinMs <= 0 || tr.RejoinGapMs <= 0 || tr.Answered == 0 {
			t.Errorf("%s trial: %s", tr.Kind, trialLine(tr))
		}
	}
	kill, term := trials[0], trials[1]
	// The standby promotes after hearing nothing for the failover timeout
	// (1 s) less at most a heartbeat interval and a tick.
	if kill.FirstGrantMs < 500 || kill.ClientGrantMs < 500 || kill.GapMs < 500 {
		t.Errorf("kill: served %.0f ms (library %.0f ms, gap %.0f ms) after the kill: sooner than a failover can be",
			kill.FirstGrantMs, kill.ClientGrantMs, kill.GapMs)
	}
	if term.ExitCode != 0 || term.FirstGrantMs > 5000 {
		t.Errorf("term: exit %d, served after %.0f ms", term.ExitCode, term.FirstGrantMs)
	}
}
