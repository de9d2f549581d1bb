package api

// Modes: Status.Mode, the value of lockd's --cluster (single: no
// --cluster).
const (
	ModeSingle   = "single"   // one node, no cluster: always active
	ModePriority = "priority" // PROTOCOL.md §6.3: an active streams to standbys
	ModeRaft     = "raft"     // PROTOCOL.md §6.4: a raft group
)

// Roles: Status.Role and Member.Role.
const (
	// RoleActive executes requests: a single node, or priority's active.
	RoleActive = "active"
	// RoleActiveChecking is a priority active back from a stall longer
	// than the failover timeout (a freeze): it executes nothing until the
	// members it last knew as live have answered it (PROTOCOL.md §6.2).
	RoleActiveChecking = "active-checking"
	// RoleHandingOver is a priority active handing its work to a
	// successor (a planned handover): it executes nothing.
	RoleHandingOver = "handing-over"
	// RoleLeaving is a priority member shutting down.
	RoleLeaving = "leaving"
	// RoleStandby follows a priority active (or waits for one).
	RoleStandby = "standby"
	// RoleLeader is raft's leader. It executes requests once it has
	// applied every entry of earlier terms; until then it holds them.
	RoleLeader = "leader"
	// RoleFollower follows a raft leader (or waits for one).
	RoleFollower = "follower"
	// RoleCandidate is a raft member standing for election.
	RoleCandidate = "candidate"
)

// Serving reports whether role is one that executes requests: RoleActive
// (a single node, priority's active) or RoleLeader (raft's). Any other
// member answers M (PROTOCOL.md §6.2).
func Serving(role string) bool { return role == RoleActive || role == RoleLeader }

// Serving reports whether the node executes requests: Serving(s.Role).
func (s *Status) Serving() bool { return Serving(s.Role) }

// Roles lists, in a fixed order, every role a node of mode reports
// (Status.Role, Member.Role): the admin endpoint exports one lockd_role
// and one lockd_cluster_member_role series per role, 1 for the current
// one and 0 for the others, so no series appears or vanishes when a role
// changes. Nil for an unknown mode.
func Roles(mode string) []string {
	switch mode {
	case ModeSingle:
		return []string{RoleActive}
	case ModePriority:
		return []string{RoleActive, RoleActiveChecking, RoleHandingOver, RoleLeaving, RoleStandby}
	case ModeRaft:
		return []string{RoleLeader, RoleFollower, RoleCandidate}
	}
	return nil
}
