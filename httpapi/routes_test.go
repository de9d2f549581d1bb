package httpapi_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/wait"
)

// TestRoutes drives every route through its answers on a single node
// (each answer checked against the served OpenAPI document by the
// client's transport).
func TestRoutes(t *testing.T) {
	e := start(t, opts{engine: func(c *engine.Config) { c.Table.MaxWaitersPerKey = 1 }})
	key := "jobs/nightly report/é" // any UTF-8, '/' and spaces included
	tok := e.acquire(key, 5000)
	if n, err := strconv.ParseUint(tok, 10, 64); err != nil || n == 0 {
		t.Fatalf("token %q", tok)
	}
	k := jsonStr(key)

	cases := []struct {
		name         string
		path, body   string
		status       int
		code         string
		check        func(t *testing.T, a answer)
		pre          func(t *testing.T)
		header, hval string
	}{
		{name: "acquire held, wait 0: T", path: "/v1/acquire", body: `{"key":` + k + `,"lease_ms":1000}`, status: 409, code: "timeout"},
		{name: "validate", path: "/v1/validate", body: `{"key":` + k + `,"token":"` + tok + `"}`, status: 200,
			check: func(t *testing.T, a answer) {
				if r := a.num("remaining_ms"); r <= 0 || r > 5000 || a.str("token") != tok || a.str("key") != key {
					t.Fatalf("%s", a.raw)
				}
			}},
		{name: "validate stale", path: "/v1/validate", body: `{"key":` + k + `,"token":"1"}`, status: 409, code: "not_held"},
		{name: "inspect", path: "/v1/inspect", body: `{"key":` + k + `}`, status: 200,
			check: func(t *testing.T, a answer) {
				if a.num("holders") != 1 || a.num("limit") != 1 || a.num("waiters") != 0 || a.str("token") != tok {
					t.Fatalf("%s", a.raw)
				}
			}},
		{name: "inspect free", path: "/v1/inspect", body: `{"key":"free"}`, status: 200,
			check: func(t *testing.T, a answer) {
				if a.num("holders") != 0 || a.num("limit") != 0 || a.str("token") != "0" || a.num("remaining_ms") != 0 {
					t.Fatalf("%s", a.raw)
				}
			}},
		{name: "renew", path: "/v1/renew", body: `{"key":` + k + `,"token":"` + tok + `","lease_ms":8500}`, status: 200,
			check: func(t *testing.T, a answer) {
				if a.num("lease_ms") != 9000 || a.str("token") != tok {
					t.Fatalf("lease_ms 8500 rounds up to 9000: %s", a.raw)
				}
			}},
		{name: "renew stale", path: "/v1/renew", body: `{"key":` + k + `,"token":"99","lease_ms":1000}`, status: 409, code: "not_held"},
		{name: "renew lease 0 and stale token: E 3 first", path: "/v1/renew", body: `{"key":` + k + `,"token":"99","lease_ms":0}`, status: 400, code: "bad_lease"},
		{name: "release stale", path: "/v1/release", body: `{"key":` + k + `,"token":"18446744073709551615"}`, status: 409, code: "not_held"},
		{name: "busy: the queue is full", path: "/v1/acquire", body: `{"key":"q","lease_ms":1000,"wait_ms":2000}`, status: 429, code: "busy",
			pre: func(t *testing.T) {
				e.acquire("q", 10000)
				e.async("/v1/acquire", `{"key":"q","lease_ms":1000,"wait_ms":1500}`) // the one waiter allowed
				wait.For(t, "key q with 1 waiter", func() bool { return e.inspect("q").num("waiters") == 1 })
			},
			check: func(t *testing.T, a answer) {
				if a.h.Get("Retry-After") == "" {
					t.Fatal("429 without Retry-After")
				}
			}},
		{name: "empty key: E 2", path: "/v1/acquire", body: `{"key":"","lease_ms":1000}`, status: 400, code: "bad_key"},
		{name: "key over 1024 bytes", path: "/v1/acquire", body: `{"key":"` + strings.Repeat("k", 1025) + `","lease_ms":1000}`, status: 400, code: "bad_key"},
		{name: "key with a newline", path: "/v1/acquire", body: `{"key":"a\nb","lease_ms":1000}`, status: 400, code: "bad_key"},
		{name: "key not a string", path: "/v1/acquire", body: `{"key":7,"lease_ms":1000}`, status: 400, code: "bad_key"},
		{name: "key missing", path: "/v1/inspect", body: `{}`, status: 400, code: "bad_key"},
		{name: "lease 0: E 3", path: "/v1/acquire", body: `{"key":"x","lease_ms":0}`, status: 400, code: "bad_lease"},
		{name: "lease over 255 s", path: "/v1/acquire", body: `{"key":"x","lease_ms":255001}`, status: 400, code: "bad_lease"},
		{name: "lease missing", path: "/v1/acquire", body: `{"key":"x"}`, status: 400, code: "bad_lease"},
		{name: "lease fractional", path: "/v1/acquire", body: `{"key":"x","lease_ms":1.5}`, status: 400, code: "bad_lease"},
		{name: "lease as a string", path: "/v1/acquire", body: `{"key":"x","lease_ms":"5000"}`, status: 400, code: "bad_lease"},
		{name: "lease null", path: "/v1/acquire", body: `{"key":"x","lease_ms":null}`, status: 400, code: "bad_lease"},
		{name: "wait over 255 s", path: "/v1/acquire", body: `{"key":"x","lease_ms":1000,"wait_ms":255001}`, status: 400, code: "bad_wait"},
		{name: "wait negative", path: "/v1/acquire", body: `{"key":"x","lease_ms":1000,"wait_ms":-1}`, status: 400, code: "bad_wait"},
		{name: "limit over 65535", path: "/v1/acquire", body: `{"key":"x","lease_ms":1000,"limit":65536}`, status: 400, code: "bad_limit"},
		{name: "limit 0: E 7", path: "/v1/acquire", body: `{"key":"x","lease_ms":1000,"limit":0}`, status: 400, code: "limit_mismatch"},
		{name: "token as a number", path: "/v1/release", body: `{"key":"x","token":12}`, status: 400, code: "bad_token"},
		{name: "token over 2^64", path: "/v1/release", body: `{"key":"x","token":"18446744073709551616"}`, status: 400, code: "bad_token"},
		{name: "token missing", path: "/v1/validate", body: `{"key":"x"}`, status: 400, code: "bad_token"},
		{name: "not JSON", path: "/v1/acquire", body: `key=x`, status: 400, code: "bad_request"},
		{name: "two JSON values", path: "/v1/inspect", body: `{"key":"x"}{"key":"y"}`, status: 400, code: "bad_request"},
		{name: "not UTF-8", path: "/v1/inspect", body: "{\"key\":\"\xff\"}", status: 400, code: "bad_request"},
		{name: "body over 16 KiB", path: "/v1/inspect", body: `{"key":"x","pad":"` + strings.Repeat("p", 17<<10) + `"}`, status: 413, code: "body_too_large"},
		{name: "unknown route", path: "/v1/lock", body: `{}`, status: 404, code: "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.pre != nil {
				c.pre(t)
			}
			a := e.post(c.path, c.body).want(t, c.status, c.code)
			if c.check != nil {
				c.check(t, a)
			}
		})
	}

	t.Run("release, then the key is free", func(t *testing.T) {
		a := e.post("/v1/release", `{"key":`+k+`,"token":"`+tok+`"}`).want(t, 200, "")
		if a.str("token") != tok || a.str("key") != key {
			t.Fatal(a.raw)
		}
		if e.inspect(key).num("holders") != 0 {
			t.Fatal("still held")
		}
	})
	t.Run("methods", func(t *testing.T) {
		for _, m := range []struct{ method, path, allow string }{
			{http.MethodGet, "/v1/acquire", "POST"}, {http.MethodPost, "/v1/watch", "GET"}, {http.MethodDelete, "/v1/openapi.json", "GET"},
		} {
			req, _ := http.NewRequest(m.method, e.base+m.path, nil)
			resp, err := e.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			a := decodeAnswer(t, resp).want(t, 405, "method_not_allowed")
			if a.h.Get("Allow") != m.allow {
				t.Fatalf("%s %s: Allow %q", m.method, m.path, a.h.Get("Allow"))
			}
		}
	})
	t.Run("openapi.json", func(t *testing.T) {
		resp, err := e.c.Get(e.base + "/v1/openapi.json")
		if err != nil {
			t.Fatal(err)
		}
		a := decodeAnswer(t, resp).want(t, 200, "")
		if a.raw != string(httpapi.OpenAPI()) {
			t.Fatal("the served document is not httpapi.OpenAPI()")
		}
	})
}

// TestShared: an acquire with a limit is an S (PROTOCOL.md §9.2).
func TestShared(t *testing.T) {
	e := start(t, opts{})
	var toks []string
	for range 2 {
		a := e.post("/v1/acquire", `{"key":"sem","lease_ms":5000,"limit":2}`).want(t, 200, "")
		if a.num("limit") != 2 {
			t.Fatal(a.raw)
		}
		toks = append(toks, a.str("token"))
	}
	e.post("/v1/acquire", `{"key":"sem","lease_ms":5000,"limit":2}`).want(t, 409, "timeout")
	e.post("/v1/acquire", `{"key":"sem","lease_ms":5000,"limit":3}`).want(t, 400, "limit_mismatch")
	if a := e.inspect("sem"); a.num("holders") != 2 || a.num("limit") != 2 || a.str("token") != toks[1] {
		t.Fatal(a.raw)
	}
	// A writer (no limit) waits for every holder.
	done := e.async("/v1/acquire", `{"key":"sem","lease_ms":5000,"wait_ms":5000}`)
	wait.For(t, "key sem with 1 waiter", func() bool { return e.inspect("sem").num("waiters") == 1 })
	e.post("/v1/release", `{"key":"sem","token":"`+toks[0]+`"}`).want(t, 200, "")
	e.post("/v1/release", `{"key":"sem","token":"`+toks[1]+`"}`).want(t, 200, "")
	a := (<-done).want(t, 200, "")
	if _, ok := a.body["limit"]; ok {
		t.Fatalf("an exclusive grant has no limit: %s", a.raw)
	}
}

// TestLongPollGranted: a waiting acquire is answered when the key is
// released, with a larger token.
func TestLongPollGranted(t *testing.T) {
	e := start(t, opts{})
	tok := e.acquire("k", 10000)
	done := e.async("/v1/acquire", `{"key":"k","lease_ms":3000,"wait_ms":5000}`)
	wait.For(t, "key k with 1 waiter", func() bool { return e.inspect("k").num("waiters") == 1 })
	if m := e.front.Metrics(); m.LongPolls != 1 {
		t.Fatalf("LongPolls %d, want 1", m.LongPolls)
	}
	e.post("/v1/release", `{"key":"k","token":"`+tok+`"}`).want(t, 200, "")
	a := (<-done).want(t, 200, "")
	t1, _ := strconv.ParseUint(tok, 10, 64)
	t2, _ := strconv.ParseUint(a.str("token"), 10, 64)
	if t2 <= t1 || a.num("lease_ms") != 3000 {
		t.Fatalf("handoff %s after token %d", a.raw, t1)
	}
}

// TestWaitHonouredToTheMillisecond: an acquire whose wait_ms passes is
// answered 409 timeout at that moment — not at the wire's whole second —
// and the grant that the release after it would have made is not made
// (the acquire was withdrawn with its connection).
func TestWaitHonouredToTheMillisecond(t *testing.T) {
	e := start(t, opts{})
	for _, wait := range []int{30, 1300} {
		key := "k" + strconv.Itoa(wait)
		tok := e.acquire(key, 10000)
		begin := time.Now()
		a := e.post("/v1/acquire", `{"key":"`+key+`","lease_ms":3000,"wait_ms":`+strconv.Itoa(wait)+`}`)
		took := time.Since(begin)
		a.want(t, 409, "timeout")
		if took < time.Duration(wait)*time.Millisecond || took > time.Duration(wait)*time.Millisecond+50*time.Millisecond {
			t.Fatalf("wait_ms %d answered after %v", wait, took)
		}
		e.post("/v1/release", `{"key":"`+key+`","token":"`+tok+`"}`).want(t, 200, "")
		if a := e.inspect(key); a.num("holders") != 0 || a.num("waiters") != 0 {
			t.Fatalf("after the timeout and the release: %s", a.raw)
		}
	}
}

// TestDisconnectMidWait: a client that goes away while its acquire waits
// leaves no waiter and, when the key is released, no lock held.
func TestDisconnectMidWait(t *testing.T) {
	e := start(t, opts{})
	tok := e.acquire("k", 10000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/v1/acquire", strings.NewReader(`{"key":"k","lease_ms":30000,"wait_ms":20000}`))
		resp, err := e.c.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Errorf("the acquire was answered %d", resp.StatusCode)
		}
	}()
	wait.For(t, "key k with 1 waiter", func() bool { return e.inspect("k").num("waiters") == 1 })
	cancel()
	<-done
	wait.For(t, "key k with 0 waiters", func() bool { return e.inspect("k").num("waiters") == 0 })
	wait.For(t, "no long-poll counted", func() bool { return e.front.Metrics().LongPolls == 0 })
	e.post("/v1/release", `{"key":"k","token":"`+tok+`"}`).want(t, 200, "")
	if a := e.inspect("k"); a.num("holders") != 0 {
		t.Fatalf("a lock is held after the waiter left: %s", a.raw)
	}
}

// TestLimits: long-polls and streams beyond their bound are refused with
// 503 and change nothing.
func TestLimits(t *testing.T) {
	e := start(t, opts{front: func(c *httpapi.Config) { c.MaxLongPolls, c.MaxStreams = 1, 1 }})
	tok := e.acquire("k", 10000)
	e.async("/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":3000}`)
	wait.For(t, "one long-poll counted", func() bool { return e.front.Metrics().LongPolls == 1 })
	a := e.post("/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":3000}`).want(t, 503, "too_many_long_polls")
	if a.h.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	if e.inspect("k").num("waiters") != 1 {
		t.Fatal("the refused acquire queued")
	}
	e.post("/v1/acquire", `{"key":"k","lease_ms":1000}`).want(t, 409, "timeout") // wait 0 is no long-poll
	s, _ := e.watch(e.c, "k", tok)
	if s == nil {
		t.Fatal("watch refused")
	}
	if name, _ := s.next(t, 5*time.Second); name != "watching" {
		t.Fatal(name)
	}
	_, a = e.watch(e.c, "k", tok)
	a.want(t, 503, "too_many_streams")
	s.resp.Body.Close()
}

// TestShuttingDown: E 4 is 503 shutting_down; once the engine stopped the
// front answers the same.
func TestShuttingDown(t *testing.T) {
	e := start(t, opts{engine: func(c *engine.Config) { c.Drain = 300 * time.Millisecond }})
	tok := e.acquire("k", 10000)
	done := e.async("/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":5000}`)
	wait.For(t, "key k with 1 waiter", func() bool { return e.inspect("k").num("waiters") == 1 })
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- e.srv.Shutdown(ctx)
	}()
	a := (<-done).want(t, 503, "shutting_down")
	if a.h.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	e.post("/v1/release", `{"key":"k","token":"`+tok+`"}`).want(t, 503, "shutting_down")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	e.post("/v1/inspect", `{"key":"k"}`).want(t, 503, "shutting_down")
}

// TestLongPollOutlastsBodyTimeout: the body's read deadline (BodyTimeout)
// does not end a long-poll that waits longer (net/http's background read,
// which tells that the client went away, would time out on it and cancel
// the request).
func TestLongPollOutlastsBodyTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("waits BodyTimeout")
	}
	e := start(t, opts{})
	tok := e.acquire("k", 30000)
	done := e.async("/v1/acquire", `{"key":"k","lease_ms":3000,"wait_ms":20000}`)
	time.Sleep(httpapi.BodyTimeout + time.Second)
	if e.inspect("k").num("waiters") != 1 {
		t.Fatal("the long-poll left the queue")
	}
	e.post("/v1/release", `{"key":"k","token":"`+tok+`"}`).want(t, 200, "")
	(<-done).want(t, 200, "")
}

// TestLongPollBoundFreedBeforeTheAnswer: a long-poll's place under
// MaxLongPolls is free by the time its client reads the answer, so a
// client that sends its next long-poll at once is not refused 503
// too_many_long_polls by its own previous request.
func TestLongPollBoundFreedBeforeTheAnswer(t *testing.T) {
	e := start(t, opts{front: func(c *httpapi.Config) { c.MaxLongPolls = 1 }})
	// Two keep-alive connections taking turns: on one, net/http reads
	// the next request only after the handler of the last returned.
	clients := [2]*http.Client{e.client(nil), e.client(nil)}
	for i := range 300 {
		a := e.postCtx(context.Background(), clients[i%2], "/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":1000}`)
		if a.status != 200 {
			t.Fatalf("long-poll %d after %d answered ones: %d %s", i+1, i, a.status, a.raw)
		}
		e.post("/v1/release", `{"key":"k","token":"`+a.str("token")+`"}`).want(t, 200, "")
	}
}
