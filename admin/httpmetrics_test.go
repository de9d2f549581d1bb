package admin_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/internal/wait"
)

// TestHTTPMetrics: with WithHTTP, /metrics has the HTTP API's requests by
// route and status, the long-polls waiting and the streams open now, and
// the front's other counters.
func TestHTTPMetrics(t *testing.T) {
	srv := lockdtest.Start(t, nil)
	front, err := httpapi.New(httpapi.Config{Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(front)
	adm := httptest.NewServer(admin.Handler(srv, admin.Build{}, admin.WithHTTP(front)))
	tr := &http.Transport{}
	hc := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		tr.CloseIdleConnections()
		adm.Close()
		api.Close()
		front.Close()
	})
	post := func(ctx context.Context, path, body string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+path, strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	scrape := func() map[string]float64 {
		resp, err := hc.Get(adm.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for name, fam := range fams {
			if !strings.HasPrefix(name, "lockd_http_") {
				continue
			}
			for _, m := range fam.Metric {
				k := name
				for _, l := range m.Label {
					k += "," + l.GetName() + "=" + l.GetValue()
				}
				got[k] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return got
	}

	if st := post(ctx, "/v1/acquire", `{"key":"k","lease_ms":30000}`); st != 200 {
		t.Fatalf("acquire: %d", st)
	}
	post(ctx, "/v1/acquire", `{"key":"k","lease_ms":30000}`) // 409
	post(ctx, "/v1/nothing", `{}`)                           // 404
	waiting := make(chan int, 1)
	go func() { waiting <- post(ctx, "/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":60000}`) }()
	tok := srv.Key([]byte("k")).Token
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/v1/watch?key=k&token="+strconv.FormatUint(tok, 10), nil)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", err, resp)
	}
	defer resp.Body.Close()
	if line, _ := bufio.NewReader(resp.Body).ReadString('\n'); line != "event: watching\n" {
		t.Fatalf("stream: %q", line)
	}
	var m map[string]float64
	wait.For(t, "one long-poll and one stream counted", func() bool {
		m = scrape()
		return m["lockd_http_long_polls"] == 1 && m["lockd_http_streams"] == 1
	})
	for k, want := range map[string]float64{
		"lockd_http_requests_total,route=acquire,status=200": 1,
		"lockd_http_requests_total,route=acquire,status=409": 1,
		"lockd_http_requests_total,route=other,status=404":   1,
		"lockd_http_forwarded_total":                         0,
		"lockd_http_redirects_total":                         0,
		"lockd_http_grants_released_total":                   0,
	} {
		if got, ok := m[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	if _, ok := m["lockd_http_pooled_connections"]; !ok {
		t.Error("no lockd_http_pooled_connections")
	}
	// The client of the long-poll goes away: 499 counted, nothing open.
	cancel()
	<-waiting
	wait.For(t, "the long-poll and the stream ended", func() bool {
		m = scrape()
		return m["lockd_http_long_polls"] == 0 && m["lockd_http_streams"] == 0 &&
			m["lockd_http_requests_total,route=acquire,status=499"] == 1 && m["lockd_http_requests_total,route=watch,status=200"] == 1
	})
}
