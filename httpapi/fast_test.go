package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// fastEnv is a front served by an Endpoint on 127.0.0.1.
type fastEnv struct {
	e    *Endpoint
	f    *Front
	addr string
}

func startFast(t *testing.T) *fastEnv {
	t.Helper()
	srv := lockdtest.Start(t, nil)
	f, err := New(Config{Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := f.Endpoint()
	served := make(chan struct{})
	go func() { defer close(served); _ = e.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-served
		f.Close()
	})
	return &fastEnv{e: e, f: f, addr: ln.Addr().String()}
}

// rawConn is a client connection that writes bytes as given and reads
// answers with net/http's parser.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (fe *fastEnv) dial(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", fe.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(parts ...string) {
	rc.t.Helper()
	for i, p := range parts {
		if i > 0 {
			time.Sleep(20 * time.Millisecond) // separate segments
		}
		if _, err := io.WriteString(rc.c, p); err != nil {
			rc.t.Fatal(err)
		}
	}
}

// read reads one answer: its status, body and header.
func (rc *rawConn) read() (int, string, http.Header) {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		rc.t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading the answer's body: %v", err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// closed reports whether the server closed the connection within d
// (net/http lingers 500 ms before it closes after some errors).
func (rc *rawConn) closed(d time.Duration) bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	_, err := rc.br.ReadByte()
	return err == io.EOF
}

func post(path, body string, extra ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + strings.Join(extra, "") +
		"Content-Length: " + itoaTest(len(body)) + "\r\n\r\n" + body
}

func itoaTest(n int) string { return string(appendInt(nil, int64(n))) }

func tokenIn(t *testing.T, body string) string {
	t.Helper()
	var a struct{ Token string }
	if err := json.Unmarshal([]byte(body), &a); err != nil || a.Token == "" {
		t.Fatalf("no token in %q (%v)", body, err)
	}
	return a.Token
}

// TestFastLane: the requests the fast lane takes are served on it with
// the answers net/http's path gives (status, body, header), in whatever
// segments they arrive and pipelined; everything else is handed to
// net/http with the bytes read, and served there.
func TestFastLane(t *testing.T) {
	fe := startFast(t)
	cases := []struct {
		name     string
		parts    []string // written with a pause between
		statuses []int    // the answers, in order
		fast     uint64   // requests served by the fast lane
		handed   uint64   // connections handed to net/http
		closed   bool     // the server closes after the answers
	}{
		{name: "one segment", parts: []string{post("/v1/acquire", `{"key":"f1","lease_ms":5000}`)}, statuses: []int{200}, fast: 1},
		{name: "header in pieces, body later", parts: []string{"POST /v1/inspect HTTP/1.1\r\nHo", "st: x\r\nContent-Length: 11\r\n\r\n", `{"key":"f1"}`[:5], `{"key":"f1"}`[5:]}, statuses: []int{400}, fast: 1},
		{name: "pipelined", parts: []string{post("/v1/inspect", `{"key":"f1"}`) + post("/v1/inspect", `{"key":"f2"}`) + post("/v1/acquire", `{"key":"f3","lease_ms":1000}`)}, statuses: []int{200, 200, 200}, fast: 3},
		{name: "connection close", parts: []string{post("/v1/inspect", `{"key":"f1"}`, "Connection: close\r\n")}, statuses: []int{200}, fast: 1, closed: true},
		{name: "escaped key (json.Unmarshal's)", parts: []string{post("/v1/inspect", `{"key":"f\u0031"}`)}, statuses: []int{200}, fast: 1},
		{name: "bad JSON", parts: []string{post("/v1/inspect", `{"key":`)}, statuses: []int{400}, fast: 1},
		{name: "GET openapi: net/http", parts: []string{"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"}, statuses: []int{200}, handed: 1},
		{name: "chunked: net/http", parts: []string{"POST /v1/inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nc\r\n{\"key\":\"f1\"}\r\n0\r\n\r\n"}, statuses: []int{200}, handed: 1},
		{name: "expect 100-continue: net/http", parts: []string{"POST /v1/inspect HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 12\r\n\r\n", `{"key":"f1"}`}, statuses: []int{100, 200}, handed: 1},
		{name: "HTTP/1.0: net/http", parts: []string{"POST /v1/inspect HTTP/1.0\r\nContent-Length: 12\r\n\r\n{\"key\":\"f1\"}"}, statuses: []int{200}, handed: 1, closed: true},
		{name: "no Host: net/http's 400", parts: []string{"POST /v1/inspect HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"key\":\"f1\"}"}, statuses: []int{400}, handed: 1, closed: true},
		{name: "two Content-Length: net/http's 400", parts: []string{"POST /v1/inspect HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nContent-Length: 13\r\n\r\n{\"key\":\"f1\"}"}, statuses: []int{400}, handed: 1, closed: true},
		{name: "header over the buffer: net/http", parts: []string{post("/v1/inspect", `{"key":"f1"}`, "X-Pad: "+strings.Repeat("p", fastBufSize)+"\r\n")}, statuses: []int{200}, handed: 1},
		{name: "fast then handed over", parts: []string{post("/v1/inspect", `{"key":"f1"}`) + "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" + post("/v1/inspect", `{"key":"f1"}`)}, statuses: []int{200, 200, 200}, fast: 1, handed: 1},
		{name: "bare LF line ends: net/http", parts: []string{"POST /v1/inspect HTTP/1.1\nHost: x\nContent-Length: 12\n\n{\"key\":\"f1\"}"}, statuses: []int{200}, handed: 1},
		{name: "unknown route: net/http's 404", parts: []string{post("/v1/nothing", `{}`)}, statuses: []int{404}, handed: 1},
		{name: "a body longer than the buffer", parts: []string{post("/v1/inspect", `{"key":"f1","pad":"`+strings.Repeat("p", 2*fastBufSize)+`"}`)}, statuses: []int{200}, fast: 1},
		{name: "a body over MaxBody: net/http's 413", parts: []string{post("/v1/inspect", `{"key":"f1","pad":"`+strings.Repeat("p", MaxBody)+`"}`)}, statuses: []int{413}, handed: 1, closed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fast0, handed0 := fe.e.servedCount(), fe.e.handedOff.Load()
			rc := fe.dial(t)
			rc.send(tc.parts...)
			for i, want := range tc.statuses {
				st, body, h := rc.read()
				if st != want {
					t.Fatalf("answer %d: %d %s, want %d", i, st, body, want)
				}
				ours := st >= 200 && !strings.Contains(tc.name, "net/http's 400") // net/http's own are text
				if ours && h.Get("Content-Type") != contentTypeJSON {
					t.Errorf("answer %d: Content-Type %q", i, h.Get("Content-Type"))
				}
				if ours && h.Get("Date") == "" {
					t.Errorf("answer %d: no Date", i)
				}
			}
			wait := 300 * time.Millisecond
			if tc.closed {
				wait = 2 * time.Second
			}
			if got := rc.closed(wait); got != tc.closed {
				t.Errorf("connection closed after the answers: %v, want %v", got, tc.closed)
			}
			if d := fe.e.servedCount() - fast0; d != tc.fast {
				t.Errorf("served by the fast lane: %d, want %d", d, tc.fast)
			}
			if d := fe.e.handedOff.Load() - handed0; d != tc.handed {
				t.Errorf("handed to net/http: %d, want %d", d, tc.handed)
			}
		})
	}
}

// TestFastLaneAnswersAsNetHTTP: the same requests served on the fast
// lane and by net/http alone give the same status, body and header
// (but Date).
func TestFastLaneAnswersAsNetHTTP(t *testing.T) {
	fe := startFast(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := fe.f.Server()
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	plain := &fastEnv{addr: ln.Addr().String()}

	fast, slow := fe.dial(t), plain.dial(t)
	type answer struct {
		status int
		body   string
		header http.Header
	}
	do := func(rc *rawConn, req string) answer {
		rc.send(req)
		st, b, h := rc.read()
		h.Del("Date")
		return answer{st, b, h}
	}
	keyF, keyS := "same-f", "same-s"
	for _, step := range []struct{ path, body string }{
		{"/v1/acquire", `{"key":"K","lease_ms":4000}`},
		{"/v1/acquire", `{"key":"K","lease_ms":4000}`},
		{"/v1/inspect", `{"key":"K"}`},
		{"/v1/release", `{"key":"K","token":"1"}`},
		{"/v1/renew", `{"key":"K","token":"x","lease_ms":1000}`},
		{"/v1/validate", `{"key":"K"}`},
		{"/v1/acquire", `{"key":"","lease_ms":1000}`},
		{"/v1/acquire", `{"key":"K","lease_ms":0}`},
		{"/v1/acquire", `{"key":"K","lease_ms":1000,"limit":70000}`},
		{"/v1/inspect", `[]`},
	} {
		a := do(fast, post(step.path, strings.ReplaceAll(step.body, `"K"`, `"`+keyF+`"`)))
		b := do(slow, post(step.path, strings.ReplaceAll(step.body, `"K"`, `"`+keyS+`"`)))
		// Tokens and keys differ between the two; the rest must not.
		norm := func(s, key string) string {
			s = strings.ReplaceAll(s, key, "K")
			var m map[string]any
			if json.Unmarshal([]byte(s), &m) == nil {
				for _, f := range []string{"token", "remaining_ms", "lease_ms"} {
					if _, ok := m[f]; ok {
						m[f] = "n"
					}
				}
				if h, ok := m["holders"].([]any); ok {
					m["holders"] = len(h)
				}
				out, _ := json.Marshal(m)
				return string(out)
			}
			return s
		}
		a.body, b.body = norm(a.body, keyF), norm(b.body, keyS)
		a.header.Del("Content-Length")
		b.header.Del("Content-Length")
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s %s:\nfast lane: %+v\nnet/http:  %+v", step.path, step.body, a, b)
		}
	}
}

// TestFastLaneClientGoneMidWait: a long-poll on the fast lane whose
// client goes away is withdrawn: the grant that comes later goes to
// nobody on that connection and the key is free (no phantom lock).
func TestFastLaneClientGoneMidWait(t *testing.T) {
	fe := startFast(t)
	holder := fe.dial(t)
	holder.send(post("/v1/acquire", `{"key":"gone","lease_ms":10000}`))
	st, body, _ := holder.read()
	if st != 200 {
		t.Fatalf("acquire: %d %s", st, body)
	}
	tok := tokenIn(t, body)

	waiter := fe.dial(t)
	waiter.send(post("/v1/acquire", `{"key":"gone","lease_ms":10000,"wait_ms":20000}`))
	deadline := time.Now().Add(5 * time.Second)
	for fe.f.longPolls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the long-poll never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the handler waits now
	waiter.c.Close()
	for fe.f.longPolls.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the long-poll did not end when its client went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
	holder.send(post("/v1/release", `{"key":"gone","token":"`+tok+`"}`))
	if st, body, _ := holder.read(); st != 200 {
		t.Fatalf("release: %d %s", st, body)
	}
	holder.send(post("/v1/inspect", `{"key":"gone"}`))
	st, body, _ = holder.read()
	if st != 200 || !strings.Contains(body, `"holders":0`) {
		t.Fatalf("inspect after the waiter left: %d %s, want the key free", st, body)
	}
}

// TestFastLaneLongPollThenNext: a long-poll granted on the fast lane is
// answered, and the connection serves the next request (the read that
// watched the client stopped without taking its bytes).
func TestFastLaneLongPollThenNext(t *testing.T) {
	fe := startFast(t)
	holder := fe.dial(t)
	holder.send(post("/v1/acquire", `{"key":"lp","lease_ms":10000}`))
	_, body, _ := holder.read()
	tok := tokenIn(t, body)
	waiter := fe.dial(t)
	waiter.send(post("/v1/acquire", `{"key":"lp","lease_ms":10000,"wait_ms":10000}`))
	time.Sleep(100 * time.Millisecond)
	holder.send(post("/v1/release", `{"key":"lp","token":"`+tok+`"}`))
	holder.read()
	st, body, _ := waiter.read()
	if st != 200 {
		t.Fatalf("long-poll: %d %s", st, body)
	}
	tok2 := tokenIn(t, body)
	waiter.send(post("/v1/release", `{"key":"lp","token":"`+tok2+`"}`))
	if st, body, _ := waiter.read(); st != 200 {
		t.Fatalf("release on the same connection: %d %s", st, body)
	}
}

// FuzzParseFast: a header the fast lane accepts is one net/http reads the
// same way (method, path, Host, Content-Length, Connection: close,
// Authorization).
func FuzzParseFast(f *testing.F) {
	for _, s := range []string{
		"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n",
		"POST /v1/release HTTP/1.1\r\nhost: 127.0.0.1:80\r\ncontent-length: 10\r\nConnection: keep-alive, close\r\nAuthorization: Basic YTpi\r\n\r\n",
		"POST /v1/inspect HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /v1/inspect HTTP/1.1\r\nHost: a\r\nContent-Length:  7 \r\nX: \t y\r\n\r\n",
		"GET /v1/inspect HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, h []byte) {
		end := bytes.Index(h, crlfcrlf)
		if end < 0 {
			return
		}
		h = h[:end+4]
		rq, ok := parseFast(h)
		if !ok {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(h)))
		if err != nil {
			t.Fatalf("parseFast took %q; net/http: %v", h, err)
		}
		if r.Method != http.MethodPost || r.URL.Path != rq.url.Path || r.Host != rq.host || r.ContentLength != rq.contentLength || r.Close != rq.close {
			t.Fatalf("%q: parseFast %+v; net/http %s %s host %q length %d close %v", h, rq, r.Method, r.URL.Path, r.Host, r.ContentLength, r.Close)
		}
		if got := r.Header.Get("Authorization"); got != string(rq.auth) {
			t.Fatalf("%q: Authorization %q, net/http %q", h, rq.auth, got)
		}
		if got := r.Header.Get(hdrForwarded); got != string(rq.forwarded) {
			t.Fatalf("%q: %s %q, net/http %q", h, hdrForwarded, rq.forwarded, got)
		}
	})
}

// TestHasCloseToken: the Connection token lists net/http reads as
// "close", and those it does not.
func TestHasCloseToken(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"close", true}, {"Close", true}, {"keep-alive, close", true}, {" close ,x", true}, {",,close,", true},
		{"keep-alive", false}, {"", false}, {"closed", false}, {"clo\u017fe", false}, {"x-close", false},
	} {
		if got := hasCloseToken(tc.v); got != tc.want {
			t.Errorf("hasCloseToken(%q) = %v, want %v", tc.v, got, tc.want)
		}
		if got := hasCloseToken([]byte(tc.v)); got != tc.want {
			t.Errorf("hasCloseToken([]byte(%q)) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
