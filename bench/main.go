package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
)

func main() {
	if kind := os.Getenv(serveEnv); kind != "" {
		loops, _ := strconv.Atoi(os.Getenv("LOCKD_BENCH_LOOPS")) // 0: the server's default
		if err := serveChild(kind, loops, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench server:", err)
			os.Exit(1)
		}
		return
	}
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	clustertest.RemoveBuild() // the lockd binary, if the cluster targets built it
	os.Exit(code)
}

// options are the command line.
type options struct {
	cfg       config
	addr      string
	redisAddr string
	etcdURL   string
	targets   []string
	workloads []string
	rounds    int
	loops     int
	jsonOut   bool
	markdown  bool
	svg       string
	jsonFile  string
	clientCPU string
	lockdBin  string
	baseBin   string
	lagEvery  time.Duration
	loadStart string // /proc/loadavg when the run started
	failover  failoverConfig
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{cfg: defaultConfig(), failover: defaultFailover()}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &o.cfg
	fs.StringVar(&o.addr, "addr", "", "benchmark a running lockd at host:port instead of starting one")
	fs.StringVar(&o.redisAddr, "redis", "", "use a running Redis at host:port instead of starting redis-server")
	fs.StringVar(&o.etcdURL, "etcd", "", "use a running etcd at http://host:port instead of starting etcd")
	targets := fs.String("targets", "lockd,echo", "comma-separated targets: "+strings.Join(targetNames(), ", ")+", or all (every one but lockd-bin, lockd-base, lockd-priority-base, lockd-raft-base, lockd-acl and the HTTP ones: lockd-http, lockd-gw, etcd-gw)")
	workloads := fs.String("workloads", strings.Join(allWorkloads, ","), "comma-separated workloads (also: "+strings.Join(extraWorkloads, ", ")+")")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds; each runs every workload on every target in turn (A B A B …)")
	fs.IntVar(&o.loops, "loops", 0, "event loops of the lockd and echo servers (0: each server's default; lockd's is one per processor, one on a machine of two or fewer)")
	fs.DurationVar(&c.Dur, "dur", c.Dur, "measured time per workload and target")
	fs.IntVar(&c.Conns, "conns", c.Conns, "connections (uncontended, contended)")
	fs.IntVar(&c.Depth, "depth", c.Depth, "uncontended requests in flight per connection")
	fs.IntVar(&c.Keys, "keys", c.Keys, "uncontended key space")
	fs.IntVar(&c.Hot, "hot", c.Hot, "contended hot keys")
	fs.IntVar(&c.Waiters, "waiters", c.Waiters, "contended waiters")
	fs.DurationVar(&c.Retry, "retry", c.Retry, "contended retry delay (jittered ±50%) for targets without a wait queue")
	fs.IntVar(&c.Fanin, "fanin", c.Fanin, "fanin connections, one lock each")
	fs.IntVar(&c.SemLimit, "sem-limit", c.SemLimit, "semaphore: permits of each of the -hot keys")
	fs.DurationVar(&c.SemHold, "sem-hold", c.SemHold, "semaphore: how long a slot holds its permit before releasing it")
	fs.IntVar(&c.Held, "held", c.Held, "held: distinct 16-byte keys the -conns × -depth slots acquire and hold before the server's memory is read")
	fs.StringVar(&c.Profile, "cpuprofile", "", "write CPU and allocation profiles of the lockd and echo servers to PREFIX-target-workload-rN.{cpu,allocs}.pprof (the lockd and echo children: also .mutex.pprof and .block.pprof)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of tables")
	fs.BoolVar(&o.markdown, "markdown", false, "print Markdown tables (for BENCHMARKS.md) instead of text")
	fs.StringVar(&o.svg, "svg", "", "write latency percentile curves to this SVG file")
	fs.StringVar(&o.jsonFile, "jsonfile", "", "also write the -json document to this file")
	fs.StringVar(&o.clientCPU, "clientprofile", "", "write a CPU profile of the load generator (this process) to this file")
	fs.StringVar(&o.lockdBin, "lockd-bin", "", "the lockd binary of the targets made of lockd processes (lockd-priority, lockd-raft, lockd-bin; default: built from this tree)")
	fs.StringVar(&o.baseBin, "base-bin", "", "the lockd binary of the lockd-base, lockd-priority-base and lockd-raft-base targets: the baseline of lockd-bin, lockd-priority and lockd-raft, e.g. built from main, for a before/after comparison in one interleaved run")
	fs.DurationVar(&o.lagEvery, "lag-every", 10*time.Millisecond, "lockd-priority: read the active's replication lag this often during a run (0: not at all)")
	fo := &o.failover
	fs.IntVar(&fo.Trials, "failover", 0, "instead of the suite: N trials of each -failover-kinds on a cluster (-failover-mode) under load (median and worst; ≥ 10 for BENCHMARKS.md)")
	fs.StringVar(&fo.Mode, "failover-mode", fo.Mode, "failover: the cluster, priority (signals the active) or raft (signals the current leader)")
	fs.IntVar(&fo.Members, "failover-members", fo.Members, "failover: members of the cluster, priority 2..7, raft 3..7 (default 3 with -failover-mode raft)")
	kinds := fs.String("failover-kinds", strings.Join(fo.Kinds, ","), "failover: kill (SIGKILL of the active or leader) and/or term (SIGTERM: a planned handover), alternated")
	fs.IntVar(&fo.Workers, "failover-workers", fo.Workers, "failover: goroutines of the client library looping acquire → release")
	fs.IntVar(&fo.Probes, "failover-probes", fo.Probes, "failover: raw probe connections that know which member answers")
	fs.DurationVar(&fo.Timeout, "failover-timeout", fo.Timeout, "failover: the cluster's --failover-timeout")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fo.Kinds = splitList(*kinds)
	for _, k := range fo.Kinds {
		if k != trialKill && k != trialTerm {
			return nil, fmt.Errorf("-failover-kinds: unknown kind %q (want kill, term)", k)
		}
	}
	minMembers := 2
	switch fo.Mode {
	case failoverPriority:
	case failoverRaft:
		minMembers = 3 // a kill must leave a majority
	default:
		return nil, fmt.Errorf("-failover-mode: unknown mode %q (want priority, raft)", fo.Mode)
	}
	if !flagSet(fs, "failover-members") {
		fo.Members = minMembers
	}
	switch {
	case fo.Trials < 0 || fo.Trials > 1000:
		return nil, errors.New("-failover must be 0..1000")
	case fo.Members < minMembers || fo.Members > 7:
		return nil, fmt.Errorf("-failover-members must be %d..7 with -failover-mode %s", minMembers, fo.Mode)
	case len(fo.Kinds) == 0:
		return nil, errors.New("-failover-kinds: give kill, term or both")
	case fo.Workers < 0 || fo.Workers > 1024:
		return nil, errors.New("-failover-workers must be 0..1024")
	case fo.Probes < 1 || fo.Probes > 64:
		return nil, errors.New("-failover-probes must be 1..64")
	case fo.Timeout < 100*time.Millisecond || fo.Timeout > time.Minute:
		return nil, errors.New("-failover-timeout must be 100ms..60s")
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *targets == "all" {
		*targets = strings.Join(allTargets(), ",")
	}
	o.targets = splitList(*targets)
	o.workloads = splitList(*workloads)
	for _, t := range o.targets {
		if !slices.Contains(targetNames(), t) {
			return nil, fmt.Errorf("-targets: unknown target %q", t)
		}
	}
	for _, w := range o.workloads {
		if !slices.Contains(allWorkloads, w) && !slices.Contains(extraWorkloads, w) {
			return nil, fmt.Errorf("-workloads: unknown workload %q", w)
		}
	}
	switch {
	case o.rounds < 1 || o.rounds > 100:
		return nil, errors.New("-rounds must be 1..100")
	case c.Dur < 100*time.Millisecond || c.Dur > 10*time.Minute:
		return nil, errors.New("-dur must be 100ms..10m")
	case c.Conns < 1 || c.Depth < 1 || c.Hot < 1 || c.Waiters < 1 || c.Fanin < 1 || c.Keys < 1:
		return nil, errors.New("-conns, -depth, -hot, -waiters, -fanin and -keys must be positive")
	case c.Held < 1 || c.Held >= maxHeld:
		return nil, fmt.Errorf("-held must be 1..%d", maxHeld-1)
	case c.Depth >= 1<<slotBits || c.Waiters >= 1<<slotBits:
		return nil, errors.New("-depth and -waiters must be below 16M")
	case c.SemLimit < 1 || c.SemLimit > 65535:
		return nil, errors.New("-sem-limit must be 1..65535")
	case c.SemHold < 0 || c.SemHold > time.Second:
		return nil, errors.New("-sem-hold must be 0..1s")
	case o.lagEvery < 0 || o.lagEvery > time.Second:
		return nil, errors.New("-lag-every must be 0..1s")
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// targetKinds are the targets -targets accepts, in the order a round runs
// them, and how each is opened. A target may start several server
// processes (target.own, target.startCluster) and point the driver at one
// of them. "all" is every target but the extra ones.
var targetKinds = []struct {
	name  string
	open  func(t *target, o *options) error
	extra bool
}{
	{"lockd", openLockd, false},
	{"lockd-priority", openPriority, false},
	{"lockd-raft", openRaft, false},
	{"lockd-bin", openLockdBin, true},
	{"lockd-base", openLockdBase, true},
	{"lockd-priority-base", openPriorityBase, true},
	{"lockd-raft-base", openRaftBase, true},
	{"lockd-acl", openLockdACL, true},
	{"echo", openEcho, false},
	{"redis", openRedis, false},
	{"lockd-tls", openLockdTLS, false},
	{"redis-tls", openRedisTLS, false},
	{"etcd", openEtcd, false},
	{"lockd-http", openLockdHTTP, true},
	{"lockd-gw", openLockdGW, true},
	{"etcd-gw", openEtcdGW, true},
}

// targetNames are the targets -targets accepts; allTargets, what "all" means.
func targetNames() []string {
	names := make([]string, len(targetKinds))
	for i, k := range targetKinds {
		names[i] = k.name
	}
	return names
}

func allTargets() []string {
	var names []string
	for _, k := range targetKinds {
		if !k.extra {
			names = append(names, k.name)
		}
	}
	return names
}

// openTarget starts (or connects to) one target.
func openTarget(name string, o *options) (*target, error) {
	t := &target{name: name, skip: map[string]string{}, stop: func() {}}
	for _, k := range targetKinds {
		if k.name == name {
			if err := k.open(t, o); err != nil {
				t.stop()
				return nil, err
			}
			return t, nil
		}
	}
	return nil, fmt.Errorf("unknown target %q", name)
}

// own makes ch one of t's server processes: profiled and its CPU time
// counted with the others, and stopped with t.
func (t *target) own(ch *child) {
	t.children = append(t.children, ch)
	t.pids = func() []int {
		pids := make([]int, len(t.children))
		for i, c := range t.children {
			pids[i] = c.cmd.Process.Pid
		}
		return pids
	}
	prev := t.stop
	t.stop = func() { ch.stop(); prev() }
}

// openLockd starts lockd in a child process (or uses -addr).
func openLockd(t *target, o *options) error {
	t.newCodec = func(int) codec { return newLockdCodec() }
	t.queues = true
	t.ping = lockdPing
	if o.addr != "" {
		t.addr = o.addr
		return nil
	}
	return t.startChild("lockd", o.loops)
}

// openLockdACL starts lockd with an ACL (PROTOCOL.md §8.2) in a child
// process: every connection says hello first, and every request is
// authorized against the identity's key prefixes and bound to it.
func openLockdACL(t *target, o *options) error {
	t.newCodec = func(int) codec { return newLockdCodec() }
	t.queues = true
	t.hello = benchHello()
	return t.startChild("lockd-acl", o.loops)
}

// openEcho starts the echo ceiling in a child process.
func openEcho(t *target, o *options) error {
	t.newCodec = func(int) codec { return newLockdCodec() }
	t.skip[wlContended] = "no lock state: nothing to wait for"
	t.skip[wlSemaphore] = t.skip[wlContended]
	return t.startChild("echo", o.loops)
}

// startChild starts a server child of kind, owned by t, and points t's
// driver and memory readings at it.
func (t *target) startChild(kind string, loops int, env ...string) error {
	ch, err := startChild(kind, loops, env...)
	if err != nil {
		return err
	}
	t.own(ch)
	t.addr, t.mem = ch.addr, ch.mem
	return nil
}

// startPeer points t at addr if it is set (a running server), else starts
// one with start; it returns the server's pid if it started it, else 0.
func (t *target) startPeer(addr string, start func() (*peer, error)) (int, error) {
	if addr != "" {
		t.addr = addr
		return 0, nil
	}
	p, err := start()
	if err != nil {
		return 0, err
	}
	pid := p.pid()
	t.pids = func() []int { return []int{pid} }
	prev := t.stop
	t.addr, t.stop = p.addr, func() { p.stop(); prev() }
	return p.pid(), nil
}

// openRedis starts redis-server (or uses -redis) and loads the scripts.
func openRedis(t *target, o *options) error {
	pid, err := t.startPeer(o.redisAddr, startRedis)
	if err != nil {
		return err
	}
	if err := redisSetup(t.addr, nil); err != nil {
		return err
	}
	t.newCodec = func(int) codec { return newRedisCodec(rand.Uint64() >> 32) }
	t.mem = func() (memStat, error) { return redisMem(t.addr, nil, pid) }
	t.ping = redisPing
	return nil
}

// openEtcd starts a one-member etcd (or uses -etcd).
func openEtcd(t *target, o *options) error {
	pid, err := t.startPeer(o.etcdURL, startEtcd)
	if err != nil {
		return err
	}
	t.etcd = newEtcdDriver(t.addr)
	t.queues = true // contended runs concurrency.Mutex, which queues waiters
	t.mem = func() (memStat, error) { return etcdMem(t.addr, pid) }
	return nil
}

// run is the whole command; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	raiseNoFile()
	if o.clientCPU != "" {
		f, err := os.Create(o.clientCPU)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	progress := func(s string) { fmt.Fprintln(stderr, s) }
	o.cfg.Progress = progress
	o.loadStart = loadAvg()
	progress("machine load (1, 5, 15 min): " + o.loadStart)

	if o.failover.Trials > 0 {
		return failoverCmd(o, stdout, stderr)
	}
	var (
		targets []*target
		mu      sync.Mutex
	)
	cleanup := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, t := range targets {
			t.stop()
		}
		targets = nil
	}
	defer cleanup()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer func() { signal.Stop(sig); close(sig) }()
	go func() {
		if _, ok := <-sig; ok {
			fmt.Fprintln(stderr, "bench: interrupted, stopping the servers")
			cleanup()
			clustertest.RemoveBuild()
			os.Exit(130)
		}
	}()
	for _, name := range o.targets {
		progress("starting " + name)
		t, err := openTarget(name, o)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %s: %v\n", name, err)
			return 1
		}
		mu.Lock()
		targets = append(targets, t)
		mu.Unlock()
	}
	results, err := runRounds(targets, o.workloads, o.rounds, &o.cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if err := report(stdout, o, results); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

// runRounds runs every workload on every target, round after round:
// within a round each workload visits the targets in turn (A B A B …), so
// each round's ratios compare runs made seconds apart.
func runRounds(targets []*target, workloads []string, rounds int, cfg *config) ([]*Result, error) {
	var out []*Result
	for round := 1; round <= rounds; round++ {
		for _, wl := range workloads {
			for _, t := range targets {
				if cfg.Progress != nil {
					cfg.Progress(fmt.Sprintf("round %d/%d  %-11s  %-5s ...", round, rounds, wl, t.name))
				}
				r, err := runWorkload(t, wl, cfg, round)
				if err != nil {
					return out, fmt.Errorf("round %d %s %s: %w", round, wl, t.name, err)
				}
				if cfg.Progress != nil {
					cfg.Progress("    " + oneLine(r))
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// oneLine is a progress summary of one result.
func oneLine(r *Result) string {
	if r.Skipped != "" {
		return "skipped: " + r.Skipped
	}
	s := fmt.Sprintf("%s %s  p50 %s  p99 %s  p99.9 %s", si(r.Rate), r.Unit, dur(r.Latency.P50), dur(r.Latency.P99), dur(r.Latency.P999))
	if r.Handoff != nil {
		s += fmt.Sprintf("  handoffs %s/s  handoff p99 %s  Jain %.3f (grants/waiter %d..%d)", si(r.HandoffRate), dur(r.Handoff.P99), r.Jain, r.MinGrants, r.MaxGrants)
	}
	if r.MemPerConn != nil {
		s += fmt.Sprintf("  mem/conn %s heap %s rss  mem/lock %s heap %s rss", bytesStr(r.MemPerConn.Heap), bytesStr(r.MemPerConn.RSS), bytesStr(r.MemPerLock.Heap), bytesStr(r.MemPerLock.RSS))
	} else if r.MemPerLock != nil && r.MemHeld != nil {
		s += fmt.Sprintf("  mem/lock %s heap %s rss  held %s heap %s rss", bytesStr(r.MemPerLock.Heap), bytesStr(r.MemPerLock.RSS), bytesStr(r.MemHeld.Heap), bytesStr(r.MemHeld.RSS))
	}
	if len(r.ServerCPU) > 0 {
		s += "  server CPU " + cpuText(r.ServerCPU) + " s"
	}
	if len(r.ServerWait) > 0 {
		s += ", waited for a CPU " + cpuText(r.ServerWait) + " s"
	}
	if r.ClientWait > 0 {
		s += fmt.Sprintf("  load generator waited for a CPU %.2f s", r.ClientWait)
	}
	if p := r.Repl; p != nil {
		s += "  " + replLine(p)
	}
	if n := r.Refused + r.Timeouts + r.NotHeld + r.Lost + r.Errors; n > 0 {
		s += fmt.Sprintf("  (refused %d, timeouts %d, not-held %d, lost %d, errors %d)", r.Refused, r.Timeouts, r.NotHeld, r.Lost, r.Errors)
	}
	return s
}

// cpuText lists CPU seconds per process ("?" for one that could not be
// read).
func cpuText(v []float64) string {
	parts := make([]string, len(v))
	for i, c := range v {
		parts[i] = "?"
		if c >= 0 {
			parts[i] = fmt.Sprintf("%.2f", c)
		}
	}
	return strings.Join(parts, " · ")
}

// replLine summarizes a cluster run's replication figures.
func replLine(p *ReplStats) string {
	s := ""
	if p.LagEveryMs > 0 {
		s = fmt.Sprintf("lag p50 %s p99 %s max %s (%d samples", durOr0(p.LagP50), durOr0(p.LagP99), durOr0(p.LagMax), p.LagSamples)
		if p.LagErrors > 0 {
			s += fmt.Sprintf(", %d failed", p.LagErrors)
		}
		s += ")  "
	}
	if p.Records > 0 {
		s += fmt.Sprintf("%.1f B/record on the wire (%.1f raw), %.0f records/batch  ", p.WirePerRecord, p.RawPerRecord, p.RecordsPerBatch)
	}
	if p.Entries > 0 {
		s += fmt.Sprintf("raft %.1f records/entry, %s entries/s, commit p50 %s p99 %s (%d samples)  ", p.RecordsPerEntry, si(p.EntriesPerSec),
			durOr0(p.CommitP50), durOr0(p.CommitP99), p.RaftSamples)
	}
	s += fmt.Sprintf("settled in %s", dur(p.SettleMs*1e3))
	if p.Failovers > 0 || p.EpochTo != p.EpochFrom {
		s += fmt.Sprintf("  FAILOVER during the run (%d; epoch %d → %d)", p.Failovers, p.EpochFrom, p.EpochTo)
	}
	return s
}

// machine describes where the run happened.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d × %s, %s %s/%s", runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// loadAvg is the machine's load averages over 1, 5 and 15 minutes.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// runHead opens every JSON document bench writes: the machine, and the
// load average when the run began and ended.
type runHead struct {
	Machine   string `json:"machine"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

// writeDoc writes doc as JSON to -jsonfile if set, and to w with -json.
func writeDoc(o *options, w io.Writer, doc any) error {
	if o.jsonFile != "" {
		b, err := json.MarshalIndent(doc, "", "  ")
		if err == nil {
			err = os.WriteFile(o.jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			return err
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	return nil
}

// report writes the results in the chosen format, and the SVG.
func report(w io.Writer, o *options, rs []*Result) error {
	ss, rt := summarize(rs), ratios(rs)
	if o.svg != "" {
		f, err := os.Create(o.svg)
		if err != nil {
			return err
		}
		err = writeSVG(f, svgPanels(rs))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	gs, loadEnd := goals(rs), loadAvg()
	doc := struct {
		runHead
		Config  config    `json:"config"`
		Rounds  int       `json:"rounds"`
		Results []*Result `json:"results"`
		Summary []summary `json:"summary"`
		Ratios  []ratio   `json:"ratios"`
		Goals   []goal    `json:"goals,omitempty"`
	}{runHead{machine(), o.loadStart, loadEnd}, o.cfg, o.rounds, rs, ss, rt, gs}
	if err := writeDoc(o, w, doc); err != nil || o.jsonOut {
		return err
	}
	write := writeText
	if o.markdown {
		write = writeMarkdown
		fmt.Fprintf(w, "Machine: %s. Rounds: %d, %v per workload and target.\n", machine(), o.rounds, o.cfg.Dur)
	}
	fmt.Fprintf(w, "Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n", o.loadStart, loadEnd)
	head, rows := tableRows(ss)
	heads, tables := byWorkload(head, rows)
	for i := range heads {
		write(w, heads[i], tables[i])
		fmt.Fprintln(w)
	}
	if len(rt) > 0 {
		h, r := ratioRows(rt)
		write(w, h, r)
	}
	if h, r := semRows(rs, &o.cfg); len(r) > 0 {
		fmt.Fprintln(w)
		write(w, h, r)
	}
	if h, r := clusterRows(rs); len(r) > 0 {
		fmt.Fprintln(w)
		write(w, h, r)
	}
	if len(gs) > 0 {
		fmt.Fprintln(w)
		h, r := goalRows(gs)
		write(w, h, r)
	}
	return nil
}
