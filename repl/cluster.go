package repl

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Cluster-wide defaults (PROTOCOL.md §6.1).
const (
	DefaultPeerOffset      = 10000
	DefaultFailoverTimeout = time.Second
)

// Bounds that Validate checks.
const (
	minFailoverTimeout = 100 * time.Millisecond
	maxFailoverTimeout = 60 * time.Second
	maxMembers         = 7
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
	// Join (raft mode): on the first start of an empty data directory,
	// do not bootstrap a cluster from Peers but wait to be added to a
	// running one (Membership.AddMember). Ignored once the data directory
	// holds raft state.
	Join bool
	// ForceNewCluster (raft mode): restart this member, from its own log
	// and snapshots, as a new cluster of which it is the only member
	// (disaster recovery when a majority is lost for good; members are
	// then added back). Needs raft state in the data directory.
	ForceNewCluster bool
	// MemberTLS, when not nil, makes every member connection mutual TLS
	// (PROTOCOL.md §8.4): this member presents MemberTLS.Certificate() and
	// accepts a peer whose certificate verifies against
	// MemberTLS.PeerCAs() and names the host of the Peers entry it
	// claims. Both are read per handshake, so a reload applies to the
	// next connection. PeerCAs() must not be nil.
	MemberTLS MemberTLS
	// Secret, when not empty, is the cluster secret (PROTOCOL.md §8.4):
	// every member connection proves both ways that its ends know it
	// before anything else is read from it. At least MinSecret bytes.
	Secret Secret
}

// MemberTLS is the member link's TLS material, read once per handshake
// (tlsconf.Store has these methods).
type MemberTLS interface {
	// Certificate is this member's certificate chain and key.
	Certificate() *tls.Certificate
	// PeerCAs is the pool a member's certificate must verify against.
	PeerCAs() *x509.CertPool
}

// Secret is the cluster secret's bytes. It formats as "(secret)" so that
// a configuration printed by mistake does not show it.
type Secret []byte

// Refusal counts the member connections this member refused for one
// reason (PROTOCOL.md §8.4; Status.MemberRefused).
type Refusal struct {
	Reason string // a word: "limit", "handshake", "config", "tls", "name", "secret"
	N      uint64
}

// MinSecret is the shortest cluster secret Validate accepts (16 bytes: a
// 128-bit random value written as raw bytes; `openssl rand -hex 32` gives
// 64).
const MinSecret = 16

// String hides the secret.
func (s Secret) String() string { return "(secret)" }

// GoString hides the secret from %#v too.
func (s Secret) GoString() string { return "(secret)" }

// AuthOn reports whether the member link authenticates its members
// (PROTOCOL.md §8.4): with TLS, a cluster secret, or both.
func (c *ClusterConfig) AuthOn() bool { return c.MemberTLS != nil || len(c.Secret) > 0 }

// FieldError is a configuration field out of bounds (Want says what it
// must be), or one that could not be used (Err says why: a data
// directory in use, a member port taken). Field is the Go name of a
// ClusterConfig or LocalConfig field ("Peers", "Self", "Listen",
// "PeerOffset", "FailoverTimeout", "DataDir", "TokenBlock", "MemberTLS",
// "Secret"): the daemon
// maps it onto its flag, so no message below cmd/ names a flag.
type FieldError struct {
	Field string
	Value any
	Want  string
	Err   error
}

func (e *FieldError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("repl: %s %v: %v", e.Field, e.Value, e.Err)
	}
	return fmt.Sprintf("repl: %s %v: %s", e.Field, e.Value, e.Want)
}

// Unwrap returns the error that made the field unusable, if any.
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks the configuration.
func (c *ClusterConfig) Validate() error {
	if len(c.Peers) < 1 || len(c.Peers) > maxMembers {
		return &FieldError{Field: "Peers", Value: len(c.Peers), Want: "must list 1..7 members"}
	}
	if c.PeerOffset < 1 || c.PeerOffset > 65535 {
		return &FieldError{Field: "PeerOffset", Value: c.PeerOffset, Want: "must be 1..65535"}
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil || host == "" {
			return &FieldError{Field: "Peers", Value: p, Want: "each member must be host:port"}
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return &FieldError{Field: "Peers", Value: p, Want: "each member needs a port 1..65535"}
		}
		if n+c.PeerOffset > 65535 {
			return &FieldError{Field: "PeerOffset", Value: c.PeerOffset, Want: fmt.Sprintf("%s's member port %d is above 65535", p, n+c.PeerOffset)}
		}
		if seen[p] {
			return &FieldError{Field: "Peers", Value: p, Want: "lists a member twice"}
		}
		seen[p] = true
	}
	if c.Self < 0 || c.Self >= len(c.Peers) {
		return &FieldError{Field: "Self", Value: c.Self, Want: "must be an entry of the member list"}
	}
	if c.FailoverTimeout < minFailoverTimeout || c.FailoverTimeout > maxFailoverTimeout {
		return &FieldError{Field: "FailoverTimeout", Value: c.FailoverTimeout, Want: "must be 100ms..60s"}
	}
	if _, err := c.memberListen(); err != nil {
		return &FieldError{Field: "Listen", Value: c.Listen, Want: err.Error()}
	}
	if c.MemberTLS != nil && c.MemberTLS.PeerCAs() == nil {
		return &FieldError{Field: "MemberTLS", Value: "TLS", Want: "needs a CA bundle the members' certificates verify against"}
	}
	if len(c.Secret) > 0 && len(c.Secret) < MinSecret {
		return &FieldError{Field: "Secret", Value: c.Secret, Want: fmt.Sprintf("must be at least %d bytes", MinSecret)}
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = DefaultTokenBlock
	}
	if c.Join && c.ForceNewCluster {
		return &FieldError{Field: "ForceNewCluster", Value: true, Want: "a member that joins a cluster cannot also force a new one"}
	}
	return nil
}

// ListenMembers binds this member's member port (memberListen). Its
// error is a *FieldError for PeerOffset: the port is the client port +
// PeerOffset.
func (c *ClusterConfig) ListenMembers() (net.Listener, error) {
	la, err := c.memberListen()
	if err != nil {
		return nil, &FieldError{Field: "Listen", Value: c.Listen, Want: err.Error()}
	}
	ln, err := net.Listen("tcp", la)
	if err != nil {
		return nil, &FieldError{Field: "PeerOffset", Value: c.PeerOffset, Err: fmt.Errorf("member port %s: %w", la, err)}
	}
	return ln, nil
}

// memberListen is where this member listens for members: Listen's host
// at Listen's port + PeerOffset.
func (c *ClusterConfig) memberListen() (string, error) {
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

// MemberAddr is where member i listens for members, as this member dials
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
