package priority

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/repl/priority/machine"
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

// TestLineageMapped: a lineage's member indexes are the sender's; they are
// mapped onto this member's list like a heartbeat's active, and an index
// this member does not list (or noActive) names nobody. Back to the wire,
// nobody is noActive.
func TestLineageMapped(t *testing.T) {
	pm := &peerMap{from: 1, xlate: []int{2, 0, -1}}
	w := lineage{{From: 0, Epoch: 5, Pos: 50}, {From: 2, Epoch: 4, Pos: 40}, {From: 1, Epoch: 3, Pos: 30}, {From: noActive}}
	got := machineLineage(&w, pm)
	want := machine.Lineage{{From: 2, Epoch: 5, Pos: 50}, {From: machine.None, Epoch: 4, Pos: 40}, {From: 0, Epoch: 3, Pos: 30}, {From: machine.None}}
	if got != want {
		t.Fatalf("mapped %+v, want %+v", got, want)
	}
	back := wireLineage(&got)
	if back[1].From != noActive || back[3].From != noActive || back[0].From != 2 || back[2].Pos != 30 {
		t.Fatalf("back on the wire: %+v", back)
	}
}
