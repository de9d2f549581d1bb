package engine

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// TestServeStoppingOnItsOwnKeepsLocks: when serving ends while no Shutdown
// was asked for (the listener fails for good), Serve returns ErrStopped
// after the node has written its snapshot, and the next start on the data
// dir reloads the held lock with its token.
func TestServeStoppingOnItsOwnKeepsLocks(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.Loops = "127.0.0.1:0", dir, 1
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	select {
	case <-s.Ready():
	case err := <-served:
		t.Fatal(err)
	}
	var out shard.Out
	st, tok := s.table.Acquire(s.now(), []byte("kept"), 0, 60, 1, nil, &out)
	if st != shard.Granted {
		t.Fatal(st)
	}
	// The listener fails for good while nobody asked to stop.
	s.lnMu.Lock()
	s.ln.Close()
	s.lnMu.Unlock()
	select {
	case err := <-served:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Serve = %v, want ErrStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the engine stopped")
	}
	s2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.closeNode(repl.Discard)
	if info := s2.table.Lookup([]byte("kept")); !info.Held || info.Token != tok {
		t.Fatalf("after the restart: %+v, want held by %d", info, tok)
	}
}
