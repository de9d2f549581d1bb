package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/history"
	"github.com/lockd-dev/lockd/proto"
)

// Raw clients around freezes and handovers (issue 18, holes 1-3). The
// workload's clients follow M and retry E 4 on another member, so they
// cannot tell what one member answered. These keep a raw connection to
// one member across a fault and check every answer it sends:
//
//   - frozen-answers: connections to a member, each served once (warm),
//     kept while it is frozen (SIGSTOP). While it is stopped, requests
//     queue up in their sockets: a ping, acquires (wait 0) of a free key
//     and of a held one, a renew of the held key's current token, a
//     release of its former token, an acquire that would queue. Once
//     another member serves at a later epoch (term), every answer the
//     resumed member sends to them must be M — or one the new state
//     allows (a renew of the current token renewed, a grant above the new
//     active's token, the former token's release refused), had it led
//     again by then: a member frozen longer than the failover timeout
//     executes nothing from its stale state (PROTOCOL.md §6.2, last
//     bullet). A closed connection is allowed (raft closes the connections
//     of proposals that cannot commit: Indeterminate). A freeze during a
//     network fault is not checked (its side may serve once it watched
//     the others silent).
//   - handover-answers: a connection to the active/leader kept across its
//     SIGTERM — an acquire queued on a held key, and a client sending every
//     5 ms; in half of the handovers every member link is first slowed to
//     1.5 × the failover timeout each way (the successor's answer comes a
//     round trip late). While a live member in sync with it exists at the
//     signal, nothing may be answered E 4 (§6.2, planned handoff).
const (
	rawFrozenConns = 3               // connections kept to a frozen member
	rawTimeout     = 5 * time.Second // a raw connection's dial, write and read
	rawLease       = 2               // seconds: the probes' keys end soon on their own
	rawHeldLease   = 15              // seconds: a key held across a handover (a queued acquire must not get it first)
	rawTickEvery   = 5 * time.Millisecond
	rawAnswerWait  = 3 * time.Second // for the answers of a resumed member
)

// rawChecks collects both checkers' findings.
type rawChecks struct {
	c    *clustertest.Cluster
	cfg  Config
	logf func(string, ...any)
	seq  atomic.Uint64 // numbers the probes' keys

	mu       sync.Mutex
	frozen   history.Result
	handover history.Result
}

func newRawChecks(cfg Config, c *clustertest.Cluster, logf func(string, ...any)) *rawChecks {
	return &rawChecks{c: c, cfg: cfg, logf: logf,
		frozen:   history.Result{Name: "frozen-answers", Figures: map[string]float64{}},
		handover: history.Result{Name: "handover-answers", Figures: map[string]float64{}}}
}

func (rc *rawChecks) add(r *history.Result, figure string, v float64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	r.Figures[figure] += v
}

func (rc *rawChecks) bad(r *history.Result, format string, args ...any) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	r.Count++
	if len(r.Violations) < history.MaxViolations {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

func (rc *rawChecks) noteOn(r *history.Result, format string, args ...any) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(r.Notes) < history.MaxViolations {
		r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
	}
}

// results returns both checkers' verdicts.
func (rc *rawChecks) results() []history.Result {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := []history.Result{rc.frozen, rc.handover}
	for i := range out {
		r := &out[i]
		r.Verdict = history.Pass
		if r.Count > 0 {
			r.Verdict = history.Violated
		}
	}
	f, h := out[0].Figures, out[1].Figures
	out[0].Summary = fmt.Sprintf("%d freezes probed (%d superseded, %d while a network fault was in force: not asserted), %d answers after resuming, %d of them M, %d connections closed instead",
		int(f["freezes"]), int(f["superseded"]), int(f["during_network_fault"]), int(f["answers"]), int(f["answers_m"]), int(f["closed"]))
	out[1].Summary = fmt.Sprintf("%d handovers probed (%d with member links slowed, %d with a live in-sync successor), %d answers, %d of them E 4",
		int(h["handovers"]), int(h["delayed"]), int(h["with_successor"]), int(h["answers"]), int(h["e4"]))
	return out
}

// leader returns the member that says it serves among those running but
// skip, with its status, or -1.
func (rc *rawChecks) leader(skip int) (int, clustertest.Status) {
	for _, m := range rc.c.Members() {
		if m.Index() == skip || !m.Alive() {
			continue
		}
		if st, err := m.Status(); err == nil && st.Serving() {
			return m.Index(), st
		}
	}
	return -1, clustertest.Status{}
}

func (rc *rawChecks) dial(m int) (*clustertest.Conn, error) {
	conn, err := clustertest.Dial(rc.c.Member(m).Addr())
	if err != nil {
		return nil, err
	}
	conn.SetTimeout(rawTimeout)
	return conn, nil
}

// take acquires key (wait 0) on member m and returns its token, 0 if not
// granted.
func (rc *rawChecks) take(m int, key string, owner uint64) uint64 {
	return rc.takeFor(m, key, owner, rawLease)
}

// takeFor is take with a lease of lease seconds.
func (rc *rawChecks) takeFor(m int, key string, owner uint64, lease uint8) uint64 {
	conn, err := rc.dial(m)
	if err != nil {
		return 0
	}
	defer conn.Close()
	r, err := conn.Do(proto.AppendAcquire(nil, 0, lease, owner, key))
	if err != nil || r.Op != proto.OpAcquire {
		return 0
	}
	return r.Token
}

// give releases key's token on member m (best effort).
func (rc *rawChecks) give(m int, key string, token uint64) {
	if m < 0 || token == 0 {
		return
	}
	if conn, err := rc.dial(m); err == nil {
		_, _ = conn.Do(proto.AppendRelease(nil, token, key))
		conn.Close()
	}
}

// freezeProbe is one frozen-answers probe.
type freezeProbe struct {
	rc      *rawChecks
	m       int
	conns   []*clustertest.Conn // served before the freeze (a ping each): warm sessions
	before  clustertest.Status  // m's /status before the freeze
	held    string              // a key held across the freeze
	free    string              // a key nobody takes
	t1      uint64              // held's token before the freeze
	t2      uint64              // … and after the new active took it again
	newLead int
	sent    []int // requests sent on each connection
	frames  []rawFrame
	mark    int       // the member's log mark while frozen: what it logs after resuming
	frozen  time.Time // when whileFrozen began (the member stopped)
}

// tookRole matches the line a member logs when it takes the active or
// leader role, with the first token of that role.
var tookRole = regexp.MustCompile(`"msg":"(?:active|leader)".*"token_start":\d+`)

// laterRole reads, from what member m logged since mark, when it first took
// the active (leader) role after resuming (a line stamped after frozen) and
// that role's first token: ok false when it did not.
func laterRole(c *clustertest.Cluster, m, mark int, frozen time.Time) (at time.Time, tokenStart uint64, ok bool) {
	line, err := c.Member(m).WaitLogSince(mark, tookRole, 10*time.Millisecond)
	if err != nil {
		return time.Time{}, 0, false
	}
	return parseRoleLine(line, frozen)
}

// parseRoleLine reads a tookRole line: when it was logged and the role's
// first token; ok false for another line or one logged before frozen.
func parseRoleLine(line string, frozen time.Time) (at time.Time, tokenStart uint64, ok bool) {
	var rec struct {
		Time       time.Time `json:"time"`
		Msg        string    `json:"msg"`
		TokenStart uint64    `json:"token_start"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil || (rec.Msg != "active" && rec.Msg != "leader") || rec.TokenStart == 0 || !rec.Time.After(frozen) {
		return time.Time{}, 0, false // another line, or one of before the freeze read late
	}
	return rec.Time, rec.TokenStart, true
}

// rawFrame is a request sent to a frozen member, for the report.
type rawFrame struct {
	what  string
	op    proto.Op
	id    uint64
	frame []byte
}

// beforeFreeze opens the probe of member m, which is about to be frozen:
// raw connections to it, each served once (a ping: the member's event
// loop has the connection, as a client's that was in use), and a key held
// (on the active) across the freeze.
func (rc *rawChecks) beforeFreeze(m int) *freezeProbe {
	k := rc.seq.Add(1)
	fp := &freezeProbe{rc: rc, m: m, newLead: -1,
		held: fmt.Sprintf("raw/frozen/%d/held", k), free: fmt.Sprintf("raw/frozen/%d/free", k)}
	for i := range rawFrozenConns {
		conn, err := rc.dial(m)
		if err != nil {
			break
		}
		if _, err := conn.Ping(k<<8 | uint64(10+i)); err != nil {
			conn.Close()
			break
		}
		fp.conns = append(fp.conns, conn)
	}
	if len(fp.conns) == 0 {
		return fp // nothing to check
	}
	fp.before, _ = rc.c.Member(m).Status()
	if l, _ := rc.leader(-1); l >= 0 {
		fp.t1 = rc.take(l, fp.held, k<<8)
	}
	return fp
}

// whileFrozen waits, until deadline, for another member to serve at a
// later epoch (term) than the frozen one knew; there it takes the held key
// again (its current token moves on); at deadline it sends the probe's
// requests, which queue up in the frozen member's sockets.
func (fp *freezeProbe) whileFrozen(stop <-chan struct{}, deadline time.Time) {
	if len(fp.conns) == 0 {
		return
	}
	fp.frozen = time.Now()
	for time.Now().Before(deadline) {
		if l, st := fp.rc.leader(fp.m); l >= 0 && st.Epoch > fp.before.Epoch {
			fp.newLead = l
			break
		}
		select {
		case <-stop:
			deadline = time.Now()
		case <-time.After(20 * time.Millisecond):
		}
	}
	k := fp.rc.seq.Load()
	if fp.newLead >= 0 && fp.t1 != 0 {
		fp.rc.give(fp.newLead, fp.held, fp.t1)
		fp.t2 = fp.rc.take(fp.newLead, fp.held, k<<8|1)
	}
	current := fp.t2
	if current == 0 {
		current = fp.t1
	}
	// Two sets: requests that change nothing in the member's stale state
	// (it would answer them at once: P, T, N), and requests it would
	// propose or queue (raft closes such a connection, holding every answer
	// behind the proposal: so they go on a connection of their own).
	quiet := []rawFrame{
		{"a ping", proto.OpPing, k<<8 | 2, proto.AppendPing(nil, k<<8|2)},
		{"an acquire (wait 0) of the held key", proto.OpAcquire, k<<8 | 4, proto.AppendAcquire(nil, 0, rawLease, k<<8|4, fp.held)},
		{"a renew of the held key's current token", proto.OpRenew, current, proto.AppendRenew(nil, rawLease, current, fp.held)},
	}
	acting := []rawFrame{
		{"an acquire (wait 0) of a free key", proto.OpAcquire, k<<8 | 3, proto.AppendAcquire(nil, 0, rawLease, k<<8|3, fp.free)},
		{"a release of the held key's former token", proto.OpRelease, fp.t1, proto.AppendRelease(nil, fp.t1, fp.held)},
		{"an acquire (wait 1) of the held key", proto.OpAcquire, k<<8 | 5, proto.AppendAcquire(nil, 1, rawLease, k<<8|5, fp.held)},
	}
	fp.frames = append(append([]rawFrame(nil), quiet...), acting...)
	fp.mark = fp.rc.c.Member(fp.m).LogMark() // frozen: everything after it is logged after resuming
	// The requests go shortly before SIGCONT: what the resumed member
	// finds first.
	select {
	case <-stop:
	case <-time.After(time.Until(deadline)):
	}
	fp.sent = make([]int, len(fp.conns))
	for i, conn := range fp.conns {
		set := quiet
		if i == len(fp.conns)-1 {
			set = acting
		}
		var out [][]byte
		for _, f := range set {
			out = append(out, f.frame)
		}
		if err := conn.Send(out...); err == nil {
			fp.sent[i] = len(out)
		}
	}
}

// allowed reports whether answer r to f could come from the state after
// the freeze (the new active's), had the resumed member led again by then:
// a renew of the held key's current token renewed, a grant above the new
// active's token, a release of the former token refused.
func (fp *freezeProbe) allowed(f rawFrame, r proto.Response) bool {
	switch {
	case fp.t2 == 0:
		return false
	case r.Op == proto.OpRenew:
		return r.ID == fp.t2 && f.op == proto.OpRenew
	case r.Op == proto.OpAcquire:
		return r.Token > fp.t2
	case r.Op == proto.OpNotHeld:
		return r.ID == fp.t1 && f.op == proto.OpRelease && fp.t1 != fp.t2
	}
	return false
}

// afterResume reads and checks what the resumed member answers. excused
// says a network fault overlapped the freeze.
func (fp *freezeProbe) afterResume(excused bool) {
	rc := fp.rc
	if len(fp.conns) == 0 {
		return
	}
	defer func() {
		for _, c := range fp.conns {
			c.Close()
		}
	}()
	defer rc.give(fp.newLead, fp.held, fp.t2)
	r := &rc.frozen
	rc.add(r, "freezes", 1)
	wasLeader := api.Serving(fp.before.Role)
	asserted := !excused && (!wasLeader || fp.newLead >= 0)
	switch {
	case excused:
		rc.add(r, "during_network_fault", 1)
	case fp.newLead >= 0:
		rc.add(r, "superseded", 1)
	case wasLeader:
		rc.add(r, "not_superseded", 1)
	}
	type readAnswer struct {
		resp proto.Response
		at   time.Time
	}
	var read []readAnswer
	for i, conn := range fp.conns {
		conn.SetTimeout(rawAnswerWait)
		for range fp.sent[i] {
			resp, err := conn.Read()
			if err != nil {
				rc.add(r, "closed", 1)
				break
			}
			read = append(read, readAnswer{resp, time.Now()})
		}
	}
	// A member that took the active (leader) role again after resuming —
	// synced as a standby first, or promoted by the rules once its check
	// ended — answers from that role's state, not from its stale one. An
	// answer read before it logged taking the role was made before it, so
	// from the stale state; one read after may come from either, and a
	// grant from the new role carries a token from its range.
	roleAt, roleStart, retook := laterRole(rc.c, fp.m, fp.mark, fp.frozen)
	for _, ra := range read {
		resp := ra.resp
		rc.add(r, "answers", 1)
		if resp.Op == proto.OpMoved {
			rc.add(r, "answers_m", 1)
			continue
		}
		f := rawFrame{what: "a request"}
		for _, g := range fp.frames {
			if resp.ID == g.id && (resp.ReqOp == 0 || resp.ReqOp == g.op) {
				f = g
			}
		}
		switch {
		case !asserted:
			rc.noteOn(r, "member %d (%s at epoch %d before its freeze, not superseded or during a network fault) answered %c to %s", fp.m, fp.before.Role, fp.before.Epoch, resp.Op, f.what)
		case fp.allowed(f, resp):
			rc.add(r, "answers_new_state", 1)
		case retook && !ra.at.Before(roleAt) && (resp.Op != proto.OpAcquire || resp.Token >= roleStart):
			rc.add(r, "answers_after_taking_the_role_again", 1)
		default:
			rc.bad(r, "member %d, %s at epoch %d before its freeze%s, answered %c (id %d, token %d) to %s queued during the freeze: from its stale state",
				fp.m, fp.before.Role, fp.before.Epoch, supersededBy(fp.newLead), resp.Op, resp.ID, resp.Token, f.what)
		}
	}
}

func supersededBy(l int) string {
	if l < 0 {
		return ""
	}
	return fmt.Sprintf(" (member %d served at a later epoch meanwhile)", l)
}

// handoverProbe is one handover-answers probe.
type handoverProbe struct {
	rc        *rawChecks
	m         int
	conn      *clustertest.Conn // the queued acquire
	held      string
	token     uint64
	successor bool // a live member in sync with m at the signal
	stop      chan struct{}
	done      sync.WaitGroup
	answers   atomic.Int64
	e4        atomic.Int64
	queuedOwn uint64
}

// beforeHandover opens the probe of member m, about to be terminated: if
// m serves, a key held on it with an acquire queued behind, and a client
// sending every 5 ms.
func (rc *rawChecks) beforeHandover(m int) *handoverProbe {
	k := rc.seq.Add(1)
	hp := &handoverProbe{rc: rc, m: m, held: fmt.Sprintf("raw/handover/%d", k), stop: make(chan struct{})}
	st, err := rc.c.Member(m).Status()
	if err != nil || !st.Serving() {
		return hp
	}
	if hp.token = rc.takeFor(m, hp.held, k<<8, rawHeldLease); hp.token == 0 {
		return hp
	}
	conn, err := rc.dial(m)
	if err != nil {
		return hp
	}
	hp.queuedOwn = k<<8 | 1
	if err := conn.Send(proto.AppendAcquire(nil, 2*rawHeldLease, rawLease, hp.queuedOwn, hp.held)); err != nil {
		conn.Close()
		return hp
	}
	hp.conn = conn
	tick, err := rc.dial(m)
	if err != nil {
		return hp
	}
	hp.done.Go(func() {
		defer tick.Close()
		for i := uint64(0); ; i++ {
			select {
			case <-hp.stop:
				return
			case <-time.After(rawTickEvery):
			}
			key := fmt.Sprintf("raw/handover/%d/tick", k)
			r, err := tick.Do(proto.AppendAcquire(nil, 0, rawLease, k<<16|i, key))
			if err != nil {
				return // the old active closed the connection
			}
			hp.count(r)
			if r.Op == proto.OpAcquire {
				if r, err = tick.Do(proto.AppendRelease(nil, r.Token, key)); err != nil {
					return
				}
				hp.count(r)
			}
		}
	})
	return hp
}

func (hp *handoverProbe) count(r proto.Response) {
	hp.answers.Add(1)
	if r.Op == proto.OpError && r.Code == proto.CodeShutdown {
		hp.e4.Add(1)
	}
}

// atSignal notes, just before the SIGTERM, whether a live member in sync
// with m exists (m's own view of the member, and the member's).
func (hp *handoverProbe) atSignal() {
	rc := hp.rc
	if hp.conn == nil {
		return
	}
	st, err := rc.c.Member(hp.m).Status()
	if err != nil || !st.Serving() {
		return
	}
	for _, m := range rc.c.Members() {
		k := m.Index()
		if k == hp.m || !m.Alive() {
			continue
		}
		ks, err := m.Status()
		if err != nil || !ks.InSync || ks.Serving() {
			continue
		}
		names := ks.Active == rc.c.Member(hp.m).Addr() || ks.Active == rc.c.Peers(k)[hp.m]
		live := false
		for _, mb := range st.Members {
			if mb.Addr == rc.c.Peers(hp.m)[k] && mb.Live {
				live = true
			}
		}
		if names && live {
			hp.successor = true
		}
	}
}

// afterExit checks what m answered once it exited. excused says a network
// fault overlapped the handover.
func (hp *handoverProbe) afterExit(excused, delayed bool) {
	rc := hp.rc
	close(hp.stop)
	if hp.conn == nil {
		hp.done.Wait()
		return
	}
	r := &rc.handover
	var queued proto.Response
	hp.conn.SetTimeout(rawAnswerWait)
	resp, err := hp.conn.Read()
	if err == nil {
		queued = resp
		hp.count(resp)
	}
	hp.conn.Close()
	hp.done.Wait()
	rc.add(r, "handovers", 1)
	if delayed {
		rc.add(r, "delayed", 1)
	}
	rc.add(r, "answers", float64(hp.answers.Load()))
	rc.add(r, "e4", float64(hp.e4.Load()))
	if l, _ := rc.leader(hp.m); l >= 0 {
		rc.give(l, hp.held, hp.token)
	}
	if !hp.successor || excused {
		if hp.e4.Load() > 0 {
			rc.noteOn(r, "member %d answered E 4 %d times with no live in-sync successor at the signal, or during a network fault", hp.m, hp.e4.Load())
		}
		return
	}
	rc.add(r, "with_successor", 1)
	slow := ""
	if delayed {
		slow = fmt.Sprintf(", member links slowed to %v", 3*rc.cfg.FailoverTimeout/2)
	}
	if n := hp.e4.Load(); n > 0 {
		rc.bad(r, "member %d, the active, answered E 4 %d times during its planned handover to a live, in-sync successor%s", hp.m, n, slow)
	}
	switch {
	case err != nil:
		rc.bad(r, "member %d's queued acquire got no answer at its handover%s: %v", hp.m, slow, err)
	case queued.Op != proto.OpMoved || len(queued.Tail) == 0:
		rc.bad(r, "member %d's queued acquire was answered %c (code %d) %q at its handover%s, want M naming the successor", hp.m, queued.Op, queued.Code, queued.Tail, slow)
	}
}
