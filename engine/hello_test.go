package engine_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
)

// TestHelloWithoutACL: a server without an ACL answers every hello H with
// the identity the hello named (the tail up to its first 0x20, or all of
// it), checks no secret, and goes on with the connection (PROTOCOL.md §8.3).
// Requests pipelined behind it are answered in order.
func TestHelloWithoutACL(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	for _, c := range []struct {
		nonce    uint64
		tail     string
		identity string
	}{
		{1, "orders s3cret", "orders"},
		{2, "orders a secret with spaces", "orders"},
		{3, "no-secret", "no-secret"},
		{4, "", ""},
		{5, " leading", ""},
		{0, "nonce0 x", "nonce0"},
	} {
		w.send(append(binary.BigEndian.AppendUint64([]byte{'H'}, c.nonce), c.tail+"\n"...))
		if f := w.expect(proto.OpHello, c.nonce); f.Tail != c.identity {
			t.Fatalf("hello %q: welcome names %q, want %q", c.tail, f.Tail, c.identity)
		}
	}
	// Pipelined: hello, acquire, ping in one write, answered in order.
	w.send(append(append(proto.AppendHello(nil, 7, "orders", "x"), proto.AppendAcquire(nil, 0, 30, 8, "k")...), proto.AppendPing(nil, 9)...))
	w.expect(proto.OpHello, 7)
	w.expect(proto.OpAcquire, 8)
	w.expect(proto.OpPing, 9)
	// A hello's tail over 1024 bytes is a bad frame (PROTOCOL.md §3).
	w.send(append(binary.BigEndian.AppendUint64([]byte{'H'}, 10), make([]byte, proto.MaxKey+1)...))
	if f := w.expect(proto.OpError, 10); f.Code != proto.CodeBadFrame || f.ReqOp != proto.OpHello {
		t.Fatalf("long hello: %+v", f)
	}
	w.closed(5 * time.Second)
}

// TestHelloOnAMemberThatRedirects: a member that answers everything else
// with M answers a hello itself (it changes no lock state).
func TestHelloOnAMemberThatRedirects(t *testing.T) {
	ts, node := startCommitting(t)
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	w := dial(t, ts.Addr())
	w.send(append(proto.AppendHello(nil, 1, "orders", "s"), proto.AppendPing(nil, 2)...))
	if f := w.expect(proto.OpHello, 1); f.Tail != "orders" {
		t.Fatalf("welcome names %q", f.Tail)
	}
	if f := w.expect(proto.OpMoved, 2); f.Tail != "127.0.0.1:1" {
		t.Fatalf("M names %q", f.Tail)
	}
}

// TestHelloWhileDraining: during the shutdown drain a hello is answered H,
// like a ping, while lock requests get E 4.
func TestHelloWhileDraining(t *testing.T) {
	ts := startServer(t, nil)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	a.grant("k", 30, 1)
	b.acquire("k", 30, 10, 2)
	b.silent(50 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	b.expect(proto.OpError, 2) // the queued acquire: the drain has begun
	a.send(append(proto.AppendHello(nil, 3, "orders", "s"), proto.AppendAcquire(nil, 0, 30, 4, "j")...))
	a.expect(proto.OpHello, 3)
	if f := a.expect(proto.OpError, 4); f.Code != proto.CodeShutdown {
		t.Fatalf("acquire while draining: %+v", f)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
