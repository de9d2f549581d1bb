package clustertest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/faultproxy"
)

// The modes of Options.Mode.
const (
	ModeSingle   = ""               // independent single nodes: no cluster flags
	ModePriority = api.ModePriority // --cluster priority (PROTOCOL.md §6.3)
	ModeRaft     = api.ModeRaft     // --cluster raft (PROTOCOL.md §6.4)
)

// Defaults of Options.
const (
	DefaultMembers         = 3
	DefaultPeerOffset      = 10000 // §6.1's default
	DefaultFailoverTimeout = time.Second
	DefaultStartTimeout    = 30 * time.Second
	DefaultStopTimeout     = 20 * time.Second
)

// Sentinel errors. Errors carry the member's index and, where it helps,
// the tail of its log.
var (
	ErrBadOptions = errors.New("clustertest: bad options")
	ErrNotRunning = errors.New("clustertest: member not running")
	ErrRunning    = errors.New("clustertest: member still running")
	ErrExited     = errors.New("clustertest: member exited")
	ErrTimeout    = errors.New("clustertest: timed out")
	ErrClosed     = errors.New("clustertest: cluster closed")
	ErrNotProxied = errors.New("clustertest: cluster has no proxies")
)

// errPortTaken marks a start that failed because a port picked free was
// taken before lockd or a proxy bound it: New tries again with new ports.
var errPortTaken = errors.New("clustertest: port taken")

const (
	startAttempts = 3
	killTimeout   = 10 * time.Second // SIGKILL to reaped
	dumpLines     = 60               // log lines per member dumped on failure
)

// Options describe a cluster. The zero value is 3 independent single nodes.
type Options struct {
	// Mode is ModeSingle, ModePriority or ModeRaft.
	Mode string
	// Members is the number of lockd processes: 1..7 in a cluster mode
	// (§6.1), 1..64 single; default 3.
	Members int
	// FailoverTimeout is --failover-timeout (default 1s). It is passed
	// as given: the binary validates it.
	FailoverTimeout time.Duration
	// PeerOffset is --peer-offset (default 10000): every member's port
	// and port + PeerOffset are picked free.
	PeerOffset int
	// Proxied puts fault proxies between the members (cluster modes only):
	// each member's --peers names the others through proxies of its own,
	// so Partition can cut any member link. See Cluster.Link.
	Proxied bool
	// ExtraArgs are appended to every member's command line, after the
	// harness's flags (so a repeated flag overrides them).
	ExtraArgs []string
	// Env is added to the harness's environment for every member.
	Env []string
	// LogFormat is --log-format: "json" (default) or "text".
	LogFormat string
	// Dir holds the members' data dirs (m0, m1, …). Start uses the
	// test's TempDir; New, a temporary directory that Close removes.
	Dir string
	// Binary is the lockd binary; default Build().
	Binary string
	// StartTimeout bounds the wait for a member's ready log line, at
	// start and on Restart (default 30s).
	StartTimeout time.Duration
	// StopTimeout bounds Term's wait for the exit (default 20s).
	StopTimeout time.Duration
	// Deferred lists members New does not start (a standby that joins a
	// loaded active later, say): start them with Member.Start.
	Deferred []int
	// Secure turns PROTOCOL.md §8's TLS and member authentication on
	// (cluster modes only): a CA made for the cluster, a certificate per
	// member naming 127.0.0.1 and a cluster secret, so every member runs
	// with --tls-cert, --tls-key, --tls-peer-ca (the client port and the
	// admin endpoint speak TLS, the member link is mutual TLS) and
	// --cluster-secret. The harness's HTTP client and Cluster.Dial speak
	// TLS then; ClientTLS is what other clients need.
	Secure bool
	// HTTPOffset, when not 0, runs every member with the HTTP API
	// (--http 127.0.0.1:P+HTTPOffset, P its client port: the same offset
	// on every member, as a cluster needs); the picked ports leave
	// P+HTTPOffset free too. Member.HTTPAddr is the address.
	HTTPOffset int
	// AdminUser and AdminPassword, when set, are the HTTP basic
	// authentication of every request the harness makes to a member's
	// admin endpoint (members run with --acl, PROTOCOL.md §8.5: a monitor
	// identity of their file).
	AdminUser, AdminPassword string
}

// basicAuth adds the harness's admin credentials to every request.
type basicAuth struct {
	user, password string
	next           http.RoundTripper
}

func (b basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(b.user, b.password)
	return b.next.RoundTrip(r)
}

func (o *Options) fill() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, args...))
	}
	maxMembers := 7
	switch o.Mode {
	case ModeSingle:
		maxMembers = 64
		if o.Proxied {
			return bad("Proxied needs a cluster mode")
		}
		if o.Secure {
			return bad("Secure needs a cluster mode")
		}
	case ModePriority, ModeRaft:
	default:
		return bad("Mode %q: want %q, %q or %q", o.Mode, ModeSingle, ModePriority, ModeRaft)
	}
	if o.Members == 0 {
		o.Members = DefaultMembers
	}
	if o.Members < 1 || o.Members > maxMembers {
		return bad("Members %d: want 1..%d", o.Members, maxMembers)
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = DefaultFailoverTimeout
	}
	if o.PeerOffset == 0 {
		o.PeerOffset = DefaultPeerOffset
	}
	if o.PeerOffset < -65535 || o.PeerOffset > 65535 {
		return bad("PeerOffset %d out of range", o.PeerOffset)
	}
	switch o.LogFormat {
	case "":
		o.LogFormat = "json"
	case "json", "text":
	default:
		return bad("LogFormat %q: want json or text", o.LogFormat)
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	for _, i := range o.Deferred {
		if i < 0 || i >= o.Members {
			return bad("Deferred: no member %d", i)
		}
	}
	return nil
}

// Cluster is a set of running lockd processes on 127.0.0.1 and, when
// proxied, the fault proxies between them. Its methods are safe for
// concurrent use.
type Cluster struct {
	opts    Options
	bin     string
	plan    *plan
	dir     string
	ownDir  bool
	mu      sync.Mutex // members: AddMember appends
	members []*Member
	links   [][]Link  // proxied: links[from][to]
	sec     *security // Secure: the TLS material and the secret
	proxies []*faultproxy.Proxy
	http    *http.Client

	closeOnce sync.Once
	closeErr  error
}

// Link is the pair of proxies member From dials to reach member To: Client
// on To's entry in From's --peers, forwarding to To's client port, and
// Member on that entry's port + offset, forwarding to To's member port.
type Link struct {
	From, To       int
	Client, Member *faultproxy.Proxy
}

// Start starts a cluster for tb (data dirs in tb.TempDir()), waits until
// every member has logged that it is ready, and closes it when the test
// ends, after logging the tail of every member's log if the test failed.
// A cluster that cannot start fails tb.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	c, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			var b strings.Builder
			c.Dump(&b, dumpLines)
			tb.Logf("clustertest: the test failed; the cluster's state:\n%s", b.String())
		}
		if err := c.Close(); err != nil {
			tb.Errorf("clustertest: close: %v", err)
		}
	})
	return c
}

// New starts a cluster, waits until every member has logged that it is
// ready and returns it; the caller must Close it. Ports are picked free;
// when one is taken before lockd binds it, New starts again on new ports
// (up to 3 times). On failure nothing is left running.
func New(opts Options) (*Cluster, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = Build(); err != nil {
			return nil, err
		}
	}
	dir, own := opts.Dir, false
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "lockd-cluster-"); err != nil {
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		own = true
	}
	var err error
	for range startAttempts {
		var c *Cluster
		if c, err = start(opts, bin, dir); err == nil {
			c.ownDir = own
			return c, nil
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	if own {
		os.RemoveAll(dir)
	}
	return nil, err
}

// start makes one attempt at starting the cluster.
func start(opts Options, bin, dir string) (*Cluster, error) {
	pl, err := newPlan(opts.Mode, opts.Members, opts.PeerOffset, opts.FailoverTimeout, opts.Proxied, opts.HTTPOffset)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	var rt http.RoundTripper = tr
	if opts.AdminUser != "" {
		rt = basicAuth{opts.AdminUser, opts.AdminPassword, rt}
	}
	c := &Cluster{opts: opts, bin: bin, plan: pl, dir: dir,
		http: &http.Client{Timeout: 2 * time.Second, Transport: rt}}
	extra := opts.ExtraArgs
	if opts.Secure {
		if c.sec, err = newSecurity(dir, opts.Members); err != nil {
			return nil, err
		}
		tr.TLSClientConfig = c.sec.clientTLS()
	}
	if err := c.openProxies(); err != nil {
		c.Close()
		return nil, err
	}
	for i := range opts.Members {
		d := filepath.Join(dir, fmt.Sprintf("m%d", i))
		if err := os.RemoveAll(d); err != nil {
			c.Close()
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			c.Close()
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		c.members = append(c.members, &Member{
			c: c, index: i, dir: d, logs: newLogBuf(),
			addr: hostPort(pl.client[i]), memberAddr: hostPort(pl.client[i] + pl.offset),
			args: pl.args(i, d, opts.LogFormat, c.memberArgs(i, extra)),
		})
	}
	var started []*Member
	for _, m := range c.members {
		if slices.Contains(opts.Deferred, m.index) {
			continue
		}
		if err := m.start(); err != nil {
			c.Close()
			return nil, err
		}
		started = append(started, m)
	}
	deadline := time.Now().Add(opts.StartTimeout)
	for _, m := range started {
		if err := m.waitReady(time.Until(deadline)); err != nil {
			if errors.Is(err, ErrExited) && m.logs.contains("address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) openProxies() error {
	n := len(c.plan.client)
	if c.plan.link == nil {
		return nil
	}
	c.links = make([][]Link, n)
	for j := range c.links {
		c.links[j] = make([]Link, n)
		for k := range c.links[j] {
			c.links[j][k].From, c.links[j][k].To = j, k
		}
	}
	for _, s := range c.plan.proxies() {
		p, err := faultproxy.New(s.listen, s.target)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		}
		c.proxies = append(c.proxies, p)
		if s.member {
			c.links[s.from][s.to].Member = p
		} else {
			c.links[s.from][s.to].Client = p
		}
	}
	return nil
}

// Members returns the members in --peers order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Member(nil), c.members...)
}

// Member returns member i (0 is the first entry of --peers: the highest
// priority in priority mode).
func (c *Cluster) Member(i int) *Member { return c.Members()[i] }

// Addrs returns every member's client address, as it listens, in --peers
// order.
func (c *Cluster) Addrs() []string {
	ms := c.Members()
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.addr
	}
	return out
}

// Peers returns member j's --peers list as its command line has it now
// (nil in ModeSingle). Without proxies it equals Addrs, until AddMember or
// SetPeers change it; with them, entry k ≠ j is the proxy member j dials
// for member k, and that is the address j names in an M for k.
func (c *Cluster) Peers(j int) []string {
	if c.plan.mode == ModeSingle {
		return nil
	}
	if p := c.Member(j).Peers(); p != nil {
		return p
	}
	if j < len(c.plan.client) {
		return c.plan.peers(j)
	}
	return nil
}

// Proxied reports whether the cluster has proxies between its members.
func (c *Cluster) Proxied() bool { return c.links != nil }

// Link returns the proxies member from dials to reach member to (zero
// proxies if the cluster is not proxied or from == to).
func (c *Cluster) Link(from, to int) Link {
	if c.links == nil || from == to {
		return Link{From: from, To: to}
	}
	return c.links[from][to]
}

// Proxies returns every proxy of the cluster.
func (c *Cluster) Proxies() []*faultproxy.Proxy {
	return append([]*faultproxy.Proxy(nil), c.proxies...)
}

// Partition cuts the member links between groups of members: every member
// link between two members of different groups is blackholed both ways
// (connections stay open and silent; the ones that lost bytes are reset at
// Heal), every link within a group is healed. Members not named form one
// more group: Partition([]int{0}) isolates member 0. The client-side
// proxies are left alone. It replaces the previous partition.
func (c *Cluster) Partition(groups ...[]int) error {
	if c.links == nil {
		return ErrNotProxied
	}
	n := len(c.plan.client)
	group := make([]int, n)
	for i := range group {
		group[i] = -1
	}
	for g, members := range groups {
		for _, i := range members {
			if i < 0 || i >= n {
				return fmt.Errorf("%w: Partition: no member %d", ErrBadOptions, i)
			}
			if group[i] >= 0 {
				return fmt.Errorf("%w: Partition: member %d in two groups", ErrBadOptions, i)
			}
			group[i] = g
		}
	}
	for i := range group {
		if group[i] < 0 {
			group[i] = len(groups)
		}
	}
	for j := range n {
		for k := range n {
			if j == k {
				continue
			}
			if p := c.links[j][k].Member; group[j] != group[k] {
				p.Blackhole(faultproxy.Both)
			} else {
				p.Unblackhole(faultproxy.Both)
			}
		}
	}
	return nil
}

// Cut drops every byte member from sends to member to on their member
// links — on the connection from dials (its Tx) and on the one to dials
// (its Rx) — while to's bytes still reach from: a one-way partition. It
// adds to the current faults; Heal lifts it.
func (c *Cluster) Cut(from, to int) error {
	if c.links == nil {
		return ErrNotProxied
	}
	n := len(c.plan.client)
	if from < 0 || from >= n || to < 0 || to >= n || from == to {
		return fmt.Errorf("%w: Cut(%d, %d)", ErrBadOptions, from, to)
	}
	c.links[from][to].Member.Blackhole(faultproxy.Tx)
	c.links[to][from].Member.Blackhole(faultproxy.Rx)
	return nil
}

// Heal lifts every fault of every proxy (Partition's included).
func (c *Cluster) Heal() {
	for _, p := range c.proxies {
		p.Heal()
	}
}

// Close kills every member (SIGKILL to its process group, then reaps it),
// heals and closes the proxies, and removes the data dirs if New made
// their directory. Later calls return the first call's result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		for _, m := range c.Members() {
			errs = append(errs, m.close())
		}
		for _, p := range c.proxies {
			p.Heal()
			errs = append(errs, p.Close())
		}
		c.http.CloseIdleConnections()
		if c.ownDir {
			errs = append(errs, os.RemoveAll(c.dir))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// Dump writes, for every member, its state and the last lines of its log,
// then every proxy with its faults: what a failed test or chaos run needs
// to see.
func (c *Cluster) Dump(w io.Writer, lines int) {
	for _, m := range c.Members() {
		tail := m.logs.tail(lines)
		fmt.Fprintf(w, "--- member %d %s (%s): last %d log lines\n", m.index, m.addr, m.describe(), len(tail))
		for _, l := range tail {
			fmt.Fprintln(w, l)
		}
	}
	for _, p := range c.proxies {
		fmt.Fprintf(w, "--- proxy %s %+v\n", p, p.Stats())
	}
}
