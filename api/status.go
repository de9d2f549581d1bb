package api

import (
	"net/url"
	"strings"
)

// Paths of the admin endpoint's JSON documents.
const (
	PathStatus = "/status" // Status
	PathKeys   = "/keys/"  // + KeyPath(key): Key
)

// Status is the document of GET /status: one node's account of itself. A
// single node fills the first block; a cluster member adds the second, and
// its mode's part: Priority or Raft.
type Status struct {
	Version       string  `json:"version"`        // lockd's build version
	Role          string  `json:"role"`           // a Role* name; RoleActive on a single node
	Addr          string  `json:"addr"`           // the client address the node listens on
	UptimeSeconds float64 `json:"uptime_seconds"` // since the server started
	Draining      bool    `json:"draining"`       // shutdown has begun
	Keys          int     `json:"keys"`           // keys held now
	Waiters       int     `json:"waiters"`        // acquires queued now
	Connections   int64   `json:"connections"`    // open client connections
	// SharedHolders counts the holders of shared keys beyond each key's
	// first (what --max-holders bounds; a key's first holder is in Keys),
	// Watches the watches registered now (PROTOCOL.md §9).
	SharedHolders int `json:"shared_holders"`
	Watches       int `json:"watches"`
	// TokenLast is the highest fencing token issued, TokenReserved the
	// mark up to which tokens are durably reserved (no token above it is
	// handed out): decimal strings.
	TokenLast     string `json:"token_last"`
	TokenReserved string `json:"token_reserved"`
	Limits        Limits `json:"limits"`

	Mode   string `json:"mode"`             // a Mode* name
	Active string `json:"active"`           // the active's (raft: the leader's) client address, "" if none is known
	Leader string `json:"leader,omitempty"` // raft: Active by its raft name, the leader's client address
	// Epoch is Priority.Epoch on a priority member, Raft.Term on a raft
	// member: two different counters, kept under this one name because
	// programs and dashboards read it from before they were apart.
	Epoch uint64 `json:"epoch"`
	// InSync: a priority standby in sync with its active (it applied a
	// snapshot and the stream after it); a raft member that knows its
	// leader.
	InSync     bool     `json:"in_sync,omitempty"`
	LagSeconds float64  `json:"lag_seconds"`       // a standby's lag, as its active last measured it
	Members    []Member `json:"members,omitempty"` // the other members, in --peers order

	Priority *PriorityStatus `json:"priority,omitempty"` // a priority member's epoch and role changes; nil otherwise
	Raft     *RaftStatus     `json:"raft,omitempty"`     // a raft member's log; nil otherwise
}

// PriorityStatus is a priority member's epoch and the role changes it
// took part in (lockd_cluster_failovers_total and the other counters have them
// too).
type PriorityStatus struct {
	Epoch             uint64 `json:"epoch"`              // the epoch of the active it serves as or follows
	Failovers         uint64 `json:"failovers"`          // promotions of this member after the active went silent
	Handovers         uint64 `json:"handovers"`          // planned handovers it took part in
	Demotions         uint64 `json:"demotions"`          // times it stepped down for a later active
	SnapshotsSent     uint64 `json:"snapshots_sent"`     // table snapshots it sent to standbys
	SnapshotsReceived uint64 `json:"snapshots_received"` // table snapshots it applied from an active
}

// Limits are the server's configured limits: its flags of the same names.
type Limits struct {
	MaxKey           int `json:"max_key"`             // --max-key: key length, bytes
	MaxKeys          int `json:"max_keys"`            // --max-keys: keys held at once
	MaxWaitersPerKey int `json:"max_waiters_per_key"` // --max-waiters-per-key
	MaxWaiters       int `json:"max_waiters"`         // --max-waiters: queued acquires over all keys
	MaxConns         int `json:"max_conns"`           // --max-conns: open client connections
	MaxOutbound      int `json:"max_outbound"`        // --max-outbound: bytes of answers buffered for a connection that does not read
	Loops            int `json:"loops"`               // --loops: event loops
	// MaxHolders (--max-holders) bounds the holders of shared keys beyond
	// each key's first; MaxWatchesPerConn (--max-watches-per-conn) one
	// connection's watches (PROTOCOL.md §9).
	MaxHolders        int `json:"max_holders"`
	MaxWatchesPerConn int `json:"max_watches_per_conn"`
}

// Member is what a cluster member knows of another member. The lag figures
// are a priority active's measure of its standbys (zero elsewhere).
type Member struct {
	Addr       string  `json:"addr"`                 // its entry of --peers
	Role       string  `json:"role"`                 // a Role* name as last heard, "" if unknown
	Live       bool    `json:"live"`                 // heard from within the failover timeout
	Unobserved bool    `json:"unobserved,omitempty"` // Live says nothing: this member cannot hear from it (a raft follower hears only its leader; ask the leader)
	InSync     bool    `json:"in_sync"`              // a standby in sync with this active
	LagSeconds float64 `json:"lag_seconds"`          // age of the oldest batch it has not acknowledged
	LagRecords uint64  `json:"lag_records"`          // records sent or queued to it and not acknowledged
	LagBytes   uint64  `json:"lag_bytes"`            // their bytes before compression
}

// RaftStatus is a raft member's log: indexes, group commit, snapshots.
type RaftStatus struct {
	Term              uint64  `json:"term"`
	CommitIndex       uint64  `json:"commit_index"`
	AppliedIndex      uint64  `json:"applied_index"`      // the last index applied to the lock table
	Entries           uint64  `json:"entries"`            // entries of lock changes this member proposed as leader and saw committed
	RecordsPerEntry   float64 `json:"records_per_entry"`  // lock changes per such entry
	CommitP50Seconds  float64 `json:"commit_p50_seconds"` // proposal to commit, over the last 1024 entries
	CommitP99Seconds  float64 `json:"commit_p99_seconds"`
	Snapshots         uint64  `json:"snapshots"`           // raft snapshots this member wrote
	LastSnapshotBytes uint64  `json:"last_snapshot_bytes"` // the size of the last one
	Elections         uint64  `json:"elections"`           // times this member became a serving leader
	Rebuilds          uint64  `json:"rebuilds"`            // times its table was rebuilt from the log
	// Configuration is the raft configuration as this member knows it
	// (GET /members has it too, with the leader and the index).
	Configuration []RaftMember `json:"configuration,omitempty"`
}

// Key is the document of GET /keys/{key}: one key on the node asked (the
// active's or leader's is the one that counts). Token, LeaseLeftMs and
// Identity are the newest holder's (the only one of an exclusive key);
// Holders and Queue list every holder and every waiter (PROTOCOL.md
// §9.5).
type Key struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       string `json:"token,omitempty"` // the grant's fencing token, decimal; absent when free
	LeaseLeftMs int64  `json:"lease_left_ms"`   // the lease left, ms; 0 when free
	Waiters     int    `json:"waiters"`         // acquires queued for it
	// Identity is the identity the grant was made to (PROTOCOL.md §8.3);
	// absent when free or granted without an ACL.
	Identity string `json:"identity,omitempty"`
	// Limit is 1 for an exclusive key, the limit of a shared key (1 too
	// for a key shared with limit 1: Shared tells them apart); absent
	// when free.
	Limit  int  `json:"limit,omitempty"`
	Shared bool `json:"shared,omitempty"`
	// Holders are the key's grants, oldest first; absent when free.
	Holders []KeyHolder `json:"holders,omitempty"`
	// Queue are the acquires queued for it in queue order, the head
	// first; absent when none.
	Queue []KeyWaiter `json:"queue,omitempty"`
}

// KeyHolder is one holder of a key (Key.Holders).
type KeyHolder struct {
	Token       string `json:"token"`              // its fencing token, decimal
	Identity    string `json:"identity,omitempty"` // the identity it was granted to; absent without an ACL
	LeaseLeftMs int64  `json:"lease_left_ms"`      // its lease left, ms
}

// KeyWaiter is one queued acquire of a key (Key.Queue).
type KeyWaiter struct {
	Owner      string `json:"owner"`              // the acquire's owner id, decimal (a correlation id, not an identity)
	Identity   string `json:"identity,omitempty"` // the identity it came from; absent without an ACL
	WaitLeftMs int64  `json:"wait_left_ms"`       // its wait left, ms (0 once over: its T is on its way)
	// Shared is false for an exclusive acquire (A), true for an acquire
	// shared (S), whose Limit it carries.
	Shared       bool `json:"shared"`
	Limit        int  `json:"limit,omitempty"`
	LeaseSeconds int  `json:"lease_seconds"` // the lease it asked for
}

// Release is the answer of DELETE /keys/{key}[?token=T] (PROTOCOL.md
// §8.5): an admin's release of the key's grant.
type Release struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
	Token    string `json:"token"`              // the released grant's token, decimal (several: the newest)
	Identity string `json:"identity,omitempty"` // the identity it was made to
	// Holders lists every grant released when a shared key was released
	// without a token (each of its holders, oldest first); absent when
	// one grant was.
	Holders []ReleasedGrant `json:"holders,omitempty"`
}

// ReleasedGrant is one grant of a Release.
type ReleasedGrant struct {
	Token    string `json:"token"`
	Identity string `json:"identity,omitempty"`
}

// Error is the body of an answer 4xx of a JSON path (GET /keys/ without a
// key).
type Error struct {
	Error string `json:"error"`
}

// KeyPath escapes key for PathKeys: url.PathEscape, and dots too, since a
// key "." or ".." (or with such a segment) would be cleaned out of the
// path by the server's router.
func KeyPath(key string) string {
	return strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}
