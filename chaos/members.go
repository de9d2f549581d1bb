package main

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/history"
)

// faultCrash is the fault recorded when a member exited without a fault
// (watch restarts it).
const faultCrash = "crash"

// members tracks what the nemesis did to each member, so that the watcher
// can tell an unexpected exit from a kill and status polls can skip a
// frozen member (its admin endpoint cannot answer), and collects what went
// wrong with the processes.
type members struct {
	c   *clustertest.Cluster
	rec *history.Recorder

	mu       sync.Mutex
	down     map[int]bool // killed or terminated by the nemesis, not restarted yet
	frozen   map[int]bool // stopped by the nemesis
	problems []string     // unexpected exits, failed restarts, unclean SIGTERM exits
}

func newMembers(c *clustertest.Cluster, rec *history.Recorder) *members {
	return &members{c: c, rec: rec, down: map[int]bool{}, frozen: map[int]bool{}}
}

func (ms *members) setDown(i int, v bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.down[i] = v
}

func (ms *members) setFrozen(i int, v bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.frozen[i] = v
}

func (ms *members) problem(format string, args ...any) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.problems = append(ms.problems, fmt.Sprintf(format, args...))
}

// reachable lists the members whose /status can answer: running, not
// frozen.
func (ms *members) reachable() []int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out []int
	for _, m := range ms.c.Members() {
		if !ms.down[m.Index()] && !ms.frozen[m.Index()] && m.Alive() {
			out = append(out, m.Index())
		}
	}
	return out
}

// leader returns a reachable member that says it serves (the active, or
// the leader; the first in --peers order), or -1.
func (ms *members) leader() int {
	for _, i := range ms.reachable() {
		if st, err := ms.c.Member(i).Status(); err == nil && api.Serving(st.Role) {
			return i
		}
	}
	return -1
}

// waitAgreement waits up to within until every member agrees which one
// serves (clustertest's WaitLeader over every member: each must answer),
// and returns it and how long it took, or -1 and why not.
func waitAgreement(c *clustertest.Cluster, within time.Duration) (int, time.Duration, string) {
	began := time.Now()
	lead, err := c.WaitLeader(within, clustertest.Every)
	if err != nil {
		return -1, time.Since(began), err.Error()
	}
	return lead, time.Since(began), ""
}

// watch restarts, every 100 ms until stop is closed, any member that ended
// without the nemesis killing it, and records it as a problem and a
// fault ("crash").
func (ms *members) watch(stop <-chan struct{}, logf func(string, ...any)) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, m := range ms.c.Members() {
			ms.mu.Lock()
			expected := ms.down[m.Index()]
			ms.mu.Unlock()
			if expected || m.Alive() {
				continue
			}
			ms.mu.Lock()
			if ms.down[m.Index()] { // the nemesis took it down meanwhile
				ms.mu.Unlock()
				continue
			}
			ms.down[m.Index()] = true
			ms.mu.Unlock()
			f := ms.rec.AddFault(history.Fault{Kind: faultCrash, Target: fmt.Sprintf("member %d", m.Index()), Start: ms.rec.Now()})
			tail := lastLines(m.Logs(), 5)
			ms.problem("member %d exited without a fault; its last lines:\n%s", m.Index(), tail)
			logf("member %d exited unexpectedly; restarting it", m.Index())
			err := m.Restart()
			note := "restarted"
			if err != nil {
				note = "restart failed: " + err.Error()
				ms.problem("member %d: restart after its unexpected exit: %v", m.Index(), err)
			} else {
				ms.setDown(m.Index(), false)
			}
			ms.rec.EndFault(f, ms.rec.Now(), note)
		}
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logProblems scans every member's log for a race report, a panic or a
// fatal runtime error.
func (ms *members) logProblems() {
	for _, m := range ms.c.Members() {
		logs := m.Logs()
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if i := strings.Index(logs, bad); i >= 0 {
				end := min(len(logs), i+400)
				ms.problem("member %d's log has %q: %s", m.Index(), bad, logs[i:end])
			}
		}
	}
}

// heal lifts every fault: the member links and the client-side proxies
// healed, frozen members resumed, every member that does not run
// restarted. It returns what failed.
func (ms *members) heal(clientProxies []proxy) []string {
	var errs []string
	ms.c.Heal()
	for _, p := range clientProxies {
		p.Heal()
	}
	for _, m := range ms.c.Members() {
		ms.mu.Lock()
		frozen := ms.frozen[m.Index()]
		ms.mu.Unlock()
		if frozen {
			if err := m.Cont(); err != nil {
				errs = append(errs, fmt.Sprintf("member %d: SIGCONT: %v", m.Index(), err))
			}
			ms.setFrozen(m.Index(), false)
		}
	}
	for _, m := range ms.c.Members() {
		if m.Alive() {
			continue
		}
		if err := m.Restart(); err != nil {
			errs = append(errs, fmt.Sprintf("member %d: restart: %v", m.Index(), err))
			continue
		}
		ms.setDown(m.Index(), false)
	}
	return errs
}

// proxy is what the run needs of a client-side fault proxy.
type proxy interface {
	Heal()
	ResetAll()
}
