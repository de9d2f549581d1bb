package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Host is the only address the picks are checked on.
const Host = "127.0.0.1"

// MinPort keeps the picks above well-known services (Redis, etcd…).
const MinPort = 12000

// ErrNoPorts means no set of free ports of the asked shape was found.
var ErrNoPorts = errors.New("freeport: no free ports")

// Picker hands out base ports; its zero value is not usable (New).
type Picker struct {
	mu       sync.Mutex
	handed   map[int]bool
	rng      *rand.Rand
	eLo, eHi int // the ephemeral range
}

var process = New()

// New returns a picker that knows the kernel's ephemeral range (Linux's
// default when it cannot be read) and has handed out nothing.
func New() *Picker {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && l <= h {
				lo, hi = l, h
			}
		}
	}
	return newPicker(lo, hi)
}

func newPicker(eLo, eHi int) *Picker {
	return &Picker{handed: map[int]bool{}, eLo: eLo, eHi: eHi,
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))}
}

// Ephemeral returns the kernel's ephemeral range as the picker read it.
func (pp *Picker) Ephemeral() (lo, hi int) { return pp.eLo, pp.eHi }

// candidates lists the base ports p with p and p+offset in range, outside
// the ephemeral range when possible.
func (pp *Picker) candidates(offset int) []int {
	for _, strict := range []bool{true, false} {
		ok := func(x int) bool {
			if x < MinPort || x > 65535 {
				return false
			}
			return !strict || x < pp.eLo || x > pp.eHi
		}
		var out []int
		for p := MinPort; p <= 65535; p++ {
			if ok(p) && ok(p+offset) {
				out = append(out, p)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// Pick returns n base ports p, all of their p and p+offset distinct, free
// at the time of the call and never handed out before by pp; with extra
// offsets (0 ignored), p+x too for each x. offset must not be 0: a
// caller with one port per base asks for Ports.
func (pp *Picker) Pick(n, offset int, extra ...int) ([]int, error) {
	if offset == 0 {
		return nil, fmt.Errorf("%w: the offset is 0", ErrNoPorts)
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	cands := pp.candidates(offset)
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 200*n || len(cands) == 0 {
			return nil, fmt.Errorf("%w: %d pairs (p, p+%d) after %d tries", ErrNoPorts, n, offset, tries)
		}
		p := cands[pp.rng.IntN(len(cands))]
		if pp.handed[p] || pp.handed[p+offset] || !free(p) || !free(p+offset) {
			continue
		}
		ok := true
		for _, x := range extra {
			if x != 0 && (p+x < MinPort || p+x > 65535 || p+x == p+offset || pp.handed[p+x] || !free(p+x)) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		pp.handed[p], pp.handed[p+offset] = true, true
		for _, x := range extra {
			if x != 0 {
				pp.handed[p+x] = true
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Ports returns n distinct ports, free and never handed out before by pp.
func (pp *Picker) Ports(n int) ([]int, error) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	cands := pp.candidates(0)
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 200*n || len(cands) == 0 {
			return nil, fmt.Errorf("%w: %d ports after %d tries", ErrNoPorts, n, tries)
		}
		p := cands[pp.rng.IntN(len(cands))]
		if pp.handed[p] || !free(p) {
			continue
		}
		pp.handed[p] = true
		out = append(out, p)
	}
	return out, nil
}

// Process returns the process's picker, the one Pick and Addrs use.
func Process() *Picker { return process }

// Pick is the process's picker's Pick.
func Pick(n, offset int, extra ...int) ([]int, error) { return process.Pick(n, offset, extra...) }

// TB is what Addrs needs of a test (testing.TB has it): the harnesses
// that import freeport are commands too, which should not import testing.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Addrs returns n addresses Host:p of the process's picker such that p
// and p+offset are free (offset 0: one port each), failing tb when there
// are none.
func Addrs(tb TB, n, offset int) []string {
	tb.Helper()
	var ports []int
	var err error
	if offset == 0 {
		ports, err = process.Ports(n)
	} else {
		ports, err = process.Pick(n, offset)
	}
	if err != nil {
		tb.Fatal(err)
	}
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = HostPort(p)
	}
	return addrs
}

// HostPort is Host:port.
func HostPort(port int) string { return net.JoinHostPort(Host, strconv.Itoa(port)) }

// free reports whether port can be listened on now.
func free(port int) bool {
	ln, err := net.Listen("tcp", HostPort(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
