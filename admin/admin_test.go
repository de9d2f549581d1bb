package admin_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(lockdtest.LeakOptions,
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"), // idle keep-alive conns of http.DefaultClient
	)...)
}

type fixture struct {
	t    *testing.T
	srv  *engine.Server
	http *httptest.Server
	conn net.Conn
	buf  []byte
}

func setup(t *testing.T) *fixture { return setupWith(t, nil) }

// setupWith is setup with the server's configuration changed by mod.
func setupWith(t *testing.T, mod func(*engine.Config)) *fixture {
	srv := lockdtest.Start(t, mod) // closed after the cleanups below
	hs := httptest.NewServer(admin.Handler(srv, admin.Build{Line: "v-test", Version: "v0.0.0-test", Revision: "0123abc"}))
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		hs.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return &fixture{t: t, srv: srv, http: hs, conn: c}
}

// do sends one request frame and returns the answer.
func (f *fixture) do(frame []byte) proto.Response {
	f.t.Helper()
	if _, err := f.conn.Write(frame); err != nil {
		f.t.Fatal(err)
	}
	_ = f.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var r proto.Response
		if n, err := proto.ParseResponse(f.buf, &r); err == nil {
			f.buf = f.buf[n:]
			return r
		}
		var tmp [256]byte
		n, err := f.conn.Read(tmp[:])
		if err != nil {
			f.t.Fatal(err)
		}
		f.buf = append(f.buf, tmp[:n]...)
	}
}

func (f *fixture) get(path string, v any) int {
	f.t.Helper()
	resp, err := http.Get(f.http.URL + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			f.t.Fatalf("GET %s: %v in %s", path, err, body)
		}
	}
	return resp.StatusCode
}

func (f *fixture) scrape() map[string]*dto.MetricFamily {
	f.t.Helper()
	resp, err := http.Get(f.http.URL + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		f.t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

// value returns the metric's value with the given labels (name=value pairs).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	fam, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range fam.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

func TestMetricsMoveWithRequests(t *testing.T) {
	f := setup(t)
	before := f.scrape()
	if v := value(t, before, "lockd_grants_total"); v != 0 {
		t.Fatalf("grants before = %v", v)
	}
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "m/k"))
	f.do(proto.AppendAcquire(nil, 0, 30, 2, "m/k"))  // T
	f.do(proto.AppendRelease(nil, a.Token+1, "m/k")) // N
	f.do(proto.AppendRenew(nil, 30, a.Token, "m/k"))
	f.do(proto.AppendAcquire(nil, 0, 0, 3, "m/k")) // E 3
	f.do(proto.AppendPing(nil, 4))
	f.do(proto.AppendRelease(nil, a.Token, "m/k"))
	m := f.scrape()
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"lockd_requests_total", []string{"op", "acquire", "result", "granted"}, 1},
		{"lockd_requests_total", []string{"op", "acquire", "result", "timeout"}, 1},
		{"lockd_requests_total", []string{"op", "acquire", "result", "error"}, 1},
		{"lockd_requests_total", []string{"op", "release", "result", "not_held"}, 1},
		{"lockd_requests_total", []string{"op", "release", "result", "released"}, 1},
		{"lockd_requests_total", []string{"op", "renew", "result", "renewed"}, 1},
		{"lockd_requests_total", []string{"op", "ping", "result", "pong"}, 1},
		{"lockd_errors_total", []string{"code", "3"}, 1},
		{"lockd_errors_total", []string{"code", "2"}, 0},
		{"lockd_grants_total", nil, 1},
		{"lockd_releases_total", nil, 1},
		{"lockd_renews_total", nil, 1},
		{"lockd_held_keys", nil, 0},
		{"lockd_connections", nil, 1},
		{"lockd_acquire_wait_seconds", nil, 1},
		{"lockd_role", []string{"role", "active"}, 1},
	}
	for _, c := range checks {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The tokens themselves are in /status (exact decimal strings; a
	// float64 gauge near 1.8e18 would lose the low 8 bits); the metric is
	// the headroom below the reservation mark, exact.
	var st api.Status
	f.get("/status", &st)
	last, _ := strconv.ParseUint(st.TokenLast, 10, 64)
	reserved, _ := strconv.ParseUint(st.TokenReserved, 10, 64)
	if last < a.Token || reserved <= last {
		t.Fatalf("/status tokens: last %s reserved %s, granted %d", st.TokenLast, st.TokenReserved, a.Token)
	}
	if v := value(t, m, "lockd_token_headroom"); v != float64(reserved-last) || v == 0 {
		t.Errorf("lockd_token_headroom %v, want %d (reserved %d - last %d)", v, reserved-last, reserved, last)
	}
	// lockd_role: one series per role of the mode, 1 for the current one.
	if n := len(m["lockd_role"].GetMetric()); n != len(api.Roles(api.ModeSingle)) {
		t.Errorf("lockd_role has %d series on a single node", n)
	}
}

func TestMetricsCountHandoffsAndWaits(t *testing.T) {
	f := setup(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "h"))
	other, err := net.Dial("tcp", f.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.Write(proto.AppendAcquire(nil, 10, 30, 2, "h"))
	deadline := time.Now().Add(5 * time.Second)
	for value(t, f.scrape(), "lockd_waiters") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("waiter not counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	f.do(proto.AppendRelease(nil, a.Token, "h"))
	deadline = time.Now().Add(5 * time.Second)
	for value(t, f.scrape(), "lockd_handoffs_total") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("handoff not counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	fam := f.scrape()["lockd_acquire_wait_seconds"].Metric[0].Histogram
	if fam.GetSampleCount() != 2 || fam.GetSampleSum() < 0.02 {
		t.Fatalf("wait histogram count %d sum %v, want 2 and ≥ 20 ms", fam.GetSampleCount(), fam.GetSampleSum())
	}
}

func TestKeysEndpoint(t *testing.T) {
	f := setup(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "dir/a b"))
	var k api.Key
	if code := f.get("/keys/"+url.PathEscape("dir/a b"), &k); code != 200 {
		t.Fatalf("status %d", code)
	}
	if !k.Held || k.Key != "dir/a b" || k.LeaseLeftMs <= 25_000 || k.LeaseLeftMs > 30_000 || k.Waiters != 0 {
		t.Fatalf("held key: %+v", k)
	}
	if k.Token != strconv.FormatUint(a.Token, 10) {
		t.Fatalf("token %q, want %d", k.Token, a.Token)
	}
	var free api.Key
	f.get("/keys/nothing", &free)
	if free.Held || free.Token != "" || free.Key != "nothing" {
		t.Fatalf("free key: %+v", free)
	}
	if code := f.get("/keys/", nil); code != http.StatusBadRequest {
		t.Fatalf("/keys/ without a key: %d", code)
	}
}

func TestStatusHealthzPprof(t *testing.T) {
	f := setup(t)
	f.do(proto.AppendPing(nil, 1)) // the server has opened our connection
	var st api.Status
	if code := f.get("/status", &st); code != 200 {
		t.Fatalf("status %d", code)
	}
	if st.Version != "v-test" || st.Role != "active" || st.Connections != 1 || st.Limits.MaxKey != 1024 || st.Limits.Loops != 2 || st.TokenLast == "" {
		t.Fatalf("status: %+v", st)
	}
	if code := f.get("/healthz", nil); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	resp, err := http.Get(f.http.URL + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("pprof index: %d", resp.StatusCode)
	}
}

func TestHealthzFailsWhileDraining(t *testing.T) {
	f := setup(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- f.srv.Shutdown(ctx)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for f.get("/healthz", nil) != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/healthz still 200 while shutting down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.conn.Close() // the last client leaves: the drain ends
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestProbes: /livez and /readyz beside /healthz on a single node —
// all 200 while serving; once shutdown has begun /readyz and /healthz are
// 503 "shutting down" while /livez stays 200 (the process is ending on
// its own: nothing to restart).
func TestProbes(t *testing.T) {
	f := setup(t)
	body := func(path string) (int, string) {
		resp, err := http.Get(f.http.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/healthz", "/livez", "/readyz"} {
		if code, b := body(p); code != http.StatusOK || b != "ok\n" {
			t.Fatalf("%s while serving: %d %q", p, code, b)
		}
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- f.srv.Shutdown(ctx)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, b := body("/readyz")
		if code == http.StatusServiceUnavailable {
			if b != "shutting down\n" {
				t.Fatalf("/readyz while draining: %q", b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 while shutting down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, b := body("/livez"); code != http.StatusOK {
		t.Fatalf("/livez while draining: %d %q", code, b)
	}
	f.conn.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHealthzTakesNoShardLock: /healthz once took every shard
// lock to read one flag, so a probe waited behind any busy shard. Here a
// shard is held (its record sink blocks inside a grant, under the shard's
// lock) while /healthz is asked: it answers at once.
func TestHealthzTakesNoShardLock(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	f := setupWith(t, func(c *engine.Config) {
		c.Table.Sink = func(r shard.Record) {
			if r.Kind == shard.RecordGrant && string(r.Key) == "healthz/busy" {
				close(entered)
				<-release
			}
		}
	})
	if _, err := f.conn.Write(proto.AppendAcquire(nil, 0, 10, 1, "healthz/busy")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the grant never reached the sink")
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(f.http.URL + "/healthz")
	close(release)
	if err != nil {
		t.Fatalf("/healthz while a shard is locked: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}
	client.CloseIdleConnections()
}

// TestBuildInfoOnASingleNode: lockd_build_info (README, /metrics) is
// exported by every node, a single node included, with the build's
// version and revision as labels.
func TestBuildInfoOnASingleNode(t *testing.T) {
	f := setup(t)
	fams := f.scrape()
	fam, ok := fams["lockd_build_info"]
	if !ok || len(fam.Metric) != 1 || fam.Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("lockd_build_info on a single node: %v", fam)
	}
	if v := value(t, fams, "lockd_build_info", "version", "v0.0.0-test", "revision", "0123abc"); v != 1 {
		t.Fatalf("lockd_build_info{version, revision} = %v", v)
	}
}

// getStrict reads path and decodes its body into v with no unknown field
// (a field the server sends that the api type lacks fails), then checks
// that v encodes back to the very bytes served: the endpoint's documents
// are api's types, whole, so the server and its consumers cannot drift.
func (f *fixture) getStrict(path string, wantCode int, v any) {
	f.t.Helper()
	resp, err := http.Get(f.http.URL + path)
	if err != nil {
		f.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != wantCode || resp.Header.Get("Content-Type") != "application/json" {
		f.t.Fatalf("GET %s: %s %q", path, resp.Status, resp.Header.Get("Content-Type"))
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		f.t.Fatalf("GET %s: %v in\n%s", path, err, body)
	}
	var again bytes.Buffer
	enc := json.NewEncoder(&again)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		f.t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), body) {
		f.t.Fatalf("GET %s: the api type encodes\n%s\nbut the server sent\n%s", path, again.Bytes(), body)
	}
}

// TestDocumentsAreAPITypes: /status, /keys/{key} (held and free) and the
// 400 of /keys/ decode into package api's types with no unknown field and
// re-encode to the served bytes. The cluster modes' documents (members,
// raft) are checked on real clusters by internal/clustertest.
func TestDocumentsAreAPITypes(t *testing.T) {
	f := setup(t)
	a := f.do(proto.AppendAcquire(nil, 0, 30, 1, "doc/k"))
	f.do(proto.AppendAcquire(nil, 0, 30, 2, "doc/../."))
	var st api.Status
	f.getStrict(api.PathStatus, http.StatusOK, &st)
	if st.Mode != api.ModeSingle || st.Role != api.RoleActive || st.Keys != 2 || st.Raft != nil || st.Members != nil ||
		st.TokenReserved == "" || st.Limits.MaxOutbound == 0 {
		t.Fatalf("status: %+v", st)
	}
	var k api.Key
	f.getStrict(api.PathKeys+api.KeyPath("doc/k"), http.StatusOK, &k)
	if !k.Held || k.Token != strconv.FormatUint(a.Token, 10) {
		t.Fatalf("held key: %+v", k)
	}
	var dots api.Key
	f.getStrict(api.PathKeys+api.KeyPath("doc/../."), http.StatusOK, &dots)
	if !dots.Held || dots.Key != "doc/../." {
		t.Fatalf("key with dot segments: %+v", dots)
	}
	var free api.Key
	f.getStrict(api.PathKeys+api.KeyPath("doc/free"), http.StatusOK, &free)
	if free.Held || free.Token != "" {
		t.Fatalf("free key: %+v", free)
	}
	var e api.Error
	f.getStrict(api.PathKeys, http.StatusBadRequest, &e)
	if e.Error == "" {
		t.Fatal("no error message")
	}
}

// TestTLSMetrics: with TLS on the client port, the handshakes that
// succeeded and failed are counted; without it the metrics are absent.
func TestTLSMetrics(t *testing.T) {
	ca, err := testcerts.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue("lockd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	f := setupWith(t, func(c *engine.Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	})
	// The fixture's plaintext connection fails its handshake.
	_, _ = f.conn.Write(proto.AppendPing(nil, 1))
	_ = f.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = f.conn.Read(make([]byte, 64))
	tc, err := tls.Dial("tcp", f.srv.Addr(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	wait.For(t, "both handshakes counted", func() bool {
		m := f.srv.Metrics()
		return m.TLSHandshakes == 1 && m.TLSHandshakeFailures == 1
	})
	fams := f.scrape()
	if v := value(t, fams, "lockd_tls_handshakes_total"); v != 1 {
		t.Fatalf("lockd_tls_handshakes_total %v, want 1", v)
	}
	if v := value(t, fams, "lockd_tls_handshake_failures_total"); v != 1 {
		t.Fatalf("lockd_tls_handshake_failures_total %v, want 1", v)
	}
	if _, ok := setup(t).scrape()["lockd_tls_handshakes_total"]; ok {
		t.Fatal("a plaintext server reports TLS handshakes")
	}
}
