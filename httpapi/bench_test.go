package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/lockdtest"
)

// nullWriter is a ResponseWriter that keeps the last body.
type nullWriter struct {
	h      http.Header
	status int
	body   []byte
}

func (w *nullWriter) Header() http.Header { return w.h }
func (w *nullWriter) WriteHeader(s int)   { w.status = s }
func (w *nullWriter) Write(b []byte) (int, error) {
	w.body = append(w.body[:0], b...)
	return len(b), nil
}
func (w *nullWriter) FlushError() error { return nil }

// BenchmarkFrontPair is one acquire and one release through the front's
// handler (no network: what the front and the engine cost), with the
// pool of local connections and with a connection opened and closed per
// request. docs/DESIGN.md "The HTTP front" quotes it.
func BenchmarkFrontPair(b *testing.B) {
	for _, pooled := range []bool{true, false} {
		name := "pooled"
		if !pooled {
			name = "connection-per-request"
		}
		b.Run(name, func(b *testing.B) {
			srv := lockdtest.Start(b, nil)
			f, err := New(Config{Server: srv})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			f.pool.off = !pooled
			w := &nullWriter{h: http.Header{}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				key := "k" + strconv.Itoa(i&1023)
				req, _ := http.NewRequest(http.MethodPost, "/v1/acquire", strings.NewReader(`{"key":"`+key+`","lease_ms":10000}`))
				f.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					b.Fatalf("acquire: %d %s", w.status, w.body)
				}
				tok := string(w.body[strings.Index(string(w.body), `"token":"`)+9:])
				tok = tok[:strings.IndexByte(tok, '"')]
				req, _ = http.NewRequest(http.MethodPost, "/v1/release", strings.NewReader(`{"key":"`+key+`","token":"`+tok+`"}`))
				f.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					b.Fatalf("release: %d %s", w.status, w.body)
				}
			}
		})
	}
}
