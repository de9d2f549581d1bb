package machine

import (
	"slices"
	"testing"
)

// positional is priority.positional (peers.go): two lists that agree
// position by position.
func positional(theirs, ours []string) bool {
	if len(theirs) != len(ours) {
		return false
	}
	for i := range theirs {
		if theirs[i] != ours[i] && (slices.Contains(ours, theirs[i]) || slices.Contains(theirs, ours[i])) {
			return false
		}
	}
	return true
}

// ready makes m the serving active at epoch e (its first reservation done).
func ready(m *Member, now int64, e uint64) {
	m.promoteAt(e)
	m.begin()
	m.becomeActive(now, "a test", Base{From: None}, 0, false)
	settle(m, now, m.out)
}

// TestRolesTwoActivesDifferentLists: two actives at the same epoch whose
// --peers put each first (a failover in the middle of a rolling change):
// by index each would keep serving; they compare their own entries
// instead, so exactly one steps down, and the same one on both sides.
func TestRolesTwoActivesDifferentLists(t *testing.T) {
	const a, b = "10.0.0.1:7070", "10.0.0.2:7070"
	now := 1000 * ms
	T := 1000 * ms
	ra := New(Config{Self: 0, Peers: []string{a, b}, Timeout: T, Now: now}) // a's list: a, b
	rb := New(Config{Self: 0, Peers: []string{b, a}, Timeout: T, Now: now}) // b's list: b, a
	ra.Step(now, Msg{Kind: MsgJoined, From: 1, Name: b, Differs: true})
	rb.Step(now, Msg{Kind: MsgJoined, From: 1, Name: a, Differs: true})
	ready(ra, now, 4)
	ready(rb, now, 4)
	// Each hears the other, the later (a: the smaller entry) judges once
	// the other holds, and says so.
	for k := range 4 {
		at := now + int64(k)*10*ms
		ra.Tick(at, Local{})
		rb.Tick(at, Local{})
		ra.Step(at, Msg{Kind: MsgHeartbeat, From: 1, HB: say(rb)})
		rb.Step(at, Msg{Kind: MsgHeartbeat, From: 1, HB: sayVerdict(ra, 1)})
	}
	if ra.role != RoleActive || ra.demotions != 0 {
		t.Fatalf("a (the smaller entry) stepped down: %v", ra.role)
	}
	if rb.role != RoleStandby || rb.active != 1 || rb.demotions != 1 {
		t.Fatalf("b did not step down towards a: %v following %d", rb.role, rb.active)
	}
	// With lists that agree, the index decides, as before.
	rc := New(Config{Self: 1, Peers: []string{a, b}, Timeout: T, Now: now})
	rc.Step(now, Msg{Kind: MsgJoined, From: 0, Name: a})
	ready(rc, now, 4)
	rc.Step(now, Msg{Kind: MsgHeartbeat, From: 0, HB: Heartbeat{Epoch: 4, Role: RoleActive, Active: 0, Serving: true, Verdict: 4}})
	if rc.role != RoleStandby || rc.active != 0 {
		t.Fatalf("member 1 of agreeing lists did not step down for member 0: %v following %d", rc.role, rc.active)
	}
}

// sayVerdict is say(m) to member to, with m's verdict on it.
func sayVerdict(m *Member, to int) Heartbeat {
	hb := say(m)
	hb.Verdict = m.verdict[to]
	return hb
}

// listSim runs the machines of members whose --peers differ: member
// names are their entries; a heartbeat is delivered with the index of its
// sender and of the active it follows mapped onto the receiver's list, as
// the link does (mapPeers).
type listSim struct {
	t     *testing.T
	now   int64
	lists map[string][]string
	m     map[string]*Member
}

func newListSim(t *testing.T, lists map[string][]string) *listSim {
	s := &listSim{t: t, now: 1000 * ms, lists: lists, m: map[string]*Member{}}
	for name, l := range lists {
		s.m[name] = New(Config{Self: slices.Index(l, name), Peers: l, Timeout: 1000 * ms, Now: s.now, TokenBlock: 10})
	}
	for name, l := range lists {
		for other, ol := range lists {
			if other != name {
				s.m[name].Step(s.now, Msg{Kind: MsgJoined, From: slices.Index(l, other), Name: other, Differs: !positional(l, ol)})
			}
		}
	}
	return s
}

// deliver makes every member hear every other's heartbeat, with in-sync
// as given (standbys that were in sync with an active that is gone); it
// reports which members promoted and which handed over.
func (s *listSim) deliver(inSync map[string]bool) (promoted map[string]bool, offered map[string]int) {
	promoted, offered = map[string]bool{}, map[string]int{}
	for to, r := range s.m {
		for from, fr := range s.m {
			if from == to {
				continue
			}
			follows := -1
			if fr.active >= 0 {
				follows = slices.Index(s.lists[to], s.lists[from][fr.active])
			}
			hb := Heartbeat{Epoch: fr.epoch, Role: fr.role, Active: follows, InSync: inSync[from], Serving: fr.servingNow()}
			wasActive := r.role == RoleActive
			acts := settle(r, s.now, r.Step(s.now, Msg{Kind: MsgHeartbeat, From: slices.Index(s.lists[to], from), HB: hb}))
			if !wasActive && r.role == RoleActive {
				promoted[to] = true
			}
			for _, a := range find(acts, ActHandoff) {
				offered[to] = a.To
			}
		}
	}
	return promoted, offered
}

// TestRolesMixedListsPromoteOne: the active is gone in the middle of a
// rolling change; the in-sync standbys disagree on which of them comes
// first (d lists c first, c lists d first). They order by their own
// entries while the lists are mixed, so exactly one promotes (by index,
// each would wait for the other forever).
func TestRolesMixedListsPromoteOne(t *testing.T) {
	s := newListSim(t, map[string][]string{
		"a": {"d", "a", "c", "x"}, // restarted with the new list, not in sync yet
		"c": {"d", "a", "c", "x"},
		"d": {"a", "c", "d", "x"}, // not restarted yet
	})
	// x was the active: gone (killed), every standby still names it.
	inSync := map[string]bool{"c": true, "d": true}
	for name, r := range s.m {
		r.inSync = inSync[name]
		r.active, r.epoch = slices.Index(s.lists[name], "x"), 3
	}
	promoted := map[string]bool{}
	for range 30 {
		s.now += 100 * ms
		for name, r := range s.m {
			was := r.role == RoleActive
			if settle(r, s.now, r.Tick(s.now, Local{})); !was && r.role == RoleActive {
				promoted[name] = true
			}
		}
		p, _ := s.deliver(inSync)
		for name := range p {
			promoted[name] = true
		}
	}
	if len(promoted) != 1 || !promoted["c"] {
		t.Fatalf("promoted %v, want only c (the smallest entry among the in-sync standbys)", promoted)
	}
}

// TestRolesMixedListsNoPriorityHandover: an active whose list puts an
// in-sync standby first does not hand over while that standby's list
// differs (it would hand back: the lists disagree); once the lists agree,
// it does.
func TestRolesMixedListsNoPriorityHandover(t *testing.T) {
	s := newListSim(t, map[string][]string{
		"c": {"d", "a", "c"},
		"d": {"a", "c", "d"},
	})
	c, d := s.m["c"], s.m["d"]
	s.now += 2000 * ms
	c.Tick(s.now, Local{})
	d.Tick(s.now, Local{})
	ready(c, s.now, 5)
	d.active, d.epoch, d.inSync = slices.Index(s.lists["d"], "c"), 5, true
	for range 10 {
		s.now += 100 * ms
		settle(c, s.now, c.Tick(s.now, Local{}))
		d.Tick(s.now, Local{})
		if _, off := s.deliver(map[string]bool{"d": true}); off["c"] >= 0 && len(off) > 0 {
			t.Fatalf("c handed over to %d while d's list differs", off["c"])
		}
	}
	// d restarts with c's list: they agree, and c hands over to d.
	s.lists["d"] = []string{"d", "a", "c"}
	c.Step(s.now, Msg{Kind: MsgJoined, From: 0, Name: "d"})
	d2 := New(Config{Self: 0, Peers: s.lists["d"], Timeout: 1000 * ms, Now: s.now})
	d2.Step(s.now, Msg{Kind: MsgJoined, From: 2, Name: "c"})
	d2.active, d2.epoch, d2.inSync = 2, 5, true
	s.m["d"] = d2
	handed := false
	for range 10 {
		s.now += 100 * ms
		if acts := settle(c, s.now, c.Tick(s.now, Local{})); len(find(acts, ActHandoff)) > 0 {
			handed = true
		}
		if _, off := s.deliver(map[string]bool{"d": true}); off["c"] == 0 && len(off) > 0 {
			handed = true
		}
	}
	if !handed {
		t.Fatal("c did not hand over to d once their lists agree")
	}
}
