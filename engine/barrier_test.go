package engine

import (
	"crypto/tls"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
)

// TestBarrier: the write lock waits for a reader of any stripe, holds off
// new readers of every stripe until Unlock, and a stripe added while it is
// held (a loop's first connection) is taken by the next Lock and cannot be
// read before this one ends.
func TestBarrier(t *testing.T) {
	const stripes = 3
	for reader := range stripes {
		t.Run("reader on stripe "+strconv.Itoa(reader), func(t *testing.T) {
			var b barrier
			ss := make([]*stripe, stripes)
			for i := range ss {
				ss[i] = new(stripe)
				b.add(ss[i])
			}
			ss[reader].RLock()
			locked := make(chan struct{})
			go func() { b.Lock(); close(locked) }()
			select {
			case <-locked:
				t.Fatalf("Lock returned while stripe %d was read", reader)
			case <-time.After(20 * time.Millisecond):
			}
			ss[reader].RUnlock()
			<-locked
			for i, s := range ss {
				if s.TryRLock() {
					t.Fatalf("stripe %d read under the write lock", i)
				}
			}
			// A stripe made now waits for Unlock to join.
			late := new(stripe)
			added := make(chan struct{})
			go func() { b.add(late); close(added) }()
			select {
			case <-added:
				t.Fatal("a stripe joined while the write lock was held")
			case <-time.After(20 * time.Millisecond):
			}
			b.Unlock()
			<-added
			for i, s := range append(ss, late) {
				if !s.TryRLock() {
					t.Fatalf("stripe %d not readable after Unlock", i)
				}
				s.RUnlock()
			}
			// The next Lock takes the late stripe too.
			late.RLock()
			locked = make(chan struct{})
			go func() { b.Lock(); close(locked) }()
			select {
			case <-locked:
				t.Fatal("Lock returned while the late stripe was read")
			case <-time.After(20 * time.Millisecond):
			}
			late.RUnlock()
			<-locked
			b.Unlock()
		})
	}
}

// TestBarrierCoversEveryStripe: every reader of the barrier — each event
// loop's counters (a loop's first connection makes them), the TLS
// connections', the local connections', the ticker's and the admin
// release's — has its stripe in the barrier, so the write lock waits for
// the batches of all of them.
func TestBarrierCoversEveryStripe(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), TLS: &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.closeNode(repl.Discard) }()
	s.statsFor(nil) // an event loop's first connection
	in := func(st *stripe) bool { return slices.Contains(s.barrier.stripes, st) }
	n := 0
	s.loops.Range(func(k, v any) bool {
		n++
		if !in(&v.(*loopStats).bar) {
			t.Errorf("the counters of %T read a stripe the barrier does not take", k)
		}
		return true
	})
	if n != 3 {
		t.Errorf("%d sets of counters, want 3 (a loop, TLS, local)", n)
	}
	if !in(s.tickBar) || !in(s.adminBar) {
		t.Error("the ticker's or the admin release's stripe is not in the barrier")
	}
}
