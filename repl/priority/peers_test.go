package priority

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestMapPeers: who a peer is here and what its indexes mean, for lists
// that agree (written the same way or through proxies), and for lists a
// rolling change of --peers left different: by the address as written.
func TestMapPeers(t *testing.T) {
	a, b, c, d := "10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070", "10.0.0.4:7070"
	tests := []struct {
		name    string
		ours    []string
		self    int
		theirs  []string
		sender  uint8
		from    int
		xlate   []int
		differs bool
		err     string
	}{
		{"the same lists", []string{a, b, c}, 0, []string{a, b, c}, 1, 1, []int{0, 1, 2}, false, ""},
		{"through proxies: positional", []string{a, "127.0.0.1:9012", "127.0.0.1:9013"}, 0,
			[]string{"127.0.0.1:9021", b, "127.0.0.1:9023"}, 1, 1, []int{0, 1, 2}, false, ""},
		{"reordered", []string{a, b, c}, 0, []string{b, a, c}, 0, 1, []int{1, 0, 2}, true, ""},
		{"a member added at the end", []string{a, b, c}, 0, []string{a, b, c, d}, 2, 2, []int{0, 1, 2, -1}, true, ""},
		{"a member removed", []string{a, b, c}, 2, []string{a, c}, 0, 0, []int{0, 2}, true, ""},
		{"a member removed, seen by the new list", []string{a, c}, 1, []string{a, b, c}, 0, 0, []int{0, -1, 1}, true, ""},
		{"the new member, not listed here", []string{a, b, c}, 0, []string{a, b, c, d}, 3, 0, nil, true, "is not in --peers here"},
		{"it says it is this member", []string{a, b, c}, 1, []string{a, b, c}, 1, 0, nil, false, "says it is this member"},
		{"it says it is this member, other list", []string{a, b}, 1, []string{b, a, c}, 0, 0, nil, true, "says it is this member"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &hello{Members: uint8(len(tc.theirs)), Self: tc.sender, Peers: tc.theirs}
			pm, err := mapPeers(h, tc.ours, tc.self)
			if tc.err != "" {
				if !errors.Is(err, errMismatch) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("mapPeers: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if pm.from != tc.from || !slices.Equal(pm.xlate, tc.xlate) || pm.differs != tc.differs || pm.name != tc.theirs[tc.sender] {
				t.Fatalf("mapPeers: %+v, want from %d xlate %v differs %v", pm, tc.from, tc.xlate, tc.differs)
			}
			if got := pm.index(noActive); got != -1 {
				t.Fatalf("index(noActive) = %d", got)
			}
		})
	}
}

// TestRolesTwoActivesDifferentLists: two actives at the same epoch whose
// --peers put each first (a failover in the middle of a rolling change):
// by index each would keep serving; they compare their own entries instead,
// so exactly one steps down, and the same one on both sides.
func TestRolesTwoActivesDifferentLists(t *testing.T) {
	const a, b = "10.0.0.1:7070", "10.0.0.2:7070"
	now := int64(1000 * ms)
	T := int64(1000 * ms)
	ra := newRoles(0, 2, T, 0, now) // a's list: a, b
	rb := newRoles(0, 2, T, 0, now) // b's list: b, a
	ra.setSelfName(a)
	rb.setSelfName(b)
	ra.setPeer(1, b, true)
	rb.setPeer(1, a, true)
	now += 2 * T
	ra.tick(now)
	rb.tick(now)
	ra.promoteAt(4)
	rb.promoteAt(4)
	hbA := peerState{epoch: 4, role: roleActive, follows: 0}
	hbB := peerState{epoch: 4, role: roleActive, follows: 0}
	ca := ra.heard(now, 1, hbB)
	cb := rb.heard(now, 1, hbA)
	if ca.demote || ra.role != roleActive {
		t.Fatalf("a (the smaller entry) stepped down: %+v", ca)
	}
	if !cb.demote || cb.follow != 1 || rb.role != roleStandby {
		t.Fatalf("b did not step down towards a: %+v, role %v", cb, rb.role)
	}
	// With lists that agree, the index decides, as before.
	rc := newRoles(1, 2, T, 0, now)
	rc.setSelfName(b)
	rc.setPeer(0, a, false)
	rc.tick(now + 2*T)
	rc.promoteAt(4)
	if c := rc.heard(now+2*T, 0, hbA); !c.demote {
		t.Fatalf("member 1 of agreeing lists did not step down for member 0: %+v", c)
	}
}

// listSim runs role machines of members whose --peers differ: member
// names are their entries; a heartbeat is delivered with the index of its
// sender and of the active it follows mapped onto the receiver's list, as
// the link does (mapPeers).
type listSim struct {
	t     *testing.T
	now   int64
	lists map[string][]string
	m     map[string]*roles
}

func newListSim(t *testing.T, lists map[string][]string) *listSim {
	s := &listSim{t: t, now: 1000 * ms, lists: lists, m: map[string]*roles{}}
	for name, l := range lists {
		r := newRoles(slices.Index(l, name), len(l), 1000*ms, 0, s.now)
		r.setSelfName(name)
		s.m[name] = r
	}
	for name, l := range lists {
		for other, ol := range lists {
			if other != name {
				s.m[name].setPeer(slices.Index(l, other), other, !positional(l, ol))
			}
		}
	}
	return s
}

// deliver makes every member hear every other's heartbeat, with in-sync
// as given (standbys that were in sync with an active that is gone).
func (s *listSim) deliver(inSync map[string]bool) map[string]change {
	out := map[string]change{}
	for to, r := range s.m {
		for from, fr := range s.m {
			if from == to {
				continue
			}
			follows := -1
			if fr.active >= 0 {
				follows = slices.Index(s.lists[to], s.lists[from][fr.active])
			}
			hb := peerState{epoch: fr.epoch, role: fr.role, follows: follows, inSync: inSync[from]}
			c := r.heard(s.now, slices.Index(s.lists[to], from), hb)
			if c.promote || c.demote || c.handover >= 0 {
				out[to] = c
			}
		}
	}
	return out
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
			if c := r.tick(s.now); c.promote {
				promoted[name] = true
			}
		}
		for name, c := range s.deliver(inSync) {
			if c.promote {
				promoted[name] = true
			}
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
	c.tick(s.now)
	d.tick(s.now)
	c.promoteAt(5)
	d.active, d.epoch, d.inSync = slices.Index(s.lists["d"], "c"), 5, true
	for range 10 {
		s.now += 100 * ms
		c.tick(s.now)
		d.tick(s.now)
		if ch, ok := s.deliver(map[string]bool{"d": true})["c"]; ok && ch.handover >= 0 {
			t.Fatalf("c handed over to %d while d's list differs", ch.handover)
		}
	}
	// d restarts with c's list: they agree, and c hands over to d.
	s.lists["d"] = []string{"d", "a", "c"}
	c.setPeer(0, "d", false)
	d2 := newRoles(0, 3, 1000*ms, 0, s.now)
	d2.setSelfName("d")
	d2.setPeer(2, "c", false)
	d2.active, d2.epoch, d2.inSync = 2, 5, true
	s.m["d"] = d2
	handed := false
	for range 10 {
		s.now += 100 * ms
		c.tick(s.now)
		if ch, ok := s.deliver(map[string]bool{"d": true})["c"]; ok && ch.handover == 0 {
			handed = true
		}
	}
	if !handed {
		t.Fatal("c did not hand over to d once their lists agree")
	}
}
