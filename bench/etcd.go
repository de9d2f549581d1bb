package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// etcdDriver drives etcd v3 with its Go client (go.etcd.io/etcd/client/v3,
// gRPC over HTTP/2). Each run opens one client — one connection — per
// connection group of the workload, so 16 × 32 uncontended slots share 16
// connections as they do on the pipelined targets; every slot is its own
// goroutine with one request in flight, multiplexed on its group's
// connection.
//
//   - uncontended and fanin: acquire is the txn "create_revision(key) = 0 →
//     put key with a lease", its fencing token the put's revision; release
//     is "mod_revision(key) = token → delete key". Uncontended slots share
//     one lease (TTL 30 s) per connection, granted before the run; fanin
//     grants each lock its own lease with the acquire, and renewing is a
//     lease keep-alive.
//   - contended: the recipe etcd users run for a blocking lock,
//     concurrency.Mutex: each waiter has its own session (a lease kept alive
//     by the client) and a Mutex on the hot key; acquire is Lock (queued by
//     revision, woken by a watch on its predecessor's key), bounded by the
//     wait; release is Unlock. The fencing token is the lock key's creation
//     revision.
type etcdDriver struct {
	endpoint string                    // http://host:port
	lastErr  atomic.Pointer[error]     // the last request failure, for the report
	failed   [opRenew + 1]atomic.Int64 // failed requests by op, for the report
}

// failures returns and resets the failed requests by op, as
// "acquire 3, renew 2", and the last failure.
func (d *etcdDriver) failures() (string, error) {
	var parts []string
	for op, name := range map[opKind]string{opAcquire: "acquire", opRelease: "release", opRenew: "renew"} {
		if n := d.failed[op].Swap(0); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
		}
	}
	slices.Sort(parts)
	var last error
	if err := d.lastErr.Swap(nil); err != nil {
		last = *err
	}
	return strings.Join(parts, ", "), last
}

func newEtcdDriver(endpoint string) *etcdDriver { return &etcdDriver{endpoint: endpoint} }

// etcdRequestTimeout bounds every request but a Lock (bounded by its wait).
const etcdRequestTimeout = 15 * time.Second

// newClient opens one client (one gRPC connection, dialled lazily).
func (d *etcdDriver) newClient(small bool) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: []string{d.endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()}
	if small {
		// fanin opens 10,000 connections: gRPC's 32 KiB read and write
		// buffers each would cost the load generator 640 MiB; its requests
		// are a few dozen bytes.
		cfg.DialOptions = []grpc.DialOption{grpc.WithReadBufferSize(4 << 10), grpc.WithWriteBufferSize(4 << 10)}
	}
	return clientv3.New(cfg)
}

// etcdSlot is what one slot holds on etcd during a run.
type etcdSlot struct {
	cli   *clientv3.Client
	lease clientv3.LeaseID
	sess  *concurrency.Session // contended: the slot's session,
	mu    *concurrency.Mutex   // its Mutex on the key it last acquired,
	muKey string               // and that key

	ka       pb.Lease_LeaseKeepAliveClient // fanin: the slot's lease stream,
	kaCancel context.CancelFunc            // and what closes it
}

// keepAlive sends one keep-alive for the slot's lease on its lease stream
// (opened on first use and kept, as clientv3's own KeepAlive keeps one per
// client) and returns the lease's remaining TTL. The stream is dropped
// when a request fails or outlives ctx; the next renew opens another.
//
// Not KeepAliveOnce: it opens a stream per call and retries at once, in a
// loop, while etcd answers Unavailable ("waiting for the applied index"),
// which is what etcd answers while fanin's 10,000 acquires are being
// applied: the renews became a storm of streams, and none completed.
func (es *etcdSlot) keepAlive(ctx context.Context) (int64, error) {
	if es.ka == nil {
		sctx, cancel := context.WithCancel(context.Background())
		ka, err := pb.NewLeaseClient(es.cli.ActiveConnection()).LeaseKeepAlive(sctx)
		if err != nil {
			cancel()
			return 0, err
		}
		es.ka, es.kaCancel = ka, cancel
	}
	stop := context.AfterFunc(ctx, es.kaCancel)
	err := es.ka.Send(&pb.LeaseKeepAliveRequest{ID: int64(es.lease)})
	var resp *pb.LeaseKeepAliveResponse
	if err == nil {
		resp, err = es.ka.Recv()
	}
	if !stop() || err != nil {
		es.dropStream()
	}
	if err != nil {
		return 0, err
	}
	return resp.TTL, nil
}

// dropStream closes the slot's lease stream, if it has one.
func (es *etcdSlot) dropStream() {
	if es.ka != nil {
		es.kaCancel()
		es.ka, es.kaCancel = nil, nil
	}
}

// etcdRun is one workload's clients, leases and sessions.
type etcdRun struct {
	d        *etcdDriver
	clients  []*clientv3.Client
	slots    []etcdSlot // by slot id
	perLock  bool       // fanin: a lease per lock, granted with the acquire
	released sync.Once
}

// etcdMode is how a workload's locks are made on etcd.
type etcdMode uint8

const (
	etcdSharedLease  etcdMode = iota // txn recipe, one lease per connection
	etcdLeasePerLock                 // txn recipe, one lease per lock (fanin)
	etcdMutex                        // concurrency.Mutex, a session per slot
	etcdSemaphore                    // the semaphore workload's recipe (semaphore_etcd.go), a session per slot
)

// start opens a client per group and prepares every slot for mode: the
// shared leases and the sessions are made here, before the clock starts.
func (d *etcdDriver) start(groups [][]*slot, mode etcdMode) (*etcdRun, error) {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	r := &etcdRun{d: d, clients: make([]*clientv3.Client, len(groups)), slots: make([]etcdSlot, n), perLock: mode == etcdLeasePerLock}
	err := parallel(len(groups), 64, func(i int) error {
		cli, err := d.newClient(len(groups) > 1024)
		if err != nil {
			return err
		}
		r.clients[i] = cli
		var lease clientv3.LeaseID
		if mode == etcdSharedLease {
			ctx, cancel := context.WithTimeout(context.Background(), etcdRequestTimeout)
			defer cancel()
			g, err := cli.Grant(ctx, 30)
			if err != nil {
				return err
			}
			lease = g.ID
		}
		for _, s := range groups[i] {
			es := &r.slots[s.id]
			es.cli, es.lease = cli, lease
			if mode == etcdMutex || mode == etcdSemaphore {
				// The contended workload's lease, as the session's TTL.
				if es.sess, err = concurrency.NewSession(cli, concurrency.WithTTL(10)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// parallel runs f(0..n-1) on width goroutines and joins their errors.
func parallel(n, width int, f func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs error
		next atomic.Int64
	)
	for range min(n, width) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					mu.Lock()
					errs = errors.Join(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

// warm opens every connection with one request each, all at once.
func (r *etcdRun) warm() error {
	return parallel(len(r.clients), 64, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), etcdRequestTimeout)
		defer cancel()
		_, err := r.clients[i].Get(ctx, "bench/health")
		return err
	})
}

// close ends the sessions (revoking their leases), revokes the shared
// leases and closes the clients.
func (r *etcdRun) close() {
	r.released.Do(func() {
		revoked := map[clientv3.LeaseID]bool{clientv3.NoLease: true}
		for i := range r.slots {
			s := &r.slots[i]
			s.dropStream()
			if s.sess != nil {
				s.sess.Close()
			} else if s.cli != nil && !r.perLock && !revoked[s.lease] {
				revoked[s.lease] = true
				ctx, cancel := context.WithTimeout(context.Background(), etcdRequestTimeout)
				s.cli.Revoke(ctx, s.lease)
				cancel()
			}
		}
		parallel(len(r.clients), 64, func(i int) error {
			if r.clients[i] != nil {
				r.clients[i].Close()
			}
			return nil
		})
	})
}

// do performs a for slot s and waits for its answer.
func (r *etcdRun) do(s *slot, a *action) answer {
	es := &r.slots[s.id]
	ctx, cancel := context.WithTimeout(context.Background(), etcdRequestTimeout)
	defer cancel()
	kind, token, err := r.op(ctx, es, a)
	if err != nil {
		if kind == ansError {
			r.d.lastErr.Store(&err)
			if a.op <= opRenew {
				r.d.failed[a.op].Add(1)
			}
		}
		return answer{kind: kind}
	}
	return answer{kind: kind, token: token}
}

// op is do's request; on error, kind says how the workload counts it.
func (r *etcdRun) op(ctx context.Context, es *etcdSlot, a *action) (ansKind, uint64, error) {
	key := string(a.key)
	switch {
	case a.limit > 0:
		return r.semOp(ctx, es, a)
	case es.sess != nil && a.op == opAcquire:
		if es.mu == nil || es.muKey != key {
			es.mu, es.muKey = concurrency.NewMutex(es.sess, key), key
		}
		lctx, cancel := context.WithTimeout(ctx, time.Duration(a.wait)*time.Second)
		defer cancel()
		if err := es.mu.Lock(lctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return ansRefused, 0, err // the wait was spent
			}
			return ansError, 0, err
		}
		return ansGranted, mutexToken(es.mu), nil
	case es.sess != nil && a.op == opRelease:
		if err := es.mu.Unlock(ctx); err != nil {
			return ansError, 0, err
		}
		return ansReleased, 0, nil
	case a.op == opAcquire:
		if r.perLock {
			g, err := es.cli.Grant(ctx, int64(a.lease))
			if err != nil {
				return ansError, 0, err
			}
			es.lease = g.ID
		}
		resp, err := es.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, strconv.Itoa(int(es.lease)), clientv3.WithLease(es.lease))).
			Commit()
		switch {
		case err != nil:
			return ansError, 0, err
		case resp.Succeeded:
			return ansGranted, uint64(resp.Header.Revision), nil
		}
		return ansRefused, 0, nil
	case a.op == opRelease:
		resp, err := es.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", int64(a.token))).
			Then(clientv3.OpDelete(key)).
			Commit()
		switch {
		case err != nil:
			return ansError, 0, err
		case resp.Succeeded:
			return ansReleased, 0, nil
		}
		return ansNotHeld, 0, nil
	case a.op == opRenew:
		// The lock lives as long as its lease: renewing is a keep-alive.
		ttl, err := es.keepAlive(ctx)
		switch {
		case err != nil:
			return ansError, 0, err
		case ttl <= 0: // the lease has expired: the lock is gone
			return ansNotHeld, 0, nil
		}
		return ansRenewed, 0, nil
	}
	return ansError, 0, fmt.Errorf("etcd: no request for op %d", a.op)
}

// mutexToken is a held Mutex's fencing token: the creation revision of its
// key, which orders the holders of one lock.
func mutexToken(m *concurrency.Mutex) uint64 {
	c := m.IsOwner()
	if cr, ok := c.GetCompare().GetTargetUnion().(*pb.Compare_CreateRevision); ok {
		return uint64(cr.CreateRevision)
	}
	return 0
}

// etcdHealth reports whether etcd at endpoint answers a read.
func etcdHealth(endpoint string) error {
	cli, err := newEtcdDriver(endpoint).newClient(false)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "bench/health")
	return err
}

// etcdMetrics reads etcd's Prometheus metrics.
func etcdMetrics(endpoint string) (map[string]*dto.MetricFamily, error) {
	c := http.Client{Timeout: etcdRequestTimeout}
	resp, err := c.Get(endpoint + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("etcd /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}

// metricSum adds up the values of the named metrics' samples: gauges and
// counters their value, histograms their sample count.
func metricSum(mfs map[string]*dto.MetricFamily, names ...string) (float64, error) {
	var sum float64
	for _, name := range names {
		mf, ok := mfs[name]
		if !ok {
			return 0, fmt.Errorf("etcd /metrics: no %s", name)
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum, nil
}

// etcdMem reads etcd's Go heap and stacks in use from its /metrics (no GC
// is forced: it includes garbage) and its RSS when the process is known.
func etcdMem(endpoint string, pid int) (memStat, error) {
	mfs, err := etcdMetrics(endpoint)
	if err != nil {
		return memStat{}, err
	}
	heap, err := metricSum(mfs, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes")
	if err != nil {
		return memStat{}, err
	}
	m := memStat{Heap: int64(heap)}
	if pid > 0 {
		m.RSS = rssOf(pid)
	}
	return m, nil
}

// etcdFsyncs returns how many WAL fsyncs etcd has made (the sample count of
// etcd_disk_wal_fsync_duration_seconds): the harness reports the count per
// run, the proof that etcd persisted what it granted.
func etcdFsyncs(endpoint string) (int64, error) {
	mfs, err := etcdMetrics(endpoint)
	if err != nil {
		return 0, err
	}
	n, err := metricSum(mfs, "etcd_disk_wal_fsync_duration_seconds")
	return int64(n), err
}
