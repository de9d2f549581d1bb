package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
)

// brokenWriter is a ResponseWriter whose client is gone: every write and
// flush fails.
type brokenWriter struct{ h http.Header }

func (w *brokenWriter) Header() http.Header       { return w.h }
func (w *brokenWriter) WriteHeader(int)           {}
func (w *brokenWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }
func (w *brokenWriter) FlushError() error         { return errors.New("broken pipe") }

// TestUndeliveredGrantReleased: a grant whose answer cannot be written —
// the write fails, or the client went away before it — is released at
// once (no phantom lock), and counted.
func TestUndeliveredGrantReleased(t *testing.T) {
	srv := lockdtest.Start(t, nil)
	f, err := New(Config{Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for i, c := range []struct {
		name string
		ctx  context.Context
	}{{"the write fails", context.Background()}, {"the client went away", gone}} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, "/v1/acquire", strings.NewReader(`{"key":"k","lease_ms":60000}`))
			f.ServeHTTP(&brokenWriter{h: http.Header{}}, req)
			if st := srv.Key([]byte("k")); st.Held {
				t.Fatalf("the undelivered grant %d is held", st.Token)
			}
			if n := f.Metrics().GrantsReleased; n != uint64(i+1) {
				t.Fatalf("GrantsReleased %d, want %d", n, i+1)
			}
		})
	}
	// The connection that released went back to the pool, clean: the next
	// request is served.
	lc := f.pool.get("")
	if lc == nil {
		t.Fatal("no pooled connection")
	}
	if err := lc.Send(proto.AppendPing(nil, 1)); err != nil {
		t.Fatal(err)
	}
	lc.Close()
}
