package repl

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Cluster-wide defaults and bounds (PROTOCOL.md §6.1).
const (
	DefaultPeerOffset      = 10000
	DefaultFailoverTimeout = time.Second
	MinFailoverTimeout     = 100 * time.Millisecond
	MaxFailoverTimeout     = 60 * time.Second
	MaxMembers             = 7
)

// ClusterConfig is a cluster member's configuration, the same on every
// member but for Self (PROTOCOL.md §6.1).
type ClusterConfig struct {
	// Peers is every member's client address as clients dial it, in
	// priority order (priority mode) or as the membership (raft): 1..7.
	Peers []string
	// Self is this member's index in Peers.
	Self int
	// Listen is this member's client listen address (--listen as
	// written); it listens for members on its host at its port +
	// PeerOffset.
	Listen string
	// PeerOffset: members talk on client port + PeerOffset (1..65535).
	PeerOffset int
	// FailoverTimeout: how long the active may be silent before a standby
	// takes over; the raft election scale (100 ms..60 s).
	FailoverTimeout time.Duration
	// DataDir holds the token mark, the epoch and the shutdown snapshot.
	DataDir string
	// TokenBlock is how many tokens one reservation covers (default
	// DefaultTokenBlock).
	TokenBlock uint64
}

// FieldError is a ClusterConfig field out of bounds; Field is the Go name
// ("Peers", "Self", "PeerOffset", "FailoverTimeout"): the daemon maps it
// onto its flag.
type FieldError struct {
	Field string
	Value any
	Want  string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("repl: %s %v: %s", e.Field, e.Value, e.Want)
}

// Validate checks the configuration.
func (c *ClusterConfig) Validate() error {
	if len(c.Peers) < 1 || len(c.Peers) > MaxMembers {
		return &FieldError{"Peers", len(c.Peers), "must list 1..7 members"}
	}
	if c.PeerOffset < 1 || c.PeerOffset > 65535 {
		return &FieldError{"PeerOffset", c.PeerOffset, "must be 1..65535"}
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil || host == "" {
			return &FieldError{"Peers", p, "each member must be host:port"}
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return &FieldError{"Peers", p, "each member needs a port 1..65535"}
		}
		if n+c.PeerOffset > 65535 {
			return &FieldError{"PeerOffset", c.PeerOffset, fmt.Sprintf("%s's member port %d is above 65535", p, n+c.PeerOffset)}
		}
		if seen[p] {
			return &FieldError{"Peers", p, "lists a member twice"}
		}
		seen[p] = true
	}
	if c.Self < 0 || c.Self >= len(c.Peers) {
		return &FieldError{"Self", c.Self, "must be an entry of the member list"}
	}
	if c.FailoverTimeout < MinFailoverTimeout || c.FailoverTimeout > MaxFailoverTimeout {
		return &FieldError{"FailoverTimeout", c.FailoverTimeout, "must be 100ms..60s"}
	}
	if _, err := c.MemberListen(); err != nil {
		return &FieldError{"Listen", c.Listen, err.Error()}
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = DefaultTokenBlock
	}
	return nil
}

// memberListen is where this member listens for members: its --listen
// host at its --listen port + PeerOffset.
func (c *ClusterConfig) MemberListen() (string, error) {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 {
		return "", fmt.Errorf("a cluster member needs a fixed port, not %q", port)
	}
	if n+c.PeerOffset > 65535 {
		return "", fmt.Errorf("member port %d is above 65535", n+c.PeerOffset)
	}
	return net.JoinHostPort(host, strconv.Itoa(n+c.PeerOffset)), nil
}

// memberAddr is where member i listens for members, as this member dials
// it: its Peers entry's host at that port + PeerOffset.
func (c *ClusterConfig) MemberAddr(i int) string {
	host, port, _ := net.SplitHostPort(c.Peers[i])
	n, _ := strconv.Atoi(port)
	return net.JoinHostPort(host, strconv.Itoa(n+c.PeerOffset))
}

// SelfIndex returns the index of self in peers (compared as text), or -1.
func SelfIndex(peers []string, self string) int {
	for i, p := range peers {
		if p == self {
			return i
		}
	}
	return -1
}
