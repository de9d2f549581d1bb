package priority

import (
	"fmt"
	"slices"
)

// A rolling change of --peers (docs/CLUSTER.md, "Changing a
// priority cluster's members"). Members are restarted one at a time with a
// new --peers (a member added, removed, the order changed), so for a while
// two members may hold different lists, in which the same index names
// different members. Every Hello therefore carries the sender's whole
// list as it writes it, and the receiver works out who the sender is and
// what the indexes in its messages (a heartbeat's active) mean here:
//
//   - the lists agree position by position — every entry equal to this
//     member's at the same index, or written differently on the two sides
//     and found nowhere in the other's list (one member written through a
//     proxy, PROTOCOL.md §6.1): an index means the same member on both
//     sides, as always;
//   - otherwise the lists differ (a change in progress): a member is the
//     same on both sides when it is written the same way, so during a
//     change every member must be written identically in every list; the
//     sender is the entry of this member's list equal to its own (its
//     --self), a peer index of its maps onto the entry equal to it here, or
//     onto nobody (a member this one does not list: its link is refused,
//     and a heartbeat that follows it counts as following no active).
//
// Priorities are each member's own list's. Two members whose lists differ
// may disagree on which of them comes first; where the role machine must
// agree — which of two actives with the same epoch steps down — it then
// compares their own entries as text instead (roles.before), the same
// answer on both sides.

// peerMap is how one peer's --peers reads here.
type peerMap struct {
	from    int    // the peer's index in this member's --peers
	xlate   []int  // the peer's index i → this member's, -1: not listed here
	differs bool   // its list differs from this member's (a change in progress)
	name    string // its own entry: its --self as it writes it
}

// index maps one of the peer's indexes onto this member's list (-1:
// nobody this member lists, or noActive).
func (m *peerMap) index(i uint8) int {
	if i == noActive || int(i) >= len(m.xlate) {
		return -1
	}
	return m.xlate[i]
}

// mapPeers decides who the sender of h is here, given this member's
// --peers (ours) and its index in them (self). The Hello has passed Check.
func mapPeers(h *hello, ours []string, self int) (peerMap, error) {
	theirs := h.Peers
	if len(theirs) != int(h.Members) || int(h.Self) >= len(theirs) {
		return peerMap{}, fmt.Errorf("%w: a Hello whose member list does not hold its own index", errMismatch)
	}
	m := peerMap{name: theirs[h.Self], xlate: make([]int, len(theirs))}
	if positional(theirs, ours) {
		for i := range m.xlate {
			m.xlate[i] = i
		}
		m.from = int(h.Self)
	} else {
		m.differs = true
		for i, p := range theirs {
			m.xlate[i] = slices.Index(ours, p)
		}
		m.from = m.xlate[h.Self]
		if m.from < 0 {
			return peerMap{}, fmt.Errorf("%w: member %s (its --self) is not in --peers here, %v (its --peers: %v); during a change of --peers every member must be written the same way in every list",
				errMismatch, m.name, ours, theirs)
		}
	}
	if m.from == self {
		return peerMap{}, fmt.Errorf("%w: member %s says it is this member (index %d)", errMismatch, m.name, self)
	}
	return m, nil
}

// positional reports whether two lists agree position by position: the
// same length, and at each index the same entry, or entries that appear
// nowhere in the other list (one member written differently).
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
