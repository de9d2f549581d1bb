package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

// TestKeepAliveFrozenServing: in a cluster of real lockd processes, the
// member that serves (priority's active, raft's leader) is frozen
// (SIGSTOP: its connections stay up and answer nothing) while a client
// keeps a 3 s lock alive. The renewal that goes to the frozen member is
// given up on within its window, its connection closed, and the next one
// reaches the member that took over, which holds the lock: the lock is
// never reported lost. (A test of the client's KeepAlive, here because it
// needs the cluster harness, which the client module's tests cannot
// import: client/go.mod would carry the server's dependencies.)
func TestKeepAliveFrozenServing(t *testing.T) {
	short(t)
	for _, mode := range []string{clustertest.ModePriority, clustertest.ModeRaft} {
		t.Run(mode, func(t *testing.T) {
			c := clustertest.Start(t, clustertest.Options{Mode: mode, Members: 3})
			lead, err := c.WaitLeader(20*time.Second, clustertest.Every)
			if err != nil {
				t.Fatal(err)
			}
			cl, err := client.New(client.Config{Addrs: c.Addrs()})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := cl.Acquire(ctx, "frozen/"+mode, client.AcquireOptions{Wait: 5 * time.Second, Lease: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var failed atomic.Int32
			ka, err := cl.KeepAlive(ctx, l, client.KeepAliveOptions{Lease: 3 * time.Second, OnRenewError: func(error) { failed.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // a renewal or two on the serving member
			if err := c.Member(lead).Stop(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Member(lead).Cont() })
			select {
			case <-ka.Lost():
				t.Fatalf("lock lost with member %d frozen: %v (%d renewals failed)", lead, ka.Err(), failed.Load())
			case <-time.After(8 * time.Second):
			}
			if err := ka.Stop(); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if err := cl.Release(context.Background(), ka.Lock()); err != nil {
				t.Fatalf("release on the member that took over: %v", err)
			}
			t.Logf("member %d frozen for 8 s: the lock was kept, %d renewals failed on the way", lead, failed.Load())
		})
	}
}
