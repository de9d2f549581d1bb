//go:build !race

package engine_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// The race detector's instrumentation allocates, so these run without it.

// roundTrip is a client that allocates nothing per request: fixed buffers,
// one connection, answers read by their known length.
type roundTrip struct {
	tb   testing.TB
	c    net.Conn
	out  []byte
	in   [256]byte
	key  []byte
	tok  uint64
	seq  uint64
	fail string
}

func newRoundTrip(tb testing.TB, addr, key string) *roundTrip {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &roundTrip{tb: tb, c: c, out: make([]byte, 0, 2048), key: []byte(key)}
}

// do writes out and reads n bytes of answers, checking the first byte.
func (r *roundTrip) do(n int, op byte) {
	if _, err := r.c.Write(r.out); err != nil {
		r.fail = err.Error()
		return
	}
	if _, err := io.ReadFull(r.c, r.in[:n]); err != nil {
		r.fail = err.Error()
		return
	}
	if r.in[0] != op {
		r.fail = "unexpected answer " + string(r.in[:n])
	}
}

// pair acquires and releases the key: two round trips.
func (r *roundTrip) pair() {
	r.seq++
	r.out = proto.AppendAcquire(r.out[:0], 0, 30, r.seq, r.key)
	r.do(1+proto.AcquiredHeaderLen+len(r.key)+1, 'A')
	r.tok = binary.BigEndian.Uint64(r.in[9:17])
	r.out = proto.AppendRelease(r.out[:0], r.tok, r.key)
	r.do(1+proto.ReleasedHeaderLen+len(r.key)+1, 'R')
}

// TestRequestAllocs: a request on the plaintext path allocates nothing in
// the server (or this client) in the steady state — with and without an
// ACL, for lock requests of an authenticated identity (the prefix check and
// the identity-bound release included) and for a hello (its SHA-256 and
// constant-time comparison). AllocsPerRun counts every allocation of the
// process, the server's loops included, averaged over the runs.
func TestRequestAllocs(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*engine.Config)
	}{
		{"no ACL", nil},
		{"ACL", func(c *engine.Config) { c.ACL = parseACL(t, aclText) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, c.mod)
			r := newRoundTrip(t, ts.Addr(), "orders/alloc")
			hello := func() {
				r.out = proto.AppendHello(r.out[:0], 1, "orders", secrets["orders"])
				r.do(1+proto.WelcomeHeaderLen+len("orders")+1, 'H')
			}
			renew := func() {
				r.out = proto.AppendRenew(r.out[:0], 30, r.tok, r.key)
				r.do(1+proto.RenewedHeaderLen+len(r.key)+1, 'K')
			}
			hello()
			for range 100 { // warm the pools
				r.pair()
			}
			if r.fail != "" {
				t.Fatal(r.fail)
			}
			if n := testing.AllocsPerRun(2000, r.pair); n != 0 || r.fail != "" {
				t.Fatalf("acquire+release: %v allocs per pair (%s)", n, r.fail)
			}
			r.out = proto.AppendAcquire(r.out[:0], 0, 30, 1, r.key)
			r.do(1+proto.AcquiredHeaderLen+len(r.key)+1, 'A')
			r.tok = binary.BigEndian.Uint64(r.in[9:17])
			if n := testing.AllocsPerRun(2000, renew); n != 0 || r.fail != "" {
				t.Fatalf("renew: %v allocs per renew (%s)", n, r.fail)
			}
			if n := testing.AllocsPerRun(2000, hello); n != 0 || r.fail != "" {
				t.Fatalf("hello: %v allocs per hello (%s)", n, r.fail)
			}
		})
	}
}

// TestSharedRequestAllocs: the requests of PROTOCOL.md §9 allocate nothing
// in the steady state either, with and without an ACL: an S and its
// release, a V, an I, and a W whose grant is then released (its L pushed
// on the same connection).
func TestSharedRequestAllocs(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*engine.Config)
	}{
		{"no ACL", nil},
		{"ACL", func(c *engine.Config) { c.ACL = parseACL(t, aclText) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, c.mod)
			r := newRoundTrip(t, ts.Addr(), "orders/shared")
			r.out = proto.AppendHello(r.out[:0], 1, "orders", secrets["orders"])
			r.do(1+proto.WelcomeHeaderLen+len("orders")+1, 'H')
			kl := len(r.key)
			shared := func() {
				r.seq++
				r.out = proto.AppendShared(r.out[:0], 0, 30, r.seq, 4, r.key)
				r.do(1+proto.AcquiredHeaderLen+kl+1, 'A')
				r.tok = binary.BigEndian.Uint64(r.in[9:17])
			}
			release := func() {
				r.out = proto.AppendRelease(r.out[:0], r.tok, r.key)
				r.do(1+proto.ReleasedHeaderLen+kl+1, 'R')
			}
			pair := func() { shared(); release() }
			watched := func() {
				shared()
				r.out = proto.AppendWatch(r.out[:0], r.tok, r.key)
				r.do(1+proto.WatchingHeaderLen+kl+1, 'W')
				r.out = proto.AppendRelease(r.out[:0], r.tok, r.key)
				r.do(1+proto.ReleasedHeaderLen+kl+1+1+proto.LostHeaderLen+kl+1, 'R')
				if r.fail == "" && r.in[1+proto.ReleasedHeaderLen+kl+1] != 'L' {
					r.fail = "no L after the R: " + string(r.in[:1+proto.ReleasedHeaderLen+kl+1+1+proto.LostHeaderLen+kl+1])
				}
			}
			validate := func() {
				r.out = proto.AppendValidate(r.out[:0], r.tok, r.key)
				r.do(1+proto.ValidHeaderLen+kl+1, 'V')
			}
			inspect := func() {
				r.out = proto.AppendInspect(r.out[:0], 9, r.key)
				r.do(1+proto.InspectionHeaderLen+kl+1, 'I')
			}
			for range 100 { // warm the pools
				pair()
				watched()
			}
			if r.fail != "" {
				t.Fatal(r.fail)
			}
			for _, op := range []struct {
				name string
				fn   func()
			}{{"S+R", pair}, {"S+W+R with its L", watched}} {
				if n := testing.AllocsPerRun(2000, op.fn); n != 0 || r.fail != "" {
					t.Fatalf("%s: %v allocs per run (%s)", op.name, n, r.fail)
				}
			}
			shared() // held for V and I
			for _, op := range []struct {
				name string
				fn   func()
			}{{"V", validate}, {"I", inspect}} {
				if n := testing.AllocsPerRun(2000, op.fn); n != 0 || r.fail != "" {
					t.Fatalf("%s: %v allocs per run (%s)", op.name, n, r.fail)
				}
			}
		})
	}
}
