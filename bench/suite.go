package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Workload names, in suite order.
const (
	wlUncontended = "uncontended"
	wlContended   = "contended"
	wlFanin       = "fanin"
	wlHandshakes  = "handshakes"
	// wlSingle is one client with one request at a time: acquire, release,
	// again: the latency of an acquire without load, which the HTTP
	// API's goal compares with the binary protocol's.
	wlSingle = "single"
)

// allWorkloads is the standard suite.
var allWorkloads = []string{wlUncontended, wlContended, wlFanin, wlHandshakes}

// extraWorkloads run only when -workloads names them.
var extraWorkloads = []string{wlHeld, wlSemaphore, wlSingle}

// config sizes the workloads. Every loop is bounded by Dur plus a drain.
type config struct {
	Dur      time.Duration // measured time per workload (uncontended, contended, fanin hold)
	Conns    int           // uncontended and contended connections
	Depth    int           // uncontended requests in flight per connection
	Keys     int           // uncontended key space
	Hot      int           // contended hot keys
	Waiters  int           // contended waiters
	Wait     time.Duration // contended acquire wait
	Retry    time.Duration // contended retry delay for targets without a wait queue
	Fanin    int           // fanin connections (one lock each)
	Lease    time.Duration // fanin lease
	Renew    time.Duration // fanin renew interval
	Held     int           // held: distinct 16-byte keys held at once
	SemLimit int           // semaphore: permits of each hot key
	SemHold  time.Duration // semaphore: how long a permit is held
	Drain    time.Duration // how long in-flight work may take to finish after Dur
	Profile  string        // CPU/alloc profile file prefix for the lockd child ("" = none)
	Progress func(string)  `json:"-"` // progress lines (nil = none)
}

// defaultConfig is the standard suite (about 10 s per target).
func defaultConfig() config {
	return config{
		Dur: 3 * time.Second, Conns: 16, Depth: 32, Keys: 1 << 20,
		Hot: 8, Waiters: 256, Wait: 5 * time.Second, Retry: time.Millisecond,
		Fanin: 10000, Lease: 3 * time.Second, Renew: time.Second, Drain: 8 * time.Second, Held: 1_000_000,
		SemLimit: 4, SemHold: time.Millisecond,
	}
}

// target is one server under test.
type target struct {
	name     string
	addr     string
	newCodec func(conn int) codec // pipelined targets
	hello    []byte               // sent first on every connection, its welcome read before the load (lockd-acl)
	etcd     *etcdDriver          // the synchronous target
	http     *httpDriver          // the HTTP targets (http.go), synchronous too
	queues   bool                 // the server has a wait queue (else: retry)
	mem      func() (memStat, error)
	children []*child             // server child processes (lockd, echo), for profiles
	cluster  *clusterTarget       // lockd processes from the binary (lockd-priority, lockd-raft, lockd-bin)
	pids     func() []int         // the server processes whose CPU time a run reports (nil: unknown)
	stop     func()               // stops every process the target started
	skip     map[string]string    // workload → why it does not apply
	tls      *tls.Config          // the driver's TLS configuration (nil: plaintext)
	ping     func(net.Conn) error // one round trip that proves a connection is served (the handshakes workload)
}

// Result is one workload run on one target in one round.
type Result struct {
	Target   string  `json:"target"`
	Workload string  `json:"workload"`
	Round    int     `json:"round"`
	Seconds  float64 `json:"seconds"`
	Unit     string  `json:"unit"`
	Ops      int64   `json:"ops"`
	Rate     float64 `json:"rate"`
	Latency  Pcts    `json:"latency"`

	Handoffs    int64   `json:"handoffs,omitempty"`
	HandoffRate float64 `json:"handoff_rate,omitempty"`
	Handoff     *Pcts   `json:"handoff_latency,omitempty"`
	Jain        float64 `json:"jain,omitempty"`
	MinGrants   int64   `json:"min_grants,omitempty"`
	MaxGrants   int64   `json:"max_grants,omitempty"`

	Conns      int      `json:"conns,omitempty"`
	MemPerConn *memStat `json:"mem_per_conn,omitempty"`
	MemPerLock *memStat `json:"mem_per_lock,omitempty"`
	MemHeld    *memStat `json:"mem_held,omitempty"` // held: the server's whole memory with every lock held

	Refused  int64  `json:"refused,omitempty"`
	Timeouts int64  `json:"timeouts,omitempty"`
	NotHeld  int64  `json:"not_held,omitempty"`
	Lost     int64  `json:"lost,omitempty"`
	Errors   int64  `json:"errors,omitempty"`
	Skipped  string `json:"skipped,omitempty"`

	// The semaphore workload: each key's permits, the most holders of one
	// key the load generator saw at once, the grants beyond the limit, and
	// the sleeps a release's notification cut short (Redis).
	Limit      int   `json:"limit,omitempty"`
	MaxHolders int   `json:"max_holders,omitempty"`
	OverLimit  int64 `json:"over_limit,omitempty"`
	Notified   int64 `json:"notified,omitempty"`

	Repl *ReplStats `json:"replication,omitempty"` // cluster targets
	// ServerCPU is the CPU time (user + system, seconds) each server
	// process of the target used during the whole run — warm-up, window
	// and drain — in the order the target started them (a cluster: in
	// --peers order). Empty when the harness did not start the server.
	ServerCPU []float64 `json:"server_cpu_s,omitempty"`
	// ServerWait is, over the same span and per server process like
	// ServerCPU, the time the process's threads were runnable but waited
	// for a CPU (Linux schedstat; -1 where unknown): how oversubscribed
	// the cores were while the server had work.
	ServerWait []float64 `json:"server_runq_wait_s,omitempty"`
	// ClientWait is the same for the load generator (this process): time
	// its goroutines' threads waited for a CPU, which every latency it
	// measures includes.
	ClientWait float64 `json:"client_runq_wait_s,omitempty"`

	hist, hand *Hist
	from, to   time.Time // the measured window
}

// Pcts summarizes a histogram in microseconds.
type Pcts struct {
	N    uint64  `json:"n"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
}

func pcts(h *Hist) Pcts {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return Pcts{N: h.Count(), P50: us(h.Quantile(.5)), P90: us(h.Quantile(.9)), P99: us(h.Quantile(.99)),
		P999: us(h.Quantile(.999)), Max: us(h.Max())}
}

// newClock starts a run's clock now.
func newClock(cfg *config, warm time.Duration) *clock {
	now := time.Now()
	return &clock{epoch: now, warm: warm, stopAt: warm + cfg.Dur, hardEnd: now.Add(warm + cfg.Dur + cfg.Drain)}
}

// runWorkload runs one workload against one target.
func runWorkload(t *target, wl string, cfg *config, round int) (*Result, error) {
	res := &Result{Target: t.name, Workload: wl, Round: round}
	if why, ok := t.skip[wl]; ok {
		res.Skipped = why
		return res, nil
	}
	if wl == wlHandshakes && (t.tls == nil || t.ping == nil) {
		res.Skipped = "plaintext: no handshake to measure"
		return res, nil
	}
	var run *clusterRun
	if t.cluster != nil {
		var err error
		if run, err = t.cluster.begin(t); err != nil {
			return nil, err
		}
	}
	if cfg.Profile != "" {
		if t.cluster != nil {
			secs := int(math.Ceil((cfg.Dur + 1500*time.Millisecond).Seconds()))
			wait := t.cluster.profile(fmt.Sprintf("%s-%s-%s-r%d", cfg.Profile, t.name, wl, round), secs)
			defer func() {
				if err := wait(); err != nil && cfg.Progress != nil {
					cfg.Progress(fmt.Sprintf("    %s: profile: %v", t.name, err))
				}
			}()
		}
		for i, ch := range t.children {
			prefix := fmt.Sprintf("%s-%s-%s-r%d", cfg.Profile, t.name, wl, round)
			if len(t.children) > 1 {
				prefix += fmt.Sprintf("-p%d", i)
			}
			if _, err := ch.do("cpu " + prefix + ".cpu.pprof"); err != nil {
				return nil, err
			}
			defer func() {
				ch.do("cpustop")
				ch.do("allocs " + prefix + ".allocs.pprof")
			}()
		}
	}
	var cpu0, wait0 []float64
	if t.pids != nil {
		cpu0, wait0 = cpuTimes(t.pids()), runqWaits(t.pids())
	}
	self := []int{os.Getpid()}
	selfWait0 := runqWaits(self)
	var err error
	switch wl {
	case wlUncontended:
		err = runUncontended(t, cfg, res)
	case wlContended:
		err = runContended(t, cfg, res)
	case wlFanin:
		err = runFanin(t, cfg, res)
	case wlHandshakes:
		err = runHandshakes(t, cfg, res)
	case wlHeld:
		err = runHeld(t, cfg, res)
	case wlSemaphore:
		err = runSemaphore(t, cfg, res)
	case wlSingle:
		err = runSingle(t, cfg, res)
	default:
		err = fmt.Errorf("unknown workload %q", wl)
	}
	if cpu0 != nil {
		res.ServerCPU = deltas(cpu0, cpuTimes(t.pids()))
		res.ServerWait = deltas(wait0, runqWaits(t.pids()))
	}
	if w := deltas(selfWait0, runqWaits(self)); w[0] >= 0 {
		res.ClientWait = w[0]
	}
	if run != nil {
		var rerr error
		res.Repl, rerr = run.end(res.from, res.to)
		err = errors.Join(err, rerr)
	}
	return res, err
}

func (r *Result) fill(st *stats, clk *clock) {
	r.Seconds = (clk.stopAt - clk.warm).Seconds()
	r.from, r.to = clk.epoch.Add(clk.warm), clk.epoch.Add(clk.stopAt)
	r.Ops = st.ops
	r.Rate = float64(st.ops) / r.Seconds
	r.hist = st.acq
	r.Latency = pcts(st.acq)
	r.Refused, r.Timeouts, r.NotHeld, r.Lost, r.Errors = st.refused, st.timeouts, st.notHeld, st.lost, st.errs
}

// makeSlots returns n slots spread round-robin over groups connections.
func makeSlots(n, groups int, seed uint64) [][]*slot {
	g := make([][]*slot, groups)
	for i := 0; i < n; i++ {
		s := &slot{id: i, rng: rand.New(rand.NewPCG(seed, uint64(i)))}
		g[i%groups] = append(g[i%groups], s)
	}
	return g
}

func warmOf(cfg *config) time.Duration { return min(500*time.Millisecond, cfg.Dur/5) }

func runUncontended(t *target, cfg *config, res *Result) error {
	res.Unit = "pairs/s"
	groups := makeSlots(cfg.Conns*cfg.Depth, cfg.Conns, rand.Uint64())
	var clk clock
	w := &uncontended{clk: &clk, keys: cfg.Keys}
	st, err := drive(t, cfg, &clk, warmOf(cfg), w, groups, 64<<10, nil)
	if err != nil {
		return err
	}
	res.fill(st, &clk)
	return nil
}

// runSingle is the uncontended loop with one slot on one connection.
func runSingle(t *target, cfg *config, res *Result) error {
	res.Unit = "pairs/s"
	groups := makeSlots(1, 1, rand.Uint64())
	var clk clock
	w := &uncontended{clk: &clk, keys: cfg.Keys}
	st, err := drive(t, cfg, &clk, warmOf(cfg), w, groups, 4<<10, nil)
	if err != nil {
		return err
	}
	res.fill(st, &clk)
	return nil
}

func runContended(t *target, cfg *config, res *Result) error {
	res.Unit = "grants/s"
	groups := makeSlots(cfg.Waiters, min(cfg.Conns, cfg.Waiters), rand.Uint64())
	var clk clock
	retry := time.Duration(0)
	if !t.queues {
		retry = cfg.Retry
	}
	w := newContended(&clk, cfg.Hot, cfg.Waiters, cfg.Wait, retry)
	st, err := drive(t, cfg, &clk, warmOf(cfg), w, groups, 64<<10, nil)
	if err != nil {
		return err
	}
	res.fill(st, &clk)
	res.Handoffs = st.handoffs
	res.HandoffRate = float64(st.handoffs) / res.Seconds
	h := pcts(st.handoff)
	res.Handoff, res.hand = &h, st.handoff
	res.Jain, res.MinGrants, res.MaxGrants = w.fairness()
	return nil
}

func runFanin(t *target, cfg *config, res *Result) error {
	res.Unit = "renews/s"
	res.Conns = cfg.Fanin
	groups := makeSlots(cfg.Fanin, cfg.Fanin, rand.Uint64())
	var clk clock
	f := &fanin{clk: &clk, lease: uint8(max(1, cfg.Lease/time.Second)), renew: cfg.Renew}
	var m0, m1, m2 memStat
	var memErr error
	measure := func(m *memStat) {
		if t.mem == nil || memErr != nil {
			return
		}
		*m, memErr = t.mem()
	}
	measure(&m0)
	dialed := make(chan struct{})
	afterDial := func() {
		time.Sleep(200 * time.Millisecond)
		measure(&m1)
		close(dialed)
	}
	// Once every slot holds its lock, measure again (while renewing).
	heldDone := make(chan struct{})
	var finished atomic.Bool
	go func() {
		defer close(heldDone)
		// The deadline counts from the end of the dialling, which takes
		// seconds for 10,000 TLS handshakes.
		for wait := true; wait; {
			select {
			case <-dialed:
				wait = false
			case <-time.After(20 * time.Millisecond):
				if finished.Load() {
					return
				}
			}
		}
		deadline := time.Now().Add(cfg.Dur + 30*time.Second)
		for f.held.Load() < int64(cfg.Fanin) {
			if finished.Load() || time.Now().After(deadline) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		measure(&m2)
	}()
	warm := max(time.Second, cfg.Renew+cfg.Renew/2)
	st, err := drive(t, cfg, &clk, warm, f, groups, 4<<10, afterDial)
	finished.Store(true)
	<-heldDone
	if err != nil {
		return err
	}
	res.fill(st, &clk)
	switch {
	case memErr != nil:
		// A server too loaded to report its memory is a result, not a
		// reason to abandon the suite.
		if cfg.Progress != nil {
			cfg.Progress(fmt.Sprintf("    %s: memory not measured: %v", t.name, memErr))
		}
	case t.mem != nil && m2 != (memStat{}):
		n := int64(cfg.Fanin)
		res.MemPerConn = &memStat{Heap: (m1.Heap - m0.Heap) / n, RSS: (m1.RSS - m0.RSS) / n}
		res.MemPerLock = &memStat{Heap: (m2.Heap - m1.Heap) / n, RSS: (m2.RSS - m1.RSS) / n}
	case t.mem != nil && cfg.Progress != nil:
		cfg.Progress(fmt.Sprintf("    %s: memory per lock not measured: only %d of %d locks were ever held at once", t.name, f.maxHeld.Load(), cfg.Fanin))
	}
	return nil
}

// drive dials the connections (or, for etcd, prepares the slots), calls
// afterDial, starts the clock and runs every slot until it is done.
func drive(t *target, cfg *config, clk *clock, warm time.Duration, w workload, groups [][]*slot, bufLen int, afterDial func()) (*stats, error) {
	if t.etcd != nil || t.http != nil {
		return driveSync(t, cfg, clk, warm, w, groups, afterDial)
	}
	conns := make([]*pconn, len(groups))
	shards := newShards(min(len(groups), 64))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
	}()
	// Dial in parallel: fanin opens 10,000 connections.
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	par := min(len(groups), 4*runtime.NumCPU())
	next := make(chan int)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				nc, err := net.DialTimeout("tcp", t.addr, 10*time.Second)
				if err != nil {
					mu.Lock()
					first = errors.Join(first, fmt.Errorf("dial %s: %w", t.addr, err))
					mu.Unlock()
					continue
				}
				if tc, ok := nc.(*net.TCPConn); ok {
					tc.SetNoDelay(true)
				}
				if t.tls != nil {
					if nc, err = handshake(nc, t.tls); err != nil {
						mu.Lock()
						first = errors.Join(first, fmt.Errorf("TLS handshake with %s: %w", t.addr, err))
						mu.Unlock()
						continue
					}
				}
				if t.hello != nil {
					if err := sayHello(nc, t.hello); err != nil {
						nc.Close()
						mu.Lock()
						first = errors.Join(first, fmt.Errorf("hello to %s: %w", t.addr, err))
						mu.Unlock()
						continue
					}
				}
				conns[i] = newPconn(nc, t.newCodec(i), w, clk, groups[i], bufLen, shards[i%len(shards)])
			}
		}()
	}
	for i := range groups {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if afterDial != nil {
		afterDial()
	}
	*clk = *newClock(cfg, warm)
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.start(); err != nil {
				errs[i] = err
				return
			}
			errs[i] = c.loop()
		}()
	}
	wg.Wait()
	return mergeShards(shards), errors.Join(errs...)
}

// syncRunner is a synchronous driver's run: one request at a time per
// slot, each slot a goroutine.
type syncRunner interface {
	do(s *slot, a *action) answer
	warm() error
	close()
}

// driveSync runs each slot as its own goroutine against the etcd driver
// or an HTTP driver.
func driveSync(t *target, cfg *config, clk *clock, warm time.Duration, w workload, groups [][]*slot, afterDial func()) (*stats, error) {
	var (
		er  syncRunner
		err error
	)
	if t.http != nil {
		er, err = t.http.start(groups)
	} else {
		mode := etcdSharedLease
		switch w.(type) {
		case *contended:
			mode = etcdMutex
		case *fanin:
			mode = etcdLeasePerLock
		case *semaphore:
			mode = etcdSemaphore
		}
		er, err = t.etcd.start(groups, mode)
	}
	if err != nil {
		return nil, err
	}
	defer er.close()
	if afterDial != nil {
		// Open the connections first, as the pipelined targets do.
		if err := er.warm(); err != nil {
			return nil, err
		}
		afterDial()
	}
	var (
		fsyncs   int64
		fsyncErr = errors.New("not etcd")
	)
	if t.etcd != nil {
		fsyncs, fsyncErr = etcdFsyncs(t.etcd.endpoint)
	}
	*clk = *newClock(cfg, warm)
	var slots []*slot
	for _, g := range groups {
		slots = append(slots, g...)
	}
	shards := newShards(min(len(slots), 64))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh := shards[i%len(shards)]
			a := w.first(s, clk.now())
			for a.op != opNone {
				var ans answer
				switch a.op {
				case opWake:
					time.Sleep(a.delay)
					ans = answer{kind: ansWake}
				default:
					if time.Now().After(clk.hardEnd) {
						sh.mu.Lock()
						sh.st.errs++
						sh.mu.Unlock()
						return
					}
					s.sentAt = clk.now()
					ans = er.do(s, &a)
				}
				sh.mu.Lock()
				a = w.next(s, &ans, clk.now(), sh.st)
				sh.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st := mergeShards(shards)
	if cfg.Progress != nil && t.http != nil {
		if n, last := t.http.failures(); last != nil {
			cfg.Progress(fmt.Sprintf("    %s: %d failed requests; the last: %v", t.name, n, last))
		}
	}
	if cfg.Progress != nil && t.etcd != nil {
		if by, last := t.etcd.failures(); last != nil {
			cfg.Progress(fmt.Sprintf("    etcd: failed requests: %s; the last: %v", by, last))
		}
		if now, err := etcdFsyncs(t.etcd.endpoint); err == nil && fsyncErr == nil {
			cfg.Progress(fmt.Sprintf("    etcd: %d WAL fsyncs during the run", now-fsyncs))
		}
	}
	return st, nil
}
