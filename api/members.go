package api

// PathMembers is the admin endpoint's raft membership: GET lists the
// configuration (Members), POST adds a member (AddMember → MemberChange),
// DELETE PathMembers + ID-or-address removes one (MemberChange).
const PathMembers = "/members"

// RaftMember is one server of a raft cluster's configuration.
type RaftMember struct {
	// ID is raft's server ID: the member's --peers index ("0".."6") for the
	// members that bootstrapped the cluster, its client address for a
	// member added later (member add).
	ID         string `json:"id"`
	Addr       string `json:"addr"`        // its client address, as the member that answered reaches it (what an M names)
	MemberAddr string `json:"member_addr"` // its member port (raft's server address): addr's port + --peer-offset
	// Voter: it counts in elections and commits. false: a non-voter that
	// receives the log but does not count (a member add in progress).
	Voter  bool `json:"voter"`
	Leader bool `json:"leader"` // the leader, as the member that answered knows it
	Self   bool `json:"self"`   // the member that answered
	// Live: heard from within the failover timeout, as the leader measures
	// it (on a follower: the leader, and itself). Absent when unknown.
	Live *bool `json:"live,omitempty"`
}

// Members is the document of GET /members: the raft configuration as the
// member asked knows it (the leader's is the one that counts).
type Members struct {
	Leader string `json:"leader"` // the leader's client address, "" while none is known
	// Index is the raft log index of this configuration (it may not be
	// committed yet on the member asked).
	Index   uint64       `json:"index"`
	Members []RaftMember `json:"members"`
}

// AddMember is the body of POST /members.
type AddMember struct {
	// Addr is the new member's client address, exactly as it writes its own
	// --self: it is the member's raft ID.
	Addr string `json:"addr"`
}

// MemberChange answers a POST or DELETE of /members: the member added or
// removed, and the configuration after the change.
type MemberChange struct {
	Member  RaftMember `json:"member"`
	Members Members    `json:"members"`
}

// NotLeader is the body of the 421 answer to a change asked of a member
// that does not lead: the leader's client address (its admin endpoint is,
// by default, that port + 1).
type NotLeader struct {
	Error  string `json:"error"`
	Leader string `json:"leader"` // "" while no leader is known: ask again shortly
}
