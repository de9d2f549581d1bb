package machine

import (
	"fmt"

	"slices"
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// simMember is one member of a simulated cluster: its machine, and what
// the driver would measure and do for it.
type simMember struct {
	m       *Member
	i       int
	down    bool  // killed: ticks not, hears nothing, says nothing
	stalled int64 // frozen until then: ticks not; what is sent to it waits
	nosync  bool  // never completes a snapshot (it refused, or its sync never ends)
	lagging bool  // the stream to it stands still (its position stays)
	gate    Gate
	pos     uint64 // its table's position
	last    uint64 // the allocator's counter
	limit   uint64 // … and limit
	mark    uint64 // its data dir's mark
	stored  uint64 // its data dir's epoch
	stopped []int  // Stop's answers
	follow  int    // the active it asked for a snapshot, None
	probe   uint64 // the probe base of this life
}

// frame is a message in flight to member to.
type frame struct {
	at  int64
	to  int
	msg Msg
}

// cluster runs the machines of n members on one fake clock, carrying out
// their actions as the driver would (reservations complete at once;
// snapshots complete at once unless nosync), and delivering every frame
// after the link's delay, in order per link.
type cluster struct {
	t       *testing.T
	now     int64
	timeout int64
	block   uint64
	delay   int64
	ms      []*simMember
	cut     [][]bool // cut[i][j]: what i sends j is lost
	flight  []frame
	logs    []string // what the members logged and their gates, for transcripts
	quiet   bool     // keep no logs
	wall    bool     // the wall-clock floor counts (Config.NoWallFloor false)
}

func newCluster(t *testing.T, n int, timeout time.Duration, stored ...uint64) *cluster {
	c := &cluster{t: t, now: 1000 * ms, timeout: int64(timeout), block: 1 << 30}
	for i := range n {
		var st uint64
		if i < len(stored) {
			st = stored[i]
		}
		c.ms = append(c.ms, &simMember{i: i, stored: st, follow: None, probe: uint64(i) << 32})
		c.cut = append(c.cut, make([]bool, n))
	}
	for i := range n {
		c.start(i)
	}
	return c
}

func (c *cluster) peers() []string {
	var p []string
	for i := range c.ms {
		p = append(p, fmt.Sprintf("m%d", i))
	}
	return p
}

// start (re)starts member i with its data dir (stored epoch, mark) and an
// empty table.
func (c *cluster) start(i int) {
	s := c.ms[i]
	s.probe += 1 << 40 // every life numbers its probes above the earlier ones'
	start := max(s.mark, s.last)
	s.m = New(Config{Self: i, Peers: c.peers(), Timeout: c.timeout, TokenBlock: c.block, StoredEpoch: s.stored,
		Probe: s.probe, Start: start, NoWallFloor: !c.wall, Now: c.now})
	s.down, s.stalled, s.pos, s.last, s.limit, s.follow, s.gate = false, 0, 0, start, start, None, Gate{}
}

// live reports whether member i runs now (not killed, not frozen).
func (c *cluster) live(i int) bool { s := c.ms[i]; return !s.down && c.now >= s.stalled }

// send puts a frame from i to j on the link.
func (c *cluster) send(from, to int, msg Msg) {
	if c.cut[from][to] || c.ms[to].down {
		return
	}
	msg.From = from
	at := c.now + c.delay
	for k := len(c.flight) - 1; k >= 0; k-- {
		if f := c.flight[k]; f.to == to && f.msg.From == from {
			at = max(at, f.at) // FIFO per link
			break
		}
	}
	c.flight = append(c.flight, frame{at: at, to: to, msg: msg})
}

// local is what member i's driver measures.
func (c *cluster) local(i int) Local {
	s := c.ms[i]
	return Local{TokenLast: s.last, TokenLimit: s.limit, Mark: s.mark, Pos: s.pos}
}

// carry does what member i's machine asked.
func (c *cluster) carry(i int, acts []Action) {
	s := c.ms[i]
	for _, a := range slices.Clone(acts) {
		switch a.Kind {
		case ActGate:
			if a.Gate.Seq < s.gate.Seq {
				continue // computed before one installed already (as the driver's publish)
			}
			if a.Gate.State != s.gate.State || a.Gate.To != s.gate.To {
				c.logf("m%d gate %s", i, gateText(a.Gate))
			}
			s.gate = a.Gate
		case ActHeartbeat:
			c.send(i, a.To, Msg{Kind: MsgHeartbeat, HB: a.HB})
		case ActHandoff:
			c.send(i, a.To, Msg{Kind: MsgHandoff, Epoch: a.Epoch, Token: s.last, Limit: max(s.limit, a.Limit, max(s.limit, s.last)+a.Reserve.Block), Lineage: a.Lineage})
		case ActHandoffAbort:
			c.send(i, a.To, Msg{Kind: MsgHandoffAbort, Epoch: a.Epoch})
		case ActAnswer:
			c.send(i, a.To, Msg{Kind: MsgAnswer, Taken: a.Taken, Epoch: a.Epoch})
		case ActFollow:
			s.follow = a.To
			c.send(i, a.To, Msg{Kind: MsgNeedSnapshot})
		case ActResync:
			if !a.Stale {
				c.snapshot(i, a.To)
			}
		case ActObserve:
			s.last = max(s.last, a.Token)
		case ActExtend:
			s.limit = max(s.limit, a.Limit)
		case ActReserve:
			r := a.Reserve
			if r.Epoch != 0 {
				s.stored = r.Epoch
			}
			start := r.Start
			if r.Floor > 0 {
				start = max(start, uint64(c.now+r.Floor))
			}
			s.last = max(s.last, start)
			limit := max(s.limit, s.last) + r.Block
			s.mark = max(s.mark, limit)
			c.input(i, Msg{Kind: MsgReserved, Op: r.Op, Limit: limit, Token: s.last, Pos: s.pos})
		case ActLog:
			c.logf("m%d %s", i, logText(a.Log))
		case ActStopped:
			s.stopped = append(s.stopped, a.To)
			c.logf("m%d stopped: requests go to %d", i, a.To)
		}
	}
}

// snapshot sends member to a snapshot of active from (NeedSnapshot or a
// resync): it replaces to's table; it completes at once unless to is
// nosync (then the table stays empty: a snapshot that never completes).
func (c *cluster) snapshot(from, to int) {
	a, s := c.ms[from], c.ms[to]
	if c.cut[from][to] || s.down || a.m.role != RoleActive && a.m.role != RoleHandover {
		return
	}
	s.pos = 0
	if s.nosync {
		c.input(to, Msg{Kind: MsgDesynced, From: from})
		return
	}
	s.pos, s.last = a.pos, max(s.last, a.last)
	c.input(to, Msg{Kind: MsgDesynced, From: from, Limit: a.limit})
	c.input(to, Msg{Kind: MsgReservedSeen, Limit: a.limit})
	s.mark = max(s.mark, a.limit)
	c.input(to, Msg{Kind: MsgSynced, From: from, Epoch: a.m.epoch})
	c.input(from, Msg{Kind: MsgSnapshotAcked, From: to, Epoch: a.m.epoch})
}

// input feeds member i one message now.
func (c *cluster) input(i int, msg Msg) {
	if !c.live(i) {
		return
	}
	c.carry(i, c.ms[i].m.Step(c.now, msg))
}

// deliver hands out every frame due by now to the members that run.
func (c *cluster) deliver() {
	for {
		k := slices.IndexFunc(c.flight, func(f frame) bool { return f.at <= c.now && c.live(f.to) })
		if k < 0 {
			return
		}
		f := c.flight[k]
		c.flight = slices.Delete(c.flight, k, k+1)
		if c.ms[f.to].down {
			continue
		}
		if f.msg.Kind == MsgNeedSnapshot {
			c.snapshot(f.to, f.msg.From)
			continue
		}
		c.input(f.to, f.msg)
	}
}

// replicate moves every in-sync standby's copy to its active's position.
func (c *cluster) replicate() {
	for i, s := range c.ms {
		m := s.m
		if !c.live(i) || s.lagging || m.role != RoleStandby || !m.inSync || m.active < 0 {
			continue
		}
		a := c.ms[m.active]
		if c.live(m.active) && !c.cut[m.active][i] && a.m.role == RoleActive {
			s.pos, s.last = a.pos, max(s.last, a.last)
		}
	}
}

// step advances the clock by d in ticks of a tenth of the timeout: each
// running member ticks, then every frame due is delivered.
func (c *cluster) step(d time.Duration) {
	every := c.timeout / 10
	for end := c.now + int64(d); c.now < end; {
		c.now += every
		for i, s := range c.ms {
			if c.live(i) {
				c.carry(i, s.m.Tick(c.now, c.local(i)))
			}
		}
		c.deliver()
		c.replicate()
	}
}

// grant makes member i, the serving active, change its table n times
// (each a grant with a new token).
func (c *cluster) grant(i int, n uint64) {
	s := c.ms[i]
	if s.gate.State != Serve {
		c.t.Fatalf("at %v: grants on member %d, whose gate is %s", time.Duration(c.now), i, gateText(s.gate))
	}
	for s.last+n > s.limit && s.gate.State == Serve {
		// The allocator asks for more, as the driver's does; the
		// simulated reservation is made at once.
		limit := s.limit
		c.input(i, Msg{Kind: MsgWantTokens})
		if s.limit == limit {
			break
		}
	}
	s.pos += n
	s.last += n
	if s.last > s.limit {
		c.t.Fatalf("member %d issued token %d above its reservation %d", i, s.last, s.limit)
	}
}

func (c *cluster) logf(format string, args ...any) {
	if !c.quiet {
		c.logs = append(c.logs, fmt.Sprintf(format, args...))
	}
}

func gateText(g Gate) string {
	if g.State == Redirect {
		if g.To < 0 {
			return "redirect (no active)"
		}
		return fmt.Sprintf("redirect m%d", g.To)
	}
	return g.State.String()
}

// logText is a log line as a transcript shows it: level, message and the
// arguments that say what was decided (times and tokens, which depend on
// the clock, are left out).
func logText(l Log) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(l.Level.String()) + ": " + l.Msg)
	for k := 0; k+1 < len(l.Args); k += 2 {
		key := fmt.Sprint(l.Args[k])
		switch key {
		case "gap", "waited", "took", "token_start", "next_token", "reserved", "members":
			continue
		}
		fmt.Fprintf(&b, " %s=%v", key, l.Args[k+1])
	}
	return b.String()
}

// actives lists the running members whose role is active.
func (c *cluster) actives() []int {
	var a []int
	for i, s := range c.ms {
		if c.live(i) && s.m.role == RoleActive {
			a = append(a, i)
		}
	}
	return a
}

// wantActive checks that member i alone is active and every other
// running member follows it.
func (c *cluster) wantActive(i int) {
	c.t.Helper()
	if a := c.actives(); len(a) != 1 || a[0] != i {
		c.t.Fatalf("at %v actives %v, want [%d]", time.Duration(c.now), a, i)
	}
	for j, s := range c.ms {
		if j != i && c.live(j) && s.m.active != i {
			c.t.Fatalf("at %v member %d follows %d, want %d", time.Duration(c.now), j, s.m.active, i)
		}
	}
}

// wantActiveAmong checks that exactly one running member is active, one
// of ids.
func (c *cluster) wantActiveAmong(ids ...int) {
	c.t.Helper()
	a := c.actives()
	if len(a) != 1 || !slices.Contains(ids, a[0]) {
		c.t.Fatalf("at %v actives %v, want one of %v", time.Duration(c.now), a, ids)
	}
}

// serving reports whether member i's gate serves now.
func (c *cluster) serving(i int) bool {
	g := c.ms[i].gate
	return g.State == Serve && c.now <= g.Until
}

// logged reports whether member i logged a line containing text.
func (c *cluster) logged(i int, text string) bool {
	p := fmt.Sprintf("m%d ", i)
	return slices.ContainsFunc(c.logs, func(l string) bool { return strings.HasPrefix(l, p) && strings.Contains(l, text) })
}

// status is one line per member: what the transcripts show.
func (c *cluster) status() []string {
	var out []string
	for i, s := range c.ms {
		if s.down {
			out = append(out, fmt.Sprintf("m%d down", i))
			continue
		}
		m := s.m
		line := fmt.Sprintf("m%d %s epoch=%d", i, m.role, m.epoch)
		if m.role == RoleStandby {
			line += fmt.Sprintf(" active=%d in_sync=%v", m.active, m.inSync)
		}
		if m.checking() {
			line += " checking"
		}
		line += fmt.Sprintf(" gate=%s pos=%d", strings.ReplaceAll(gateText(s.gate), " ", "_"), s.pos)
		if !c.live(i) {
			line += " frozen"
		}
		out = append(out, line)
	}
	return out
}
