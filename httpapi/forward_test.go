package httpapi_test

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
)

// member starts a front whose engine's gate is gate, in front of the
// cluster whose serving member is active (nil: none): its PortOffset puts
// the active's HTTP endpoint at its client port + the offset, as every
// member's must be.
func member(t *testing.T, gate repl.Gate, active *env, mod func(*httpapi.Config)) *env {
	t.Helper()
	node := &httpapi.GatedNode{}
	node.SetGate(gate)
	offset := 0
	if active != nil {
		offset = port(t, strings.TrimPrefix(active.base, "http://")) - port(t, active.srv.Addr())
	}
	e := start(t, opts{
		engine: func(c *engine.Config) {
			node.Local = repl.NewLocal(repl.LocalConfig{DataDir: c.DataDir})
			c.Node = node
		},
		front: func(c *httpapi.Config) {
			c.PortOffset = offset
			if mod != nil {
				mod(c)
			}
		},
	})
	e.srv.GateChanged()
	return e
}

func port(t *testing.T, hostport string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("no port in %q", hostport)
	}
	return n
}

// TestForwarded: a member that does not serve sends each request on to the
// serving member's HTTP endpoint and relays the answer — a grant, a
// long-poll answered by the release there, a watch's stream — so that a
// client pointed at any member is served.
func TestForwarded(t *testing.T) {
	active := start(t, opts{})
	standby := member(t, repl.Gate{State: repl.Redirect, Addr: active.srv.Addr()}, active, nil)

	a := standby.post("/v1/acquire", `{"key":"k","lease_ms":10000}`).want(t, 200, "")
	tok := a.str("token")
	if at := active.inspect("k"); at.str("token") != tok {
		t.Fatalf("the grant through the standby is not the active's: %s", at.raw)
	}
	if st := standby.srv.Key([]byte("k")); st.Held {
		t.Fatal("the standby's own table took the grant")
	}

	// A long-poll through the standby waits at the active and is answered
	// by the release there.
	done := standby.async("/v1/acquire", `{"key":"k","lease_ms":3000,"wait_ms":5000}`)
	wait.For(t, "a waiter at the active", func() bool { return active.inspect("k").num("waiters") == 1 })
	s, w := standby.watch(standby.c, "k", tok)
	if s == nil {
		t.Fatalf("watch through the standby: %s", w.raw)
	}
	if ev, _ := s.next(t, 5*time.Second); ev != "watching" {
		t.Fatalf("first event %s", ev)
	}
	active.post("/v1/release", `{"key":"k","token":"`+tok+`"}`).want(t, 200, "")
	if ev, data := s.next(t, 5*time.Second); ev != "lost" || data["reason_name"] != "released" {
		t.Fatalf("relayed: %s %v", ev, data)
	}
	s.ended(t, 5*time.Second)
	g := (<-done).want(t, 200, "")
	if g.str("token") == tok || active.inspect("k").str("token") != g.str("token") {
		t.Fatalf("the long-poll through the standby: %s", g.raw)
	}
	standby.post("/v1/release", `{"key":"k","token":"`+g.str("token")+`"}`).want(t, 200, "")
	standby.post("/v1/release", `{"key":"k","token":"`+g.str("token")+`"}`).want(t, 409, "not_held")
	if m := standby.front.Metrics(); m.Forwarded != 5 {
		t.Fatalf("Forwarded %d, want the 5 requests made through the standby", m.Forwarded)
	}
}

// TestNotServing: a request another member forwarded (Lockd-Forwarded)
// that meets M is answered 421 not_serving naming the active, not
// forwarded again: the member that forwarded it asks its own engine again.
func TestNotServing(t *testing.T) {
	active := start(t, opts{})
	standby := member(t, repl.Gate{State: repl.Redirect, Addr: active.srv.Addr()}, active, nil)
	a := standby.post("/v1/acquire", `{"key":"k","lease_ms":1000}`, "Lockd-Forwarded", "1").want(t, 421, "not_serving")
	if e, _ := a.body["error"].(map[string]any); e["active"] != active.srv.Addr() {
		t.Fatalf("421 names %v, want %s", e["active"], active.srv.Addr())
	}
	if active.inspect("k").num("holders") != 0 || standby.front.Metrics().Forwarded != 0 {
		t.Fatal("the 421 request was executed or forwarded")
	}
}

// TestNoActive: an M without an address (no active known: a failover, an
// election) is asked again until the request's deadline, then 503
// no_active; nothing was done.
func TestNoActive(t *testing.T) {
	e := member(t, repl.Gate{State: repl.Redirect}, nil, nil)
	begin := time.Now()
	a := e.post("/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":400}`).want(t, 503, "no_active")
	if took := time.Since(begin); took < 200*time.Millisecond || took > 400*time.Millisecond+time.Second {
		t.Fatalf("answered after %v, want about the wait of 400 ms", took)
	}
	if a.h.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
}

// TestHeld: a member whose gate holds (a new leader catching up) answers
// nothing; at the transport deadline a request that changes nothing is
// 503 unavailable, a release or renew 502 indeterminate, an acquire that
// waits 409 timeout at its wait_ms.
func TestHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5 s transport deadline")
	}
	e := member(t, repl.Gate{State: repl.Hold}, nil, nil)
	cases := []struct {
		path, body string
		status     int
		code       string
		after      time.Duration
	}{
		{"/v1/validate", `{"key":"k","token":"5"}`, 503, "unavailable", httpapi.TransportDeadline},
		{"/v1/acquire", `{"key":"k","lease_ms":1000}`, 503, "unavailable", httpapi.TransportDeadline},
		{"/v1/release", `{"key":"k","token":"5"}`, 502, "indeterminate", httpapi.TransportDeadline},
		{"/v1/renew", `{"key":"k","token":"5","lease_ms":1000}`, 502, "indeterminate", httpapi.TransportDeadline},
		{"/v1/acquire", `{"key":"k","lease_ms":1000,"wait_ms":700}`, 409, "timeout", 700 * time.Millisecond},
	}
	begin := time.Now()
	answers := make([]<-chan answer, len(cases))
	for i, c := range cases {
		answers[i] = e.async(c.path, c.body)
	}
	for i, c := range cases {
		a := (<-answers[i]).want(t, c.status, c.code)
		if took := time.Since(begin); took < c.after {
			t.Fatalf("%s %s answered after %v, before %v", c.path, c.body, took, c.after)
		}
		if c.status == http.StatusServiceUnavailable && a.h.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
}
