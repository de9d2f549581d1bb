//go:build !race

package engine_test

import (
	"testing"

	"github.com/lockd-dev/lockd/proto"
)

// TestLocalPairAllocs: an acquire and a release through an in-process
// connection — what the HTTP front does per request, beside net/http's
// work — allocate nothing once the connection's buffers have grown.
func TestLocalPairAllocs(t *testing.T) {
	s := startServer(t, nil)
	c, err := s.OpenLocal("", "test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var frames, out []byte
	var r proto.Response
	var owner uint64
	pair := func() {
		owner++
		frames = proto.AppendAcquire(frames[:0], 0, 30, owner, "alloc/k")
		if err := c.Send(frames); err != nil {
			t.Fatal(err)
		}
		out = c.Take(out[:0])
		if _, err := proto.ParseResponse(out, &r); err != nil || r.Op != proto.OpAcquire {
			t.Fatalf("acquire: %c %v", r.Op, err)
		}
		frames = proto.AppendRelease(frames[:0], r.Token, "alloc/k")
		if err := c.Send(frames); err != nil {
			t.Fatal(err)
		}
		out = c.Take(out[:0])
		if _, err := proto.ParseResponse(out, &r); err != nil || r.Op != proto.OpRelease {
			t.Fatalf("release: %c %v", r.Op, err)
		}
	}
	for range 100 {
		pair()
	}
	if n := testing.AllocsPerRun(1000, pair); n != 0 {
		t.Fatalf("%.1f allocations per acquire and release through a local connection, want 0", n)
	}
}
