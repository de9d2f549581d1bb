package clustertest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// A fixed plan: members on 12001..12003; with proxies, member j reaches
// member k through 13000 + 10j + k (and that + 10000 for the member link).
func fixedPlan(mode string, proxied bool) *plan {
	pl := &plan{mode: mode, offset: 10000, failover: 1500 * time.Millisecond, client: []int{12001, 12002, 12003}}
	if proxied {
		pl.link = [][]int{{0, 13001, 13002}, {13010, 0, 13012}, {13020, 13021, 0}}
	}
	return pl
}

// TestArgs: the command lines are exactly §6.1's flags, with and without
// proxies, and nothing of them in single mode.
func TestArgs(t *testing.T) {
	common := func(j int) []string {
		return []string{"--listen", fmt.Sprintf("127.0.0.1:1200%d", j+1), "--data-dir", "/d/m", "--admin", "127.0.0.1:0", "--log-format", "json"}
	}
	cases := []struct {
		name    string
		pl      *plan
		j       int
		cluster []string
	}{
		{"single", fixedPlan(ModeSingle, false), 1, nil},
		{"priority member 0", fixedPlan(ModePriority, false), 0, []string{"--cluster", "priority",
			"--peers", "127.0.0.1:12001,127.0.0.1:12002,127.0.0.1:12003", "--self", "127.0.0.1:12001",
			"--peer-offset", "10000", "--failover-timeout", "1.5s"}},
		{"raft member 2", fixedPlan(ModeRaft, false), 2, []string{"--cluster", "raft",
			"--peers", "127.0.0.1:12001,127.0.0.1:12002,127.0.0.1:12003", "--self", "127.0.0.1:12003",
			"--peer-offset", "10000", "--failover-timeout", "1.5s"}},
		{"proxied member 0", fixedPlan(ModePriority, true), 0, []string{"--cluster", "priority",
			"--peers", "127.0.0.1:12001,127.0.0.1:13001,127.0.0.1:13002", "--self", "127.0.0.1:12001",
			"--peer-offset", "10000", "--failover-timeout", "1.5s"}},
		{"proxied member 1", fixedPlan(ModePriority, true), 1, []string{"--cluster", "priority",
			"--peers", "127.0.0.1:13010,127.0.0.1:12002,127.0.0.1:13012", "--self", "127.0.0.1:12002",
			"--peer-offset", "10000", "--failover-timeout", "1.5s"}},
		{"proxied member 2", fixedPlan(ModeRaft, true), 2, []string{"--cluster", "raft",
			"--peers", "127.0.0.1:13020,127.0.0.1:13021,127.0.0.1:12003", "--self", "127.0.0.1:12003",
			"--peer-offset", "10000", "--failover-timeout", "1.5s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.pl.args(tc.j, "/d/m", "json", []string{"--loops", "2"})
			want := append(append(common(tc.j), tc.cluster...), "--loops", "2")
			if !slices.Equal(got, want) {
				t.Fatalf("args\n got %q\nwant %q", got, want)
			}
		})
	}
}

// TestProxySpecs: for every ordered pair (j, k) the client-side proxy
// listens on k's entry in j's --peers and forwards to k's client port; the
// member-link proxy listens on that entry's port + offset (where j dials)
// and forwards to k's member port (k's client port + offset, where k
// listens).
func TestProxySpecs(t *testing.T) {
	pl := fixedPlan(ModePriority, true)
	specs := pl.proxies()
	if len(specs) != 12 {
		t.Fatalf("%d proxies for 3 members, want 3·2·2 = 12", len(specs))
	}
	want := map[string]string{ // listen → target
		"127.0.0.1:13001": "127.0.0.1:12002", "127.0.0.1:23001": "127.0.0.1:22002", // 0 → 1
		"127.0.0.1:13002": "127.0.0.1:12003", "127.0.0.1:23002": "127.0.0.1:22003", // 0 → 2
		"127.0.0.1:13010": "127.0.0.1:12001", "127.0.0.1:23010": "127.0.0.1:22001", // 1 → 0
		"127.0.0.1:13012": "127.0.0.1:12003", "127.0.0.1:23012": "127.0.0.1:22003", // 1 → 2
		"127.0.0.1:13020": "127.0.0.1:12001", "127.0.0.1:23020": "127.0.0.1:22001", // 2 → 0
		"127.0.0.1:13021": "127.0.0.1:12002", "127.0.0.1:23021": "127.0.0.1:22002", // 2 → 1
	}
	for _, s := range specs {
		if want[s.listen] != s.target {
			t.Errorf("proxy %+v: want target %q", s, want[s.listen])
		}
		entry := pl.peers(s.from)[s.to]
		if !s.member && s.listen != entry {
			t.Errorf("client proxy %d→%d listens on %s, not on the --peers entry %s", s.from, s.to, s.listen, entry)
		}
		delete(want, s.listen)
	}
	if len(want) != 0 {
		t.Errorf("no proxy on %v", want)
	}
	if fixedPlan(ModePriority, false).proxies() != nil {
		t.Error("proxies without Proxied")
	}
}

// TestNewPlan: real picks satisfy the arithmetic for any member count, and
// every port of a plan is distinct.
func TestNewPlan(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		for _, proxied := range []bool{false, true} {
			pl, err := newPlan(ModePriority, n, 10000, time.Second, proxied, 0)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			use := func(p int) {
				if seen[p] || seen[p+pl.offset] {
					t.Fatalf("port %d or %d used twice in %+v", p, p+pl.offset, pl)
				}
				seen[p], seen[p+pl.offset] = true, true
			}
			for _, p := range pl.client {
				use(p)
			}
			for j := range pl.link {
				for k, p := range pl.link[j] {
					if j != k {
						use(p)
					}
				}
			}
			if want := n; proxied {
				want = n * n
				if len(seen) != 2*want {
					t.Fatalf("n=%d proxied: %d ports, want %d", n, len(seen), 2*want)
				}
			} else if len(seen) != 2*want {
				t.Fatalf("n=%d: %d ports, want %d", n, len(seen), 2*want)
			}
			for j := range n {
				if self := hostPort(pl.client[j]); pl.peers(j)[j] != self || !slices.Contains(pl.args(j, "d", "json", nil), self) {
					t.Fatalf("member %d: --self %s is not its own --peers entry: %v", j, self, pl.peers(j))
				}
			}
		}
	}
}

func TestOptions(t *testing.T) {
	var o Options
	if err := o.fill(); err != nil {
		t.Fatal(err)
	}
	if o.Members != 3 || o.PeerOffset != 10000 || o.FailoverTimeout != time.Second || o.LogFormat != "json" ||
		o.StartTimeout != DefaultStartTimeout || o.StopTimeout != DefaultStopTimeout {
		t.Fatalf("defaults: %+v", o)
	}
	for _, bad := range []Options{
		{Mode: "paxos"},
		{Mode: ModeSingle, Proxied: true},
		{Mode: ModeRaft, Members: 8},
		{Members: -1},
		{LogFormat: "xml"},
		{PeerOffset: 70000},
		{Members: 2, Deferred: []int{2}},
	} {
		if err := bad.fill(); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%+v: %v, want ErrBadOptions", bad, err)
		}
	}
}

func TestLogFields(t *testing.T) {
	cases := []struct{ format, line, msg, addr string }{
		{"json", `{"time":"x","level":"INFO","msg":"ready","addr":"127.0.0.1:5","loops":2}`, "ready", "127.0.0.1:5"},
		{"json", `{"time":"x","level":"INFO","msg":"admin endpoint","addr":"127.0.0.1:6"}`, "admin endpoint", "127.0.0.1:6"},
		{"json", `not json`, "", ""},
		{"json", `{"msg":`, "", ""},
		{"text", `time=x level=INFO msg=ready addr=127.0.0.1:5 loops=2`, "ready", "127.0.0.1:5"},
		{"text", `time=x level=INFO msg="admin endpoint" addr=127.0.0.1:6`, "admin endpoint", "127.0.0.1:6"},
		{"text", `time=x level=INFO msg="say \"hi\"" peer_addr=1`, `say "hi"`, ""},
	}
	for _, tc := range cases {
		if msg, addr := logFields(tc.format, tc.line); msg != tc.msg || addr != tc.addr {
			t.Errorf("%s %q: %q %q, want %q %q", tc.format, tc.line, msg, addr, tc.msg, tc.addr)
		}
	}
}

func TestParseStatus(t *testing.T) {
	s, err := parseStatus([]byte(`{"role":"standby","addr":"a:1","active":"b:2","epoch":18446744073709551615,"keys":3,"token_last":"99"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Role != "standby" || s.Active != "b:2" || s.Epoch != 1<<64-1 || s.Keys != 3 || s.TokenLast != 99 || s.Addr != "a:1" {
		t.Fatalf("%+v", s)
	}
	s, err = parseStatus([]byte(`{"role":"follower","leader":"c:3","epoch":"12"}`))
	if err != nil || s.Active != "c:3" || s.Epoch != 12 {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := parseStatus([]byte(`<html>`)); err == nil {
		t.Fatal("no error on a non-JSON /status")
	}
}

func TestLogBuf(t *testing.T) {
	l := newLogBuf()
	l.add("one")
	mark := l.mark()
	go func() {
		time.Sleep(20 * time.Millisecond)
		l.add("two")
		l.add("three")
	}()
	if line, err := l.wait(mark, regexp.MustCompile(`^t`), 5*time.Second); err != nil || line != "two" {
		t.Fatalf("wait: %q %v", line, err)
	}
	if _, err := l.wait(mark, regexp.MustCompile(`one`), 30*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a line before the mark matched: %v", err)
	}
	// Bounded: the oldest half goes, marks still count every line.
	l = newLogBuf()
	l.max = 100
	for i := range 50 {
		l.add(fmt.Sprintf("line %02d", i))
	}
	if l.size > l.max || l.mark() != 50 {
		t.Fatalf("size %d mark %d", l.size, l.mark())
	}
	if got := l.since(48); !slices.Equal(got, []string{"line 48", "line 49"}) {
		t.Fatalf("since 48: %q", got)
	}
	if got := strings.Join(l.tail(1), ""); got != "line 49" {
		t.Fatalf("tail: %q", got)
	}
	if !l.contains("line 49") || l.contains("line 00") {
		t.Fatal("contains")
	}
}
