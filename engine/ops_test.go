package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// TestHurryCutsTheDrain: Hurry during a long drain ends it at once, and
// the shutdown still writes the snapshot: the next start on the data dir
// has the held lock with its token.
func TestHurryCutsTheDrain(t *testing.T) {
	ts := startServer(t, func(c *engine.Config) { c.Drain = 4 * time.Second })
	w := dial(t, ts.Addr())
	tok := w.grant("held", 60, 1)
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned after %s (%v) with a client connected and a 4 s drain", time.Since(began), err)
	case <-time.After(300 * time.Millisecond):
	}
	ts.Hurry()
	ts.Hurry() // twice is harmless
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Fatalf("Shutdown took %s after Hurry; the drain was 4 s", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Hurry did not end the drain")
	}
	ts2 := startWith(t, ts.cfg)
	w2 := dial(t, ts2.Addr())
	w2.release("held", tok)
	w2.expect(proto.OpRelease, tok) // the snapshot kept it, same token
}

// TestLive: Live is nil while serving, wraps ErrNotLive once the loops'
// ticker has not run for LiveStall, is nil again when it runs, and stays
// nil through a shutdown that was asked for.
func TestLive(t *testing.T) {
	ts := startServer(t, nil)
	if err := ts.Live(); err != nil {
		t.Fatalf("Live while serving: %v", err)
	}
	resume := engine.StallTicker(ts.Server)
	deadline := time.Now().Add(engine.LiveStall + 2*time.Second)
	for ts.Live() == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	err := ts.Live()
	resume()
	if !errors.Is(err, engine.ErrNotLive) {
		t.Fatalf("Live with the ticker stuck for %s: %v", engine.LiveStall+2*time.Second, err)
	}
	t.Logf("stuck: %v", err)
	deadline = time.Now().Add(time.Second)
	for ts.Live() != nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := ts.Live(); err != nil {
		t.Fatalf("Live once the ticker runs again: %v", err)
	}
	ts.shutdown()
	if err := ts.Live(); err != nil {
		t.Fatalf("Live after a shutdown that was asked for: %v", err)
	}
}
