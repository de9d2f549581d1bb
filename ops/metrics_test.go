package ops_test

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v2"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
)

// process is a single lockd started by these tests with a command line of
// their own (a node with TLS, an environment file), and its addresses.
type process struct {
	*clustertest.Proc
	t           *testing.T
	addr, admin string // client address; admin endpoint ("host:port")
}

// startLockd runs lockdBin with env added and args, and returns once it
// logs ready.
func startLockd(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := clustertest.StartProc(t, clustertest.ProcOptions{Binary: lockdBin, Args: args, Env: env})
	return &process{Proc: p, t: t, addr: p.Addr(), admin: p.AdminAddr()}
}

func (p *process) logs() string { return p.Logs() }

// httpLine is the log line (text format, lockd's default) naming the HTTP
// API's address; it comes before the ready line.
var httpLine = regexp.MustCompile(`msg="http endpoint" addr=(\S+)`)

// httpAddr is the HTTP API's address from the log.
func (p *process) httpAddr() string {
	p.t.Helper()
	line, err := p.WaitLog(httpLine, time.Second)
	if err != nil {
		p.t.Fatalf("no http endpoint line: %v\n%s", err, p.logs())
	}
	return httpLine.FindStringSubmatch(line)[1]
}

// term sends SIGTERM and returns the exit code.
func (p *process) term() int {
	p.t.Helper()
	code, err := p.Term()
	if err != nil {
		p.t.Fatalf("lockd on SIGTERM: %v\n%s", err, p.logs())
	}
	return code
}

// exported is the set of metric names a scrape exposes, with a histogram's
// _bucket, _sum and _count.
type exported map[string]bool

// scrape reads url's /metrics with hc into names and returns the families.
func scrape(t *testing.T, hc *http.Client, url string, names exported) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s/metrics: %s %s", url, resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics does not parse: %v", url, err)
	}
	for name, f := range fams {
		names[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
			names[name+"_sum"], names[name+"_count"] = true, true
		}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names[name+"_bucket"] = true
		}
	}
	return fams
}

// probe returns the status code and body of url's path.
func probe(t *testing.T, hc *http.Client, url, path string) (int, string) {
	t.Helper()
	resp, err := hc.Get(url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// labelOf returns m's value of label name.
func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// checkRoles: lockd_role has exactly one series per role of mode, one of
// them 1 (role), and lockd_cluster_member_role one per role for each
// other member (cluster modes): series never come and go with a role.
func checkRoles(t *testing.T, fams map[string]*dto.MetricFamily, mode, role string, others int) {
	t.Helper()
	roles := api.Roles(mode)
	var got []string
	for _, m := range fams["lockd_role"].GetMetric() {
		r := labelOf(m, "role")
		got = append(got, r)
		if v := m.GetGauge().GetValue(); (r == role) != (v == 1) || v != 0 && v != 1 {
			t.Errorf("lockd_role{role=%q} = %v on a %s", r, v, role)
		}
	}
	sort.Strings(got)
	want := slices.Clone(roles)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("lockd_role series %v, want one per role of %s: %v", got, mode, want)
	}
	if mode == api.ModeSingle {
		return
	}
	if n := len(fams["lockd_cluster_member_role"].GetMetric()); n != others*len(roles) {
		t.Errorf("lockd_cluster_member_role has %d series, want %d (%d members × %d roles)", n, others*len(roles), others, len(roles))
	}
	if n := len(fams["lockd_cluster_member_live"].GetMetric()); n != others {
		t.Errorf("lockd_cluster_member_live has %d series, want one per other member (%d)", n, others)
	}
}

// traffic takes and releases a few locks on addr (the serving member).
func traffic(t *testing.T, addr string) {
	t.Helper()
	c, err := clustertest.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 20 {
		key := fmt.Sprintf("ops/%d", i)
		r, err := c.Do(proto.AppendAcquire(nil, 0, 30, uint64(i+1), key))
		if err != nil || r.Op != proto.OpAcquire {
			t.Fatalf("acquire %s on %s: %v %c", key, addr, err, r.Op)
		}
		if i%2 == 0 {
			if r, err := c.Do(proto.AppendRelease(nil, r.Token, key)); err != nil || r.Op != proto.OpRelease {
				t.Fatalf("release %s: %v %c", key, err, r.Op)
			}
		}
	}
}

// TestDashboardAndRulesNameExportedMetrics starts lockd as an operator
// runs it — a single node with TLS and --acl, a priority cluster and a
// raft cluster — scrapes every member, and checks that every metric
// ops/grafana/lockd.json's queries and ops/prometheus/lockd-rules.yml's
// expressions name is one that lockd exports (with Go's and the process's
// collectors), that every query names at least one, and that every
// dashboard query parses (promtool). On the way it checks the fixed role
// series, the raft commit histogram, /livez and /readyz on every member,
// and a raft follower's view of the other follower.
func TestDashboardAndRulesNameExportedMetrics(t *testing.T) {
	names := exported{}
	plain := &http.Client{Timeout: 5 * time.Second}
	defer plain.CloseIdleConnections()

	t.Run("single node with TLS and --acl", func(t *testing.T) {
		dir := t.TempDir()
		ca, err := testcerts.NewCA("ops-test-ca")
		if err != nil {
			t.Fatal(err)
		}
		pair, err := ca.Issue("lockd", "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		cert, key, err := pair.Write(dir, "server")
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte("prom-secret"))
		aclFile := filepath.Join(dir, "acl")
		if err := os.WriteFile(aclFile, []byte("prom sha256:"+hex.EncodeToString(sum[:])+" - monitor\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startLockd(t, []string{"LOCKD_TLS_CERT=" + cert, "LOCKD_TLS_KEY=" + key, "LOCKD_ACL=" + aclFile, "LOCKD_HTTP=127.0.0.1:0"},
			"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--loops", "1")
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Timeout: 5 * time.Second, Transport: basic{"prom", "prom-secret", tr}}
		url := "https://" + p.admin
		// A TLS handshake and a refused hello, so the counters move; an
		// HTTP API request, so its request counter has a series.
		if c, err := tls.Dial("tcp", p.addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}); err == nil {
			_, _ = c.Write(proto.AppendHello(nil, 1, "nobody", "wrong"))
			_, _ = c.Read(make([]byte, 64))
			c.Close()
		}
		httpURL := "https://" + p.httpAddr()
		if resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get(httpURL + "/v1/openapi.json"); err != nil {
			t.Errorf("the HTTP API: %v", err)
		} else {
			resp.Body.Close()
		}
		// The HTTP API counts an answer when its handler returns, just
		// after the client has it: scrape until the count is there.
		var fams map[string]*dto.MetricFamily
		wait.For(t, "lockd_http_requests_total in /metrics", func() bool {
			fams = scrape(t, hc, url, names)
			return fams["lockd_http_requests_total"] != nil
		})
		checkRoles(t, fams, api.ModeSingle, api.RoleActive, 0)
		open := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tr.TLSClientConfig}}
		defer open.CloseIdleConnections()
		for _, path := range []string{"/livez", "/readyz", "/healthz"} {
			if code, body := probe(t, open, url, path); code != http.StatusOK {
				t.Errorf("%s without credentials on a node with --acl: %d %q", path, code, body)
			}
		}
		if code, _ := probe(t, open, url, "/metrics"); code != http.StatusUnauthorized {
			t.Errorf("/metrics without credentials on a node with --acl: %d", code)
		}
		if code := p.term(); code != 0 {
			t.Errorf("exit %d", code)
		}
	})

	for _, mode := range []string{api.ModePriority, api.ModeRaft} {
		t.Run(mode+" cluster", func(t *testing.T) {
			c := clustertest.Start(t, clustertest.Options{Mode: mode, Members: 3, Binary: lockdBin})
			lead, err := c.WaitLeader(20*time.Second, clustertest.Every)
			if err != nil {
				t.Fatal(err)
			}
			traffic(t, c.Member(lead).Addr())
			// Every member ready: the serving one, the others in sync.
			if _, err := c.WaitStatuses(20*time.Second, clustertest.Every, func(sts []clustertest.Status) error {
				for _, st := range sts {
					if !st.Serving() && !st.InSync {
						return fmt.Errorf("member %d not in sync", st.Index)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, m := range c.Members() {
				st, err := m.Status()
				if err != nil {
					t.Fatal(err)
				}
				for _, path := range []string{"/livez", "/readyz", "/healthz"} {
					if code, body := probe(t, plain, m.AdminURL(), path); code != http.StatusOK {
						t.Errorf("member %d (%s) %s: %d %q", m.Index(), st.Role, path, code, body)
					}
				}
				fams := scrape(t, plain, m.AdminURL(), names)
				checkRoles(t, fams, mode, st.Role, 2)
				if mode != api.ModeRaft {
					continue
				}
				if st.Leader != st.Active || st.Leader == "" {
					t.Errorf("member %d: /status leader %q, active %q", m.Index(), st.Leader, st.Active)
				}
				h := fams["lockd_raft_commit_latency_seconds"]
				if h.GetType() != dto.MetricType_HISTOGRAM || len(h.GetMetric()) != 1 {
					t.Fatalf("lockd_raft_commit_latency_seconds: %v", h)
				}
				n := h.GetMetric()[0].GetHistogram().GetSampleCount()
				if st.Serving() && (n == 0 || n != st.Raft.Entries) {
					t.Errorf("leader: %d commit latencies in the histogram, %d entries committed", n, st.Raft.Entries)
				}
				if st.Serving() {
					continue
				}
				// A follower hears only from the leader: the other follower
				// is a follower it does not observe, not "(none) down".
				for _, om := range st.Members {
					switch {
					case om.Addr == st.Active:
						if om.Role != api.RoleLeader || !om.Live {
							t.Errorf("member %d sees its leader as %+v", m.Index(), om)
						}
					case om.Role != api.RoleFollower || !om.Unobserved || om.Live:
						t.Errorf("member %d sees the other follower as %+v, want a follower it does not observe", m.Index(), om)
					}
				}
			}
		})
	}
	if t.Failed() {
		return
	}

	var dash dashboard
	b, err := os.ReadFile("grafana/lockd.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/lockd.json: %v", err)
	}
	queries := dash.queries()
	if len(queries) < 30 {
		t.Fatalf("only %d queries in the dashboard", len(queries))
	}
	rules, recorded := ruleExprs(t)
	check := func(where, expr string) {
		got := metricNames(expr)
		if len(got) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, name := range got {
			if !names[name] && !recorded[name] && name != "up" {
				t.Errorf("%s names %s, which no running lockd exported (query %q)", where, name, expr)
			}
		}
	}
	for _, q := range queries {
		check("grafana/lockd.json panel "+strconvQuote(q.panel), q.expr)
	}
	for _, r := range rules {
		check("prometheus/lockd-rules.yml "+r.name, r.expr)
	}
	promtoolParses(t, queries)
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }

// basic adds basic authentication to every request.
type basic struct {
	user, pass string
	next       http.RoundTripper
}

func (b basic) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(b.user, b.pass)
	return b.next.RoundTrip(r)
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Panels  []panel  `json:"panels"` // a collapsed row's
	Targets []target `json:"targets"`
}

type target struct {
	Expr string `json:"expr"`
}

type query struct{ panel, expr string }

// queries lists every PromQL expression of the dashboard: the panels'
// targets (rows' panels included) and the query variables'.
func (d *dashboard) queries() []query {
	var out []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, query{p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := ""
		switch x := v.Query.(type) {
		case string:
			q = x
		case map[string]any:
			q, _ = x["query"].(string)
		}
		// label_values(METRIC{...}, label): the metric is what counts.
		if m := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`).FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		out = append(out, query{"variable $" + v.Name, q})
	}
	return out
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames are the metric names expr refers to: the identifiers
// outside strings that are lockd's, Go's or the process's metrics, or a
// recording rule's (with a colon), or up.
func metricNames(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`)
	expr = regexp.MustCompile(`\$__\w+|\$\w+`).ReplaceAllString(expr, "")
	var out []string
	for _, id := range identifier.FindAllString(expr, -1) {
		if strings.HasPrefix(id, "lockd_") || strings.HasPrefix(id, "process_") || strings.HasPrefix(id, "go_") ||
			strings.Contains(id, ":") || id == "up" {
			out = append(out, id)
		}
	}
	return out
}

type rule struct{ name, expr string }

// ruleExprs reads the rules file: every expression, and the names it
// records.
func ruleExprs(t *testing.T) ([]rule, map[string]bool) {
	t.Helper()
	b, err := os.ReadFile("prometheus/lockd-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
				Alert  string `yaml:"alert"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("lockd-rules.yml: %v", err)
	}
	var out []rule
	recorded := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			out = append(out, rule{r.Record + r.Alert, r.Expr})
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d rules read", len(out))
	}
	return out, recorded
}

// promtoolParses checks every dashboard query with promtool's PromQL
// parser: each becomes a recording rule of a scratch file (Grafana's
// variables replaced by values) that promtool check rules must accept.
func promtoolParses(t *testing.T, queries []query) {
	t.Helper()
	pt := needTool(t, "promtool", "prometheus")
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", ".*", "$instance", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range queries {
		e, _ := json.Marshal(vars.Replace(q.expr)) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", i, e)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run("", pt, "check", "rules", f); err != nil {
		t.Fatalf("a dashboard query does not parse: %v\n%s", err, out)
	}
}

// TestReadinessFollowsQuorum: a raft member alone (its peers not started)
// is live but not ready (no leader: it would answer M with no address);
// once a majority runs every member is ready; after the kill -9 of two of
// the three, the survivor is not ready again within a few failover
// timeouts, and still live.
func TestReadinessFollowsQuorum(t *testing.T) {
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	c := clustertest.Start(t, clustertest.Options{Mode: api.ModeRaft, Members: 3, Binary: lockdBin, Deferred: []int{1, 2}})
	alone := c.Member(0).AdminURL()
	if code, body := probe(t, hc, alone, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez of a member alone: %d %q", code, body)
	}
	if code, body := probe(t, hc, alone, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz of a member alone: %d %q, want 503", code, body)
	} else {
		t.Logf("alone: /readyz %d %s", code, strings.TrimSpace(body))
	}
	for _, i := range []int{1, 2} {
		if err := c.Member(i).Start(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(20*time.Second, clustertest.Every); err != nil {
		t.Fatal(err)
	}
	waitProbe := func(url, path string, want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			code, body := probe(t, hc, url, path)
			if code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s%s: %d %q, want %d", url, path, code, body, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, m := range c.Members() {
		waitProbe(m.AdminURL(), "/readyz", http.StatusOK)
	}
	for _, i := range []int{1, 2} {
		if err := c.Member(i).Kill(); err != nil {
			t.Fatal(err)
		}
	}
	waitProbe(alone, "/readyz", http.StatusServiceUnavailable)
	if code, body := probe(t, hc, alone, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez without quorum: %d %q", code, body)
	}
}
