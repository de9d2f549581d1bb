package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/wait"
)

// TestWatch: a watch's stream starts with watching and ends with exactly
// one lost carrying why the grant ended: released (1), expired (2),
// forced by the admin endpoint's DELETE (3), and the server shutting down
// (4, last: it stops the server).
func TestWatch(t *testing.T) {
	e := start(t, opts{
		engine: func(c *engine.Config) { c.Drain = 100 * time.Millisecond },
		front:  func(c *httpapi.Config) { c.KeepAlive = 20 * time.Millisecond },
	})
	adm := httptest.NewServer(admin.Handler(e.srv, admin.Build{}))
	defer adm.Close()

	lost := func(t *testing.T, s *stream, key, tok string, reason int64, name string) {
		t.Helper()
		ev, data := s.next(t, 5*time.Second)
		if ev != "lost" || data["key"] != key || data["token"] != tok || data["reason_name"] != name {
			t.Fatalf("got %s %v, want lost %s", ev, data, name)
		}
		if r, _ := data["reason"].(interface{ Int64() (int64, error) }).Int64(); r != reason {
			t.Fatalf("reason %d, want %d", r, reason)
		}
		s.ended(t, 5*time.Second)
	}
	open := func(t *testing.T, key, tok string) *stream {
		t.Helper()
		s, a := e.watch(e.c, key, tok)
		if s == nil {
			t.Fatalf("watch: %d %s", a.status, a.raw)
		}
		if ev, data := s.next(t, 5*time.Second); ev != "watching" || data["token"] != tok || data["key"] != key {
			t.Fatalf("first event %s %v", ev, data)
		}
		return s
	}

	t.Run("released", func(t *testing.T) {
		tok := e.acquire("r", 10000)
		s := open(t, "r", tok)
		s.keepAlive(t, 5*time.Second) // an idle stream carries comment lines
		e.post("/v1/release", `{"key":"r","token":"`+tok+`"}`).want(t, 200, "")
		lost(t, s, "r", tok, 1, "released")
	})
	t.Run("expired", func(t *testing.T) {
		tok := e.acquire("x", 1000)
		s := open(t, "x", tok)
		begin := time.Now()
		lost(t, s, "x", tok, 2, "expired")
		if took := time.Since(begin); took > 1100*time.Millisecond {
			t.Fatalf("the expiry was pushed after %v", took)
		}
	})
	t.Run("forced", func(t *testing.T) {
		tok := e.acquire("f/1", 10000)
		s := open(t, "f/1", tok)
		req, _ := http.NewRequest(http.MethodDelete, adm.URL+"/keys/f/1?token="+tok, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("admin DELETE: %v %v", err, resp)
		}
		resp.Body.Close()
		lost(t, s, "f/1", tok, 3, "forced")
	})
	t.Run("errors before the stream", func(t *testing.T) {
		_, a := e.watch(e.c, "none", "5")
		a.want(t, 409, "not_held")
		_, a = e.watch(e.c, "none", "x5")
		a.want(t, 400, "bad_token")
		_, a = e.watch(e.c, "", "5")
		a.want(t, 400, "bad_key")
		resp, err := e.c.Get(e.base + "/v1/watch?key=k")
		if err != nil {
			t.Fatal(err)
		}
		decodeAnswer(t, resp).want(t, 400, "bad_token")
	})
	t.Run("client goes away", func(t *testing.T) {
		tok := e.acquire("gone", 10000)
		s := open(t, "gone", tok)
		wait.For(t, "the watch registered", func() bool { return e.srv.Metrics().Watches == 1 })
		s.resp.Body.Close()
		wait.For(t, "the watch and its stream gone", func() bool { return e.srv.Metrics().Watches == 0 && e.front.Metrics().Streams == 0 })
	})
	t.Run("shutdown", func(t *testing.T) {
		tok := e.acquire("s", 10000)
		s := open(t, "s", tok)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- e.srv.Shutdown(ctx) }()
		lost(t, s, "s", tok, 4, "cannot_tell")
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
