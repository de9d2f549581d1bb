package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/history"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(clustertest.Main(m),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"), // idle keep-alive conns of the harness's HTTP client
	)
}

// shortDuration is the length of each CI run (LOCKD_CHAOS_SHORT overrides).
func shortDuration(t *testing.T) time.Duration {
	if v := os.Getenv("LOCKD_CHAOS_SHORT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LOCKD_CHAOS_SHORT=%q: %v", v, err)
		}
		return d
	}
	return 20 * time.Second
}

// shortBigLocks is the large-state phase's size in the CI form
// (LOCKD_CHAOS_BIG_LOCKS overrides): smaller than a long run's million,
// and still a snapshot that takes many of its 100 ms failover timeouts
// (the issue saw false promotions from 150,000 locks on).
func shortBigLocks(t *testing.T) int {
	if v := os.Getenv("LOCKD_CHAOS_BIG_LOCKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("LOCKD_CHAOS_BIG_LOCKS=%q: %v", v, err)
		}
		return n
	}
	return 150_000
}

// logWriter sends the run's progress lines to the test log.
type logWriter struct {
	t  *testing.T
	mu sync.Mutex
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestChaosShort is the CI form: every mode (one node, a priority
// cluster, a raft cluster), a fixed seed and a random one (in the log; a
// failure prints the command that reruns it), each for a short run, and
// one more run of each cluster mode with PROTOCOL.md §8 on (-secure: TLS,
// mutual TLS between members, a cluster secret) on the fixed seed. Every checker must pass, and the run must have injected
// faults and granted locks (a run that did nothing proves nothing).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs real clusters for a while: not under -short")
	}
	d := shortDuration(t)
	random := rand.Uint64()%1_000_000_000 + 1
	t.Logf("seeds: 1 and %d (random), %v each; seed 1 once more with -secure in the cluster modes", random, d)
	type run struct {
		seed   uint64
		secure bool
	}
	for _, mode := range []string{"single", "priority", "raft"} {
		unavailable := ""
		for _, rn := range []run{{1, false}, {random, false}, {1, true}} {
			if rn.secure && mode == "single" {
				continue // clustertest runs single nodes in plaintext
			}
			name := fmt.Sprintf("%s/seed=%d", mode, rn.seed)
			if rn.secure {
				name += "/secure"
			}
			t.Run(name, func(t *testing.T) {
				if unavailable != "" {
					t.Skip(unavailable)
				}
				cfg := DefaultConfig()
				cfg.Mode, cfg.Duration, cfg.Seed, cfg.Secure = mode, d, rn.seed, rn.secure
				cfg.BigLocks = shortBigLocks(t)
				if rn.secure {
					cfg.BigLocks = 0 // the large-state phase once per seed is enough
				}
				rep, err := Run(context.Background(), cfg, &logWriter{t: t})
				if errors.Is(err, ErrModeUnavailable) {
					unavailable = err.Error()
					t.Skip(unavailable)
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("report:\n%s", rep.Text())
				if !rep.Passed {
					t.Errorf("the chaos run failed; rerun with: %s", rep.Command)
				}
				if rep.FaultsTotal == 0 {
					t.Error("no fault was injected")
				}
				if rep.Availability.Granted == 0 {
					t.Error("no lock was granted")
				}
				// fenced-safety, tokens, linearizability, the mutex's
				// overlap, the semaphore's fence and overlap, liveness,
				// members, client-errors, frozen-answers, handover-answers
				// and large-state: each reports, whatever the mode.
				if len(rep.Checkers) != 12 {
					t.Errorf("%d checkers ran, want 12", len(rep.Checkers))
				}
				// The semaphore workers took permits, and filled a key.
				for _, c := range rep.Checkers {
					if strings.HasPrefix(c.Name, "semaphore-") && c.Name != "semaphore-fenced" &&
						(c.Figures["grants"] == 0 || c.Figures["most_holders_at_once"] < float64(cfg.SemLimit)) {
						t.Errorf("%s: %v grants, at most %v holders at once; want some, and the limit %d reached",
							c.Name, c.Figures["grants"], c.Figures["most_holders_at_once"], cfg.SemLimit)
					}
				}
			})
		}
	}
}

// TestParseFlags: the flags map onto Config; bad values are rejected with
// an error naming the flag.
func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-mode", "raft", "-duration", "90s", "-seed", "42", "-faults", "kill, drop,kill", "-workers", "3"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != "raft" || cfg.Duration != 90*time.Second || cfg.Seed != 42 || cfg.Workers != 3 ||
		!slices.Equal(cfg.Faults, []string{"kill", "drop"}) || cfg.Keys != DefaultConfig().Keys {
		t.Fatalf("parsed %+v", cfg)
	}
	if cfg, err := parseFlags([]string{"-mode", "priority", "-faults", "none"}, &bytes.Buffer{}); err != nil || cfg.faultsOn(FaultKill) {
		t.Fatalf("-faults none: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{}, "-mode"},
		{[]string{"-mode", "paxos"}, "-mode"},
		{[]string{"-mode", "single", "-secure"}, "-secure"},
		{[]string{"-mode", "raft", "-duration", "0s"}, "-duration"},
		{[]string{"-mode", "raft", "-seed", "-1"}, "-seed"},
		{[]string{"-mode", "raft", "-workers", "0"}, "-workers"},
		{[]string{"-mode", "raft", "-keys", "0"}, "-keys"},
		{[]string{"-mode", "raft", "-sem-workers", "-1"}, "-sem-workers"},
		{[]string{"-mode", "raft", "-sem-keys", "0"}, "-sem-keys"},
		{[]string{"-mode", "raft", "-sem-limit", "0"}, "-sem-limit"},
		{[]string{"-mode", "raft", "-lease", "1500ms"}, "-lease"},
		{[]string{"-mode", "raft", "-failover-timeout", "10ms"}, "-failover-timeout"},
		{[]string{"-mode", "raft", "-faults", "kill,flood"}, "-faults"},
		{[]string{"-mode", "raft", "-faults", "none,kill"}, "-faults"},
		{[]string{"-mode", "raft", "-interval", "1ms"}, "-interval"},
		{[]string{"-mode", "raft", "-max-active", "0"}, "-max-active"},
		{[]string{"-mode", "raft", "-check-timeout", "1ms"}, "-check-timeout"},
		{[]string{"-mode", "raft", "-big-locks", "10"}, "-big-locks"},
		{[]string{"-mode", "raft", "-big-locks", "20000000"}, "-big-locks"},
		{[]string{"-mode", "raft", "-big-failover-timeout", "50ms"}, "-big-failover-timeout"},
		{[]string{"-mode", "raft", "extra"}, "unexpected"},
		{[]string{"-mode", "raft", "-nope"}, "-nope"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(tc.args, &bytes.Buffer{})
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("error %v, want ErrUsage naming %s", err, tc.flag)
			}
		})
	}
}

// TestCommandReruns: the command a report prints parses back into the
// same configuration.
func TestCommandReruns(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mode, cfg.Seed, cfg.Duration = "priority", 77, 10*time.Minute
	cfg.Workers, cfg.Lease, cfg.Faults, cfg.Interval = 9, 5*time.Second, []string{"stop", "partition"}, 700*time.Millisecond
	cfg.SemWorkers, cfg.SemKeys, cfg.SemLimit = 0, 3, 5
	cfg.Secure = true
	cfg.BigLocks, cfg.BigFailover = 200_000, 250*time.Millisecond
	args := strings.Fields(cfg.Command())
	if !slices.Equal(args[:3], []string{"go", "run", "./chaos"}) {
		t.Fatalf("command %q", cfg.Command())
	}
	back, err := parseFlags(args[3:], &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Faults, cfg.Faults) {
		t.Fatalf("faults %v, want %v", back.Faults, cfg.Faults)
	}
	back.Faults, cfg.Faults = nil, nil
	if fmt.Sprint(back) != fmt.Sprint(cfg) {
		t.Fatalf("rerun config %+v, want %+v", back, cfg)
	}
}

// TestRealMainUsage: a bad flag exits 2 with a message naming it.
func TestRealMainUsage(t *testing.T) {
	var out, errw bytes.Buffer
	if code := realMain(context.Background(), []string{"-mode", "priority", "-keys", "-3"}, &out, &errw); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(errw.String(), "-keys") {
		t.Fatalf("stderr %q does not name -keys", errw.String())
	}
}

// TestModeUnavailable: a lockd that rejects the mode ("not in this build")
// makes the command exit 2 with that message, not 1.
func TestModeUnavailable(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "lockd")
	script := "#!/bin/sh\necho 'lockd: --cluster raft: not in this build yet (issue 12); use --cluster priority' >&2\nexit 2\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	code := realMain(context.Background(), []string{"-mode", "raft", "-duration", "1s", "-lockd", fake}, &out, &errw)
	if code != 2 || !strings.Contains(errw.String(), "not in this build") {
		t.Fatalf("exit %d, stderr %q; want 2 and the binary's reason", code, errw.String())
	}
}

// TestNemesisPlans: a seed fixes the schedule of plans; every kind comes
// up once in every bag of len(AllFaults); holds are within their bounds (a freeze and a partition longer than
// the failover timeout).
func TestNemesisPlans(t *testing.T) {
	cfg := DefaultConfig()
	draw := func(seed uint64) []plan {
		rng := rand.New(rand.NewPCG(seed, 1))
		var ps []plan
		var bag []string
		for range 500 {
			var p plan
			_, p, bag = nextPlan(rng, cfg, AllFaults, bag, 3)
			ps = append(ps, p)
		}
		return ps
	}
	a, b, c := draw(5), draw(5), draw(6)
	if !slices.Equal(a, b) {
		t.Fatal("one seed, two schedules")
	}
	if slices.Equal(a, c) {
		t.Fatal("two seeds, one schedule")
	}
	seen := map[string]int{}
	for _, p := range a {
		seen[p.kind]++
		if p.pick < 0 || p.pick > 2 || p.pick2 < 0 || p.pick2 > 1 {
			t.Fatalf("picks out of range: %+v", p)
		}
		switch p.kind {
		case FaultStop, FaultPartition:
			if p.hold <= cfg.FailoverTimeout {
				t.Fatalf("%s held %v, not past the failover timeout", p.kind, p.hold)
			}
		case FaultKill, FaultHandover:
			if p.hold <= 0 || p.hold > 4*time.Second {
				t.Fatalf("%s held %v", p.kind, p.hold)
			}
		}
	}
	for _, k := range AllFaults {
		if seen[k] != 100 {
			t.Fatalf("kind %s planned %d times in 500 draws, want 100 (one per bag)", k, seen[k])
		}
	}
	for i := 0; i+len(AllFaults) <= len(a); i += len(AllFaults) {
		bag := map[string]bool{}
		for _, p := range a[i : i+len(AllFaults)] {
			bag[p.kind] = true
		}
		if len(bag) != len(AllFaults) {
			t.Fatalf("faults %d..%d do not hold every kind: %v", i, i+len(AllFaults)-1, bag)
		}
	}
	// One node (single mode): every pick is member 0.
	rng := rand.New(rand.NewPCG(5, 1))
	var bag []string
	for range 50 {
		var p plan
		_, p, bag = nextPlan(rng, cfg, AllFaults, bag, 1)
		if p.pick != 0 || p.pick2 != 0 {
			t.Fatalf("one member, picks %d and %d", p.pick, p.pick2)
		}
	}
}

// TestClassify: the client's errors map to outcomes as the protocol says
// (§7): indeterminate both ways, the rest definitive.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err    error
		out    history.Outcome
		detail string
	}{
		{nil, history.OK, ""},
		{client.ErrIndeterminate, history.Unknown, "indeterminate"},
		{fmt.Errorf("wrapped: %w", client.ErrIndeterminate), history.Unknown, "indeterminate"},
		{client.ErrTimeout, history.Fail, history.DetailTimeout},
		{client.ErrBusy, history.Fail, history.DetailBusy},
		{client.ErrNotHeld, history.Fail, history.DetailNotHeld},
		{client.ErrNoConnection, history.Fail, history.DetailNoConn},
		{context.DeadlineExceeded, history.Fail, "not sent: context deadline exceeded"},
		{client.ErrClosed, history.Fail, "closed"},
		{errors.New("surprise"), history.Unknown, "surprise"},
	} {
		out, detail := classify(tc.err)
		if out != tc.out || detail != tc.detail {
			t.Errorf("%v: %s %q, want %s %q", tc.err, out, detail, tc.out, tc.detail)
		}
		if tc.err != nil && tc.detail != "surprise" && !expected(out, detail) {
			t.Errorf("%v: not an expected outcome", tc.err)
		}
	}
	if expected(classify(&client.ServerError{Code: 2, Msg: "bad key"})) {
		t.Error("a server error is expected")
	}
}

// TestSplitWindows: a priority run excuses token order from a partition's
// start until 2 × the failover timeout and the slack after its heal, only
// for partitions (a freeze or a kill gets no window); a partition that
// starts before the previous one's demotion bound continues its window.
func TestSplitWindows(t *testing.T) {
	s := time.Second
	h := history.History{Faults: []history.Fault{
		{Kind: FaultKill, Start: 1 * s, End: 2 * s},
		{Kind: FaultPartition, Start: 3 * s, End: 5 * s},
		{Kind: FaultStop, Start: 10 * s, End: 12 * s},
		{Kind: FaultPartition, Start: 20 * s, End: 22 * s},
		{Kind: FaultPartition, Start: 24 * s, End: 25 * s}, // before 22 + 2 s + slack
	}}
	w := splitWindows(h, s)
	want := []history.Window{{Start: 3 * s, End: 7*s + splitSlack}, {Start: 20 * s, End: 27*s + splitSlack}}
	if len(w) != len(want) {
		t.Fatalf("windows %+v, want %+v", w, want)
	}
	for i := range want {
		if w[i].Start != want[i].Start || w[i].End != want[i].End {
			t.Fatalf("window %d: %+v, want %+v", i, w[i], want[i])
		}
	}
}

// TestRecheck: a saved history is checked again without a cluster, with
// the same verdicts: a token granted twice fails the tokens checker, and
// the command exits 1; a good history passes and exits 0.
func TestRecheck(t *testing.T) {
	dir := t.TempDir()
	save := func(name string, h history.History) string {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := h.WriteJSON(f); err != nil {
			t.Fatal(err)
		}
		return path
	}
	grant := func(id int, key string, token uint64, call time.Duration) history.Op {
		return history.Op{ID: id, Kind: history.Acquire, Key: key, Token: token, Lease: 3 * time.Second,
			Call: call, Return: call + time.Millisecond, Outcome: history.OK, Grant: -1}
	}
	good := save("good.json", history.History{Ops: []history.Op{grant(0, "a", 10, 0), grant(1, "b", 11, time.Second)}})
	bad := save("bad.json", history.History{Ops: []history.Op{grant(0, "a", 10, 0), grant(1, "b", 10, time.Second)}})
	for _, tc := range []struct {
		path string
		code int
	}{{good, 0}, {bad, 1}} {
		var out, errw bytes.Buffer
		code := realMain(context.Background(), []string{"-mode", "priority", "-recheck", tc.path}, &out, &errw)
		if code != tc.code {
			t.Fatalf("%s: exit %d, want %d\n%s%s", tc.path, code, tc.code, out.String(), errw.String())
		}
		if tc.code == 1 && !strings.Contains(out.String(), "granted twice") {
			t.Fatalf("%s: the report does not name the duplicate:\n%s", tc.path, out.String())
		}
	}
	var out, errw bytes.Buffer
	if code := realMain(context.Background(), []string{"-mode", "raft", "-recheck", filepath.Join(dir, "none.json")}, &out, &errw); code != 2 {
		t.Fatalf("a missing history: exit %d, want 2 (%s)", code, errw.String())
	}
}

// TestReport: a failing report says FAILED with the seed and the command;
// its JSON parses back.
func TestReport(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mode, cfg.Seed = "raft", 99
	rep := newReport(cfg)
	rep.WorkloadEnd = 10 * time.Second
	rep.addHistory(history.History{
		Ops: []history.Op{
			{ID: 0, Kind: history.Acquire, Key: "k", Token: 5, Call: time.Second, Return: 2 * time.Second, Outcome: history.OK, Grant: -1},
			{ID: 1, Kind: history.Acquire, Key: "k", Call: 3 * time.Second, Return: 4 * time.Second, Outcome: history.Fail, Detail: history.DetailTimeout, Grant: -1},
		},
		Faults: []history.Fault{{Kind: FaultKill}, {Kind: FaultKill}, {Kind: "crash"}},
	}, cfg)
	rep.Checkers = []history.Result{{Name: "tokens", Verdict: history.Violated, Count: 1, Violations: []string{"token 5 granted twice"}}}
	rep.finish(time.Minute)
	if rep.Passed || rep.FaultsTotal != 2 || rep.Faults["crash"] != 1 || rep.Availability.Granted != 1 ||
		rep.Availability.LongestGapSecs != 8 || rep.Operations["acquire"]["fail: timeout"] != 1 {
		t.Fatalf("report %+v", rep)
	}
	text := rep.Text()
	for _, want := range []string{"FAILED (seed 99)", "-seed 99", "token 5 granted twice", "kill 2"} {
		if !strings.Contains(text, want) {
			t.Fatalf("text lacks %q:\n%s", want, text)
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || back.Seed != 99 || back.Passed || back.Checkers[0].Count != 1 {
		t.Fatalf("JSON round trip: %+v %v", back, err)
	}
}

// TestClientErrorsCountsEveryAnomaly: the report counts every anomaly,
// and lists only the first history.MaxViolations.
func TestClientErrorsCountsEveryAnomaly(t *testing.T) {
	wl := &workload{}
	for i := range 75 {
		wl.anomaly("anomaly %d", i)
	}
	res := clientErrors(wl)
	if res.Count != 75 || len(res.Violations) != history.MaxViolations || res.Verdict != history.Violated {
		t.Fatalf("count %d, %d listed, verdict %v; want 75, %d, violated", res.Count, len(res.Violations), res.Verdict, history.MaxViolations)
	}
}
