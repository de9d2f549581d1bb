package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// TestOutageIsNotTimeout: an acquire that never found a connection is
// ErrNoConnection with the dial error, never ErrTimeout (a cron job must
// not read an outage as "someone else holds it"); a T from a reachable
// server is ErrTimeout and not ErrNoConnection.
func TestOutageIsNotTimeout(t *testing.T) {
	cl := newClient(t, fastConfig(deadAddr(t)))
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		cfgT := cl.cfg.TransportTimeout
		cl.cfg.TransportTimeout = 300 * time.Millisecond // the wait-0 call's bound
		_, err := cl.Acquire(ctxT(t, 5*time.Second), "outage", AcquireOptions{Wait: wait})
		cl.cfg.TransportTimeout = cfgT
		if !errors.Is(err, ErrNoConnection) || errors.Is(err, ErrTimeout) {
			t.Fatalf("wait %v: err = %v, want ErrNoConnection and not ErrTimeout", wait, err)
		}
		if !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("wait %v: err = %q does not carry the dial error", wait, err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) {
			t.Fatalf("wait %v: the dial error is not reachable through errors.As: %v", wait, err)
		}
	}

	f := newFake(t, func(fc *fconn, r freq) {
		fc.send(proto.AppendTimeout(nil, r.ID, r.Key))
	})
	cl = newClient(t, fastConfig(f.addr()))
	_, err := cl.Acquire(ctxT(t, 5*time.Second), "held", AcquireOptions{Wait: time.Second})
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrNoConnection) {
		t.Fatalf("T: err = %v, want ErrTimeout and not ErrNoConnection", err)
	}
}

// TestFailFast: with Config.FailFast and no server ever reached, every call
// fails at once with the dial error instead of waiting for a redial.
func TestFailFast(t *testing.T) {
	cfg := fastConfig(deadAddr(t), deadAddr(t))
	cfg.FailFast = true
	cfg.TransportTimeout = 5 * time.Second
	cfg.ReleaseRetry = 5 * time.Second
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	l := Lock{Key: "ff", Token: 7}
	calls := []struct {
		name string
		call func() error
	}{
		{"acquire wait 5s", func() error { _, err := cl.Acquire(ctx, "ff", AcquireOptions{Wait: 5 * time.Second}); return err }},
		{"acquire wait 0", func() error { _, err := cl.Acquire(ctx, "ff", AcquireOptions{}); return err }},
		{"release", func() error { return cl.Release(ctx, l) }},
		{"renew", func() error { _, err := cl.Renew(ctx, l, time.Second); return err }},
		{"ping", func() error { _, err := cl.Ping(ctx); return err }},
	}
	for _, c := range calls {
		start := time.Now()
		err := c.call()
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("%s: failed after %v; the 5 s deadline was waited out", c.name, el)
		}
		if !errors.Is(err, ErrNoConnection) || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s: err = %v, want ErrNoConnection with the dial error", c.name, err)
		}
	}
}

// TestFailFastOnlyUntilReached: once a server has answered, FailFast
// changes nothing: a call waits within its deadline for the redial.
func TestFailFastOnlyUntilReached(t *testing.T) {
	f := newFake(t, nil)
	addr := f.addr()
	cfg := fastConfig(addr)
	cfg.FailFast = true
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	f.close()
	waitDown(t, cl)
	time.AfterFunc(300*time.Millisecond, func() { newFakeAt(t, addr, nil) })
	if _, err := cl.Acquire(ctx, "ff-later", AcquireOptions{Wait: 3 * time.Second}); err != nil {
		t.Fatalf("Acquire across the server's restart: %v", err)
	}
}

// waitDown waits until cl has no live connection.
func waitDown(t *testing.T, cl *Client) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for liveConns(cl) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("connections still up 5 s after the server closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rejecting is a listener that accepts every connection and closes it at
// once without a byte, as lockd does at --max-conns.
func rejecting(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// TestRejectedConnection: a server that accepts and closes at once is
// told apart from a refused dial: ErrNoConnection with ErrRejected, and a
// message that names the connection limit. Against a fake and against a
// real lockd at its --max-conns.
func TestRejectedConnection(t *testing.T) {
	srv := ownServer(t, "--max-conns", "1")
	hold, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	// The held connection is the server's one: a ping on it answers.
	if _, err := hold.Write(proto.AppendPing(nil, 1)); err != nil {
		t.Fatal(err)
	}
	_ = hold.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := hold.Read(make([]byte, 64)); err != nil {
		t.Fatalf("the first connection is not served: %v", err)
	}
	for name, addr := range map[string]string{"fake": rejecting(t), "lockd --max-conns 1": srv.Addr()} {
		t.Run(name, func(t *testing.T) {
			cfg := fastConfig(addr)
			cfg.FailFast = true
			cfg.TransportTimeout = 5 * time.Second
			cl := newClient(t, cfg)
			start := time.Now()
			_, err := cl.Ping(ctxT(t, 10*time.Second))
			if el := time.Since(start); el > 3*time.Second {
				t.Errorf("failed after %v", el)
			}
			if !errors.Is(err, ErrNoConnection) || !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "--max-conns") {
				t.Fatalf("err = %v, want ErrNoConnection with ErrRejected naming --max-conns", err)
			}
		})
	}
	// Without FailFast the reason is the same once the deadline passes.
	cfg := fastConfig(rejecting(t))
	cfg.TransportTimeout = 500 * time.Millisecond
	cl := newClient(t, cfg)
	_, err = cl.Ping(context.Background())
	if !errors.Is(err, ErrNoConnection) || !errors.Is(err, ErrRejected) {
		t.Fatalf("without FailFast: err = %v, want ErrNoConnection with ErrRejected", err)
	}
}
