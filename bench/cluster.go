package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

// Sentinel errors of the cluster targets.
var (
	errNotSettled = errors.New("bench: cluster not settled")
	errAdmin      = errors.New("bench: admin endpoint")
)

// settleTimeout bounds the wait for a cluster to settle before a run: the
// first start (one failover timeout), a snapshot, or a handover back to
// the first member after a failover the load caused.
const settleTimeout = 60 * time.Second

// Replication counters read from the active's /metrics before and after a
// run (docs/CLUSTER.md, "Observability").
const (
	mRecords   = "lockd_replication_records_total"
	mBatches   = "lockd_replication_batches_total"
	mRawBytes  = "lockd_replication_raw_bytes_total"
	mWireBytes = "lockd_replication_wire_bytes_total"
	mFailovers = "lockd_cluster_failovers_total"
	mHandovers = "lockd_cluster_handovers_total"
	mEpoch     = "lockd_cluster_epoch"
	// raft mode: the leader's log entries of lock changes and the changes
	// in them.
	mRaftEntries = "lockd_raft_entries_total"
	mRaftRecords = "lockd_raft_entry_records_total"
)

var replCounters = []string{mRecords, mBatches, mRawBytes, mWireBytes, mFailovers, mHandovers, mEpoch, mRaftEntries, mRaftRecords}

// raftEvery is how often a lockd-raft run reads the leader's /status (its
// commit latency and entry count) when lag sampling is on.
const raftEvery = 100 * time.Millisecond

// ReplStats is what a run on a cluster target measured besides the load
// generator's figures.
type ReplStats struct {
	// Replication lag as the active measures it (the age of the oldest
	// batch the standby has not acknowledged; 0 when every batch is
	// acknowledged), sampled every LagEvery during the measured window.
	LagEveryMs float64 `json:"lag_every_ms,omitempty"`
	LagSamples int     `json:"lag_samples"`
	LagErrors  int     `json:"lag_errors,omitempty"` // samples that failed (admin endpoint busy or down)
	LagP50     float64 `json:"lag_p50_us"`
	LagP99     float64 `json:"lag_p99_us"`
	LagMax     float64 `json:"lag_max_us"`
	LagRecMax  uint64  `json:"lag_records_max"` // the most records ever unacknowledged in a sample

	// Counter deltas over the whole run (warm-up, window and drain).
	Records   uint64 `json:"records"`
	Batches   uint64 `json:"batches"`
	RawBytes  uint64 `json:"raw_bytes"`
	WireBytes uint64 `json:"wire_bytes"`
	// WirePerRecord is compressed (framed) bytes per record, RawPerRecord
	// the bytes before compression, RecordsPerBatch records ÷ batches.
	WirePerRecord   float64 `json:"wire_bytes_per_record"`
	RawPerRecord    float64 `json:"raw_bytes_per_record"`
	RecordsPerBatch float64 `json:"records_per_batch"`

	Failovers uint64  `json:"failovers,omitempty"` // during the run: a run that caused one is suspect
	Handovers uint64  `json:"handovers,omitempty"`
	EpochFrom uint64  `json:"epoch_from,omitempty"`
	EpochTo   uint64  `json:"epoch_to,omitempty"`
	SettleMs  float64 `json:"settle_ms"` // the wait for the cluster to settle before the run

	// raft mode, from the leader: Entries and EntryRecords are counter
	// deltas over the whole run (log entries of lock changes, and the
	// changes in them); EntriesPerSec is the entry rate over the measured
	// window and CommitP50/CommitP99 (µs) the medians, over the /status
	// samples taken in the window, of the leader's commit latency
	// quantiles (each over its last 1024 entries).
	Entries         uint64  `json:"raft_entries,omitempty"`
	EntryRecords    uint64  `json:"raft_entry_records,omitempty"`
	RecordsPerEntry float64 `json:"raft_records_per_entry,omitempty"`
	EntriesPerSec   float64 `json:"raft_entries_per_sec,omitempty"`
	CommitP50       float64 `json:"raft_commit_p50_us,omitempty"`
	CommitP99       float64 `json:"raft_commit_p99_us,omitempty"`
	RaftSamples     int     `json:"raft_samples,omitempty"`
}

// lagSample is one reading of the active's view of its standbys.
type lagSample struct {
	at      time.Time
	secs    float64 // the largest lag over the standbys
	records uint64
}

// raftSample is one reading of a raft leader's /status.
type raftSample struct {
	at                   time.Time
	entries              uint64
	commitP50, commitP99 float64 // seconds
}

// quantile is the nearest-rank q-quantile of sorted (0 when empty).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// replStats computes a run's ReplStats from the counters read before and
// after it and the lag samples taken meanwhile: only samples inside
// [from, to) count.
func replStats(before, after map[string]float64, samples []lagSample, raft []raftSample, from, to time.Time) *ReplStats {
	rs := &ReplStats{}
	delta := func(name string) uint64 {
		a, okA := after[name]
		b, okB := before[name]
		if !okA || !okB || a < b {
			return 0
		}
		return uint64(a - b)
	}
	rs.Records, rs.Batches = delta(mRecords), delta(mBatches)
	rs.RawBytes, rs.WireBytes = delta(mRawBytes), delta(mWireBytes)
	rs.Failovers, rs.Handovers = delta(mFailovers), delta(mHandovers)
	rs.EpochFrom, rs.EpochTo = uint64(before[mEpoch]), uint64(after[mEpoch])
	rs.Entries, rs.EntryRecords = delta(mRaftEntries), delta(mRaftRecords)
	if rs.Entries > 0 {
		rs.RecordsPerEntry = float64(rs.EntryRecords) / float64(rs.Entries)
	}
	var first, last *raftSample
	var p50s, p99s []float64
	for i := range raft {
		s := &raft[i]
		if s.at.Before(from) || !s.at.Before(to) {
			continue
		}
		if first == nil {
			first = s
		}
		last = s
		p50s, p99s = append(p50s, s.commitP50*1e6), append(p99s, s.commitP99*1e6)
	}
	rs.RaftSamples = len(p50s)
	if first != nil && last != first && last.entries >= first.entries {
		rs.EntriesPerSec = float64(last.entries-first.entries) / last.at.Sub(first.at).Seconds()
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	rs.CommitP50, rs.CommitP99 = quantile(p50s, .5), quantile(p99s, .5)
	if rs.Records > 0 {
		rs.WirePerRecord = float64(rs.WireBytes) / float64(rs.Records)
		rs.RawPerRecord = float64(rs.RawBytes) / float64(rs.Records)
	}
	if rs.Batches > 0 {
		rs.RecordsPerBatch = float64(rs.Records) / float64(rs.Batches)
	}
	var lags []float64
	for _, s := range samples {
		if s.at.Before(from) || !s.at.Before(to) {
			continue
		}
		lags = append(lags, s.secs*1e6)
		rs.LagRecMax = max(rs.LagRecMax, s.records)
	}
	slices.Sort(lags)
	rs.LagSamples = len(lags)
	rs.LagP50, rs.LagP99 = quantile(lags, .5), quantile(lags, .99)
	if len(lags) > 0 {
		rs.LagMax = lags[len(lags)-1]
	}
	return rs
}

// settled reports which member a cluster of mode should be driven at, given
// every member's /status in --peers order, and whether it is ready for a
// run: priority — the first member active and every other member a
// standby in sync; raft — exactly one leader, and every other member a
// follower (not a candidate, not a second leader); single — the member is
// active.
func settled(mode string, sts []clustertest.Status) (int, bool) {
	switch mode {
	case clustertest.ModePriority:
		if len(sts) == 0 || sts[0].Role != api.RoleActive {
			return -1, false
		}
		for _, st := range sts[1:] {
			if st.Role != api.RoleStandby || !st.InSync || st.Active != sts[0].Addr {
				return -1, false
			}
		}
		return 0, true
	case clustertest.ModeRaft:
		leader := -1
		for i, st := range sts {
			switch st.Role {
			case api.RoleLeader:
				if leader >= 0 {
					return -1, false
				}
				leader = i
			case api.RoleFollower:
			default:
				return -1, false
			}
		}
		return leader, leader >= 0
	default:
		if len(sts) == 1 && sts[0].Role == api.RoleActive {
			return 0, true
		}
		return -1, false
	}
}

// errUnsettled is ok's complaint to waitSettled's reading.
var errUnsettled = errors.New("not settled")

// waitSettled waits up to timeout until ok accepts a reading of every
// member's /status in --peers order (clustertest's WaitStatuses: a member
// that does not answer counts as not yet), and returns the member ok
// names and how long it waited.
func waitSettled(c *clustertest.Cluster, mode string, timeout time.Duration, ok func([]clustertest.Status) (int, bool)) (int, time.Duration, error) {
	began := time.Now()
	member := -1
	_, err := c.WaitStatuses(timeout, clustertest.Every, func(sts []clustertest.Status) error {
		i, done := ok(sts)
		if !done {
			return errUnsettled
		}
		member = i
		return nil
	})
	if err != nil {
		return -1, time.Since(began), fmt.Errorf("%w within %v (%s): %w", errNotSettled, timeout, mode, err)
	}
	return member, time.Since(began), nil
}

// clusterTarget is a target made of lockd processes started from the
// lockd binary (clustertest runs them): a priority cluster, a raft cluster
// or a single node.
type clusterTarget struct {
	mode     string
	c        *clustertest.Cluster
	lagEvery time.Duration
	http     *http.Client // keep-alive, for the lag sampler and the counters
	driven   int          // the member the driver is pointed at
}

// lockdBinary returns the lockd binary the cluster targets run: -lockd-bin,
// or one built from this tree without the race detector (a race-enabled
// server would measure the race detector; LOCKD_RACE=1 asks for it anyway,
// LOCKD_BIN names a binary, as for clustertest).
func lockdBinary(o *options) (string, error) {
	if o.lockdBin != "" {
		return o.lockdBin, nil
	}
	if os.Getenv("LOCKD_RACE") == "" {
		os.Setenv("LOCKD_RACE", "0")
	}
	return clustertest.Build()
}

// rejectedFlags runs bin with args plus --version and reports why it
// refuses them: the usage message when it exits 2 (a flag it does not
// accept), "" when it accepts them. lockd checks every flag before it
// looks at --version, so nothing starts.
func rejectedFlags(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(slices.Clone(args), "--version")...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "", nil
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = "exit status 2"
		}
		return msg, nil
	}
	return "", fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, out)
}

// openPriority starts the lockd-priority target: an active and one standby.
func openPriority(t *target, o *options) error {
	return t.startCluster(o, clustertest.ModePriority, 2)
}

// openRaft starts the lockd-raft target: three members, --cluster raft,
// fsync on (lockd's default; the harness passes no flag that weakens it).
// A binary that does not accept --cluster raft yet makes every workload of
// the target skipped, with its message, instead of failing the run.
func openRaft(t *target, o *options) error {
	bin, err := lockdBinary(o)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-raft-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	peers := "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
	why, err := rejectedFlags(bin, "--cluster", api.ModeRaft, "--peers", peers, "--listen", "127.0.0.1:1",
		"--data-dir", dir, "--admin", "")
	if err != nil {
		return err
	}
	if why != "" {
		why = "this lockd binary does not run --cluster raft: " + why
		t.newCodec = func(int) codec { return newLockdCodec() }
		for _, wl := range allWorkloads {
			t.skip[wl] = why
		}
		if o.cfg.Progress != nil {
			o.cfg.Progress("    lockd-raft skipped: " + why)
		}
		return nil
	}
	return t.startCluster(o, clustertest.ModeRaft, 3)
}

// openLockdBin starts lockd-bin: the lockd binary as a single node, started
// as the cluster members are — the baseline that separates the cost of a
// cluster from that of the binary (admin endpoint, logging) against the
// harness's own lockd child.
func openLockdBin(t *target, o *options) error {
	return t.startCluster(o, clustertest.ModeSingle, 1)
}

// openLockdBase starts lockd-base: lockd-bin with the -base-bin binary, so
// that one interleaved run measures two builds of lockd (a change and the
// commit before it) with the same load generator, round by round.
func openLockdBase(t *target, o *options) error {
	bo, err := baseOptions(o)
	if err != nil {
		return err
	}
	return t.startCluster(bo, clustertest.ModeSingle, 1)
}

// openPriorityBase and openRaftBase start lockd-priority-base and
// lockd-raft-base: lockd-priority and lockd-raft with the -base-bin
// binary, so that a change to the cluster modes is measured against the
// commit before it, round by round, in one interleaved run.
func openPriorityBase(t *target, o *options) error {
	bo, err := baseOptions(o)
	if err != nil {
		return err
	}
	return openPriority(t, bo)
}

func openRaftBase(t *target, o *options) error {
	bo, err := baseOptions(o)
	if err != nil {
		return err
	}
	return openRaft(t, bo)
}

// baseOptions are o with the -base-bin binary as the lockd binary.
func baseOptions(o *options) (*options, error) {
	if o.baseBin == "" {
		return nil, errors.New("give its binary with -base-bin")
	}
	bo := *o
	bo.lockdBin = o.baseBin
	return &bo, nil
}

// startCluster starts members lockd processes of mode, owned by t, and
// points t's driver, memory readings and profiles at the member that
// serves.
func (t *target) startCluster(o *options, mode string, members int) error {
	bin, err := lockdBinary(o)
	if err != nil {
		return err
	}
	var args []string
	if o.loops > 0 {
		args = []string{"--loops", strconv.Itoa(o.loops)}
	}
	c, err := clustertest.New(clustertest.Options{Mode: mode, Members: members, Binary: bin, ExtraArgs: args})
	if err != nil {
		return err
	}
	ct := &clusterTarget{mode: mode, c: c, lagEvery: o.lagEvery,
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	prev := t.stop
	t.stop = func() { ct.close(); prev() }
	t.cluster = ct
	t.pids = func() []int {
		var pids []int
		for _, m := range c.Members() {
			pids = append(pids, m.PID())
		}
		return pids
	}
	t.newCodec = func(int) codec { return newLockdCodec() }
	t.queues = true
	t.mem = ct.mem
	if _, err := ct.settle(settleTimeout); err != nil {
		return err
	}
	t.addr = c.Member(ct.driven).Addr()
	return nil
}

func (ct *clusterTarget) close() {
	ct.c.Close()
	ct.http.CloseIdleConnections()
}

// settle waits until the cluster is ready for a run (settled) and points
// ct at the member to drive; it returns how long it waited.
func (ct *clusterTarget) settle(timeout time.Duration) (time.Duration, error) {
	i, waited, err := waitSettled(ct.c, ct.mode, timeout, func(sts []clustertest.Status) (int, bool) { return settled(ct.mode, sts) })
	if err == nil {
		ct.driven = i
	}
	return waited, err
}

// admin is the driven member's admin URL.
func (ct *clusterTarget) admin() string { return ct.c.Member(ct.driven).AdminURL() }

// get reads url with the keep-alive client.
func (ct *clusterTarget) get(url string, into func(io.Reader) error) error {
	resp, err := ct.http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("%w: %s: %s", errAdmin, url, resp.Status)
	}
	if into == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return into(resp.Body)
}

// metrics reads the named metrics of the driven member (a metric it does
// not export is absent from the map).
func (ct *clusterTarget) metrics(names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := ct.get(ct.admin()+"/metrics", func(r io.Reader) error {
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(r)
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, ok := mfs[n]; ok {
				v, err := metricSum(mfs, n)
				if err != nil {
					return err
				}
				out[n] = v
			}
		}
		return nil
	})
	return out, err
}

// mem is the driven member's Go heap + stacks after a forced GC (the
// admin's heap profile with gc=1 runs one), and its RSS.
func (ct *clusterTarget) mem() (memStat, error) {
	url := ct.admin()
	if err := ct.get(url+"/debug/pprof/heap?gc=1", nil); err != nil {
		return memStat{}, err
	}
	v, err := ct.metrics("go_memstats_heap_alloc_bytes", "go_memstats_stack_inuse_bytes")
	if err != nil {
		return memStat{}, err
	}
	return memStat{Heap: int64(v["go_memstats_heap_alloc_bytes"] + v["go_memstats_stack_inuse_bytes"]),
		RSS: rssOf(ct.c.Member(ct.driven).PID())}, nil
}

// statusSample reads the driven member's /status: for an active, the
// largest lag over its standbys and the records not acknowledged then; for
// a raft leader, its entry count and commit latency.
func (ct *clusterTarget) statusSample(url string) (lagSample, raftSample, error) {
	var st api.Status
	at := time.Now()
	err := ct.get(url+api.PathStatus, func(r io.Reader) error { return json.NewDecoder(r).Decode(&st) })
	ls, rs := lagSample{at: at}, raftSample{at: at}
	for _, m := range st.Members {
		ls.secs, ls.records = max(ls.secs, m.LagSeconds), max(ls.records, m.LagRecords)
	}
	if st.Raft != nil {
		rs.entries, rs.commitP50, rs.commitP99 = st.Raft.Entries, st.Raft.CommitP50Seconds, st.Raft.CommitP99Seconds
	} else if err == nil && ct.mode == clustertest.ModeRaft {
		err = errors.New("/status has no raft section")
	}
	return ls, rs, err
}

// clusterRun is what a cluster target watches during one run.
type clusterRun struct {
	ct      *clusterTarget
	settle  time.Duration
	before  map[string]float64
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples []lagSample
	raft    []raftSample
	errs    int
}

// begin waits until the cluster is settled, points t at the member to
// drive, reads the counters and starts the sampler (lagEvery > 0): in
// priority mode every lagEvery it reads the active's /status, whose
// members[].lag_seconds is the figure lockd_replication_lag_seconds{member}
// exports (the same function fills both; /status is cheaper to serve and
// parse than the whole /metrics page); in raft mode every raftEvery it
// reads the leader's entry count and commit latency there.
func (ct *clusterTarget) begin(t *target) (*clusterRun, error) {
	waited, err := ct.settle(settleTimeout)
	if err != nil {
		return nil, err
	}
	t.addr = ct.c.Member(ct.driven).Addr()
	before, err := ct.metrics(replCounters...)
	if err != nil {
		return nil, err
	}
	r := &clusterRun{ct: ct, settle: waited, before: before, stop: make(chan struct{}), done: make(chan struct{})}
	every := ct.lagEvery
	if ct.mode == clustertest.ModeRaft {
		every = raftEvery
	}
	if ct.mode == clustertest.ModeSingle || ct.lagEvery <= 0 {
		close(r.done)
		return r, nil
	}
	url := ct.admin()
	go func() {
		defer close(r.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			ls, rs, err := ct.statusSample(url)
			r.mu.Lock()
			switch {
			case err != nil:
				r.errs++
			case ct.mode == clustertest.ModeRaft:
				r.raft = append(r.raft, rs)
			default:
				r.samples = append(r.samples, ls)
			}
			r.mu.Unlock()
		}
	}()
	return r, nil
}

// end stops the sampler, reads the counters again and returns the run's
// figures, the lag over the measured window [from, to).
func (r *clusterRun) end(from, to time.Time) (*ReplStats, error) {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	after, err := r.ct.metrics(replCounters...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := replStats(r.before, after, r.samples, r.raft, from, to)
	rs.LagErrors = r.errs
	rs.SettleMs = float64(r.settle) / 1e6
	if r.ct.mode == clustertest.ModePriority && r.ct.lagEvery > 0 {
		rs.LagEveryMs = float64(r.ct.lagEvery) / 1e6
	}
	return rs, nil
}

// profile takes a CPU profile of every running member for secs seconds
// through its admin endpoint, then an allocation profile: files
// prefix-pN.cpu.pprof and prefix-pN.allocs.pprof. The returned func waits
// for them.
func (ct *clusterTarget) profile(prefix string, secs int) func() error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	long := &http.Client{Timeout: time.Duration(secs+30) * time.Second}
	for _, m := range ct.c.Members() {
		url := m.AdminURL()
		if !m.Alive() || url == "" {
			continue
		}
		p := fmt.Sprintf("%s-p%d", prefix, m.Index())
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := errors.Join(fetchTo(long, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", url, secs), p+".cpu.pprof"),
				fetchTo(long, url+"/debug/pprof/allocs", p+".allocs.pprof"))
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	return func() error {
		wg.Wait()
		long.CloseIdleConnections()
		return errors.Join(errs...)
	}
}

// fetchTo writes the body of url to file.
func fetchTo(c *http.Client, url, file string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s: %s", errAdmin, url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
