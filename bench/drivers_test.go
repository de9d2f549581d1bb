package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func checkClean(t *testing.T, r *Result) {
	t.Helper()
	if r.Errors != 0 || r.NotHeld != 0 || r.Lost != 0 {
		t.Errorf("%s %s: errors %d, not-held %d, lost %d; want none", r.Target, r.Workload, r.Errors, r.NotHeld, r.Lost)
	}
	if r.Ops == 0 || r.Rate <= 0 {
		t.Errorf("%s %s: no operations measured", r.Target, r.Workload)
	}
	if r.Latency.N == 0 || r.Latency.P50 <= 0 || r.Latency.P99 < r.Latency.P50 || r.Latency.Max < r.Latency.P999 {
		t.Errorf("%s %s: implausible latency %+v", r.Target, r.Workload, r.Latency)
	}
}

// checkContended asserts a contended run saw hand-offs and a sane fairness figure.
func checkContended(t *testing.T, r *Result, minJain float64) {
	t.Helper()
	checkClean(t, r)
	if r.Handoffs == 0 || r.Handoffs > r.Ops || r.Handoff == nil || r.Handoff.N != uint64(r.Handoffs) {
		t.Errorf("%s contended: handoffs %d of %d grants (%+v)", r.Target, r.Handoffs, r.Ops, r.Handoff)
	}
	if r.Jain < minJain || r.Jain > 1.0000001 || r.MinGrants > r.MaxGrants {
		t.Errorf("%s contended: Jain %.3f (grants %d..%d), want ≥ %.2f", r.Target, r.Jain, r.MinGrants, r.MaxGrants, minJain)
	}
}

func checkFanin(t *testing.T, r *Result, cfg *config) {
	t.Helper()
	checkClean(t, r)
	if r.Refused != 0 {
		t.Errorf("%s fanin: %d acquires refused; every slot has its own key", r.Target, r.Refused)
	}
	if r.Conns != cfg.Fanin || r.MemPerConn == nil || r.MemPerLock == nil {
		t.Errorf("%s fanin: conns %d, mem/conn %v, mem/lock %v: memory not measured", r.Target, r.Conns, r.MemPerConn, r.MemPerLock)
	}
}

func TestLockdDriver(t *testing.T) {
	tg := openTest(t, "lockd")
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	// lockd queues waiters in FIFO order: with every waiter looping, grants
	// per waiter can differ by little.
	checkContended(t, run1(t, tg, wlContended, cfg), 0.9)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
}

// TestLockdACLDriver: the lockd-acl target says hello on every connection
// (a refused hello would fail the run, and an unauthenticated request would
// be E 5 and counted as an error) and runs every workload cleanly.
func TestLockdACLDriver(t *testing.T) {
	tg := openTest(t, "lockd-acl")
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	checkContended(t, run1(t, tg, wlContended, cfg), 0.9)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
}

func TestEchoDriver(t *testing.T) {
	tg := openTest(t, "echo")
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	if r := run1(t, tg, wlContended, cfg); r.Skipped == "" {
		t.Error("echo has no lock state; contended must be skipped")
	}
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
}

func TestRedisDriver(t *testing.T) {
	needPeer(t, "redis-server")
	tg := openTest(t, "redis")
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	// Retry with back-off is not FIFO; only require that it works.
	checkContended(t, run1(t, tg, wlContended, cfg), 0.1)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
}

func TestEtcdDriver(t *testing.T) {
	needPeer(t, "etcd")
	tg := openTest(t, "etcd")
	cfg := smallConfig()
	cfg.Dur = 800 * cfg.Dur / 400 // etcd does a few hundred txns a second
	before, err := etcdFsyncs(tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	// etcd persists before it answers: a run of puts and deletes fsyncs its WAL.
	if after, err := etcdFsyncs(tg.addr); err != nil || after <= before {
		t.Errorf("etcd WAL fsyncs %d before the run, %d after (%v): etcd must fsync", before, after, err)
	}
	r := run1(t, tg, wlContended, cfg)
	checkClean(t, r)
	if r.Ops > 0 && r.Handoffs > r.Ops {
		t.Errorf("etcd contended: %d handoffs of %d grants", r.Handoffs, r.Ops)
	}
	// concurrency.Mutex queues its waiters by revision: hand-offs happen,
	// and no waiter starves.
	checkContended(t, r, 0.5)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
}

// TestEtcdRecipes drives each etcd recipe through the driver by hand:
// concurrency.Mutex (a waiter blocks until the holder releases, then gets a
// larger fencing token; a wait that is spent is a refusal), the txn recipe
// (a held key is refused, a stale token's release is not-held) and
// fanin's renew (renewed while the lease lives, not-held once it is gone).
func TestEtcdRecipes(t *testing.T) {
	needPeer(t, "etcd")
	tg := openTest(t, "etcd")
	a, b := &slot{id: 0}, &slot{id: 1}
	er, err := tg.etcd.start([][]*slot{{a}, {b}}, etcdMutex)
	if err != nil {
		t.Fatal(err)
	}
	defer er.close()
	lock := action{op: opAcquire, key: []byte("bench/test/mutex"), wait: 5, lease: 10}
	ga := er.do(a, &lock)
	if ga.kind != ansGranted || ga.token == 0 {
		t.Fatalf("first Lock: %+v (last error %v)", ga, tg.etcd.lastErr.Load())
	}
	got := make(chan answer, 1)
	go func() { got <- er.do(b, &lock) }()
	select {
	case gb := <-got:
		t.Fatalf("second Lock answered %+v while the first holds the lock", gb)
	case <-time.After(300 * time.Millisecond):
	}
	if r := er.do(a, &action{op: opRelease, key: lock.key}); r.kind != ansReleased {
		t.Fatalf("Unlock: %+v", r)
	}
	gb := <-got
	if gb.kind != ansGranted || gb.token <= ga.token {
		t.Fatalf("waiter after the hand-off: %+v, want granted with a token above %d", gb, ga.token)
	}
	short := lock
	short.wait = 1
	if r := er.do(a, &short); r.kind != ansRefused {
		t.Fatalf("Lock with a 1 s wait on a held lock: %+v, want refused", r)
	}
	if r := er.do(b, &action{op: opRelease, key: lock.key}); r.kind != ansReleased {
		t.Fatalf("Unlock: %+v", r)
	}

	tx, err := tg.etcd.start([][]*slot{{a}}, etcdSharedLease)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.close()
	key := []byte("bench/test/txn")
	g := tx.do(a, &action{op: opAcquire, key: key, lease: 30})
	if g.kind != ansGranted || g.token == 0 {
		t.Fatalf("txn acquire: %+v", g)
	}
	if r := tx.do(a, &action{op: opAcquire, key: key, lease: 30}); r.kind != ansRefused {
		t.Fatalf("txn acquire of a held key: %+v, want refused", r)
	}
	if r := tx.do(a, &action{op: opRelease, key: key, token: g.token - 1}); r.kind != ansNotHeld {
		t.Fatalf("txn release with a stale token: %+v, want not-held", r)
	}
	if r := tx.do(a, &action{op: opRelease, key: key, token: g.token}); r.kind != ansReleased {
		t.Fatalf("txn release: %+v", r)
	}

	// fanin's lock: its own lease, renewed on the slot's lease stream,
	// not held once the lease is gone.
	fi, err := tg.etcd.start([][]*slot{{a}}, etcdLeasePerLock)
	if err != nil {
		t.Fatal(err)
	}
	defer fi.close()
	if r := fi.do(a, &action{op: opAcquire, key: key, lease: 3}); r.kind != ansGranted {
		t.Fatalf("fanin acquire: %+v", r)
	}
	for range 2 {
		if r := fi.do(a, &action{op: opRenew, key: key, lease: 3}); r.kind != ansRenewed {
			t.Fatalf("renew: %+v (last error %v)", r, tg.etcd.lastErr.Load())
		}
	}
	es := &fi.slots[a.id]
	if _, err := es.cli.Revoke(context.Background(), es.lease); err != nil {
		t.Fatal(err)
	}
	if r := fi.do(a, &action{op: opRenew, key: key, lease: 3}); r.kind != ansNotHeld {
		t.Fatalf("renew of a revoked lease: %+v, want not-held", r)
	}
}

// TestMetricSum reads gauges, counters and histogram counts from the
// Prometheus text format, and names a metric that is missing.
func TestMetricSum(t *testing.T) {
	const text = `# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.2e+06
# TYPE go_memstats_stack_inuse_bytes gauge
go_memstats_stack_inuse_bytes 65536
# TYPE etcd_disk_wal_fsync_duration_seconds histogram
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 3
etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 7
etcd_disk_wal_fsync_duration_seconds_sum 0.5
etcd_disk_wal_fsync_duration_seconds_count 7
# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_method="Txn"} 10
grpc_server_handled_total{grpc_method="Range"} 5
`
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		names []string
		want  float64
	}{
		{[]string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes"}, 1200000 + 65536},
		{[]string{"etcd_disk_wal_fsync_duration_seconds"}, 7},
		{[]string{"grpc_server_handled_total"}, 15},
	} {
		if got, err := metricSum(mfs, c.names...); err != nil || got != c.want {
			t.Errorf("%v: %v %v, want %v", c.names, got, err, c.want)
		}
	}
	if _, err := metricSum(mfs, "go_memstats_heap_inuse_bytes", "nope"); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing metric: %v", err)
	}
}

// TestCommandAgainstAddr runs the command itself with -addr and -json
// against a running lockd.
func TestCommandAgainstAddr(t *testing.T) {
	srv := openTest(t, "lockd")
	var out, errb bytes.Buffer
	code := run([]string{"-addr", srv.addr, "-targets", "lockd", "-workloads", "uncontended,contended",
		"-dur", "300ms", "-conns", "2", "-depth", "2", "-waiters", "4", "-hot", "2", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "round 1/1  uncontended") {
		t.Errorf("no progress on stderr: %q", errb.String())
	}
	var doc struct {
		Results []Result  `json:"results"`
		Summary []summary `json:"summary"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	if len(doc.Results) != 2 || doc.Results[0].Rate <= 0 || doc.Results[1].HandoffRate <= 0 {
		t.Fatalf("results: %+v", doc.Results)
	}
	if len(doc.Summary) != 2 || doc.Summary[0].Target != "lockd" {
		t.Fatalf("summary: %+v", doc.Summary)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-targets", "memcached"}, {"-workloads", "nope"}, {"-rounds", "0"}, {"-dur", "1ms"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}
