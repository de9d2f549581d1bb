package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/fence"
	"github.com/lockd-dev/lockd/internal/history"
)

// resource is the fenced resource: an in-process store of one record per
// key, guarded by a fence.Checker, whose every decision is recorded with
// its order. The check and the write are one step (Checker.Do). The
// semaphore keys have a counted fence instead (semaphore.go).
type resource struct {
	rec   *history.Recorder
	fence fence.Checker

	mu      sync.Mutex // orders decisions: seq is the order the checker sees them in
	seq     uint64
	counted map[string]*countedKey // the semaphore keys' counted fences
}

func newResource(rec *history.Recorder) *resource {
	return &resource{rec: rec, counted: map[string]*countedKey{}}
}

// write has the fence judge worker's write under key with token, and
// records the decision; true if accepted.
func (r *resource) write(worker, grant int, key string, token uint64, late bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := r.rec.Now()
	// What is written does not matter: the checkers read the fence's
	// decisions, recorded below.
	err := r.fence.Do(key, token, func() error { return nil })
	r.seq++
	op := history.Op{Worker: worker, Kind: history.Write, Key: key, Token: token, Call: call, Return: r.rec.Now(),
		Outcome: history.OK, Grant: grant, Seq: r.seq, Late: late}
	if err != nil {
		op.Outcome, op.Detail = history.Fail, history.DetailStale
	}
	r.rec.Add(op)
	return err == nil
}

// classify maps a client error to an outcome and its detail.
func classify(err error) (history.Outcome, string) {
	var se *client.ServerError
	switch {
	case err == nil:
		return history.OK, ""
	case errors.Is(err, client.ErrIndeterminate): // before ErrClosed: a closed call may match both
		return history.Unknown, "indeterminate"
	case errors.Is(err, client.ErrTimeout):
		return history.Fail, history.DetailTimeout
	case errors.Is(err, client.ErrBusy):
		return history.Fail, history.DetailBusy
	case errors.Is(err, client.ErrNotHeld):
		return history.Fail, history.DetailNotHeld
	case errors.Is(err, client.ErrNoConnection):
		return history.Fail, history.DetailNoConn
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client returns ctx.Err() only for a request it did not send.
		return history.Fail, "not sent: " + err.Error()
	case errors.Is(err, client.ErrClosed):
		return history.Fail, "closed"
	case errors.As(err, &se):
		return history.Fail, se.Error()
	}
	return history.Unknown, err.Error()
}

// expected reports whether a failure's detail is one the protocol allows
// under faults (the rest — a server error, an unknown error — are
// anomalies the report counts).
func expected(out history.Outcome, detail string) bool {
	switch detail {
	case "", "indeterminate", history.DetailTimeout, history.DetailBusy, history.DetailNotHeld,
		history.DetailNoConn, "closed":
		return true
	}
	return out == history.Fail && len(detail) > 9 && detail[:9] == "not sent:"
}

// workload is the workers' shared setup.
type workload struct {
	cfg   Config
	rec   *history.Recorder
	res   *resource
	keys  []string               // the mutex workers' keys
	sem   []string               // the semaphore workers' keys, each of cfg.SemLimit permits
	addrs func(loc int) []string // every member's address, as a client at location loc reaches it

	mu        sync.Mutex
	anomalies []string // the first few, for the report
	anomalyN  int      // all of them
}

func keyName(i int) string { return "chaos/" + strconv.Itoa(i) }

func newWorkload(cfg Config, rec *history.Recorder, res *resource, addrs func(int) []string) *workload {
	w := &workload{cfg: cfg, rec: rec, res: res, addrs: addrs}
	for i := range cfg.Keys {
		w.keys = append(w.keys, keyName(i))
	}
	for i := range cfg.SemKeys {
		w.sem = append(w.sem, semKeyName(i))
	}
	return w
}

func (w *workload) anomaly(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.anomalyN++
	if len(w.anomalies) < history.MaxViolations {
		w.anomalies = append(w.anomalies, fmt.Sprintf(format, args...))
	}
}

// newClient returns a client at location loc (on member loc's side of a
// partition) given every member's address through that location's
// proxies, with the library's defaults.
func (w *workload) newClient(loc int) (*client.Client, error) {
	cfg := client.Config{Addrs: w.addrs(loc), TLS: w.cfg.clientTLS}
	if w.cfg.Mode == api.ModeSingle {
		// One node: every restart is an outage for every client, which
		// then waits for its redial; at the default 3 s most of a short
		// run would be spent waiting, and the checkers would see little.
		cfg.ReconnectInterval = singleReconnect
	}
	return client.New(cfg)
}

// singleReconnect is the clients' ReconnectInterval in single mode.
const singleReconnect = 250 * time.Millisecond

// worker is one client process of the workload.
type worker struct {
	w   *workload
	id  int
	cl  *client.Client
	rng *rand.Rand
}

// note records an operation's outcome as an anomaly when the protocol
// does not allow it under faults.
func (k *worker) note(op history.Op) {
	if !expected(op.Outcome, op.Detail) {
		k.w.anomaly("worker %d: %s", k.id, op)
	}
}

// acquire runs one acquire — a permit of a semaphore of limit permits
// (AcquireShared) when limit > 0 — and records it; it returns the op's ID
// and the lock (zero unless granted).
func (k *worker) acquire(key string, wait time.Duration, limit int) (int, client.Lock) {
	lease := k.w.cfg.Lease
	call := k.w.rec.Now()
	opts := client.AcquireOptions{Wait: wait, Lease: lease}
	var (
		l   client.Lock
		err error
	)
	if limit > 0 {
		l, err = k.cl.AcquireShared(context.Background(), key, limit, opts)
	} else {
		l, err = k.cl.Acquire(context.Background(), key, opts)
	}
	op := history.Op{Worker: k.id, Kind: history.Acquire, Key: key, Lease: lease, Wait: wait, Limit: limit,
		Call: call, Return: k.w.rec.Now(), Grant: -1}
	op.Outcome, op.Detail = classify(err)
	if err == nil {
		op.Token, op.Expires = l.Token, k.w.rec.At(l.Expires)
	}
	k.note(op)
	return k.w.rec.Add(op), l
}

// renew runs one renew of grant g's lock, bounded by ctx, and records it.
// It returns the lock with its new lease (l itself unless answered K) and
// whether the server answered N (the lock is gone).
func (k *worker) renew(ctx context.Context, g int, l client.Lock) (client.Lock, bool) {
	lease := k.w.cfg.Lease
	call := k.w.rec.Now()
	nl, err := k.cl.Renew(ctx, l, lease)
	op := history.Op{Worker: k.id, Kind: history.Renew, Key: l.Key, Token: l.Token, Lease: lease,
		Call: call, Return: k.w.rec.Now(), Grant: g}
	op.Outcome, op.Detail = classify(err)
	if err == nil {
		op.Expires = k.w.rec.At(nl.Expires)
	} else {
		nl = l
	}
	k.note(op)
	k.w.rec.Add(op)
	return nl, op.Detail == history.DetailNotHeld
}

// release releases grant g's lock and records it.
func (k *worker) release(g int, l client.Lock) history.Outcome {
	call := k.w.rec.Now()
	err := k.cl.Release(context.Background(), l)
	op := history.Op{Worker: k.id, Kind: history.Release, Key: l.Key, Token: l.Token,
		Call: call, Return: k.w.rec.Now(), Grant: g}
	op.Outcome, op.Detail = classify(err)
	k.note(op)
	k.w.rec.Add(op)
	return op.Outcome
}

// Workload shape.
const (
	writeMargin = 50 * time.Millisecond // no write closer than this to the lease's conservative end
	lateChance  = 0.02                  // a holder that pauses past its lease, then writes
	longChance  = 0.05                  // a hold of half the lease to the lease, kept by renewals
	renewChance = 0.25                  // a renewal during a short hold
)

// run loops until stop is closed: acquire a random key of keys — a
// permit of it when limit > 0 — hold it (write, renew), release it.
func (k *worker) run(stop <-chan struct{}, keys []string, limit int) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		key := keys[k.rng.IntN(len(keys))]
		var wait time.Duration
		if k.rng.Float64() >= 0.3 {
			wait = 500*time.Millisecond + time.Duration(k.rng.Int64N(int64(1500*time.Millisecond)))
		}
		g, l := k.acquire(key, wait, limit)
		if l.Token == 0 {
			k.pause(stop, 20*time.Millisecond+time.Duration(k.rng.Int64N(int64(150*time.Millisecond))))
			continue
		}
		k.hold(stop, g, l, limit)
		k.pause(stop, time.Duration(k.rng.Int64N(int64(20*time.Millisecond))))
	}
}

// put writes to the resource under grant g's lock: through the counted
// fence, declaring the lease's end, for a permit of a semaphore of limit
// permits (limit > 0), else through the fence of one holder.
func (k *worker) put(g int, l client.Lock, limit int, late bool) bool {
	if limit > 0 {
		return k.w.res.writeCounted(k.id, g, l.Key, limit, l.Token, k.w.rec.At(l.Expires), late)
	}
	return k.w.res.write(k.id, g, l.Key, l.Token, late)
}

// hold works under grant g: writes spread over the hold, renewals when the
// hold needs them (and sometimes when it does not), then the release. A
// few holders pause past the lease's end and write late, as a holder
// stalled by a GC pause or a swap storm would; fencing must turn them away
// once a successor has written. A semaphore's holder (limit > 0) tells the
// counted fence it is done before it releases.
func (k *worker) hold(stop <-chan struct{}, g int, l client.Lock, limit int) {
	lease := k.w.cfg.Lease
	var holdFor time.Duration
	switch r := k.rng.Float64(); {
	case r < longChance:
		holdFor = lease/2 + time.Duration(k.rng.Int64N(int64(lease/2)))
	default:
		holdFor = 10*time.Millisecond + time.Duration(k.rng.ExpFloat64()*float64(80*time.Millisecond))
		holdFor = min(holdFor, lease/3)
	}
	late := k.rng.Float64() < lateChance
	renewOnce := k.rng.Float64() < renewChance
	writes := 1 + k.rng.IntN(4)
	began := time.Now()
	end := began.Add(holdFor)
	for i := range writes {
		at := began.Add(holdFor * time.Duration(i) / time.Duration(writes))
		if !k.sleepUntil(stop, at) {
			break
		}
		if renewOnce || time.Until(l.Expires) < lease*2/3 {
			renewOnce = false
			ctx, cancel := context.WithDeadline(context.Background(), l.Expires.Add(-writeMargin))
			nl, gone := k.renew(ctx, g, l)
			cancel()
			if gone {
				break // N: the lock is lost; stop writing
			}
			l = nl
		}
		if time.Now().After(l.Expires.Add(-writeMargin)) {
			break // the lease may be over: a careful holder stops
		}
		k.put(g, l, limit, false)
	}
	if late {
		if k.sleepUntil(stop, l.Expires.Add(50*time.Millisecond+time.Duration(k.rng.Int64N(int64(450*time.Millisecond))))) {
			k.put(g, l, limit, true)
		}
	} else {
		k.sleepUntil(stop, end)
	}
	if limit > 0 {
		k.w.res.leave(k.id, g, l.Key, l.Token)
	}
	k.release(g, l)
}

// sleepUntil sleeps until t; false if stop was closed first.
func (k *worker) sleepUntil(stop <-chan struct{}, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-stop:
		return false
	}
}

func (k *worker) pause(stop <-chan struct{}, d time.Duration) { k.sleepUntil(stop, time.Now().Add(d)) }
