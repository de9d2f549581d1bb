package admin

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/httpapi"
)

// httpCollector turns one httpapi.Metrics snapshot per scrape into the
// HTTP API's metrics.
type httpCollector struct {
	f                                       *httpapi.Front
	requests, longPolls, streams, forwarded *prometheus.Desc
	redirects, released, pooled             *prometheus.Desc
}

func newHTTPCollector(f *httpapi.Front) *httpCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("lockd_http_"+name, help, labels, nil)
	}
	return &httpCollector{f: f,
		requests:  d("requests_total", "HTTP API answers by route (acquire, release, renew, validate, inspect, watch, openapi, other) and status (499: the client went away first, nothing written).", "route", "status"),
		longPolls: d("long_polls", "Acquires with wait_ms > 0 waiting now (--http-max-long-polls bounds them)."),
		streams:   d("streams", "Watches (SSE streams) open now (--http-max-streams bounds them)."),
		forwarded: d("forwarded_total", "Requests forwarded to the serving member's HTTP endpoint (this member answered M)."),
		redirects: d("redirects_total", "Requests answered 307 to the serving member (authenticated by a client certificate, whose identity cannot be forwarded)."),
		released:  d("grants_released_total", "Grants released because their HTTP answer could not be delivered (the client went away)."),
		pooled:    d("pooled_connections", "Idle in-process connections the front keeps for the next requests."),
	}
}

func (c *httpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.longPolls, c.streams, c.forwarded, c.redirects, c.released, c.pooled} {
		ch <- d
	}
}

func (c *httpCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.f.Metrics()
	counter, gauge := emitters(ch)
	for _, r := range m.Requests {
		counter(c.requests, r.N, r.Route, strconv.Itoa(r.Status))
	}
	gauge(c.longPolls, float64(m.LongPolls))
	gauge(c.streams, float64(m.Streams))
	counter(c.forwarded, m.Forwarded)
	counter(c.redirects, m.Redirected)
	counter(c.released, m.GrantsReleased)
	gauge(c.pooled, float64(m.IdleConns))
}
