//go:build !race

package httpapi

import "testing"

// TestParseFastAllocs: reading a request's header on the fast lane
// allocates nothing, a Connection list included (Node's fetch sends one
// on every request).
func TestParseFastAllocs(t *testing.T) {
	h := []byte("POST /v1/acquire HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: keep-alive, close\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n")
	if n := testing.AllocsPerRun(200, func() {
		if rq, ok := parseFast(h); !ok || !rq.close {
			t.Fatal("parseFast refused the header or missed close")
		}
	}); n != 1 {
		// One: the Host string the Request carries.
		t.Fatalf("parseFast allocated %v times per header, want 1 (the Host)", n)
	}
}
