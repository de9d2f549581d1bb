package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/faultproxy"
	"github.com/lockd-dev/lockd/internal/history"
)

// maxDown is how many members may be killed, terminated or frozen at
// once: one, so that a raft cluster keeps its majority through process
// faults alone (partitions on top of one can still take it away).
const maxDown = 1

// singleUp is how long a single node runs after a process fault ends
// before the next one may take it down: with one node every kill, freeze
// or termination is an outage, and back to back they would leave the
// workload nothing to do between them.
const singleUp = 2 * time.Second

// nemesis injects faults at random times, in random order, bounded: at most
// Config.MaxActive at once, at most maxDown members down or frozen, one
// network fault at a time; each fault is reverted when its time is up or
// when the nemesis stops.
type nemesis struct {
	cfg     Config
	c       *clustertest.Cluster
	ms      *members
	rec     *history.Recorder
	clients [][]*faultproxy.Proxy // the client-side proxies: [location][member]
	rng     *rand.Rand
	logf    func(string, ...any)
	raw     *rawChecks // raw clients across freezes and handovers

	mu        sync.Mutex
	active    int       // faults in force
	down      int       // members down or frozen by a fault in force
	netBusy   bool      // a network fault (or slowed member links) in force
	netFaults int       // network faults begun so far: one began during a fault if this moved
	upAt      time.Time // when the last process fault ended (single mode: see singleUp)
	wg        sync.WaitGroup
}

func newNemesis(cfg Config, c *clustertest.Cluster, ms *members, rec *history.Recorder, clients [][]*faultproxy.Proxy, raw *rawChecks, logf func(string, ...any)) *nemesis {
	return &nemesis{cfg: cfg, c: c, ms: ms, rec: rec, clients: clients, raw: raw, logf: logf,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x6e656d65736973))} // "nemesis"
}

// netMark returns whether a network fault is in force now and how many
// have begun: two marks tell whether one overlapped what happened between
// them.
func (n *nemesis) netMark() (bool, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.netBusy, n.netFaults
}

// netOverlap reports whether a network fault was in force at mark a, at
// mark b, or began between them.
func netOverlap(busyA bool, a int, busyB bool, b int) bool { return busyA || busyB || a != b }

// claimNet makes a fault of the caller's the network fault in force (no
// partition starts while it runs); false if one is in force already.
func (n *nemesis) claimNet() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.netBusy {
		return false
	}
	n.netBusy = true
	n.netFaults++
	return true
}

func (n *nemesis) releaseNet() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.netBusy = false
}

// plan is one fault's random choices, drawn in the same number and order
// whatever the cluster's state, so that a seed gives one schedule.
type plan struct {
	kind   string
	hold   time.Duration
	coin   float64 // aim at the active/leader when below the kind's bias
	pick   int     // a member, when not aimed
	pick2  int     // a second member
	choice float64 // a variant
}

// run injects faults until stop is closed, then waits until every fault
// it started has been reverted.
func (n *nemesis) run(stop <-chan struct{}) {
	defer n.wg.Wait()
	var kinds []string
	for _, k := range AllFaults {
		if n.cfg.faultsOn(k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return
	}
	members := len(n.c.Members())
	var bag []string
	for {
		var wait time.Duration
		var p plan
		wait, p, bag = nextPlan(n.rng, n.cfg, kinds, bag, members)
		timer := time.NewTimer(wait)
		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}
		n.start(p, stop)
	}
}

// nextPlan draws the pause before the next fault and the fault's plan,
// with the same draws whatever comes out. Kinds come out of a bag that
// holds each kind once, refilled in a random order when empty: every kind
// comes up within any run of 2 × len(kinds) faults, so a short run sees
// them all, in a random order. It returns the bag left.
func nextPlan(rng *rand.Rand, cfg Config, kinds, bag []string, members int) (time.Duration, plan, []string) {
	if len(bag) == 0 {
		bag = slices.Clone(kinds)
		rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
	}
	wait := time.Duration(float64(cfg.Interval) * (0.3 + 1.4*rng.Float64()))
	p := plan{kind: bag[0], coin: rng.Float64(),
		pick: rng.IntN(members), pick2: rng.IntN(max(members-1, 1)), choice: rng.Float64()}
	p.hold = holdFor(cfg, p.kind, rng.Float64())
	return wait, p, bag[1:]
}

// holdFor maps a uniform draw to how long a fault of kind lasts.
func holdFor(cfg Config, kind string, u float64) time.Duration {
	t := cfg.FailoverTimeout
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(u*float64(hi-lo)) }
	switch kind {
	case FaultKill:
		return between(500*time.Millisecond, 4*time.Second)
	case FaultStop:
		return between(t*3/2, 4*t) // longer than the failover timeout
	case FaultPartition:
		return between(2*t, 8*t) // clients on the far side need seconds to notice
	case FaultHandover:
		return between(500*time.Millisecond, 3*time.Second)
	}
	return 0
}

// start begins fault p if the bounds allow it now (else it is skipped).
func (n *nemesis) start(p plan, stop <-chan struct{}) {
	n.mu.Lock()
	if n.active >= n.cfg.MaxActive {
		n.mu.Unlock()
		return
	}
	switch p.kind {
	case FaultKill, FaultStop, FaultHandover:
		if n.down >= maxDown || (len(n.c.Members()) == 1 && time.Since(n.upAt) < singleUp) {
			n.mu.Unlock()
			return
		}
		n.down++
	case FaultPartition:
		if n.netBusy {
			n.mu.Unlock()
			return
		}
		n.netBusy = true
		n.netFaults++
	}
	if p.kind != FaultDrop {
		n.active++
	}
	n.mu.Unlock()
	n.wg.Go(func() {
		defer func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			switch p.kind {
			case FaultKill, FaultStop, FaultHandover:
				n.down--
				n.upAt = time.Now()
			case FaultPartition:
				n.netBusy = false
			}
			if p.kind != FaultDrop {
				n.active--
			}
		}()
		switch p.kind {
		case FaultKill:
			n.kill(p, stop)
		case FaultStop:
			n.stop(p, stop)
		case FaultHandover:
			n.handover(p, stop)
		case FaultPartition:
			n.partition(p, stop)
		case FaultDrop:
			n.drop(p)
		}
	})
}

// target picks a member for a process fault: the active/leader when the
// coin falls below bias and one is known, else the planned pick.
func (n *nemesis) target(p plan, bias float64) (int, string) {
	if p.coin < bias {
		if l := n.ms.leader(); l >= 0 {
			return l, "the active/leader"
		}
	}
	return p.pick, ""
}

// hold waits d or until stop is closed.
func hold(stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// begin records the start of a fault and logs it.
func (n *nemesis) begin(kind, target, note string) int {
	n.logf("fault %s %s %s", kind, target, note)
	return n.rec.AddFault(history.Fault{Kind: kind, Target: target, Start: n.rec.Now(), Note: note})
}

func (n *nemesis) end(f int, note string) {
	n.rec.EndFault(f, n.rec.Now(), note)
}

// restart starts member m again after a kill or a termination.
func (n *nemesis) restart(m int) string {
	if err := n.c.Member(m).Restart(); err != nil {
		n.ms.problem("member %d: restart: %v", m, err)
		return "restart failed: " + err.Error()
	}
	n.ms.setDown(m, false)
	return "restarted"
}

func (n *nemesis) kill(p plan, stop <-chan struct{}) {
	m, why := n.target(p, 0.5)
	target := fmt.Sprintf("member %d", m)
	n.ms.setDown(m, true)
	f := n.begin(FaultKill, target, why)
	if err := n.c.Member(m).Kill(); err != nil {
		n.ms.problem("member %d: kill: %v", m, err)
	}
	hold(stop, p.hold)
	n.end(f, n.restart(m))
}

// stop freezes a member with raw connections kept to it: requests queue
// up in their sockets while it is stopped, and every answer it sends after
// SIGCONT is checked (rawChecks, frozen-answers). In half of the freezes
// the member's network goes quiet while it is stopped and for a third of
// the failover timeout after it resumes: its member links are cut and the
// workload's connections to it paused (held, delivered in order after),
// as a frozen process's peers see it on a real network — their writes fill
// its socket buffers and stop — and unlike the fault proxies, which go on
// reading for it and hand it the new term or epoch the instant it resumes.
// So the resumed member cannot learn at once that it was superseded, and
// the raw probes' requests are the first it finds: what it answers before
// it learns shows whether it serves from its stale state.
func (n *nemesis) stop(p plan, stop <-chan struct{}) {
	m, why := n.target(p, 0.5)
	target := fmt.Sprintf("member %d", m)
	quiet := p.choice < 0.5 && n.c.Proxied() && n.claimNet()
	if quiet {
		defer n.releaseNet()
		why = strings.TrimSpace(why + " quiet links")
	}
	busyA, a := n.netMark()
	probe := n.raw.beforeFreeze(m)
	f := n.begin(FaultStop, target, why)
	n.ms.setFrozen(m, true)
	mem := n.c.Member(m)
	if err := mem.Stop(); err != nil {
		n.ms.setFrozen(m, false)
		probe.afterResume(true)
		n.end(f, "SIGSTOP failed: "+err.Error())
		return
	}
	stopped := time.Now()
	if quiet {
		if err := n.c.Partition([]int{m}); err != nil {
			n.logf("quiet links of member %d: %v", m, err)
		}
		n.pauseClients(m, true)
	}
	probe.whileFrozen(stop, stopped.Add(p.hold-100*time.Millisecond))
	hold(stop, time.Until(stopped.Add(p.hold)))
	note := "resumed"
	if err := mem.Cont(); err != nil {
		note = "SIGCONT failed: " + err.Error()
		n.ms.problem("member %d: SIGCONT: %v", m, err)
	}
	n.ms.setFrozen(m, false)
	if quiet {
		time.Sleep(n.cfg.FailoverTimeout / 3)
		_ = n.c.Partition() // every member link healed
		n.pauseClients(m, false)
	}
	busyB, b := n.netMark()
	probe.afterResume(!quiet && netOverlap(busyA, a, busyB, b))
	n.end(f, note)
}

// handover terminates a member (a planned handover when it is the
// active/leader) with raw connections kept to it (rawChecks,
// handover-answers); in half of them every member link is first slowed to
// 1.5 × the failover timeout each way (the successor's answer then comes
// late), and stays slow until the member has exited.
func (n *nemesis) handover(p plan, stop <-chan struct{}) {
	m, why := n.target(p, 0.7)
	target := fmt.Sprintf("member %d", m)
	delayed := p.choice < 0.5 && n.c.Proxied() && n.claimNet()
	if delayed {
		defer n.releaseNet()
		why = strings.TrimSpace(why + " member links slowed")
	}
	n.ms.setDown(m, true)
	f := n.begin(FaultHandover, target, why)
	if delayed {
		n.slowLinks(3 * n.cfg.FailoverTimeout / 2)
	}
	busyA, a := n.netMark()
	probe := n.raw.beforeHandover(m)
	probe.atSignal()
	code, err := n.c.Member(m).Term()
	busyB, b := n.netMark()
	probe.afterExit(!delayed && netOverlap(busyA, a, busyB, b), delayed)
	if delayed {
		n.slowLinks(0)
	}
	note := fmt.Sprintf("exit %d", code)
	switch {
	case err != nil:
		note = "SIGTERM: " + err.Error()
		n.ms.problem("member %d: SIGTERM: %v", m, err)
	case code != 0:
		n.ms.problem("member %d: exit status %d after SIGTERM, want 0", m, code)
	}
	hold(stop, p.hold)
	n.end(f, note+"; "+n.restart(m))
}

// pauseClients pauses (or resumes) every client path to member m: the
// workload's proxies and the ones its M answers lead to.
func (n *nemesis) pauseClients(m int, on bool) {
	var ps []*faultproxy.Proxy
	for _, row := range n.clients {
		ps = append(ps, row[m])
	}
	for j := range n.c.Members() {
		if l := n.c.Link(j, m).Client; l != nil {
			ps = append(ps, l)
		}
	}
	for _, px := range ps {
		if on {
			px.Pause(faultproxy.Both)
		} else {
			px.Resume(faultproxy.Both)
		}
	}
}

// slowLinks delays every member link to d each way. A delay is raised in
// steps of a third, each held as long as the step: a step leaves a gap of
// its size in every link's stream (what was read before it is due sooner),
// a third of 1.5 × the failover timeout, so the members stay live. Lowered,
// it drops at once (what is held is then due at once: no gap).
func (n *nemesis) slowLinks(d time.Duration) {
	set := func(v time.Duration) {
		for j := range n.c.Members() {
			for k := range n.c.Members() {
				if l := n.c.Link(j, k).Member; l != nil {
					l.Delay(faultproxy.Both, v)
				}
			}
		}
	}
	if d == 0 {
		set(0)
		return
	}
	for step := 1; step <= 3; step++ {
		set(d * time.Duration(step) / 3)
		time.Sleep(d/3 + 100*time.Millisecond)
	}
}

// partition cuts the cluster in groups. A two-way partition cuts the
// member links between groups and the paths of the clients located with
// one group to the members of another (a client at location L is on
// member L's side), as a network partition between machines would. The
// proxies an M answer leads clients to (member j's --peers entry for k)
// are shared by clients of every location, so they are all cut, their
// connections reset: a client cannot reach the other side through an
// address it learned before the partition, and goes to the members of
// its side directly. A one-way cut drops what one member sends to
// another on the member link only. The client paths that are cut begin
// with a reset of their connections (as a firewall that rejects, so
// clients notice) and then drop everything (as one that drops).
func (n *nemesis) partition(p plan, stop <-chan struct{}) {
	members := len(n.c.Members())
	if members == 1 {
		n.cutOff(p, stop)
		return
	}
	var err error
	var target string
	var groups [][]int
	switch {
	case p.choice < 0.55: // one member alone: the active/leader most of the time
		m, why := n.target(p, 0.7)
		groups = [][]int{{m}}
		target = fmt.Sprintf("{%d} | {%s} %s", m, others(members, m), why)
	case p.choice < 0.8: // one way: from stops reaching to; to still reaches from
		from, _ := n.target(p, 0.7)
		to := (from + 1 + p.pick2) % members
		err = n.c.Cut(from, to)
		target = fmt.Sprintf("cut %d → %d", from, to)
	default: // every member alone
		var names []string
		for i := range members {
			groups = append(groups, []int{i})
			names = append(names, fmt.Sprintf("{%d}", i))
		}
		target = strings.Join(names, " | ")
	}
	if groups != nil {
		if err = n.c.Partition(groups...); err == nil {
			n.cutClients(groups)
		}
	}
	f := n.begin(FaultPartition, target, "")
	if err != nil {
		n.healAll()
		n.end(f, "failed: "+err.Error())
		return
	}
	hold(stop, p.hold)
	n.healAll()
	n.end(f, "healed")
}

// cutOff is a single node's partition: the clients of locations 1 and 2,
// across a network from the node (location 0 is beside it), lose their
// paths to it — one location, or both; or both hear nothing back while
// their requests still arrive (a one-way cut: executed requests whose
// answers are lost, the outcomes the clients cannot know). Cut paths
// begin with a reset of their connections, as in partition.
func (n *nemesis) cutOff(p plan, stop <-chan struct{}) {
	locs, dir, how := []int{1, 2}, faultproxy.Both, "cut off"
	switch {
	case p.choice < 0.55:
		locs = []int{1 + int(p.coin*2)}
	case p.choice < 0.8:
	default:
		dir, how = faultproxy.Rx, "answers lost"
	}
	var names []string
	for _, loc := range locs {
		names = append(names, fmt.Sprint(loc))
		for _, px := range n.clients[loc] {
			px.Blackhole(dir)
			px.ResetAll()
		}
	}
	f := n.begin(FaultPartition, fmt.Sprintf("clients at %s %s", strings.Join(names, ", "), how), "")
	hold(stop, p.hold)
	n.healAll()
	n.end(f, "healed")
}

// cutClients blackholes every client path between groups (members not
// named form one more group, as in Cluster.Partition).
func (n *nemesis) cutClients(groups [][]int) {
	members := len(n.c.Members())
	group := make([]int, members)
	for i := range group {
		group[i] = len(groups)
	}
	for g, ms := range groups {
		for _, m := range ms {
			group[m] = g
		}
	}
	for loc := range n.clients {
		for m, px := range n.clients[loc] {
			if group[loc%members] != group[m] {
				px.Blackhole(faultproxy.Both)
				px.ResetAll()
			}
		}
	}
	for j := range members {
		for k := range members {
			if l := n.c.Link(j, k).Client; l != nil {
				l.Blackhole(faultproxy.Both)
				l.ResetAll()
			}
		}
	}
}

// healAll lifts every network fault: the member links, the proxies the
// M answers lead to, and the clients' own proxies.
func (n *nemesis) healAll() {
	n.c.Heal()
	for _, row := range n.clients {
		for _, px := range row {
			px.Heal()
		}
	}
}

// others lists the members but m, space-separated.
func others(members, m int) string {
	var s []string
	for i := range members {
		if i != m {
			s = append(s, fmt.Sprint(i))
		}
	}
	return strings.Join(s, " ")
}

// drop resets client connections: to every member, or to one.
func (n *nemesis) drop(p plan) {
	members := len(n.c.Members())
	var target string
	var ps []*faultproxy.Proxy
	if p.choice < 0.5 {
		target = "every member"
		for _, row := range n.clients {
			ps = append(ps, row...)
		}
		for j := range members {
			for k := range members {
				if l := n.c.Link(j, k).Client; l != nil {
					ps = append(ps, l)
				}
			}
		}
	} else {
		m := p.pick
		target = fmt.Sprintf("member %d", m)
		for _, row := range n.clients {
			ps = append(ps, row[m])
		}
		for j := range members {
			if l := n.c.Link(j, m).Client; l != nil {
				ps = append(ps, l)
			}
		}
	}
	f := n.begin(FaultDrop, "client connections to "+target, "")
	for _, px := range ps {
		px.ResetAll()
	}
	n.end(f, "")
}
