package httpapi

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/ratelog"
)

// Front is the HTTP/JSON API in front of one engine.Server: an
// http.Handler for the routes of openapi.json. It is safe for concurrent
// use.
type Front struct {
	cfg  Config
	srv  *engine.Server
	log  *slog.Logger
	pool pool
	fwd  *http.Client // to the serving member's HTTP endpoint

	longPolls atomic.Int64
	streams   atomic.Int64
	stats     [nRoutes][600]atomic.Uint64 // requests by route and status
	forwarded atomic.Uint64
	released  atomic.Uint64 // grants released because their answer could not be delivered
	redirects atomic.Uint64

	nonce atomic.Uint64

	// stopping is set by Stopping: the member is shutting down.
	stopping atomic.Bool
	// ctx ends when the front closes: forwards in flight end with it.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the OpenAPI 3 document the front serves at
// /v1/openapi.json.
func OpenAPI() []byte { return openapiDoc }

// New makes a front for cfg.Server, which must be serving (or about to:
// requests made before it is ready are answered 503 shutting_down).
func New(cfg Config) (*Front, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Front{cfg: cfg, srv: cfg.Server, log: cfg.Logger}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	tr := &http.Transport{
		Proxy:               nil, // members talk directly: an HTTP_PROXY of the environment must not see credentials
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	if cfg.ForwardTLS != nil {
		tr.DialTLSContext = f.dialTLS
	}
	f.fwd = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return f, nil
}

// Stopping tells the front that its member is shutting down (call it
// before engine.Server.Shutdown, whose planned handover answers queued
// acquires M before the engine drains): from then on a request that meets
// M is answered 503 shutting_down naming the serving member, not
// forwarded — a forward could outlive this process.
func (f *Front) Stopping() { f.stopping.Store(true) }

// Close ends the requests forwarded to another member that are still in
// flight (their clients are answered: a change that may have been made
// there is 502 indeterminate, a watch ends with lost reason 4) and closes
// the front's idle local and forwarding connections. Requests on this
// member's engine end with it (its shutdown answers them).
func (f *Front) Close() {
	f.closeOnce.Do(func() {
		f.cancel()
		f.pool.close()
		f.fwd.CloseIdleConnections()
	})
}

// Server returns an http.Server for the front with its limits
// (docs/HTTP.md, "Limits"): header size and time, idle keep-alive
// connections; errors go to the front's log, at most a line a second.
// The caller sets TLS by serving on a tls.Listener.
func (f *Front) Server() *http.Server {
	return &http.Server{
		Handler:           f,
		ReadHeaderTimeout: HeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          log.New(&rateWriter{l: f.log}, "", 0),
	}
}

// Routes, for the metrics.
const (
	routeAcquire = iota
	routeRelease
	routeRenew
	routeValidate
	routeInspect
	routeWatch
	routeOpenAPI
	routeOther
	nRoutes
)

var routeNames = [nRoutes]string{"acquire", "release", "renew", "validate", "inspect", "watch", "openapi", "other"}

var routes = map[string]int{
	"/v1/acquire": routeAcquire, "/v1/release": routeRelease, "/v1/renew": routeRenew, "/v1/validate": routeValidate,
	"/v1/inspect": routeInspect, "/v1/watch": routeWatch, "/v1/openapi.json": routeOpenAPI,
}

// ServeHTTP serves one request.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route, ok := routes[r.URL.Path]
	if !ok {
		route = routeOther
	}
	c := &call{f: f, w: w, r: r, route: route, rc: http.NewResponseController(w), start: time.Now()}
	defer func() {
		if c.status >= 100 && c.status < 600 {
			f.stats[route][c.status].Add(1)
		}
	}()
	if !ok {
		c.fail(http.StatusNotFound, CodeNotFound, "no such route: "+r.URL.Path+" (see /v1/openapi.json)")
		return
	}
	want := http.MethodPost
	if route == routeWatch || route == routeOpenAPI {
		want = http.MethodGet
	}
	if r.Method != want && !(want == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", want)
		c.fail(http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" "+r.URL.Path+": use "+want)
		return
	}
	switch route {
	case routeOpenAPI:
		c.reply(http.StatusOK, openapiDoc)
	case routeWatch:
		c.watch()
	default:
		c.request()
	}
}

// admit counts one more on n if that keeps it at most max; false (and
// nothing counted) otherwise. It bounds the long-polls and the streams.
func admit(n *atomic.Int64, max int) bool {
	if n.Add(1) > int64(max) {
		n.Add(-1)
		return false
	}
	return true
}

// rateWriter is the http.Server's error log (a failed TLS handshake, a bad
// request line): one line a second at most, with the number dropped.
type rateWriter struct {
	l    *slog.Logger
	logs ratelog.Shared
}

func (w *rateWriter) Write(p []byte) (int, error) {
	if held, ok := w.logs.Allow(time.Now().UnixNano()); ok {
		w.l.Warn("http endpoint: a connection failed", "err", strings.TrimSpace(string(p)), "dropped_since_last", held)
	}
	return len(p), nil
}

// call is one HTTP request being served.
type call struct {
	f      *Front
	w      http.ResponseWriter
	r      *http.Request
	rc     *http.ResponseController
	route  int
	status int // written, for the metrics
	start  time.Time
	cred   creds
	// waitEnded, for a long-poll, frees its place under MaxLongPolls
	// (once) before its answer is written.
	waitEnded func()
}

// reply writes a JSON answer (within WriteTimeout) and reports whether it
// reached the connection: false when the write failed.
func (c *call) reply(status int, body []byte) bool {
	c.status = status
	if c.waitEnded != nil {
		c.waitEnded()
	}
	h := c.w.Header()
	// Canonical keys set directly (no canonicalization per request); the
	// shared value slices are never changed.
	h["Content-Type"] = hdrJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["Cache-Control"] = hdrNoStore
	_ = c.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	c.w.WriteHeader(status)
	if c.r.Method == http.MethodHead {
		return c.rc.Flush() == nil
	}
	if _, err := c.w.Write(body); err != nil {
		return false
	}
	return c.rc.Flush() == nil
}

var (
	hdrJSON    = []string{contentTypeJSON}
	hdrNoStore = []string{"no-store"}
)

// fail writes the error shape.
func (c *call) fail(status int, code, msg string) {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		c.w.Header().Set("Retry-After", retryAfterSeconds)
	case http.StatusUnauthorized:
		c.w.Header().Set("WWW-Authenticate", `Basic realm="lockd", charset="UTF-8"`)
	}
	c.reply(status, errorBody(code, msg, ""))
}

// failWith writes a badRequest, or any other error as a 400.
func (c *call) failWith(err error) {
	var br *badRequest
	if errors.As(err, &br) {
		c.fail(br.status, br.code, br.msg)
		return
	}
	c.fail(http.StatusBadRequest, CodeBadRequest, err.Error())
}

// readBody reads the request's body: at most MaxBody bytes (413), within
// BodyTimeout (408). net/http lifts the deadline itself when the body is
// read to its end (it starts its background read then, which tells a
// long-poll that its client went away, and which must not time out).
func (c *call) readBody() ([]byte, error) {
	if fb, ok := c.r.Body.(*fastBody); ok {
		if b, whole := fb.bytes(); whole {
			// Read with the header by the fast lane (fast.go): no copy,
			// no deadline.
			return b, nil
		}
	}
	_ = c.rc.SetReadDeadline(time.Now().Add(BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, MaxBody))
	if err != nil {
		// The rest of the body is not read: the connection closes after
		// the answer (net/http would otherwise wait for the rest).
		c.w.Header().Set("Connection", "close")
		var mb *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mb):
			return nil, &badRequest{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "the body is over " + strconv.Itoa(MaxBody) + " bytes"}
		case errors.As(err, &ne) && ne.Timeout():
			return nil, &badRequest{http.StatusRequestTimeout, CodeRequestTimeout, "the body did not arrive within " + BodyTimeout.String()}
		}
		return nil, &badRequest{http.StatusBadRequest, CodeBadRequest, "reading the body: " + err.Error()}
	}
	return body, nil
}

// creds are what may authenticate a request: HTTP basic authentication
// (user = identity, password = secret) and the Common Name of a client
// certificate the TLS handshake verified against --tls-client-ca.
type creds struct {
	user, pass string
	basic      bool
	cn         string
}

func credsOf(r *http.Request) creds {
	var c creds
	c.user, c.pass, c.basic = r.BasicAuth()
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.PeerCertificates) > 0 {
		c.cn = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	return c
}

// Metrics is a snapshot of the front's counters.
type Metrics struct {
	// Requests counts the answers by route and HTTP status (non-zero
	// cells only).
	Requests []RouteCount
	// LongPolls and Streams are the acquires waiting (wait_ms > 0) and the
	// watches open now.
	LongPolls, Streams int64
	// Forwarded counts the requests forwarded to the serving member,
	// Redirected those answered 307 to it (certificate identities).
	Forwarded, Redirected uint64
	// GrantsReleased counts the grants released because their answer
	// could not be delivered (the client went away).
	GrantsReleased uint64
	// IdleConns is the pooled local connections.
	IdleConns int
}

// RouteCount is the number of answers of one route with one status.
type RouteCount struct {
	Route  string
	Status int
	N      uint64
}

// Metrics returns the front's counters.
func (f *Front) Metrics() Metrics {
	m := Metrics{LongPolls: f.longPolls.Load(), Streams: f.streams.Load(), Forwarded: f.forwarded.Load(),
		Redirected: f.redirects.Load(), GrantsReleased: f.released.Load(), IdleConns: f.pool.idleCount()}
	for r := range f.stats {
		for st := range f.stats[r] {
			if n := f.stats[r][st].Load(); n > 0 {
				m.Requests = append(m.Requests, RouteCount{Route: routeNames[r], Status: st, N: n})
			}
		}
	}
	return m
}

// dialTLS dials another member's HTTPS endpoint with ForwardTLS's
// configuration, naming the host it dials (its --peers entry's host, as
// the member link checks it).
func (f *Front) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	cfg := f.cfg.ForwardTLS().Clone()
	cfg.ServerName = host
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	cfg.NextProtos = []string{"http/1.1"}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}, Config: cfg}
	return d.DialContext(ctx, network, addr)
}
