package httpapi

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestErrorLogLimited: the http.Server's error log (a flood of failed TLS
// handshakes or bad request lines) writes one line a second at most, the
// next one saying how many were dropped.
func TestErrorLogLimited(t *testing.T) {
	var out bytes.Buffer
	w := &rateWriter{l: slog.New(slog.NewTextHandler(&out, nil))}
	for range 1000 {
		if n, err := w.Write([]byte("http: TLS handshake error from 127.0.0.1:1: EOF\n")); n == 0 || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "TLS handshake error") || !strings.Contains(lines[0], "dropped_since_last=0") {
		t.Fatalf("1000 failures in well under a second logged:\n%s", out.String())
	}
}
