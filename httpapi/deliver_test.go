package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
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

// TestUndeliveredForwardedGrantReleased: a request forwarded to the
// serving member is granted there; when the forwarding member cannot
// write that grant to its client, it releases it at the serving member at
// once (no phantom lock across members).
func TestUndeliveredForwardedGrantReleased(t *testing.T) {
	active := lockdtest.Start(t, nil)
	fa, err := New(Config{Server: active})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := fa.Endpoint()
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(ln) }()
	defer func() { hs.Close(); <-served; fa.Close() }()
	_, hp, _ := net.SplitHostPort(ln.Addr().String())
	_, cp, _ := net.SplitHostPort(active.Addr())
	httpPort, _ := strconv.Atoi(hp)
	clientPort, _ := strconv.Atoi(cp)

	node := &GatedNode{}
	standby := lockdtest.Start(t, func(c *engine.Config) {
		node.Local = repl.NewLocal(repl.LocalConfig{DataDir: c.DataDir})
		c.Node = node
	})
	node.SetGate(repl.Gate{State: repl.Redirect, Addr: active.Addr()})
	standby.GateChanged()
	fs, err := New(Config{Server: standby, PortOffset: httpPort - clientPort})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()

	req, _ := http.NewRequest(http.MethodPost, "/v1/acquire", strings.NewReader(`{"key":"k","lease_ms":60000}`))
	fs.ServeHTTP(&brokenWriter{h: http.Header{}}, req)
	if m := fs.Metrics(); m.Forwarded != 1 || m.GrantsReleased != 1 {
		t.Fatalf("Forwarded %d, GrantsReleased %d; want 1 1", m.Forwarded, m.GrantsReleased)
	}
	if st := active.Key([]byte("k")); st.Held {
		t.Fatalf("the undelivered grant %d is held at the active", st.Token)
	}
	if m := active.Metrics(); m.Table.Grants != 1 {
		t.Fatalf("the active granted %d times, want 1 (the grant that was released)", m.Table.Grants)
	}
}
