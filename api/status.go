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
// a raft member the third.
type Status struct {
	Version       string  `json:"version"`        // lockd's build version
	Role          string  `json:"role"`           // a Role* name; RoleActive on a single node
	Addr          string  `json:"addr"`           // the client address the node listens on
	UptimeSeconds float64 `json:"uptime_seconds"` // since the server started
	Draining      bool    `json:"draining"`       // shutdown has begun
	Keys          int     `json:"keys"`           // keys held now
	Waiters       int     `json:"waiters"`        // acquires queued now
	Connections   int64   `json:"connections"`    // open client connections
	// TokenLast is the highest fencing token issued, TokenReserved the
	// mark up to which tokens are durably reserved (no token above it is
	// handed out): decimal strings.
	TokenLast     string `json:"token_last"`
	TokenReserved string `json:"token_reserved"`
	Limits        Limits `json:"limits"`

	Mode   string `json:"mode"`             // a Mode* name
	Active string `json:"active"`           // the active's (raft: the leader's) client address, "" if none is known
	Leader string `json:"leader,omitempty"` // raft: Active by its raft name, the leader's client address
	Epoch  uint64 `json:"epoch"`            // priority: the active's epoch; raft: the term
	// InSync: a priority standby in sync with its active (it applied a
	// snapshot and the stream after it); a raft member that knows its
	// leader.
	InSync     bool     `json:"in_sync,omitempty"`
	LagSeconds float64  `json:"lag_seconds"`       // a standby's lag, as its active last measured it
	Members    []Member `json:"members,omitempty"` // the other members, in --peers order

	Raft *RaftStatus `json:"raft,omitempty"` // a raft member's log; nil otherwise
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
// active's or leader's is the one that counts).
type Key struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       string `json:"token,omitempty"` // the grant's fencing token, decimal; absent when free
	LeaseLeftMs int64  `json:"lease_left_ms"`   // the lease left, ms; 0 when free
	Waiters     int    `json:"waiters"`         // acquires queued for it
	// Identity is the identity the grant was made to (PROTOCOL.md §8.3);
	// absent when free or granted without an ACL.
	Identity string `json:"identity,omitempty"`
}

// Release is the answer of DELETE /keys/{key}[?token=T] (PROTOCOL.md
// §8.5): an admin's release of the key's grant.
type Release struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
	Token    string `json:"token"`              // the released grant's token, decimal
	Identity string `json:"identity,omitempty"` // the identity it was made to
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
