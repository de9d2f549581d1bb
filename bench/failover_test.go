package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
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
	gs := failoverGoals(trials, failoverPriority)
	if len(gs) != 2 || gs[0].Met != 2 || gs[0].Trials != 3 || gs[0].Median != 1000 || gs[0].Worst != 1600 ||
		gs[1].Met != 1 || gs[1].Trials != 2 || gs[1].Worst != 150 {
		t.Errorf("goals %+v", gs)
	}
	heads, tables := failoverTables(trials, sums, gs, failoverPriority, true)
	if len(heads) != 3 || len(tables[0]) != 5 || len(tables[1]) != 2 || len(tables[2]) != 2 {
		t.Fatalf("tables: %d, rows %d %d %d", len(heads), len(tables[0]), len(tables[1]), len(tables[2]))
	}
	// Priority's columns are as they were before raft mode.
	if got := strings.Join(heads[0][:4], "|"); got != "kind|trial|successor|first grant ms" || len(heads[0]) != 14 ||
		heads[1][7] != "rejoin handover gap" || strings.Join(heads[2], "|") != "failover target|median ms|worst ms|met" {
		t.Errorf("priority heads %q", heads)
	}
	if got := strings.Join(tables[2][0], " | "); !strings.Contains(got, "1000.0 | 1600.0 | 2 of 3 trials") {
		t.Errorf("goal row %q", got)
	}
	if got := strings.Join(tables[0][0], " | "); !strings.HasSuffix(got, "library indeterminate 3 (+0..0 ms) | -") {
		t.Errorf("trial row with outcomes %q", got)
	}
	// Markdown: outcomes summed per kind and phase in a fourth table.
	heads, tables = failoverTables(trials, sums, gs, failoverPriority, false)
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
		{[]string{"-failover", "3", "-failover-mode", "paxos"}, "-failover-mode: unknown mode"},
		{[]string{"-failover", "3", "-failover-mode", "raft", "-failover-members", "2"}, "-failover-members must be 3..7 with -failover-mode raft"},
		{[]string{"-failover", "3", "-failover-mode", "raft", "-failover-members", "8"}, "-failover-members must be 3..7"},
		{[]string{"-failover", "3", "-failover-members", "1"}, "-failover-members must be 2..7 with -failover-mode priority"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errb.String(), c.want)
		}
	}
}

// shortFailover runs one kill and one term trial on a real cluster of mode
// under a light load (4 library workers, 1 probe), checks what both modes
// promise — successorOK accepts who served, every figure was measured,
// the kill was answered no sooner than killFloorMs, the SIGTERM ended with
// exit code 0 and was served within 5 s — and returns the trials.
func shortFailover(t *testing.T, mode string, members int, successorOK func(*Trial) bool, killFloorMs float64) []*Trial {
	t.Helper()
	if testing.Short() {
		t.Skip("kills lockd processes")
	}
	bin, err := lockdBinary(clusterOpts())
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultFailover()
	cfg.Mode, cfg.Members = mode, members
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
		if !successorOK(tr) || tr.FirstGrantMs <= 0 || tr.FirstGrantMs > 10000 || tr.GapMs <= 0 || tr.ClientGapMs <= 0 ||
			tr.RejoinMs <= 0 || tr.RejoinGapMs <= 0 || tr.Answered == 0 {
			t.Errorf("%s trial: %s", tr.Kind, trialLine(tr, mode))
		}
	}
	kill, term := trials[0], trials[1]
	if kill.FirstGrantMs < killFloorMs || kill.ClientGrantMs < killFloorMs || kill.GapMs < killFloorMs {
		t.Errorf("kill: served %.0f ms (library %.0f ms, gap %.0f ms) after the kill: sooner than a failover can be",
			kill.FirstGrantMs, kill.ClientGrantMs, kill.GapMs)
	}
	if term.ExitCode != 0 || term.FirstGrantMs > 5000 {
		t.Errorf("term: exit %d, served after %.0f ms", term.ExitCode, term.FirstGrantMs)
	}
	return trials
}

// TestFailoverShort runs one trial of each kind on a real two-member
// cluster under load: the successor is the second member, a kill is
// answered only after the failover timeout has mostly passed (the standby
// cannot promote sooner), a SIGTERM hands over with exit code 0, the gaps
// and the rejoin are measured, and nothing is left running.
func TestFailoverShort(t *testing.T) {
	// The standby promotes after hearing nothing for the failover timeout
	// (1 s) less at most a heartbeat interval and a tick.
	shortFailover(t, failoverPriority, 2, func(tr *Trial) bool { return tr.Victim == 0 && tr.Successor == 1 }, 500)
}

// TestFailoverModeFlag: the mode's default member count, and an explicit
// count kept in either mode.
func TestFailoverModeFlag(t *testing.T) {
	for _, c := range []struct {
		args        []string
		mode        string
		wantMembers int
	}{
		{[]string{"-failover", "3"}, failoverPriority, 2},
		{[]string{"-failover", "3", "-failover-members", "3"}, failoverPriority, 3},
		{[]string{"-failover", "3", "-failover-mode", "raft"}, failoverRaft, 3},
		{[]string{"-failover", "3", "-failover-mode", "raft", "-failover-members", "5"}, failoverRaft, 5},
	} {
		var errb bytes.Buffer
		o, err := parseFlags(c.args, &errb)
		if err != nil {
			t.Errorf("%v: %v (%s)", c.args, err, errb.String())
			continue
		}
		if o.failover.Mode != c.mode || o.failover.Members != c.wantMembers {
			t.Errorf("%v: mode %q, %d members; want %q, %d", c.args, o.failover.Mode, o.failover.Members, c.mode, c.wantMembers)
		}
	}
}

func TestProbeErrorOutcome(t *testing.T) {
	for _, c := range []struct {
		release bool
		code    uint8
		want    string
		e4      int64
	}{
		{false, proto.CodeShutdown, outProbeE4, 1},
		{true, proto.CodeShutdown, outProbeReleaseE4, 1},
		{false, 3, "probe E3", 0},
		{true, 5, "probe release E5", 0},
	} {
		got := probeErrorOutcome(c.release, c.code)
		if got != c.want {
			t.Errorf("probeErrorOutcome(%v, %d) = %q, want %q", c.release, c.code, got, c.want)
		}
		if n := e4Answers(map[string]Outcome{got: {N: 1}, "probe M": {N: 7}}); n != c.e4 {
			t.Errorf("%q: %d E 4 answers, want %d", got, n, c.e4)
		}
	}
}

// raftSt is a raft member's /status as the harness parses it.
func raftSt(addr, role, leader string, term, commit, applied uint64) clustertest.Status {
	return clustertest.Status{Status: api.Status{Addr: addr, Role: role, Active: leader,
		Raft: &api.RaftStatus{Term: term, CommitIndex: commit, AppliedIndex: applied}}}
}

// TestRaftSettled feeds successive polls of three members to raftSettled:
// settled needs the same leader and term in two polls in a row, and every
// follower naming it, on its term and applied up to what it had committed
// at the poll before.
func TestRaftSettled(t *testing.T) {
	const a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	// poll: b leads in term 5 having committed commit; a and c applied
	// applied and name b.
	poll := func(commit, appliedA, appliedC uint64) []clustertest.Status {
		return []clustertest.Status{raftSt(a, api.RoleFollower, b, 5, commit, appliedA), raftSt(b, api.RoleLeader, b, 5, commit, commit),
			raftSt(c, api.RoleFollower, b, 5, commit, appliedC)}
	}
	with := func(sts []clustertest.Status, i int, st clustertest.Status) []clustertest.Status {
		sts = slices.Clone(sts)
		sts[i] = st
		return sts
	}
	for _, tc := range []struct {
		name  string
		polls [][]clustertest.Status
		want  []int // per poll: the leader once settled, -1 not yet
	}{
		{"settles on the second poll", [][]clustertest.Status{poll(100, 100, 100), poll(120, 100, 105)}, []int{-1, 1}},
		{"a follower behind the previous commit", [][]clustertest.Status{poll(100, 90, 100), poll(120, 99, 120), poll(130, 120, 125)},
			[]int{-1, -1, 1}},
		{"a restarted member with no leader yet", [][]clustertest.Status{
			with(poll(100, 0, 100), 0, raftSt(a, api.RoleFollower, "", 4, 0, 0)),
			with(poll(110, 0, 110), 0, raftSt(a, api.RoleFollower, "", 4, 0, 0)),
			with(poll(120, 0, 120), 0, raftSt(a, api.RoleFollower, b, 4, 0, 0)), // the old term still
			poll(130, 125, 130),
		}, []int{-1, -1, -1, 1}},
		{"a candidate resets", [][]clustertest.Status{
			poll(100, 100, 100), with(poll(100, 100, 100), 0, raftSt(a, api.RoleCandidate, "", 6, 100, 100)), poll(100, 100, 100), poll(100, 100, 100),
		}, []int{-1, -1, -1, 1}},
		{"a new term between polls", [][]clustertest.Status{
			poll(100, 100, 100),
			{raftSt(a, api.RoleFollower, b, 6, 100, 100), raftSt(b, api.RoleLeader, b, 6, 101, 101), raftSt(c, api.RoleFollower, b, 6, 101, 101)},
			{raftSt(a, api.RoleFollower, b, 6, 101, 101), raftSt(b, api.RoleLeader, b, 6, 101, 101), raftSt(c, api.RoleFollower, b, 6, 101, 101)},
		}, []int{-1, -1, 1}},
		{"a new leader between polls", [][]clustertest.Status{
			poll(100, 100, 100),
			{raftSt(a, api.RoleFollower, c, 5, 100, 100), raftSt(b, api.RoleFollower, c, 5, 100, 100), raftSt(c, api.RoleLeader, c, 5, 100, 100)},
			{raftSt(a, api.RoleFollower, c, 5, 100, 100), raftSt(b, api.RoleFollower, c, 5, 100, 100), raftSt(c, api.RoleLeader, c, 5, 100, 100)},
		}, []int{-1, -1, 2}},
		{"two leaders", [][]clustertest.Status{
			with(poll(100, 100, 100), 0, raftSt(a, api.RoleLeader, a, 4, 90, 90)), with(poll(100, 100, 100), 0, raftSt(a, api.RoleLeader, a, 4, 90, 90)),
		}, []int{-1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := newRaftSettled()
			for i, sts := range tc.polls {
				got, ok := rs.ok(sts)
				if ok != (tc.want[i] >= 0) || ok && got != tc.want[i] {
					t.Errorf("poll %d: %d, %v; want %d", i, got, ok, tc.want[i])
				}
			}
		})
	}
}

// TestFailoverGoalsAndTablesRaft: raft's goals are PROTOCOL.md §6.2's (3 s
// after a kill, 500 ms after a SIGTERM, no E 4, counted over acquires and
// releases), and its tables name each trial's victim and the new leader.
func TestFailoverGoalsAndTablesRaft(t *testing.T) {
	trials := []*Trial{
		{Kind: trialKill, N: 1, Victim: 0, Successor: 2, FirstGrantMs: 1200, GapMs: 1200},
		{Kind: trialTerm, N: 1, Victim: 2, Successor: 1, FirstGrantMs: 40, GapMs: 35},
		{Kind: trialKill, N: 2, Victim: 1, Successor: 0, FirstGrantMs: 3100, GapMs: 3100},
		{Kind: trialTerm, N: 2, Victim: 0, Successor: 2, FirstGrantMs: 600, GapMs: 550,
			Outcomes: map[string]Outcome{outProbeReleaseE4: {N: 2}, outProbeE4: {N: 1}}},
		{Kind: trialKill, N: 3, Victim: 2, Successor: 1, FirstGrantMs: 900, GapMs: 900},
	}
	gs := failoverGoals(trials, failoverRaft)
	want := []failoverGoal{
		{Limit: 3000, Median: 1200, Worst: 3100, Met: 2, Trials: 3},
		{Limit: 500, Median: 320, Worst: 600, Met: 1, Trials: 2},
		{Limit: 0, Median: 1.5, Worst: 3, Met: 1, Trials: 2, Unit: goalAnswers},
	}
	if len(gs) != len(want) {
		t.Fatalf("goals %+v", gs)
	}
	for i, w := range want {
		w.What = gs[i].What
		if gs[i] != w {
			t.Errorf("goal %d: %+v, want %+v", i, gs[i], w)
		}
	}
	sums := summarizeTrials(trials, []string{trialKill, trialTerm})
	if sums[1].ProbeShuttingDown != 3 {
		t.Errorf("term E 4 answers %d, want 3 (acquires and releases)", sums[1].ProbeShuttingDown)
	}
	heads, tables := failoverTables(trials, sums, gs, failoverRaft, false)
	if got := strings.Join(heads[0][:5], "|"); got != "kind|trial|leader killed/stopped|new leader|first grant ms" {
		t.Errorf("trial heads %q", got)
	}
	if got := strings.Join(tables[0][2][:5], "|"); got != "kill|2|1|0|3100.0" {
		t.Errorf("trial row %q", got)
	}
	if heads[1][7] != "rejoin gap" {
		t.Errorf("summary heads %q", heads[1])
	}
	if got := strings.Join(heads[2], "|"); got != "failover target|median|worst|met" {
		t.Errorf("goal heads %q", got)
	}
	if got := strings.Join(tables[2][0][1:], "|"); got != "1200.0 ms|3100.0 ms|2 of 3 trials" {
		t.Errorf("goal row %q", got)
	}
	if got := strings.Join(tables[2][2][1:], "|"); got != "1.5 answers|3.0 answers|1 of 2 trials" {
		t.Errorf("E 4 goal row %q", got)
	}
	if line := trialLine(trials[2], failoverRaft); !strings.HasPrefix(line, "leader 1 kill: member 0 served 3100 ms") || !strings.Contains(line, ", gap ") {
		t.Errorf("progress line %q", line)
	}
}

// TestFailoverShortRaft runs one trial of each kind on a real three-member
// raft cluster under load: the victim is whichever member leads, the new
// leader is another, a kill is answered only after an election (a
// follower waits at least the heartbeat timeout, T/2, before it stands), a
// SIGTERM transfers the leadership with exit code 0 and no answer E 4, the
// restarted member rejoins as a follower, and nothing is left running.
func TestFailoverShortRaft(t *testing.T) {
	// A follower stands after hearing nothing for raft's heartbeat timeout
	// (T/2 = 500 ms, randomised up to T) less a heartbeat interval.
	trials := shortFailover(t, failoverRaft, 3, func(tr *Trial) bool {
		return tr.Victim >= 0 && tr.Victim < 3 && tr.Successor >= 0 && tr.Successor < 3 && tr.Successor != tr.Victim
	}, 300)
	term := trials[1]
	if n := e4Answers(term.Outcomes) + e4Answers(term.RejoinOutcomes); n != 0 {
		t.Errorf("term: %d answers E 4 (%s; rejoin %s)", n, outcomeText(term.Outcomes), outcomeText(term.RejoinOutcomes))
	}
}
