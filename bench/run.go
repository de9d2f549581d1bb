package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// opKind is what a slot asks its target to do next.
type opKind uint8

const (
	opNone    opKind = iota // the slot is done
	opAcquire               // acquire key with wait and lease
	opRelease               // release key with token
	opRenew                 // renew key's lease with token
	opWake                  // call the workload again after delay, sending nothing
)

// action is one step of a slot: a request to send, or a pause.
type action struct {
	op    opKind
	key   []byte // valid until the action is encoded
	wait  uint8  // seconds the server may queue an acquire (lockd only)
	lease uint8  // seconds
	token uint64
	delay time.Duration // opWake
	limit uint16        // acquire, release: a semaphore's permits (0: an exclusive lock)
}

// ansKind classifies an answer in target-neutral terms.
type ansKind uint8

const (
	ansGranted  ansKind = iota + 1 // lockd A, Redis +OK, etcd txn succeeded
	ansRefused                     // lockd T/B, Redis nil, etcd txn failed
	ansReleased                    // lockd R, Redis :1, etcd deleted 1
	ansNotHeld                     // lockd N, Redis :0, etcd compare failed
	ansRenewed                     // lockd K, Redis :1 on renew
	ansError                       // lockd E, Redis -ERR, HTTP failure
	ansWake                        // an opWake's delay passed
)

// answer is a decoded reply, routed to the slot that asked.
type answer struct {
	kind  ansKind
	slot  int
	token uint64
}

// slot is one logical client: at most one request in flight at a time.
type slot struct {
	id        int    // index over the whole run
	local     int    // index within its connection
	key       []byte // the key it acquires or holds
	token     uint64
	sentAt    time.Duration // when the current request was issued
	waitStart time.Duration // when the current acquire loop started
	rng       *rand.Rand
	conn      *pconn      // the pipelined connection carrying it (nil for etcd)
	wake      *time.Timer // its pending opWake, while it sleeps (guarded by conn.mu)
}

// stats collects what one connection (or one synchronous slot) measured
// inside the window; merged at the end of a run.
type stats struct {
	acq      *Hist // acquire latency (renew latency for fanin)
	handoff  *Hist
	ops      int64 // pairs (uncontended), grants (contended), renews (fanin)
	handoffs int64
	refused  int64
	timeouts int64
	notHeld  int64
	errs     int64
	lost     int64
}

func newStats() *stats { return &stats{acq: NewHist(), handoff: NewHist()} }

// statShard is a stats shared by several connections (a histogram is 264 KiB:
// fanin's 10,000 connections share 64 of them).
type statShard struct {
	mu sync.Mutex
	st *stats
}

// newShards returns n shards.
func newShards(n int) []*statShard {
	sh := make([]*statShard, n)
	for i := range sh {
		sh[i] = &statShard{st: newStats()}
	}
	return sh
}

// mergeShards sums the shards.
func mergeShards(sh []*statShard) *stats {
	st := newStats()
	for _, s := range sh {
		s.mu.Lock()
		st.merge(s.st)
		s.mu.Unlock()
	}
	return st
}

func (s *stats) merge(o *stats) {
	s.acq.Merge(o.acq)
	s.handoff.Merge(o.handoff)
	s.ops += o.ops
	s.handoffs += o.handoffs
	s.refused += o.refused
	s.timeouts += o.timeouts
	s.notHeld += o.notHeld
	s.errs += o.errs
	s.lost += o.lost
}

// clock is the monotonic time base shared by every connection of a run.
type clock struct {
	epoch   time.Time
	warm    time.Duration // measuring starts here
	stopAt  time.Duration // and ends here; no new work is started after it
	hardEnd time.Time     // connections still busy then are abandoned
}

func (c *clock) now() time.Duration            { return time.Since(c.epoch) }
func (c *clock) inWindow(t time.Duration) bool { return t >= c.warm && t < c.stopAt }
func (c *clock) stopping(t time.Duration) bool { return t >= c.stopAt }

// workload is the per-slot state machine every target is driven by.
type workload interface {
	// first returns slot s's first action.
	first(s *slot, now time.Duration) action
	// next takes the answer to s's last action, records what it measures in
	// st, and returns the next action (opNone when s is done).
	next(s *slot, a *answer, now time.Duration, st *stats) action
}

// codec encodes actions and decodes answers for one pipelined connection.
// Calls are serialized by the connection.
type codec interface {
	encode(dst []byte, s *slot, a action) []byte
	// decode parses one answer: (n, nil), (0, errIncomplete) or a fatal error.
	decode(in []byte, a *answer) (int, error)
}

var errIncomplete = errors.New("incomplete")

// pconn is one pipelined connection carrying several slots.
type pconn struct {
	nc     net.Conn
	cd     codec
	w      workload
	clk    *clock
	slots  []*slot
	bufLen int

	mu     sync.Mutex // guards everything below, and writes; taken before sh.mu
	out    []byte
	sh     *statShard
	active int
	closed bool
	err    error
}

func newPconn(nc net.Conn, cd codec, w workload, clk *clock, slots []*slot, bufLen int, sh *statShard) *pconn {
	c := &pconn{nc: nc, cd: cd, w: w, clk: clk, slots: slots, bufLen: bufLen, sh: sh, active: len(slots)}
	for i, s := range slots {
		s.local, s.conn = i, c
	}
	return c
}

// start issues every slot's first action and flushes them.
func (c *pconn) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.now()
	for _, s := range c.slots {
		c.issue(s, c.w.first(s, now))
	}
	return c.flush()
}

// issue encodes a (mu held).
func (c *pconn) issue(s *slot, a action) {
	switch a.op {
	case opNone:
		c.active--
		if c.active == 0 {
			// Wake the reader if it is blocked.
			c.nc.SetReadDeadline(time.Now())
		}
	case opWake:
		s.wake = time.AfterFunc(a.delay, func() { c.woken(s) })
	default:
		s.sentAt = c.clk.now()
		c.out = c.cd.encode(c.out, s, a)
	}
}

// woken hands slot s its ansWake: its opWake's delay passed, or a
// notification cut it short (pconn.notify).
func (c *pconn) woken(s *slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.wake = nil
	if c.closed {
		return
	}
	now := c.clk.now()
	c.sh.mu.Lock()
	a := c.w.next(s, &answer{kind: ansWake, slot: s.local}, now, c.sh.st)
	c.sh.mu.Unlock()
	c.issue(s, a)
	if err := c.flush(); err != nil && c.err == nil {
		c.err = err
	}
}

// flush writes the pending requests (mu held).
func (c *pconn) flush() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.out)
	c.out = c.out[:0]
	return err
}

// loop reads answers until every slot is done or the hard end passes.
func (c *pconn) loop() error {
	buf := make([]byte, c.bufLen)
	r, w := 0, 0
	c.nc.SetReadDeadline(c.clk.hardEnd)
	var a answer
	for {
		c.mu.Lock()
		done, err := c.active == 0, c.err
		c.mu.Unlock()
		if done || err != nil {
			return err
		}
		if w == len(buf) {
			if r == 0 {
				return errors.New("answer larger than the read buffer")
			}
			w = copy(buf, buf[r:w])
			r = 0
		}
		n, err := c.nc.Read(buf[w:])
		w += n
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.mu.Lock()
				busy := c.active
				c.mu.Unlock()
				if busy == 0 {
					return nil
				}
				if time.Now().Before(c.clk.hardEnd) {
					c.nc.SetReadDeadline(c.clk.hardEnd)
					continue
				}
				return fmt.Errorf("%d slots still busy at the hard end", busy)
			}
			return err
		}
		c.mu.Lock()
		c.sh.mu.Lock()
		now := c.clk.now()
		for r < w {
			k, err := c.cd.decode(buf[r:w], &a)
			if err == errIncomplete {
				break
			}
			if err != nil {
				c.sh.mu.Unlock()
				c.mu.Unlock()
				return err
			}
			r += k
			if a.slot < 0 || a.slot >= len(c.slots) {
				c.sh.mu.Unlock()
				c.mu.Unlock()
				return fmt.Errorf("answer for unknown slot %d", a.slot)
			}
			s := c.slots[a.slot]
			c.issue(s, c.w.next(s, &a, now, c.sh.st))
		}
		c.sh.mu.Unlock()
		if r == w {
			r, w = 0, 0
		}
		err = c.flush()
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// close stops timers from writing and closes the socket.
func (c *pconn) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.nc.Close()
}

// ---- workloads ----

// uncontended: acquire a random key (wait 0), release it with its token.
// Key names are formatted into the slot's buffer: a table of a million
// strings would cost the load generator two cache misses per request.
type uncontended struct {
	clk  *clock
	keys int
}

func (u *uncontended) acquire(s *slot) action {
	s.key = strconv.AppendUint(append(s.key[:0], "bench/key/"...), uint64(s.rng.IntN(u.keys)), 10)
	return action{op: opAcquire, key: s.key, wait: 0, lease: 30}
}

func (u *uncontended) first(s *slot, now time.Duration) action { return u.acquire(s) }

func (u *uncontended) next(s *slot, a *answer, now time.Duration, st *stats) action {
	in := u.clk.inWindow(now)
	switch a.kind {
	case ansGranted:
		if in {
			st.acq.Record(now - s.sentAt)
		}
		s.token = a.token
		return action{op: opRelease, key: s.key, token: s.token}
	case ansReleased:
		if in {
			st.ops++
		}
	case ansRefused:
		if in {
			st.refused++
		}
	case ansNotHeld:
		st.notHeld++
	default:
		st.errs++
	}
	if u.clk.stopping(now) {
		return action{}
	}
	return u.acquire(s)
}

// contended: W waiters loop acquire(wait) → release on H hot keys. A target
// without a wait queue (retry > 0) retries a refused acquire after a jittered
// retry delay, as redsync does, until the wait is spent.
type contended struct {
	clk    *clock
	hot    [][]byte
	relAt  []atomic.Int64 // per hot key: when its last release was issued
	wait   time.Duration
	retry  time.Duration // 0: the server queues
	waitS  uint8
	grants []atomic.Int64 // per waiter, inside the window (for fairness)
}

func newContended(clk *clock, hot, waiters int, wait, retry time.Duration) *contended {
	c := &contended{clk: clk, hot: make([][]byte, hot), relAt: make([]atomic.Int64, hot),
		wait: wait, retry: retry, waitS: uint8(min(255, (wait+time.Second-1)/time.Second)),
		grants: make([]atomic.Int64, waiters)}
	for i := range c.hot {
		c.hot[i] = []byte("bench/hot/" + strconv.Itoa(i))
	}
	for i := range c.relAt {
		c.relAt[i].Store(-1)
	}
	return c
}

func (c *contended) hotIndex(s *slot) int { return s.id % len(c.hot) }

func (c *contended) acquire(s *slot) action {
	s.key = c.hot[c.hotIndex(s)]
	w := c.waitS
	if c.retry > 0 {
		w = 0
	}
	return action{op: opAcquire, key: s.key, wait: w, lease: 10}
}

func (c *contended) first(s *slot, now time.Duration) action {
	s.waitStart = now
	return c.acquire(s)
}

func (c *contended) next(s *slot, a *answer, now time.Duration, st *stats) action {
	in := c.clk.inWindow(now)
	switch a.kind {
	case ansGranted:
		k := c.hotIndex(s)
		if in {
			st.ops++
			st.acq.Record(now - s.waitStart)
			c.grants[s.id].Add(1)
			// A real handoff: this waiter was already waiting when the key
			// was last released; the latency runs from that release being
			// issued to this grant being read.
			if rel := time.Duration(c.relAt[k].Load()); rel >= 0 && s.waitStart < rel {
				st.handoffs++
				st.handoff.Record(now - rel)
			}
		}
		s.token = a.token
		c.relAt[k].Store(int64(c.clk.now()))
		return action{op: opRelease, key: s.key, token: s.token}
	case ansRefused:
		if c.retry > 0 && now-s.waitStart < c.wait && !c.clk.stopping(now) {
			if in {
				st.refused++
			}
			d := c.retry/2 + time.Duration(s.rng.Int64N(int64(c.retry)))
			return action{op: opWake, delay: d}
		}
		if in {
			st.timeouts++
		}
	case ansWake:
		if c.clk.stopping(now) {
			return action{}
		}
		return c.acquire(s)
	case ansReleased:
	case ansNotHeld:
		st.notHeld++
	default:
		st.errs++
	}
	if c.clk.stopping(now) {
		return action{}
	}
	s.waitStart = now
	return c.acquire(s)
}

// fairness returns Jain's index (Σx)²/(n·Σx²) of the grants per waiter
// within each hot key — FIFO is a promise per key, and keys can run at
// different rates — taking the worst key, and the min and max grants of any
// waiter. 1 means every waiter of a key was granted equally often.
func (c *contended) fairness() (jain float64, lo, hi int64) {
	jain, lo = 1, -1
	for k := range c.hot {
		var sum, sq float64
		n := 0
		for i := k; i < len(c.grants); i += len(c.hot) {
			g := c.grants[i].Load()
			sum += float64(g)
			sq += float64(g) * float64(g)
			n++
			if lo < 0 || g < lo {
				lo = g
			}
			hi = max(hi, g)
		}
		if n == 0 {
			continue
		}
		j := 0.0
		if sq > 0 {
			j = sum * sum / (float64(n) * sq)
		}
		jain = min(jain, j)
	}
	return jain, max(lo, 0), hi
}

// fanin: every slot (one per connection) holds its own key with a short
// lease and renews it every renew interval; at the end it releases.
type fanin struct {
	clk     *clock
	lease   uint8
	renew   time.Duration
	held    atomic.Int64
	maxHeld atomic.Int64
}

func (f *fanin) first(s *slot, now time.Duration) action {
	s.key = []byte("bench/fanin/" + strconv.Itoa(s.id))
	return action{op: opAcquire, key: s.key, lease: f.lease}
}

func (f *fanin) next(s *slot, a *answer, now time.Duration, st *stats) action {
	in := f.clk.inWindow(now)
	switch a.kind {
	case ansGranted:
		s.token = a.token
		n := f.held.Add(1)
		for m := f.maxHeld.Load(); n > m && !f.maxHeld.CompareAndSwap(m, n); m = f.maxHeld.Load() {
		}
		return action{op: opWake, delay: f.renew}
	case ansRenewed:
		if in {
			st.ops++
			st.acq.Record(now - s.sentAt)
		}
		return action{op: opWake, delay: f.renew}
	case ansWake:
		if f.clk.stopping(now) {
			return action{op: opRelease, key: s.key, token: s.token}
		}
		return action{op: opRenew, key: s.key, token: s.token, lease: f.lease}
	case ansNotHeld:
		st.lost++
		f.held.Add(-1)
	case ansReleased:
		f.held.Add(-1)
	case ansRefused:
		st.refused++
	default:
		st.errs++
	}
	return action{}
}
