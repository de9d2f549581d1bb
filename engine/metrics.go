package engine

import (
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// Request results counted per op.
const (
	resGranted = iota
	resTimeout
	resBusy
	resQueued
	resReleased
	resRenewed
	resNotHeld
	resPong
	resError
	resMoved
	resWelcome
	resValid     // V: the token holds a grant
	resWatching  // W: registered
	resInspected // I
	nResults
)

var resultNames = [nResults]string{"granted", "timeout", "busy", "queued", "released", "renewed", "not_held", "pong", "error", "moved", "welcome",
	"valid", "watching", "inspected"}

// counts is one batch's tally, kept in its scratch (no atomics) and added
// to its loop's stats once per batch.
type counts struct {
	req  [len(proto.RequestOps)][nResults]uint32
	errs [proto.MaxCode + 1]uint32 // by E code (index 0 unused)
	auth [nAuth]uint32             // ACL refusals by kind (auth.go)
	any  bool
}

func (c *counts) request(op proto.Op, res int) {
	if i := op.RequestIndex(); i >= 0 {
		c.req[i][res]++
	}
	c.any = true
}

func (c *counts) error(op proto.Op, code uint8) {
	c.request(op, resError)
	c.errs[code]++
}

// loopStats are one event loop's counters: written by that loop only (one
// atomic add per non-zero cell per batch), read by scrapes.
type loopStats struct {
	req  [len(proto.RequestOps)][nResults]atomic.Uint64
	errs [proto.MaxCode + 1]atomic.Uint64
	auth [nAuth]atomic.Uint64
	_    [64]byte
}

func (l *loopStats) add(c *counts) {
	if !c.any {
		return
	}
	for i := range c.req {
		for j, n := range c.req[i] {
			if n != 0 {
				l.req[i][j].Add(uint64(n))
			}
		}
	}
	for code, n := range c.errs {
		if n != 0 {
			l.errs[code].Add(uint64(n))
		}
	}
	for k, n := range c.auth {
		if n != 0 {
			l.auth[k].Add(uint64(n))
		}
	}
	*c = counts{}
}

// statsFor returns the counters of c's event loop.
func (s *Server) statsFor(loop gnet.EventLoop) *loopStats {
	if v, ok := s.loops.Load(loop); ok {
		return v.(*loopStats)
	}
	v, _ := s.loops.LoadOrStore(loop, new(loopStats))
	return v.(*loopStats)
}

// WaitBuckets are the upper bounds, in seconds, of the acquire-to-grant
// histogram.
var WaitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 255}

// waitHist is the acquire-to-grant histogram of queued acquires (atomic:
// handoffs are delivered from loops, the ticker and closing connections).
type waitHist struct {
	buckets [21]atomic.Uint64 // len(WaitBuckets)+1, the last is +Inf
	sumNs   atomic.Uint64
}

func (h *waitHist) observe(d int64) {
	if d < 0 {
		d = 0
	}
	sec := float64(d) / 1e9
	i := 0
	for i < len(WaitBuckets) && sec > WaitBuckets[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.sumNs.Add(uint64(d))
}

// RequestCount is the number of requests of one op with one result.
type RequestCount struct {
	Op     string // "acquire", "release", "renew", "ping", "hello", "acquire-shared", "validate", "watch", "inspect"
	Result string // "granted", "timeout", "busy", "queued", "released", "renewed", "not_held", "pong", "error", "moved", "welcome", "valid", "watching", "inspected"
	N      uint64
}

// Metrics is a snapshot of the server's counters and gauges.
type Metrics struct {
	Requests []RequestCount            // non-zero cells only
	Errors   [proto.MaxCode + 1]uint64 // E frames sent, by code (index 0 unused)
	Table    shard.Counters            // grants, handoffs, expiries, timeouts, releases, renews
	Keys     int                       // keys held
	Waiters  int                       // queued acquires
	// Holders counts the holders of shared keys beyond each key's first
	// (what --max-holders bounds; a key's first holder is in Keys), and
	// Watches the watches registered now (PROTOCOL.md §9).
	Holders, Watches int
	// Lost counts the L frames pushed to watches, by reason (index 0
	// unused; 1 released, 2 expired, 3 forced, 4 this node can no longer
	// tell).
	Lost          [shard.ReasonCannotTell + 1]uint64
	Conns         int64  // open connections
	LocalConns    int64  // open in-process connections (OpenLocal: the HTTP front's)
	TokenLast     uint64 // highest token issued
	TokenReserved uint64 // durable reservation mark
	// Wait is the acquire-to-grant histogram: immediate grants count as 0,
	// queued ones by their time in the queue. Counts are per bucket of
	// WaitBuckets (not cumulative), the last one +Inf.
	WaitCounts []uint64
	WaitSum    float64 // seconds
	Uptime     time.Duration
	Draining   bool
	Moved      uint64 // queued acquires answered M when the gate closed
	// TLS port: handshakes that succeeded and that failed (a plaintext
	// client, a bad or missing client certificate, a timeout).
	TLSHandshakes, TLSHandshakeFailures uint64
	// With an ACL (Config.ACL): what it refused, the reloads that put a
	// new file in force and those that failed (the old one stayed), and
	// the grants released through AdminRelease.
	Auth          AuthFailures
	ACLReloads    uint64
	ACLReloadErrs uint64
	AdminReleases uint64
}

// Metrics aggregates the loops' counters and reads the table's.
func (s *Server) Metrics() Metrics {
	var m Metrics
	var req [len(proto.RequestOps)][nResults]uint64
	s.loops.Range(func(_, v any) bool {
		l := v.(*loopStats)
		for i := range l.req {
			for j := range l.req[i] {
				req[i][j] += l.req[i][j].Load()
			}
		}
		for code := range l.errs {
			m.Errors[code] += l.errs[code].Load()
		}
		m.Auth.Hello += l.auth[authHello].Load()
		m.Auth.Unauthenticated += l.auth[authUnauthenticated].Load()
		m.Auth.Denied += l.auth[authDenied].Load()
		return true
	})
	m.Auth.Removed = s.auth.removed.Load()
	m.ACLReloads, m.ACLReloadErrs = s.auth.reloads.Load(), s.auth.reloadsFailed.Load()
	m.AdminReleases = s.adminReleases.Load()
	m.Errors[proto.CodeShutdown] += s.cancelled.Load()
	for i := range req {
		for j, n := range req[i] {
			if n != 0 {
				m.Requests = append(m.Requests, RequestCount{Op: proto.RequestOps[i].String(), Result: resultNames[j], N: n})
			}
		}
	}
	m.Table = s.table.Counters()
	st := s.table.Stats()
	m.Keys, m.Waiters = st.Keys, st.Waiters
	m.Holders, m.Watches = st.Holders, st.Watches
	for r := range s.lostL {
		m.Lost[r] = s.lostL[r].Load()
	}
	m.Conns = s.conns.Load()
	m.LocalConns = s.localConns.Load()
	m.TokenLast, m.TokenReserved = s.table.Tokens().Last(), s.table.Tokens().Limit()
	m.WaitCounts = make([]uint64, len(s.wait.buckets))
	for i := range s.wait.buckets {
		m.WaitCounts[i] = s.wait.buckets[i].Load()
	}
	m.WaitCounts[0] += req[proto.OpAcquire.RequestIndex()][resGranted] // immediate grants waited 0
	m.WaitSum = float64(s.wait.sumNs.Load()) / 1e9
	m.Uptime = time.Since(s.epoch)
	m.Draining = s.draining.Load()
	m.Moved = s.moved.Load()
	m.TLSHandshakes, m.TLSHandshakeFailures = s.tlsHandshakes.Load(), s.tlsFailures.Load()
	return m
}
