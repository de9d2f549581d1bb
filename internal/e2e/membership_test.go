package e2e

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
)

// The cluster-operations procedures of docs/CLUSTER.md, with
// real processes: replace a dead raft member, move one to a new address,
// recover from the loss of a majority, and a rolling change of a priority
// cluster's --peers. Each holds locks across the procedure and checks them,
// with their tokens, on the members that end it, and runs a client (the Go
// client, given the members' addresses) throughout.

// clientLoad is a client that acquires and releases fresh keys one after
// another while a procedure runs: every acquire must succeed (the cluster
// serves throughout) and its tokens must increase strictly.
type clientLoad struct {
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	tokens []uint64
	errs   []error
}

// startLoad runs a clientLoad against addrs until stop.
func startLoad(t *testing.T, addrs []string) *clientLoad {
	t.Helper()
	cfg := client.DefaultConfig()
	cfg.Addrs = addrs
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := &clientLoad{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer cl.Close()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			lk, err := cl.Acquire(ctx, fmt.Sprintf("load/%d", i), client.AcquireOptions{Wait: 5 * time.Second, Lease: 20 * time.Second})
			if err == nil {
				err = cl.Release(ctx, lk)
			}
			cancel()
			l.mu.Lock()
			if err != nil {
				l.errs = append(l.errs, fmt.Errorf("load/%d: %w", i, err))
			} else {
				l.tokens = append(l.tokens, lk.Token)
			}
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { l.end() })
	return l
}

// count is how many acquires succeeded so far.
func (l *clientLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tokens)
}

// waitMore waits until n more acquires succeeded (the cluster serves).
func (l *clientLoad) waitMore(t *testing.T, n int, what string) {
	t.Helper()
	want := l.count() + n
	deadline := time.Now().Add(20 * time.Second)
	for l.count() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the client made %d acquires in 20 s, want %d more", what, l.count()-want+n, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *clientLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// check ends the load and fails the test on any error or any token that
// does not increase; it returns the highest token.
func (l *clientLoad) check(t *testing.T, what string) uint64 {
	t.Helper()
	l.end()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Fatalf("%s: %d of %d acquires failed, the first: %v", what, len(l.errs), len(l.errs)+len(l.tokens), l.errs[0])
	}
	for i := 1; i < len(l.tokens); i++ {
		if l.tokens[i] <= l.tokens[i-1] {
			t.Fatalf("%s: token %d after %d: tokens must increase", what, l.tokens[i], l.tokens[i-1])
		}
	}
	if len(l.tokens) == 0 {
		t.Fatalf("%s: the client made no acquire", what)
	}
	t.Logf("%s: the client made %d acquires, none failed, tokens increasing", what, len(l.tokens))
	return l.tokens[len(l.tokens)-1]
}

// holdLocks grants n keys prefix/i on member i's connection (lease 200 s)
// and returns them with their tokens, and the highest token.
func holdLocks(t *testing.T, c *clustertest.Cluster, i int, prefix string, n int) (map[string]uint64, uint64) {
	t.Helper()
	conn := dial(t, c, i)
	held := map[string]uint64{}
	var last uint64
	for k := range n {
		key := fmt.Sprintf("%s/%d", prefix, k)
		held[key] = grant(t, conn, key, 200, uint64(k+1))
		last = max(last, held[key])
	}
	return held, last
}

// waitHolds waits until member i holds every key of want with its token
// (other keys may be held too: the load's).
func waitHolds(t *testing.T, c *clustertest.Cluster, i int, want map[string]uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := dumpKeys(t, c, i)
		missing := ""
		for k, tok := range want {
			if got[k] != tok {
				missing = fmt.Sprintf("%s with token %d (it has %d)", k, tok, got[k])
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: member %d does not hold %s", what, i, missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// memberChange makes a membership change on the leader (what lockctl
// member add/remove do): it asks the member every running member agrees
// leads, and on a 421 (the leader moved, or it handed over to be removed)
// asks again.
func memberChange(t *testing.T, c *clustertest.Cluster, method, path string, body any) api.MemberChange {
	t.Helper()
	var ch api.MemberChange
	var err error
	for range 10 {
		l := servingMember(t, c)
		err = c.Member(l).Admin(method, path, body, &ch, 90*time.Second)
		var ae *clustertest.AdminError
		if errors.As(err, &ae) && ae.Code == 421 {
			t.Logf("%s %s on member %d: 421 %s", method, path, l, ae.Body)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return ch
}

// servingMember waits until a running member says it serves (a joiner
// not added yet names no leader, so agreement is not asked for) and
// returns it.
func servingMember(t *testing.T, c *clustertest.Cluster) int {
	t.Helper()
	l := -1
	_, err := c.WaitStatuses(15*time.Second, clustertest.Running(), func(sts []clustertest.Status) error {
		for _, st := range sts {
			if api.Serving(st.Role) {
				l = st.Index
				return nil
			}
		}
		return errors.New("no member serves")
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// voters are the client addresses of the voters of member i's
// configuration.
func voters(t *testing.T, c *clustertest.Cluster, i int) []string {
	t.Helper()
	var ms api.Members
	if err := c.Member(i).Admin("GET", api.PathMembers, nil, &ms, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms.Members {
		if m.Voter {
			out = append(out, m.Addr)
		}
	}
	slices.Sort(out)
	return out
}

// votersBecome waits until member i's view of the voters satisfies ok
// (a member learns a configuration change from the leader's log a round
// trip after the leader: it may lag the answer of the change) and
// returns the last view.
func votersBecome(t *testing.T, c *clustertest.Cluster, i int, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := voters(t, c, i)
		if ok(got) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRaftReplaceDeadMember is docs/CLUSTER.md's "Replace a dead member":
// kill -9 a follower, remove it, start a fresh member (new port, new data
// dir, --join) and add it. The cluster serves throughout (a client's every
// acquire succeeds, tokens increasing); the new member ends with every
// held lock and its token; it votes: with it, the cluster survives the loss
// of one more original member.
func TestRaftReplaceDeadMember(t *testing.T) {
	c, l := startRaft(t, false)
	noRaces(t, c)
	held, last := holdLocks(t, c, l, "held", 50)
	load := startLoad(t, c.Addrs())
	load.waitMore(t, 5, "before")
	dead := (l + 1) % 3
	if err := c.Member(dead).Kill(); err != nil {
		t.Fatal(err)
	}
	ch := memberChange(t, c, "DELETE", api.PathMembers+"/"+c.Member(dead).Addr(), nil)
	t.Logf("removed %s: %d members left", ch.Member.ID, len(ch.Members.Members))
	load.waitMore(t, 5, "after the removal")
	var current []string
	for i, a := range c.Addrs() {
		if i != dead {
			current = append(current, a)
		}
	}
	nm, err := c.AddMember(func(self string) []string { return append(slices.Clone(current), self) }, "--join")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := nm.Status(); err != nil || st.Active != "" || api.Serving(st.Role) {
		t.Fatalf("a joiner not added yet: %+v %v (it must name no leader and serve nothing)", st.Status, err)
	}
	ch = memberChange(t, c, "POST", api.PathMembers, api.AddMember{Addr: nm.Addr()})
	if !ch.Member.Voter || ch.Member.Addr != nm.Addr() {
		t.Fatalf("added %+v", ch.Member)
	}
	want := sorted(append(current, nm.Addr()))
	if got := votersBecome(t, c, nm.Index(), func(v []string) bool { return slices.Equal(v, want) }); !slices.Equal(got, want) {
		t.Fatalf("the new member's voters %v, want %v", got, want)
	}
	waitHolds(t, c, nm.Index(), held, "the new member")
	load.waitMore(t, 5, "after the add")
	// The new member votes: the leader and it are a majority without the
	// last original follower.
	other := (l + 2) % 3
	if err := c.Member(other).Kill(); err != nil {
		t.Fatal(err)
	}
	load.waitMore(t, 10, "after losing the last original follower")
	lastLoad := load.check(t, "replace a dead member")
	nl, _ := waitServing(t, c, 10*time.Second)
	waitHolds(t, c, nl, held, "the leader")
	if tok := grant(t, dial(t, c, nl), "after", 10, 1); tok <= max(last, lastLoad) {
		t.Fatalf("token after the procedure %d, not above %d", tok, max(last, lastLoad))
	}
}

// TestRaftMoveMember is docs/CLUSTER.md's "Move a member to a new address"
// in its safe order — add the new member, remove the old, stop the old —
// for the leader itself (the removal hands the leadership over first).
// The cluster serves throughout and the moved member holds every lock.
func TestRaftMoveMember(t *testing.T) {
	c, l := startRaft(t, false)
	noRaces(t, c)
	held, last := holdLocks(t, c, l, "held", 50)
	load := startLoad(t, c.Addrs())
	load.waitMore(t, 5, "before")
	old := c.Member(l)
	var rest []string
	for i, a := range c.Addrs() {
		if i != l {
			rest = append(rest, a)
		}
	}
	nm, err := c.AddMember(func(self string) []string { return append(slices.Clone(rest), self) }, "--join")
	if err != nil {
		t.Fatal(err)
	}
	memberChange(t, c, "POST", api.PathMembers, api.AddMember{Addr: nm.Addr()})
	waitHolds(t, c, nm.Index(), held, "the new member")
	if got := votersBecome(t, c, nm.Index(), func(v []string) bool { return len(v) == 4 }); len(got) != 4 {
		t.Fatalf("voters during the move %v, want 4", got)
	}
	load.waitMore(t, 5, "with four voters")
	// The old member leads: its removal hands the leadership over (a 421
	// naming the successor), which removes it.
	ch := memberChange(t, c, "DELETE", api.PathMembers+"/"+old.Addr(), nil)
	want := sorted(append(rest, nm.Addr()))
	if got := votersBecome(t, c, nm.Index(), func(v []string) bool { return slices.Equal(v, want) }); !slices.Equal(got, want) {
		t.Fatalf("voters after the move %v, want %v (removed %+v)", got, want, ch.Member)
	}
	if _, err := old.WaitLog(regexp.MustCompile(`handed the leadership over`), 5*time.Second); err != nil {
		t.Fatalf("the old leader did not hand over before its removal: %v", err)
	}
	if code, err := old.Term(); err != nil || code != 0 {
		t.Fatalf("SIGTERM of the removed member: exit %d, %v", code, err)
	}
	load.waitMore(t, 10, "after the move")
	lastLoad := load.check(t, "move the leader")
	nl, _ := waitServing(t, c, 10*time.Second)
	waitHolds(t, c, nm.Index(), held, "the moved member")
	waitHolds(t, c, nl, held, "the leader")
	if tok := grant(t, dial(t, c, nl), "after", 10, 1); tok <= max(last, lastLoad) {
		t.Fatalf("token after the move %d, not above %d", tok, max(last, lastLoad))
	}
}

// TestRaftForceNewCluster is docs/CLUSTER.md's "Disaster recovery": three
// members hold locks, two are killed for good (the leader among them); the
// third restarts with --force-new-cluster and serves alone with every lock
// it had, its first token above every earlier token; two fresh members
// join and get every lock. A member left behind that starts again on its
// old data dir is refused, the flag left on is refused at the next start.
func TestRaftForceNewCluster(t *testing.T) {
	c, l := startRaft(t, false)
	noRaces(t, c)
	held, last := holdLocks(t, c, l, "held", 100)
	settleKeys(t, c, held)
	survivor := (l + 1) % 3
	lost := []int{l, (l + 2) % 3}
	for _, i := range lost {
		if err := c.Member(i).Kill(); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Member(survivor)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := s.RestartWith("--force-new-cluster"); err != nil {
		t.Fatal(err)
	}
	nl, took := waitServing(t, c, 15*time.Second)
	if nl != survivor {
		t.Fatalf("member %d serves, want the survivor %d", nl, survivor)
	}
	t.Logf("the survivor serves alone %v after its restart with --force-new-cluster", time.Since(began).Round(time.Millisecond))
	_ = took
	waitHolds(t, c, survivor, held, "the recovered member")
	if tok := grant(t, dial(t, c, survivor), "first", 30, 1); tok <= last {
		t.Fatalf("first token after the recovery %d, not above %d", tok, last)
	}
	load := startLoad(t, []string{s.Addr()})
	load.waitMore(t, 5, "alone")
	var added []*clustertest.Member
	for range 2 {
		current := []string{s.Addr()}
		for _, m := range added {
			current = append(current, m.Addr())
		}
		nm, err := c.AddMember(func(self string) []string { return append(slices.Clone(current), self) }, "--join")
		if err != nil {
			t.Fatal(err)
		}
		memberChange(t, c, "POST", api.PathMembers, api.AddMember{Addr: nm.Addr()})
		added = append(added, nm)
		load.waitMore(t, 5, "after adding "+nm.Addr())
	}
	for _, m := range added {
		waitHolds(t, c, m.Index(), held, "a member added back")
	}
	if got := voters(t, c, survivor); len(got) != 3 {
		t.Fatalf("voters after adding back %v", got)
	}
	// A member left behind starts again on its old data dir: the cluster
	// refuses it and goes on serving.
	back := c.Member(lost[1])
	if err := back.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitLog(regexp.MustCompile(`the forced recovery left behind is talking to this cluster: refused`), 10*time.Second); err != nil {
		t.Fatalf("the survivor did not refuse a member left behind: %v", err)
	}
	load.waitMore(t, 10, "with a member left behind running")
	if err := back.Kill(); err != nil {
		t.Fatal(err)
	}
	lastLoad := load.check(t, "forced recovery")
	// The flag left on: the next start is refused, naming it; without it
	// the member rejoins its new cluster.
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	err := s.RestartWith("--force-new-cluster")
	if !errors.Is(err, clustertest.ErrExited) || !strings.Contains(err.Error(), "remove the flag") {
		t.Fatalf("restart with the flag left on: %v, want an exit naming the flag", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	nl, _ = waitServing(t, c, 15*time.Second, lost...)
	waitHolds(t, c, nl, held, "the leader at the end")
	if tok := grant(t, dial(t, c, nl), "after", 10, 1); tok <= max(last, lastLoad) {
		t.Fatalf("token at the end %d, not above %d", tok, max(last, lastLoad))
	}
}

// rollTo restarts member m with --peers peers (SIGTERM, then the new
// command line) and waits until it is back: every running member agrees
// on the active, and m is it or a standby in sync with it.
func rollTo(t *testing.T, c *clustertest.Cluster, m *clustertest.Member, peers []string) {
	t.Helper()
	if m.Alive() {
		if code, err := m.Term(); err != nil || code != 0 {
			t.Fatalf("SIGTERM of member %d: exit %d, %v", m.Index(), code, err)
		}
	}
	m.SetPeers(peers)
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitStatus(20*time.Second, func(s clustertest.Status) bool {
		return s.Role == api.RoleActive || (s.Role == api.RoleStandby && s.InSync)
	}); err != nil {
		t.Fatalf("member %d with --peers %v: %v", m.Index(), peers, err)
	}
	waitActive(t, c, 20*time.Second)
}

// TestPriorityRollingPeersChange is docs/CLUSTER.md's "Changing a priority
// cluster's members": a rolling restart, one member at a time, that adds a
// member (at the end), removes one, and reorders the list so that the new
// member comes first. Locks held across it keep their tokens on whichever
// member is active, a client given every member's address keeps working
// (no failed acquire, tokens increasing), and at the end every member
// follows the first of the new list.
func TestPriorityRollingPeersChange(t *testing.T) {
	c, a0 := startPriority(t, 3, false)
	noRaces(t, c)
	A, B, C := c.Member(0), c.Member(1), c.Member(2)
	if a0 != 0 {
		t.Fatalf("member %d is the active at start", a0)
	}
	abc := c.Addrs()
	D, err := c.NewMember(func(self string) []string { return append(slices.Clone(abc), self) })
	if err != nil {
		t.Fatal(err)
	}
	held, last := holdLocks(t, c, 0, "held", 100)
	load := startLoad(t, append(slices.Clone(abc), D.Addr()))
	load.waitMore(t, 5, "before")
	activeHolds := func(what string) {
		t.Helper()
		a, _ := waitActive(t, c, 20*time.Second)
		waitHolds(t, c, a, held, what)
	}

	// 1. Add D at the end: every member that stays learns of it first, then
	// D starts (it joins as a standby and syncs).
	abcd := append(slices.Clone(abc), D.Addr())
	for _, m := range []*clustertest.Member{C, B, A} {
		rollTo(t, c, m, abcd)
		load.waitMore(t, 3, fmt.Sprintf("after restarting member %d with D", m.Index()))
	}
	if err := D.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := D.WaitStatus(20*time.Second, func(s clustertest.Status) bool { return s.Role == api.RoleStandby && s.InSync }); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "A is the active of A,B,C,D")
	activeHolds("after adding D")

	// 2. Remove B: it stops first, then the others drop it.
	if code, err := B.Term(); err != nil || code != 0 {
		t.Fatalf("SIGTERM of B: exit %d, %v", code, err)
	}
	acd := []string{A.Addr(), C.Addr(), D.Addr()}
	for _, m := range []*clustertest.Member{D, C, A} {
		rollTo(t, c, m, acd)
		load.waitMore(t, 3, fmt.Sprintf("after restarting member %d without B", m.Index()))
	}
	activeHolds("after removing B")

	// 3. Reorder: D first. Once every member has the new order, the active
	// hands over to D (it is in sync and comes first).
	dac := []string{D.Addr(), A.Addr(), C.Addr()}
	for _, m := range []*clustertest.Member{C, A, D} {
		rollTo(t, c, m, dac)
		load.waitMore(t, 3, fmt.Sprintf("after restarting member %d in the new order", m.Index()))
	}
	waitActiveIs(t, c, D.Index(), "D, first of the new list, is the active")
	activeHolds("after the reorder")
	for _, m := range []*clustertest.Member{A, C, D} {
		if got := m.Peers(); !slices.Equal(got, dac) {
			t.Fatalf("member %d's --peers %v", m.Index(), got)
		}
	}
	load.waitMore(t, 10, "at the end")
	lastLoad := load.check(t, "rolling change of --peers")
	if tok := grant(t, dial(t, c, D.Index()), "after", 10, 1); tok <= max(last, lastLoad) {
		t.Fatalf("token after the change %d, not above %d", tok, max(last, lastLoad))
	}
}
