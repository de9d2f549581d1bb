package client

import (
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
	// queued (the wire wait, counted from the send) to form the deadline for
	// reading its answer, so a T sent right at the end of the wait is still
	// read as a definitive timeout rather than an indeterminate outcome
	// (default 1 s).
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
	return nil
}
