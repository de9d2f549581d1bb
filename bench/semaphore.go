package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// wlSemaphore is the counted-lock workload, outside the standard suite
// (-workloads semaphore): -waiters slots on -hot keys, each key a
// semaphore of -sem-limit permits, every slot looping acquire a permit
// (wait up to -wait) → hold it -sem-hold → release. The same state
// machine drives every target, each with its own semaphore:
//
//   - lockd: S with the limit (PROTOCOL.md §9.2), queued by the server
//     (FIFO), R to release — raw frames, like the other lockd workloads;
//   - Redis: Redisson's RPermitExpirableSemaphore, as Lua scripts run by
//     EVALSHA (semaphore_redis.go): permits with an expiry, so a crashed
//     client's permit comes back; no server-side queue, so a refused slot
//     waits for a release's notification (pub/sub) or the nearest
//     permit's expiry, then tries again, as Redisson's client does;
//   - etcd: a FIFO semaphore built the way concurrency.Mutex is
//     (semaphore_etcd.go): a key per waiter under the semaphore's prefix,
//     on the waiter's session lease; the first limit keys by creation
//     revision hold the permits; a waiter watches the prefix's deletions.
//
// It reports grants/s, the wait (first attempt → grant, the whole wait
// with every retry), the fairness per key, and what the load generator
// saw of the limit: the most holders of one key at once and how many
// grants went beyond the limit (0 on a correct semaphore). A holder is
// counted from the moment its grant is read until its release is issued,
// a span inside the server's own, so the count can only be lower than the
// server's, never higher: a grant beyond the limit is the server's.
const wlSemaphore = "semaphore"

// semaphore is the workload's state.
type semaphore struct {
	*contended // the hot keys, the wait, per-waiter grants and fairness

	limit   uint16
	hold    time.Duration
	held    []atomic.Int32 // per key: holders now, as the load generator sees them
	maxHeld []atomic.Int32 // per key: the most at once
	over    atomic.Int64   // grants that found the key's count at the limit already
	// gen[s.id] counts slot s's sleeps after a refusal (guarded by the
	// slot's connection, like the rest of a slot's state): a notification
	// registered for one sleep must not cut short a later one.
	gen    []uint64
	notify []*semNotifier // Redis: one subscriber per connection (nil: none)
}

func newSemaphore(clk *clock, cfg *config, retry time.Duration) *semaphore {
	w := &semaphore{contended: newContended(clk, cfg.Hot, cfg.Waiters, cfg.Wait, retry),
		limit: uint16(cfg.SemLimit), hold: cfg.SemHold,
		held: make([]atomic.Int32, cfg.Hot), maxHeld: make([]atomic.Int32, cfg.Hot), gen: make([]uint64, cfg.Waiters)}
	for i := range w.hot {
		w.hot[i] = []byte("bench/sem/" + strconv.Itoa(i))
	}
	return w
}

func (w *semaphore) acquire(s *slot) action {
	a := w.contended.acquire(s)
	a.limit = w.limit
	return a
}

func (w *semaphore) first(s *slot, now time.Duration) action {
	s.waitStart = now
	return w.acquire(s)
}

// again starts slot s's next acquire loop, or ends it once the run stops.
func (w *semaphore) again(s *slot, now time.Duration) action {
	if w.clk.stopping(now) {
		return action{}
	}
	s.waitStart = now
	return w.acquire(s)
}

func (w *semaphore) next(s *slot, a *answer, now time.Duration, st *stats) action {
	in := w.clk.inWindow(now)
	k := w.hotIndex(s)
	switch a.kind {
	case ansGranted:
		n := w.held[k].Add(1)
		if n > int32(w.limit) {
			w.over.Add(1)
		}
		for m := w.maxHeld[k].Load(); n > m && !w.maxHeld[k].CompareAndSwap(m, n); m = w.maxHeld[k].Load() {
		}
		if in {
			st.ops++
			st.acq.Record(now - s.waitStart)
			w.grants[s.id].Add(1)
		}
		s.token = a.token
		if w.hold > 0 {
			return action{op: opWake, delay: w.hold}
		}
		return w.release(s, k)
	case ansWake:
		if s.token != 0 { // the hold is over
			return w.release(s, k)
		}
		// A refused slot's sleep ended (a notification or its timer).
		if now-s.waitStart >= w.wait || w.clk.stopping(now) {
			if in {
				st.timeouts++
			}
			return w.again(s, now)
		}
		return w.acquire(s)
	case ansRefused:
		if w.retry > 0 && now-s.waitStart < w.wait && !w.clk.stopping(now) {
			if in {
				st.refused++
			}
			return w.sleep(s, k, a.token, now)
		}
		if in {
			st.timeouts++
		}
	case ansReleased:
	case ansNotHeld:
		st.notHeld++
	default:
		st.errs++
	}
	s.token = 0
	return w.again(s, now)
}

// release ends slot s's hold of key k: it stops counting as a holder now,
// just before its release is sent.
func (w *semaphore) release(s *slot, k int) action {
	w.held[k].Add(-1)
	tok := s.token
	s.token = 0
	return action{op: opRelease, key: s.key, token: tok, limit: w.limit}
}

// sleep is a refused slot's wait on a target without a queue (Redis): until
// a release is announced on the key's channel, the nearest permit's expiry
// (expiresMs, wall-clock milliseconds; 0 if none was told) or the end of
// the wait, whichever comes first — Redisson's tryAcquire loop.
func (w *semaphore) sleep(s *slot, k int, expiresMs uint64, now time.Duration) action {
	d := w.wait - (now - s.waitStart)
	if expiresMs > 0 {
		d = min(d, max(0, time.Until(time.UnixMilli(int64(expiresMs)))))
	}
	w.gen[s.id]++
	if n := w.notifier(s); n != nil && n.wait(s, k, w.gen[s.id]) {
		return w.acquire(s) // a release was announced while it was not waiting
	}
	return action{op: opWake, delay: d}
}

// notifier returns the subscriber of slot s's connection (nil: none).
func (w *semaphore) notifier(s *slot) *semNotifier {
	if len(w.notify) == 0 {
		return nil
	}
	return w.notify[s.id%len(w.notify)]
}

// wakeEarly cuts slot s's sleep short if it is still the sleep gen, and
// hands it its ansWake; false if that sleep is over (the slot woke on its
// own or is doing something else now).
func (w *semaphore) wakeEarly(s *slot, gen uint64) bool {
	c := s.conn
	c.mu.Lock()
	if c.closed || w.gen[s.id] != gen || s.wake == nil || !s.wake.Stop() {
		c.mu.Unlock()
		return false
	}
	s.wake = nil
	c.mu.Unlock()
	c.woken(s)
	return true
}

// maxHolders returns the most holders any key had at once.
func (w *semaphore) maxHolders() int {
	m := int32(0)
	for i := range w.maxHeld {
		m = max(m, w.maxHeld[i].Load())
	}
	return int(m)
}

// runSemaphore runs the semaphore workload on t.
func runSemaphore(t *target, cfg *config, res *Result) error {
	res.Unit = "grants/s"
	groups := makeSlots(cfg.Waiters, min(cfg.Conns, cfg.Waiters), rand.Uint64())
	var clk clock
	retry := time.Duration(0)
	if !t.queues {
		retry = cfg.Retry // only a flag: a refused slot sleeps until notified (sleep)
	}
	w := newSemaphore(&clk, cfg, retry)
	if setup := semSetupFor(t); setup != nil {
		stop, err := setup(w, len(groups))
		if err != nil {
			return err
		}
		defer stop()
	}
	st, err := drive(t, cfg, &clk, warmOf(cfg), w, groups, 64<<10, nil)
	if err != nil {
		return err
	}
	res.fill(st, &clk)
	res.Limit, res.MaxHolders, res.OverLimit = int(w.limit), w.maxHolders(), w.over.Load()
	res.Jain, res.MinGrants, res.MaxGrants = w.fairness()
	for _, n := range w.notify {
		res.Notified += n.woke.Load()
	}
	if res.OverLimit > 0 && cfg.Progress != nil {
		cfg.Progress(fmt.Sprintf("    %s: %d grants beyond the limit of %d (at most %d holders of one key at once)", t.name, res.OverLimit, w.limit, res.MaxHolders))
	}
	return nil
}

// semRows is one row per semaphore result: what the load generator saw of
// the limit, beside the figures of the summary table.
func semRows(rs []*Result, cfg *config) (head []string, rows [][]string) {
	head = []string{"target", "round", "grants/s", "wait p50", "wait p99", "Jain", "most holders of a key at once", "grants beyond the limit", "retries", "woken by a notification", "permits busy"}
	for _, r := range rs {
		if r.Workload != wlSemaphore || r.Skipped != "" {
			continue
		}
		busy := "-"
		if cfg.SemHold > 0 && cfg.Hot > 0 && r.Limit > 0 {
			// grants/s × hold = permits held on average, over the permits there are.
			busy = fmt.Sprintf("%.0f %%", 100*r.Rate*cfg.SemHold.Seconds()/float64(cfg.Hot*r.Limit))
		}
		rows = append(rows, []string{r.Target, fmt.Sprint(r.Round), si(r.Rate), dur(r.Latency.P50), dur(r.Latency.P99),
			fmt.Sprintf("%.3f", r.Jain), fmt.Sprintf("%d of %d", r.MaxHolders, r.Limit), fmt.Sprint(r.OverLimit),
			fmt.Sprint(r.Refused), fmt.Sprint(r.Notified), busy})
	}
	return head, rows
}

// semNotifier is one connection's subscriber to the semaphores' channels
// (Redis): Redisson's SemaphorePubSub. A release publishes the permits now
// free; the subscriber wakes that many of its connection's sleeping
// waiters of the key, oldest first, and keeps what is left over as
// credit (Redisson's latch) for the next waiter to go to sleep, which
// then tries again at once. Every connection subscribes, as every
// Redisson client does, so one release wakes a waiter on each.
type semNotifier struct {
	w    *semaphore
	keys map[string]int // channel → hot key index
	nc   interface{ Close() error }
	done chan struct{}
	woke atomic.Int64 // sleeps cut short by a notification

	mu      sync.Mutex
	waiting [][]semWaiter // per key, in the order they went to sleep
	credit  []int         // per key: announced permits nobody was waiting for
	room    []int         // per key: the most credit kept (this connection's waiters of the key)
}

// semWaiter is one sleep of one slot.
type semWaiter struct {
	s   *slot
	gen uint64
}

// wait registers slot s's sleep gen on key k; true if a credit was there
// to take instead (the slot tries again at once).
func (n *semNotifier) wait(s *slot, k int, gen uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.credit[k] > 0 {
		n.credit[k]--
		return true
	}
	n.waiting[k] = append(n.waiting[k], semWaiter{s, gen})
	return false
}

// announce wakes up to permits sleeping waiters of key k, oldest first;
// what is left becomes credit.
func (n *semNotifier) announce(k, permits int) {
	for permits > 0 {
		n.mu.Lock()
		if len(n.waiting[k]) == 0 {
			n.credit[k] = min(n.credit[k]+permits, n.room[k])
			n.mu.Unlock()
			return
		}
		x := n.waiting[k][0]
		n.waiting[k] = n.waiting[k][1:]
		n.mu.Unlock()
		if n.w.wakeEarly(x.s, x.gen) { // takes the slot's connection lock: not under n.mu
			n.woke.Add(1)
			permits--
		}
	}
}
