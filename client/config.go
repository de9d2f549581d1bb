package client

import (
	"crypto/tls"
	"errors"
	"net"
	"time"
)

// Config configures a Client. Zero fields take the defaults of
// DefaultConfig; Addrs is required.
type Config struct {
	// Addrs lists the servers' host:port addresses. The client keeps one
	// persistent connection per address, two when a single address is given.
	Addrs []string
	// ConnsPerAddr overrides the number of connections per address
	// (default 1, or 2 when len(Addrs) == 1).
	ConnsPerAddr int
	// DialTimeout bounds one dial (default 5 s).
	DialTimeout time.Duration
	// ReconnectInterval is the pause before a lost or failed connection is
	// dialled again, in the background (default 3 s).
	ReconnectInterval time.Duration
	// TransportTimeout is the deadline of a whole wait=0 acquire, renew or
	// ping: to find a connection, send and read the answer; also the
	// longest a connection's write may block before the connection is
	// failed (default 5 s).
	TransportTimeout time.Duration
	// AnswerAllowance is added to the time the server may keep an acquire
	// queued (the wire wait, counted from the send) to form the deadline
	// for its answer, which a stand-in awaits after the caller's wait ended:
	// a connection still without that answer then is taken to be broken
	// and closed (default 1 s).
	AnswerAllowance time.Duration
	// ReleaseRetry is how long Release keeps trying (default 5 s).
	ReleaseRetry time.Duration
	// ReleaseRetryInterval is the pause between Release attempts (default
	// 200 ms).
	ReleaseRetryInterval time.Duration
	// RetryPause is the pause before resending a request the server did not
	// execute and could not redirect (M with no address, E 4) (default
	// 100 ms).
	RetryPause time.Duration
	// DefaultLease is the lease of an acquire whose options give none
	// (default 30 s).
	DefaultLease time.Duration
	// FailFast is for short-lived programs such as command-line tools.
	// Until an answer has been read from some server, a call that finds
	// no live connection fails at once with ErrNoConnection (and the
	// reason: the dial error, or ErrRejected) as soon as every address has
	// failed once, instead of waiting within its deadline for a
	// background redial. Once a server has answered, connections that drop
	// are redialled in the background as without it. Long-lived programs
	// leave it false: a server that is down when they start is dialled
	// again every ReconnectInterval and used when it comes up.
	FailFast bool

	// TLS, when not nil, makes every connection TLS with these settings
	// (PROTOCOL.md §8.1): RootCAs verifies the servers (nil: the system's
	// roots), Certificates (or GetClientCertificate) is the client
	// certificate for mutual TLS. An empty ServerName is set, for each
	// connection, to the host of the address dialled (an address an M
	// names included); set it to verify every server under one name.
	// LoadTLS builds one from PEM files. New keeps a copy (Clone) and
	// raises a MinVersion below TLS 1.2; the handshake is part of the dial
	// and bounded by DialTimeout.
	TLS *tls.Config
	// Identity names the client to a server started with --acl
	// (PROTOCOL.md §8.2): 1..64 bytes of A–Z a–z 0–9 . _ @ -. When set, a
	// hello (H) with Identity and Secret is the first frame of every
	// connection, and requests are pipelined behind it without waiting
	// for its answer. A server without --acl answers the hello and checks
	// nothing, so a client can be given its credentials before the server
	// requires them. Empty: no hello (a client certificate may still
	// authenticate the connection).
	Identity string
	// Secret is Identity's secret: 1..256 bytes without 0x0A (LoadSecret
	// reads one from a file). It is required with Identity and never
	// printed (see Secret).
	Secret Secret
}

// DefaultConfig returns the defaults of docs/PROTOCOL.md §7, without
// addresses.
func DefaultConfig() Config {
	return Config{
		DialTimeout:          5 * time.Second,
		ReconnectInterval:    3 * time.Second,
		TransportTimeout:     5 * time.Second,
		AnswerAllowance:      time.Second,
		ReleaseRetry:         5 * time.Second,
		ReleaseRetryInterval: 200 * time.Millisecond,
		RetryPause:           100 * time.Millisecond,
		DefaultLease:         30 * time.Second,
	}
}

// Validate fills zero fields with defaults and rejects nonsense.
func (c *Config) Validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("client: no server addresses")
	}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return errors.New("client: bad address " + a + ": " + err.Error())
		}
	}
	if c.ConnsPerAddr < 0 || c.ConnsPerAddr > 64 {
		return errors.New("client: ConnsPerAddr must be 0..64")
	}
	if c.ConnsPerAddr == 0 {
		c.ConnsPerAddr = 1
		if len(c.Addrs) == 1 {
			c.ConnsPerAddr = 2
		}
	}
	d := DefaultConfig()
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.DialTimeout, d.DialTimeout},
		{&c.ReconnectInterval, d.ReconnectInterval},
		{&c.TransportTimeout, d.TransportTimeout},
		{&c.AnswerAllowance, d.AnswerAllowance},
		{&c.ReleaseRetry, d.ReleaseRetry},
		{&c.ReleaseRetryInterval, d.ReleaseRetryInterval},
		{&c.RetryPause, d.RetryPause},
		{&c.DefaultLease, d.DefaultLease},
	} {
		if *f.v < 0 {
			return errors.New("client: negative duration in Config")
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.DefaultLease > 255*time.Second {
		return ErrInvalidLease
	}
	switch {
	case c.Identity != "" && !validIdentity(c.Identity):
		return &FieldError{Field: "Identity", Value: c.Identity, Want: "1..64 bytes of A-Z a-z 0-9 . _ @ -"}
	case c.Identity == "" && c.Secret != "":
		return &FieldError{Field: "Identity", Want: "required with a Secret"}
	case c.Identity != "" && !validSecret(c.Secret):
		return &FieldError{Field: "Secret", Want: "1..256 bytes without a newline, required with an Identity"}
	}
	if c.TLS != nil {
		c.TLS = c.TLS.Clone()
		if c.TLS.MinVersion < tls.VersionTLS12 {
			c.TLS.MinVersion = tls.VersionTLS12
		}
	}
	return nil
}

// clientCert reports whether c presents a client certificate: such a
// connection may be authenticated without a hello (PROTOCOL.md §8.3).
func (c *Config) clientCert() bool {
	return c.TLS != nil && (len(c.TLS.Certificates) > 0 || c.TLS.GetClientCertificate != nil)
}
