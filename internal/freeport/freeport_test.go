package freeport

import (
	"errors"
	"net"
	"strconv"
	"testing"
)

func TestPick(t *testing.T) {
	pp := New()
	for _, off := range []int{10000, 1, -5000, 30000, 1000} {
		ports, err := pp.Pick(8, off)
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		for _, p := range ports {
			for _, x := range []int{p, p + off} {
				if x < MinPort || x > 65535 || (x >= pp.eLo && x <= pp.eHi) {
					t.Errorf("offset %d: port %d outside the allowed range (ephemeral %d-%d)", off, x, pp.eLo, pp.eHi)
				}
			}
		}
	}
	for _, off := range []int{0, 60000} {
		if _, err := pp.Pick(1, off); !errors.Is(err, ErrNoPorts) {
			t.Errorf("offset %d: %v, want ErrNoPorts", off, err)
		}
	}
	// When the ephemeral range covers everything, the picks fall back to it.
	all := newPicker(1, 65535)
	if c := all.candidates(10000); len(c) == 0 || c[0] != MinPort {
		t.Fatalf("no fallback candidates: %d", len(c))
	}
}

// TestAddrsNeverTwice: every address (and member port) handed out in one
// process is distinct, outside the ephemeral range, and free to bind; a
// picker that closes a ":0" listener and hands its port out again gave
// the same port twice under parallel tests.
func TestAddrsNeverTwice(t *testing.T) {
	lo, hi := process.Ephemeral()
	seen := map[string]bool{}
	for _, tc := range []struct {
		n, offset int
	}{{3, 1000}, {5, 10000}, {1, 0}, {8, 0}, {3, 1000}} {
		addrs := Addrs(t, tc.n, tc.offset)
		if len(addrs) != tc.n {
			t.Fatalf("Addrs(%d, %d): %d addresses", tc.n, tc.offset, len(addrs))
		}
		for _, a := range addrs {
			_, ps, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatal(err)
			}
			p, _ := strconv.Atoi(ps)
			all := []int{p}
			if tc.offset != 0 {
				all = append(all, p+tc.offset)
			}
			for _, x := range all {
				hp := HostPort(x)
				if seen[hp] {
					t.Fatalf("%s handed out twice", hp)
				}
				seen[hp] = true
				if x >= lo && x <= hi {
					t.Errorf("%s is in the ephemeral range %d-%d", hp, lo, hi)
				}
				ln, err := net.Listen("tcp", hp)
				if err != nil {
					t.Fatalf("%s handed out but not free: %v", hp, err)
				}
				ln.Close()
			}
		}
	}
}
