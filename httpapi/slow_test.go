package httpapi_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/httpapi"
)

// TestSlowAndOversizeRequests: the limits of docs/HTTP.md answer with
// their documented status and hold nothing: a header over 16 KiB is 431
// (net/http's), a body that does not arrive within BodyTimeout is 408, a
// header that does not is closed without an answer; and a body over
// 16 KiB is 413 without being read whole.
func TestSlowAndOversizeRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 10 s timeouts")
	}
	e := start(t, opts{})
	addr := strings.TrimPrefix(e.base, "http://")
	dial := func(t *testing.T) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	doc, err := served()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("header over 16 KiB", func(t *testing.T) {
		c, br := dial(t)
		_, _ = io.WriteString(c, "POST /v1/inspect HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("p", 20<<10)+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("body slower than 10 s", func(t *testing.T) {
		c, br := dial(t)
		begin := time.Now()
		_, _ = io.WriteString(c, "POST /v1/inspect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"key\":")
		_ = c.SetReadDeadline(time.Now().Add(httpapi.BodyTimeout + 5*time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if took := time.Since(begin); resp.StatusCode != http.StatusRequestTimeout || took < httpapi.BodyTimeout {
			t.Fatalf("status %d after %v: %s", resp.StatusCode, took, body)
		}
		if err := doc.Check(http.MethodPost, "/v1/inspect", resp.StatusCode, resp.Header, body); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("header slower than 10 s", func(t *testing.T) {
		c, br := dial(t)
		begin := time.Now()
		_, _ = io.WriteString(c, "POST /v1/inspect HTTP/1.1\r\nHost: x\r\n")
		_ = c.SetReadDeadline(time.Now().Add(httpapi.HeaderTimeout + 5*time.Second))
		n, err := br.ReadByte()
		if took := time.Since(begin); err != io.EOF || took < httpapi.HeaderTimeout {
			t.Fatalf("after %v: read %q, %v; want EOF after %v", took, n, err, httpapi.HeaderTimeout)
		}
	})
	t.Run("body over 16 KiB", func(t *testing.T) {
		c, br := dial(t)
		// Announce far more than is sent: the answer comes without
		// waiting for it.
		_, _ = io.WriteString(c, "POST /v1/inspect HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"+strings.Repeat("{", 17<<10))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if err := doc.Check(http.MethodPost, "/v1/inspect", resp.StatusCode, resp.Header, body); err != nil {
			t.Fatal(err)
		}
	})
}
