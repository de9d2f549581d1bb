package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl"
)

// Membership: the raft configuration is the cluster's
// membership, and it changes through hashicorp/raft's configuration
// changes (repl.Membership: AddMember, RemoveMember).
//
// Who a member is. Every member has a raft server ID, fixed for the life
// of its data directory and stored in it (raft/member-id): the members
// that bootstrap a cluster from --peers take their index there ("0",
// "1", …, as before), a member added later (started with --join) takes
// its client address (its --self), which is what member add is given, so
// it knows its own ID before anyone has told it anything. A server's
// raft address is its member port; its client address (what an M names,
// what /status and /members show) is that address's host at its port −
// --peer-offset, which is its --peers entry for the bootstrap members (so
// a member written differently on different nodes, through a proxy, is
// still named as this member writes it) and its --self for the others.
// --peers is read only at a first start: to bootstrap, and to find
// --self; every later start reads the membership from the log.
//
// Adding a member is two changes: AddNonvoter (it receives the leader's
// snapshot and log but counts in no quorum, so a slow catch-up stalls
// nothing), then, once its answers show that its log reaches the entry
// that added it, AddVoter. Removing the leader hands the leadership over
// first, as a SIGTERM does, and leaves the removal to the successor.
// Changes are refused when the live voters would not be a majority of the
// new configuration (the change could never commit and the cluster would
// stop). The leader lease counts over the configuration's voters
// (lease.setVoters), recomputed and republished whenever it moves.

// memberIDFile holds this member's raft server ID in --data-dir/raft.
const memberIDFile = "member-id"

// memberState is the membership side of the node.
type memberState struct {
	change sync.Mutex                 // one configuration change at a time
	view   atomic.Pointer[memberView] // the latest configuration known (refreshView)

	mu    sync.Mutex
	heard map[raft.ServerID]heard // leader: each member's newest answer
	// indexed: the servers of the configuration whose log index was last
	// found, and that index (configIndex); under mu.
	indexed   []raft.Server
	indexedAt uint64

	// gone: the members a forced recovery left behind (recover.go); none
	// of their requests reaches raft while they are not in the
	// configuration.
	gone    atomic.Pointer[map[string]bool]
	goneLog atomic.Int64 // when a request of theirs was last logged (unix ns)
}

// heard is a member's newest answer to an AppendEntries (a heartbeat or
// entries) of the leader's term: when the request was sent (the table's
// clock) and the last log index it reported.
type heard struct {
	at      int64
	lastLog uint64
}

// memberView is a configuration and its raft index.
type memberView struct {
	servers []raft.Server
}

// voters returns the IDs of the view's voters.
func (v *memberView) voters() []raft.ServerID {
	var out []raft.ServerID
	for _, s := range v.servers {
		if s.Suffrage == raft.Voter {
			out = append(out, s.ID)
		}
	}
	return out
}

// server returns the server with id, if any.
func (v *memberView) server(id raft.ServerID) (raft.Server, bool) {
	if v != nil {
		for _, s := range v.servers {
			if s.ID == id {
				return s, true
			}
		}
	}
	return raft.Server{}, false
}

// memberID returns this member's raft server ID and whether it must
// bootstrap the cluster from --peers: the ID stored in the data directory
// when it holds raft state (the --peers index for a directory from before
// IDs were stored), else the --peers index (bootstrap) or, with Join, the
// client address. The ID is written before raft starts.
func (n *node) memberID(base string, existing bool) (raft.ServerID, bool, error) {
	path := filepath.Join(base, memberIDFile)
	if existing {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			id := strings.TrimSpace(string(b))
			if id == "" {
				return "", false, fmt.Errorf("raftnode: %s is empty: the data directory is damaged", path)
			}
			return raft.ServerID(id), false, nil
		case !errors.Is(err, fs.ErrNotExist):
			return "", false, err
		}
	}
	id, bootstrap := raft.ServerID(strconv.Itoa(n.cfg.Self)), !existing
	if !existing && n.cfg.Join {
		id, bootstrap = raft.ServerID(n.self), false
	}
	if err := writeFileSynced(path, []byte(string(id)+"\n")); err != nil {
		return "", false, fmt.Errorf("raftnode: storing the member ID: %w", err)
	}
	return id, bootstrap, nil
}

// clientAddr is the client address of the member whose raft address
// (member port) is a: its host at port − PeerOffset.
func (n *node) clientAddr(a raft.ServerAddress) string {
	host, port, err := net.SplitHostPort(string(a))
	if err != nil {
		return string(a)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p-n.cfg.PeerOffset < 1 {
		return string(a)
	}
	return net.JoinHostPort(host, strconv.Itoa(p-n.cfg.PeerOffset))
}

// memberAddrOf checks a new member's client address and returns its
// member port's address.
func (n *node) memberAddrOf(addr string) (raft.ServerAddress, error) {
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.Atoi(port)
	switch {
	case err != nil || host == "":
		return "", fmt.Errorf("%w %q: want host:port, as the member writes its own --self", repl.ErrBadMember, addr)
	case perr != nil || p < 1 || p > 65535:
		return "", fmt.Errorf("%w %q: the port must be 1..65535", repl.ErrBadMember, addr)
	case p+n.cfg.PeerOffset > 65535:
		return "", fmt.Errorf("%w %q: its member port %d (port + peer offset) is above 65535", repl.ErrBadMember, addr, p+n.cfg.PeerOffset)
	}
	return raft.ServerAddress(net.JoinHostPort(host, strconv.Itoa(p+n.cfg.PeerOffset))), nil
}

// refreshView reads raft's latest configuration; when its voters changed,
// the lease counts over the new ones and a serving gate is republished
// with the end they give (earlier or later).
func (n *node) refreshView() *memberView {
	f := n.r.GetConfiguration()
	if f.Error() != nil {
		return n.ms.view.Load()
	}
	v := &memberView{servers: f.Configuration().Servers}
	old := n.ms.view.Swap(v)
	if old == nil || !slices.Equal(old.voters(), v.voters()) {
		n.lease.setVoters(v.voters())
		n.republish()
	}
	return v
}

// republish replaces a serving gate with one that ends where the lease now
// ends, even if that is earlier (the configuration changed: the old end
// may count over voters that no longer decide).
func (n *node) republish() {
	n.gateMu.Lock()
	term := n.serveTerm
	if term == 0 {
		n.gateMu.Unlock()
		return
	}
	old := n.gate.Load()
	g := &repl.Gate{State: repl.Serve, Until: n.lease.until(term)}
	n.gate.Store(g)
	n.gateMu.Unlock()
	n.changed(old, g)
}

// leaderOf returns the leader's ID and client address ("" when none is
// known), the address as this member's configuration writes it.
func (n *node) leaderOf() (raft.ServerID, string) {
	if n.r == nil {
		return "", ""
	}
	addr, id := n.r.LeaderWithID()
	if id == "" {
		return "", ""
	}
	if s, ok := n.ms.view.Load().server(id); ok {
		return id, n.clientAddr(s.Address)
	}
	return id, n.clientAddr(addr)
}

// otherLeader is the leader's client address when another member leads,
// else "".
func (n *node) otherLeader() string {
	if id, addr := n.leaderOf(); id != "" && id != n.id {
		return addr
	}
	return ""
}

// heardFrom records a member's answer to an AppendEntries sent at at
// (memberTransport).
func (n *node) heardFrom(id raft.ServerID, lastLog uint64, at int64) {
	n.ms.mu.Lock()
	if n.ms.heard == nil {
		n.ms.heard = map[raft.ServerID]heard{}
	}
	if h := n.ms.heard[id]; at >= h.at {
		n.ms.heard[id] = heard{at: at, lastLog: lastLog}
	}
	n.ms.mu.Unlock()
}

// heardOf returns what member id last answered, and whether it did.
func (n *node) heardOf(id raft.ServerID) (heard, bool) {
	n.ms.mu.Lock()
	defer n.ms.mu.Unlock()
	h, ok := n.ms.heard[id]
	return h, ok
}

// liveAt reports whether member id answered a request sent within half
// the failover timeout (raft's heartbeat timeout; heartbeats go every
// twentieth) before now: the leader's view.
func (n *node) liveAt(id raft.ServerID, now int64) bool {
	h, ok := n.heardOf(id)
	return ok && now-h.at < int64(n.cfg.FailoverTimeout/2)
}

// configuration is the view as the admin endpoint shows it.
func (n *node) configuration(v *memberView) []api.RaftMember {
	if v == nil {
		return nil
	}
	lid, _ := n.leaderOf()
	leading := n.leadTerm.Load() != 0
	now := n.clock()
	out := make([]api.RaftMember, 0, len(v.servers))
	for _, s := range v.servers {
		m := api.RaftMember{ID: string(s.ID), Addr: n.clientAddr(s.Address), MemberAddr: string(s.Address),
			Voter: s.Suffrage == raft.Voter, Leader: s.ID == lid, Self: s.ID == n.id}
		var live *bool
		switch {
		case m.Self:
			live = ptr(true)
		case leading:
			live = ptr(n.liveAt(s.ID, now))
		case m.Leader:
			live = ptr(time.Since(n.r.LastContact()) < n.cfg.FailoverTimeout)
		}
		m.Live = live
		out = append(out, m)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// Members is the configuration as this member knows it (repl.Membership).
func (n *node) Members() (api.Members, error) {
	if n.r == nil {
		return api.Members{}, errClosed
	}
	v := n.refreshView()
	if v == nil {
		return api.Members{}, errors.New("raftnode: the raft configuration cannot be read")
	}
	_, leader := n.leaderOf()
	return api.Members{Leader: leader, Index: n.configIndex(v), Members: n.configuration(v)}, nil
}

// configIndex is the raft log index of v's configuration. hashicorp/raft's
// GetConfiguration leaves it 0 (it answers from a copy of the latest
// configuration that does not carry its index, and the main loop that has
// it is not reachable from outside the package), so it is found where raft
// found the configuration: the newest configuration entry of the log, or,
// when a snapshot compacted that away, the newest snapshot's configuration
// index. The scan runs when the servers change (an admin request, not the
// actor) and is kept while they stay the same.
func (n *node) configIndex(v *memberView) uint64 {
	n.ms.mu.Lock()
	if n.ms.indexedAt != 0 && slices.Equal(n.ms.indexed, v.servers) {
		at := n.ms.indexedAt
		n.ms.mu.Unlock()
		return at
	}
	n.ms.mu.Unlock()
	at := n.findConfigIndex()
	n.ms.mu.Lock()
	n.ms.indexed, n.ms.indexedAt = v.servers, at
	n.ms.mu.Unlock()
	return at
}

// findConfigIndex is the index of the newest configuration entry in the
// log, else the newest snapshot's configuration index, else 0.
func (n *node) findConfigIndex() uint64 {
	first, err1 := n.logs.FirstIndex()
	last, err2 := n.logs.LastIndex()
	if err1 == nil && err2 == nil && first > 0 {
		var e raft.Log
		for i := last; i >= first; i-- {
			if n.logs.GetLog(i, &e) != nil {
				break // compacted meanwhile: the snapshot has it
			}
			if e.Type == raft.LogConfiguration {
				return i
			}
		}
	}
	if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
		return metas[0].ConfigurationIndex
	}
	return 0
}

// mustLead returns nil while this member leads and serves, else a
// NotLeaderError naming the leader.
func (n *node) mustLead() error {
	if n.leadTerm.Load() != 0 && n.r.State() == raft.Leader {
		return nil
	}
	return &repl.NotLeaderError{Leader: n.otherLeader()}
}

// changeErr words an error of a configuration change: a leadership lost
// meanwhile is a NotLeaderError.
func (n *node) changeErr(what string, err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return &repl.NotLeaderError{Leader: n.otherLeader()}
	}
	return fmt.Errorf("raftnode: %s: %w", what, err)
}

// changed answers a change with the configuration after it.
func (n *node) changeDone(id raft.ServerID, before raft.Server) api.MemberChange {
	v := n.refreshView()
	ms := api.Members{Index: n.configIndex(v), Members: n.configuration(v)}
	_, ms.Leader = n.leaderOf()
	var m api.RaftMember
	for _, x := range ms.Members {
		if x.ID == string(id) {
			m = x
		}
	}
	if m.ID == "" { // removed: as it was
		m = api.RaftMember{ID: string(before.ID), Addr: n.clientAddr(before.Address), MemberAddr: string(before.Address),
			Voter: before.Suffrage == raft.Voter}
	}
	return api.MemberChange{Member: m, Members: ms}
}

// liveMajority reports whether the live voters of voters (this member
// and those that answered within the failover timeout, plus extra) are a
// majority of them.
func (n *node) liveMajority(voters []raft.ServerID, extra raft.ServerID) (live, need int) {
	now := n.clock()
	for _, id := range voters {
		if id == n.id || id == extra || n.liveAt(id, now) {
			live++
		}
	}
	return live, len(voters)/2 + 1
}

// AddMember adds the member whose client address is addr (repl.Membership):
// a non-voter until its log reaches the entry that added it (waiting at
// most wait), then a voter.
func (n *node) AddMember(ctx context.Context, addr string, wait time.Duration) (api.MemberChange, error) {
	maddr, err := n.memberAddrOf(addr)
	if err != nil {
		return api.MemberChange{}, err
	}
	if !n.stream.auth.names(string(maddr)) {
		return api.MemberChange{}, fmt.Errorf("%w: %s is not in --peers, and with member authentication on (--tls-peer-ca, --cluster-secret) members prove who they are by their --peers entry: list the new member in every member's --peers first (a rolling restart), then add it", repl.ErrBadMember, addr)
	}
	n.ms.change.Lock()
	defer n.ms.change.Unlock()
	if err := n.mustLead(); err != nil {
		return api.MemberChange{}, err
	}
	id := raft.ServerID(addr)
	v := n.refreshView()
	for _, s := range v.servers {
		switch {
		case s.ID == id && s.Suffrage == raft.Voter:
			return api.MemberChange{}, fmt.Errorf("%w: %s is a voter already", repl.ErrMemberExists, addr)
		case s.ID != id && (s.Address == maddr || n.clientAddr(s.Address) == addr):
			return api.MemberChange{}, fmt.Errorf("%w: member %s has the address %s: remove it first", repl.ErrMemberExists, s.ID, addr)
		}
	}
	voters := v.voters()
	if len(voters) >= maxMembers {
		return api.MemberChange{}, repl.ErrMembersFull
	}
	began := time.Now()
	f := n.r.AddNonvoter(id, maddr, 0, n.cfg.FailoverTimeout)
	if err := f.Error(); err != nil {
		return api.MemberChange{}, n.changeErr("adding "+addr+" as a non-voter", err)
	}
	at := f.Index()
	n.refreshView()
	n.log.Info("member added as a non-voter: it catches up from the leader's snapshot and log", "member", addr, "index", at)
	deadline := time.Now().Add(wait)
	for {
		if h, ok := n.heardOf(id); ok && h.lastLog >= at {
			break
		}
		if err := n.mustLead(); err != nil {
			return api.MemberChange{}, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			h, _ := n.heardOf(id)
			return api.MemberChange{}, fmt.Errorf("%w: %s is a non-voter whose log reaches index %d of %d after %v (is it running, with --join and --self %s?); member add again to wait more, or member remove it",
				repl.ErrNotCaughtUp, addr, h.lastLog, at, time.Since(began).Round(time.Millisecond), addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if live, need := n.liveMajority(append(voters, id), id); live < need {
		return api.MemberChange{}, fmt.Errorf("%w: with %s the cluster would have %d voters, %d of them live, and need %d", repl.ErrQuorumAtRisk, addr, len(voters)+1, live, need)
	}
	f = n.r.AddVoter(id, maddr, 0, n.cfg.FailoverTimeout)
	if err := f.Error(); err != nil {
		return api.MemberChange{}, n.changeErr("making "+addr+" a voter", err)
	}
	ch := n.changeDone(id, raft.Server{})
	n.log.Info("member added", "member", addr, "id", id, "index", f.Index(), "voters", len(voters)+1, "took", time.Since(began))
	return ch, nil
}

// RemoveMember removes the member whose raft ID or client address is
// member (repl.Membership). The leader hands its leadership over first
// and returns a NotLeaderError naming the successor.
func (n *node) RemoveMember(ctx context.Context, member string) (api.MemberChange, error) {
	n.ms.change.Lock()
	defer n.ms.change.Unlock()
	if err := n.mustLead(); err != nil {
		return api.MemberChange{}, err
	}
	v := n.refreshView()
	var target raft.Server
	found := false
	for _, match := range []func(raft.Server) bool{
		func(s raft.Server) bool { return string(s.ID) == member },
		func(s raft.Server) bool { return n.clientAddr(s.Address) == member || string(s.Address) == member },
	} {
		for _, s := range v.servers {
			if !found && match(s) {
				target, found = s, true
			}
		}
	}
	if !found {
		return api.MemberChange{}, fmt.Errorf("%w: no member has the ID or address %q", repl.ErrNoMember, member)
	}
	if target.ID == n.id {
		n.log.Info("asked to remove this member, the leader: handing the leadership over first")
		n.actMu.Lock()
		succ, err := n.handOverLocked(ctx)
		n.actMu.Unlock()
		if err != nil {
			return api.MemberChange{}, fmt.Errorf("raftnode: handing the leadership over before removing this member: %w", err)
		}
		n.log.Info("handed the leadership over", "successor", succ, "why", "this member is being removed: the successor removes it")
		return api.MemberChange{}, &repl.NotLeaderError{Leader: succ}
	}
	voters := v.voters()
	if target.Suffrage == raft.Voter {
		rest := slices.DeleteFunc(slices.Clone(voters), func(id raft.ServerID) bool { return id == target.ID })
		if live, need := n.liveMajority(rest, ""); live < need {
			return api.MemberChange{}, fmt.Errorf("%w: without %s the cluster would have %d voters, %d of them live, and need %d: remove a member that is down first",
				repl.ErrQuorumAtRisk, member, len(rest), live, need)
		}
	}
	began := time.Now()
	f := n.r.RemoveServer(target.ID, 0, n.cfg.FailoverTimeout)
	if err := f.Error(); err != nil {
		return api.MemberChange{}, n.changeErr("removing "+member, err)
	}
	n.ms.mu.Lock()
	delete(n.ms.heard, target.ID)
	n.ms.mu.Unlock()
	ch := n.changeDone(target.ID, target)
	n.log.Info("member removed", "member", n.clientAddr(target.Address), "id", target.ID, "index", f.Index(), "took", time.Since(began))
	return ch, nil
}

// errNoSuccessor: the leadership transfer ended without another leader
// known.
var errNoSuccessor = errors.New("raftnode: no other member took the leadership over")

// handOverLocked hands this member's leadership over (actMu held, this
// member leading): hold requests, let every numbered record commit,
// transfer to the most up-to-date follower, wait until the new leader is
// known, then give the leadership up (the Redirect names it). It returns
// the successor's client address; on failure this member serves again.
func (n *node) handOverLocked(ctx context.Context) (string, error) {
	n.publish(&repl.Gate{State: repl.Hold})
	deadline := time.Now().Add(n.cfg.FailoverTimeout)
	for n.committed.Load() < n.barrier.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if err := n.r.LeadershipTransfer().Error(); err != nil {
		if t := n.leadTerm.Load(); t != 0 && n.r.State() == raft.Leader {
			n.serve(t)
		}
		return "", err
	}
	for ctx.Err() == nil && time.Now().Before(deadline.Add(n.cfg.FailoverTimeout)) {
		if n.otherLeader() != "" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	n.stepLocked()
	if g := n.Gate(); g.State == repl.Redirect && g.Addr != "" {
		return g.Addr, nil
	}
	return "", errNoSuccessor
}
