package clustertest

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/freeport"
)

// host is the only address the harness uses.
const host = "127.0.0.1"

func hostPort(port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// plan is where everything of a cluster listens, fixed before anything
// starts, and the command lines that follow from it (PROTOCOL.md §6.1).
type plan struct {
	mode     string
	offset   int
	failover time.Duration
	client   []int // member i's client port; its member port is client[i]+offset
	// http, when not 0, is the HTTP API's offset (Options.HTTPOffset):
	// member i runs with --http at client[i]+http.
	http int
	// link[j][k], j != k, proxied only: the port of the proxy member j
	// dials for member k (its client port; the proxy of the member link
	// listens on link[j][k]+offset, since a member dials an entry's port
	// + offset). nil without proxies.
	link [][]int
}

// peers is member j's --peers: every member's client address in priority
// order, the others through their proxies when there are proxies, its own
// as it listens (so that --self matches it).
func (pl *plan) peers(j int) []string {
	out := make([]string, len(pl.client))
	for k, port := range pl.client {
		if pl.link != nil && k != j {
			port = pl.link[j][k]
		}
		out[k] = hostPort(port)
	}
	return out
}

// args is member j's command line, without the binary: --listen, --data-dir,
// --admin (a free port, read back from the log), --log-format, then in a
// cluster mode the five flags of §6.1, then extra (last, so it can override).
func (pl *plan) args(j int, dataDir, logFormat string, extra []string) []string {
	return pl.argsOf(hostPort(pl.client[j]), pl.peers(j), dataDir, logFormat, extra)
}

// argsOf is the command line of the member listening on self with peers
// as its --peers.
func (pl *plan) argsOf(self string, peers []string, dataDir, logFormat string, extra []string) []string {
	a := []string{"--listen", self, "--data-dir", dataDir, "--admin", host + ":0", "--log-format", logFormat}
	if pl.http != 0 {
		_, port, _ := net.SplitHostPort(self)
		p, _ := strconv.Atoi(port)
		a = append(a, "--http", hostPort(p+pl.http))
	}
	if pl.mode != ModeSingle {
		a = append(a,
			"--cluster", pl.mode,
			"--peers", strings.Join(peers, ","),
			"--self", self,
			"--peer-offset", strconv.Itoa(pl.offset),
			"--failover-timeout", pl.failover.String())
	}
	return append(a, extra...)
}

// proxySpec is one proxy of a proxied cluster: member from dials it to
// reach member to, on the client port or (member) on the member link.
type proxySpec struct {
	from, to       int
	member         bool
	listen, target string
}

// proxies lists the proxies of a proxied plan: for every ordered pair of
// members (j, k), one on k's entry in j's --peers, forwarding to k's client
// port, and one on that entry's port + offset, forwarding to k's member
// port.
func (pl *plan) proxies() []proxySpec {
	if pl.link == nil {
		return nil
	}
	var out []proxySpec
	for j := range pl.client {
		for k := range pl.client {
			if j == k {
				continue
			}
			out = append(out,
				proxySpec{from: j, to: k, listen: hostPort(pl.link[j][k]), target: hostPort(pl.client[k])},
				proxySpec{from: j, to: k, member: true, listen: hostPort(pl.link[j][k] + pl.offset), target: hostPort(pl.client[k] + pl.offset)})
		}
	}
	return out
}

// newPlan picks the ports of a cluster of n members: for each member, and
// with proxies for each ordered pair of members, a port p such that p and
// p+offset are free.
func newPlan(mode string, n, offset int, failover time.Duration, proxied bool, httpOffset int) (*plan, error) {
	need := n
	if proxied {
		need += n * (n - 1)
	}
	ports, err := freeport.Pick(need, offset, httpOffset)
	if err != nil {
		return nil, err
	}
	pl := &plan{mode: mode, offset: offset, failover: failover, client: ports[:n], http: httpOffset}
	if proxied {
		rest := ports[n:]
		pl.link = make([][]int, n)
		for j := range n {
			pl.link[j] = make([]int, n)
			for k := range n {
				if j != k {
					pl.link[j][k], rest = rest[0], rest[1:]
				}
			}
		}
	}
	return pl, nil
}

// ErrNoPorts means no pair of free ports (p, p+offset) could be found.
var ErrNoPorts = freeport.ErrNoPorts
