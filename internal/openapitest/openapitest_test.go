package openapitest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// served is lockd's document, read from the source tree.
func served() (*Doc, error) {
	b, err := os.ReadFile("../../httpapi/openapi.json")
	if err != nil {
		return nil, err
	}
	return Load(b)
}

// TestOpenAPIValidator: the validator refuses what the document does not
// allow (so a test that passes through it could fail).
func TestOpenAPIValidator(t *testing.T) {
	doc, err := served()
	if err != nil {
		t.Fatal(err)
	}
	json := http.Header{"Content-Type": {"application/json"}}
	cases := []struct {
		name   string
		path   string
		status int
		h      http.Header
		body   string
		ok     bool
	}{
		{"grant", "/v1/acquire", 200, json, `{"key":"k","token":"12","lease_ms":5000}`, true},
		{"token as a number", "/v1/acquire", 200, json, `{"key":"k","token":12,"lease_ms":5000}`, false},
		{"token not digits", "/v1/acquire", 200, json, `{"key":"k","token":"1e3","lease_ms":5000}`, false},
		{"missing lease", "/v1/acquire", 200, json, `{"key":"k","token":"12"}`, false},
		{"undocumented field", "/v1/acquire", 200, json, `{"key":"k","token":"12","lease_ms":5000,"x":1}`, false},
		{"lease out of range", "/v1/acquire", 200, json, `{"key":"k","token":"12","lease_ms":999}`, false},
		{"error", "/v1/acquire", 409, json, `{"error":{"code":"timeout","message":"m"}}`, true},
		{"unknown code", "/v1/acquire", 409, json, `{"error":{"code":"nope","message":"m"}}`, false},
		{"undocumented status", "/v1/inspect", 429, json, `{"error":{"code":"busy","message":"m"}}`, false},
		{"429 without Retry-After", "/v1/acquire", 429, json, `{"error":{"code":"busy","message":"m"}}`, false},
		{"429 with Retry-After", "/v1/acquire", 429, http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}},
			`{"error":{"code":"busy","message":"m"}}`, true},
		{"wrong media type", "/v1/acquire", 200, http.Header{"Content-Type": {"text/plain"}}, `{}`, false},
		{"stream", "/v1/watch", 200, http.Header{"Content-Type": {"text/event-stream"}},
			"event: watching\ndata: {\"key\":\"k\",\"token\":\"1\"}\n\n: keep-alive\n\nevent: lost\ndata: {\"key\":\"k\",\"token\":\"1\",\"reason\":2,\"reason_name\":\"expired\"}\n\n", true},
		{"stream: bad reason", "/v1/watch", 200, http.Header{"Content-Type": {"text/event-stream"}},
			"event: watching\ndata: {\"key\":\"k\",\"token\":\"1\"}\n\nevent: lost\ndata: {\"key\":\"k\",\"token\":\"1\",\"reason\":5,\"reason_name\":\"expired\"}\n\n", false},
		{"stream: lost first", "/v1/watch", 200, http.Header{"Content-Type": {"text/event-stream"}},
			"event: lost\ndata: {\"key\":\"k\",\"token\":\"1\",\"reason\":1,\"reason_name\":\"released\"}\n\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := doc.Check(http.MethodPost, c.path, c.status, c.h, []byte(c.body))
			if c.path == "/v1/watch" {
				err = doc.Check(http.MethodGet, c.path, c.status, c.h, []byte(c.body))
			}
			if (err == nil) != c.ok {
				t.Fatalf("check: %v, want ok=%v", err, c.ok)
			}
		})
	}
}

// TestStreamClosedWhileRead: a stream may be closed by the test while
// another goroutine reads it (an SSE reader the test leaves behind): no
// race, and what was read is checked.
func TestStreamClosedWhileRead(t *testing.T) {
	doc, err := served()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "event: watching\ndata: {\"key\":\"k\",\"token\":\"1\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	hc := &http.Client{Transport: Transport(t, doc, http.DefaultTransport)}
	resp, err := hc.Get(srv.URL + "/v1/watch")
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 7)
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				return
			}
		}
	}()
	resp.Body.Close()
	<-read
}
