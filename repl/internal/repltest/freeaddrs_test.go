package repltest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFreeAddrs: the addresses of one process's clusters are distinct
// (client and member ports alike) and outside the kernel's ephemeral
// range, where another test's outgoing connection may take a port
// between its pick and its bind; a picker that handed out ":0" ports
// gave one cluster the same port twice ("lists a member twice").
func TestFreeAddrs(t *testing.T) {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			lo, _ = strconv.Atoi(f[0])
			hi, _ = strconv.Atoi(f[1])
		}
	}
	seen := map[int]bool{}
	for range 20 {
		for _, a := range FreeAddrs(t, 3, 1000) {
			_, ps, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatal(err)
			}
			p, _ := strconv.Atoi(ps)
			for _, x := range []int{p, p + 1000} {
				if seen[x] {
					t.Fatalf("port %d handed out twice", x)
				}
				seen[x] = true
				if x >= lo && x <= hi {
					t.Fatalf("port %d is in the ephemeral range %d-%d", x, lo, hi)
				}
			}
		}
	}
}
