package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/internal/openapitest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, lockdtest.LeakOptions...)
}

// env is an in-process lockd with the HTTP front in front of it, served
// on 127.0.0.1 by the front's Endpoint (what lockd --http serves: the
// fast lane, and net/http for what it hands over), so every test here
// runs through both.
type env struct {
	t     testing.TB
	srv   *engine.Server
	front *httpapi.Front
	hs    *httpapi.Endpoint
	base  string // http://127.0.0.1:port
	c     *http.Client
}

type opts struct {
	engine func(*engine.Config)
	front  func(*httpapi.Config)
	tls    *tls.Config // serve HTTPS with it
	client *tls.Config // the test client's TLS
}

func start(t testing.TB, o opts) *env {
	t.Helper()
	srv := lockdtest.Start(t, o.engine)
	cfg := httpapi.Config{Server: srv}
	if o.front != nil {
		o.front(&cfg)
	}
	f, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http"
	if o.tls != nil {
		ln = tls.NewListener(ln, o.tls)
		scheme = "https"
	}
	hs := f.Endpoint()
	go func() { _ = hs.Serve(ln) }()
	e := &env{t: t, srv: srv, front: f, hs: hs, base: scheme + "://" + ln.Addr().String()}
	e.c = e.client(o.client)
	t.Cleanup(func() {
		e.c.CloseIdleConnections()
		// Shutdown waits for the connections to end (net/http lingers
		// 500 ms on one it closes after an error): nothing outlives the
		// test.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		_ = hs.Close()
		f.Close()
	})
	return e
}

// client is an HTTP client whose every answer is checked against the
// OpenAPI document.
func (e *env) client(tc *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: tc, DisableCompression: true}
	e.t.Cleanup(tr.CloseIdleConnections)
	doc, err := served()
	if err != nil {
		e.t.Fatalf("the served OpenAPI document: %v", err)
	}
	return &http.Client{Transport: openapitest.Transport(e.t, doc, tr),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// async posts in the background; the answer (status 0 on a transport
// error) comes on the channel, and the test waits for it before its
// server closes.
func (e *env) async(path, body string) <-chan answer {
	ch := make(chan answer, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodPost, e.base+path, strings.NewReader(body))
		resp, err := e.c.Do(req)
		if err != nil {
			ch <- answer{raw: err.Error()}
			return
		}
		ch <- decodeAnswer(e.t, resp)
	}()
	e.t.Cleanup(func() { <-done })
	return ch
}

// answer is a decoded answer.
type answer struct {
	status int
	h      http.Header
	body   map[string]any
	raw    string
}

func (a answer) str(k string) string {
	v, _ := a.body[k].(string)
	return v
}

func (a answer) num(k string) int64 {
	n, _ := a.body[k].(json.Number)
	v, _ := n.Int64()
	return v
}

// code is the error code of an error answer.
func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// post sends body (a JSON text) to path.
func (e *env) post(path, body string, hdr ...string) answer {
	e.t.Helper()
	return e.postCtx(context.Background(), e.c, path, body, hdr...)
}

func (e *env) postCtx(ctx context.Context, c *http.Client, path, body string, hdr ...string) answer {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("POST %s %s: %v", path, body, err)
	}
	return decodeAnswer(e.t, resp)
}

func decodeAnswer(t testing.TB, resp *http.Response) answer {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, h: resp.Header, raw: string(raw)}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	_ = d.Decode(&a.body)
	return a
}

// want fails unless a has status (and, for an error, code).
func (a answer) want(t testing.TB, status int, code string) answer {
	t.Helper()
	if a.status != status || code != "" && a.code() != code {
		t.Fatalf("got %d %s, want %d %s", a.status, a.raw, status, code)
	}
	return a
}

// acquire acquires key (wait 0) and returns the token.
func (e *env) acquire(key string, leaseMs int, hdr ...string) string {
	e.t.Helper()
	a := e.post("/v1/acquire", `{"key":`+jsonStr(key)+`,"lease_ms":`+itoa(leaseMs)+`}`, hdr...).want(e.t, 200, "")
	return a.str("token")
}

func (e *env) inspect(key string, hdr ...string) answer {
	e.t.Helper()
	return e.post("/v1/inspect", `{"key":`+jsonStr(key)+`}`, hdr...).want(e.t, 200, "")
}

func jsonStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func itoa(n int) string { return strconv.Itoa(n) }

// stream is an open watch.
type stream struct {
	resp *http.Response
	br   *bufio.Reader
}

// watch opens GET /v1/watch; a non-200 answer is returned instead.
func (e *env) watch(c *http.Client, key, token string, hdr ...string) (*stream, answer) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.base+"/v1/watch?key="+urlQuery(key)+"&token="+token, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("watch: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, decodeAnswer(e.t, resp)
	}
	s := &stream{resp: resp, br: bufio.NewReader(resp.Body)}
	e.t.Cleanup(func() { resp.Body.Close() })
	return s, answer{status: 200}
}

// next reads the next named event within d (comments skipped).
func (s *stream) next(t testing.TB, d time.Duration) (name string, data map[string]any) {
	t.Helper()
	type res struct {
		name string
		data map[string]any
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		var r res
		for {
			line, err := s.br.ReadString('\n')
			if err != nil {
				r.err = err
				ch <- r
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "" && r.name != "":
				ch <- r
				return
			case strings.HasPrefix(line, "event: "):
				r.name = line[7:]
			case strings.HasPrefix(line, "data: "):
				d := json.NewDecoder(strings.NewReader(line[6:]))
				d.UseNumber()
				_ = d.Decode(&r.data)
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("stream: %v", r.err)
		}
		return r.name, r.data
	case <-time.After(d):
		s.resp.Body.Close()
		<-ch
		t.Fatalf("no event within %v", d)
	}
	return "", nil
}

// keepAlive reads the stream until its next comment line (": keep-alive"),
// within d; an event before it fails the test.
func (s *stream) keepAlive(t testing.TB, d time.Duration) {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		for {
			line, err := s.br.ReadString('\n')
			if err != nil || line != "\n" {
				done <- strings.TrimSuffix(line, "\n")
				return
			}
		}
	}()
	select {
	case line := <-done:
		if line != ": keep-alive" {
			t.Fatalf("want a keep-alive comment, got %q", line)
		}
	case <-time.After(d):
		s.resp.Body.Close()
		<-done
		t.Fatalf("no keep-alive comment within %v", d)
	}
	// The blank line that ends the comment's block.
	if line, err := s.br.ReadString('\n'); err != nil || line != "\n" {
		t.Fatalf("after the comment: %q, %v", line, err)
	}
}

// ended checks that the stream ends (EOF) within d.
func (s *stream) ended(t testing.TB, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(s.br)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stream ended with %v", err)
		}
	case <-time.After(d):
		s.resp.Body.Close()
		<-done
		t.Fatal("stream did not end")
	}
	s.resp.Body.Close()
}

func urlQuery(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(hex2(c)))
		}
	}
	return b.String()
}

func hex2(c byte) string {
	const h = "0123456789abcdef"
	return string([]byte{h[c>>4], h[c&0xf]})
}
