//go:build !race

package client

import (
	"context"
	"testing"
	"time"
)

// TestAllocs: an Acquire + Release round trip through the client allocates
// at most 2 times (in fact none once the pools are warm).
func TestAllocs(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	waitUp(t, cl, 2)
	ctx := context.Background()
	opts := AcquireOptions{Wait: time.Second, Lease: 30 * time.Second}
	i := 0
	n := testing.AllocsPerRun(500, func() {
		l, err := cl.Acquire(ctx, benchKeys[i%len(benchKeys)], opts)
		i++
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	})
	if n > 2 {
		t.Fatalf("%.2f allocations per Acquire+Release, want at most 2", n)
	}
	t.Logf("%.2f allocations per Acquire+Release", n)
}

// TestAllocsS9: a shared acquire + release, a validate and an inspect
// allocate no more than an exclusive pair does (the Ticket is pooled, the
// answers parsed in place).
func TestAllocsS9(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, fastConfig(srv.Addr()))
	waitUp(t, cl, 2)
	ctx := context.Background()
	opts := AcquireOptions{Wait: time.Second, Lease: 30 * time.Second}
	i := 0
	n := testing.AllocsPerRun(500, func() {
		l, err := cl.AcquireShared(ctx, benchKeys[i%len(benchKeys)], 4, opts)
		i++
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	})
	if n > 2 {
		t.Fatalf("%.2f allocations per AcquireShared+Release, want at most 2", n)
	}
	t.Logf("%.2f allocations per AcquireShared+Release", n)
	l, err := cl.Acquire(ctx, "allocs/validate", opts)
	if err != nil {
		t.Fatal(err)
	}
	n = testing.AllocsPerRun(500, func() {
		if _, err := cl.Validate(ctx, l.Key, l.Token); err != nil {
			t.Fatal(err)
		}
	})
	if n > 1 {
		t.Fatalf("%.2f allocations per Validate, want at most 1", n)
	}
	t.Logf("%.2f allocations per Validate", n)
	n = testing.AllocsPerRun(500, func() {
		if _, err := cl.Inspect(ctx, l.Key); err != nil {
			t.Fatal(err)
		}
	})
	if n > 1 {
		t.Fatalf("%.2f allocations per Inspect, want at most 1", n)
	}
	t.Logf("%.2f allocations per Inspect", n)
}
