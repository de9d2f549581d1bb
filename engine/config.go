package engine

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// Config configures a Server. New fills zero fields with the defaults of
// DefaultConfig (SetDefaults) and then checks every field (Validate).
type Config struct {
	// Listen is the TCP address to serve, host:port (default 127.0.0.1:7070;
	// port 0 picks a free port, see Server.Addr).
	Listen string
	// DataDir holds the token mark and the shutdown snapshot (default
	// ./lockd-data). Used by the default node (Node nil).
	DataDir string
	// MaxKey is the longest key accepted, 1..1024 bytes (default 1024).
	MaxKey int
	// MaxConns bounds open client connections, 1..2^30; more are closed at
	// once (default 100,000).
	MaxConns int
	// Loops is the number of event loops, 1..1024 (default: the number of
	// cores).
	Loops int
	// MaxOutbound bounds the answers buffered for one connection that does
	// not read them, 64 KiB..2^40 bytes; past it the connection is closed
	// (default 4 MiB).
	MaxOutbound int
	// MaxPendingGrants bounds the grants one connection has not taken from
	// its socket: while that many of its grants are buffered on their way
	// (written, not yet reached the socket), its acquires are answered B
	// (1..2^30, default 4096), so one client that reads slowly pins a
	// bounded number of keys.
	MaxPendingGrants int
	// FrameTimeout is how long a frame may stay incomplete: a connection
	// whose inbound buffer has held the same partial frame for longer is
	// closed (default 10 s, 100 ms..1 h). An idle connection between frames
	// is never closed.
	FrameTimeout time.Duration
	// TokenBlock is how many tokens one durable reservation covers, ≥ 2
	// (default 1<<22). Larger blocks mean fewer disk syncs and larger gaps
	// after a crash. Used by the default node (Node nil).
	TokenBlock uint64
	// Drain is how long Shutdown keeps connections open after answering
	// the queued acquires, answering new A/R/K with E 4, unless every client
	// leaves sooner: 1 ms..4 s (default 2 s), so that connections close
	// within 5 s of the signal.
	Drain time.Duration
	// Table sizes the lock table and its limits (MaxKeys, MaxWaitersPerKey,
	// MaxWaiters, MaxWaitersPerConn, MaxHolders: each 1..2^40;
	// MaxWatchesPerConn: 1..2^30).
	Table shard.Config
	// TLS, when set, makes the client port speak TLS and nothing else
	// (PROTOCOL.md §8.1): its certificate, and ClientCAs with ClientAuth
	// for mutual TLS (lockd's tlsconf builds it from the files and
	// reloads them through GetConfigForClient). The engine raises
	// MinVersion to TLS 1.2 and turns dynamic record sizing off; the
	// rest is the caller's. A handshake must finish within FrameTimeout.
	// nil: plaintext.
	TLS *tls.Config
	// Node is where state goes beyond the event loops: persistence, token
	// reservations, membership (package repl). nil means a single node on
	// DataDir (repl.NewLocal).
	Node repl.Node
	// ACL, if not nil, turns authentication and authorization on
	// (PROTOCOL.md §8.2, §8.3): every connection needs an identity of it
	// for lock requests, reaches only its identity's keys, and a grant can
	// be released or renewed only by the identity it was made to (or an
	// admin). Server.SetACL replaces it while serving. nil: no identities,
	// the token alone decides (§1–§7).
	ACL *acl.ACL
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// Bounds of Config fields.
const (
	maxLimit = 1 << 40 // MaxKeys, MaxWaitersPerKey, MaxWaiters, MaxHolders, MaxOutbound
	maxConns = 1 << 30 // MaxConns, MaxPendingGrants, MaxWatchesPerConn
	maxLoops = 1024
	minOut   = 64 << 10
	minDrain = time.Millisecond
	maxDrain = 4 * time.Second
)

// Bounds of Config.FrameTimeout.
const (
	MinFrameTimeout = 100 * time.Millisecond
	MaxFrameTimeout = time.Hour
)

// DefaultConfig returns the defaults documented in docs/OPERATING.md.
func DefaultConfig() Config {
	return Config{
		Listen:           "127.0.0.1:7070",
		DataDir:          "./lockd-data",
		MaxKey:           proto.MaxKey,
		MaxConns:         100_000,
		Loops:            runtime.NumCPU(),
		MaxOutbound:      4 << 20,
		MaxPendingGrants: 4096,
		FrameTimeout:     10 * time.Second,
		TokenBlock:       repl.DefaultTokenBlock,
		Drain:            2 * time.Second,
		Table:            shard.DefaultConfig(),
	}
}

// ConfigError is a Config field whose value is out of bounds. Field is the
// field's Go path ("MaxConns", "Table.MaxKeys"): the daemon maps it onto
// its flag.
type ConfigError struct {
	Field string
	Value any
	Want  string // what the field must be
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("engine: %s %v: %s", e.Field, e.Value, e.Want)
}

// SetDefaults fills zero fields with the defaults of DefaultConfig.
func (c *Config) SetDefaults() {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.DataDir == "" {
		c.DataDir = d.DataDir
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.MaxKey, d.MaxKey)
	setInt(&c.MaxConns, d.MaxConns)
	setInt(&c.Loops, d.Loops)
	setInt(&c.MaxOutbound, d.MaxOutbound)
	setInt(&c.Table.MaxKeys, d.Table.MaxKeys)
	setInt(&c.Table.MaxWaitersPerKey, d.Table.MaxWaitersPerKey)
	setInt(&c.Table.MaxWaiters, d.Table.MaxWaiters)
	setInt(&c.Table.MaxWaitersPerConn, d.Table.MaxWaitersPerConn)
	setInt(&c.Table.MaxHolders, d.Table.MaxHolders)
	setInt(&c.Table.MaxWatchesPerConn, d.Table.MaxWatchesPerConn)
	setInt(&c.MaxPendingGrants, d.MaxPendingGrants)
	if c.FrameTimeout == 0 {
		c.FrameTimeout = d.FrameTimeout
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = d.TokenBlock
	}
	if c.Drain == 0 {
		c.Drain = d.Drain
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks every field against its bounds (zero is not a default
// here: call SetDefaults first for that) and returns a *ConfigError naming
// the first field out of bounds, or the table's own error for Table.Shards
// and Table.Tick.
func (c *Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return &ConfigError{"Listen", fmt.Sprintf("%q", c.Listen), "must be host:port (" + err.Error() + ")"}
	}
	if c.DataDir == "" && c.Node == nil {
		return &ConfigError{"DataDir", `""`, "must not be empty"}
	}
	ints := []struct {
		field     string
		v, lo, hi int
	}{
		{"MaxKey", c.MaxKey, 1, proto.MaxKey},
		{"Table.MaxKeys", c.Table.MaxKeys, 1, maxLimit},
		{"Table.MaxWaitersPerKey", c.Table.MaxWaitersPerKey, 1, maxLimit},
		{"Table.MaxWaiters", c.Table.MaxWaiters, 1, maxLimit},
		{"Table.MaxWaitersPerConn", c.Table.MaxWaitersPerConn, 1, maxLimit},
		{"Table.MaxHolders", c.Table.MaxHolders, 1, maxLimit},
		{"Table.MaxWatchesPerConn", c.Table.MaxWatchesPerConn, 1, maxConns},
		{"MaxPendingGrants", c.MaxPendingGrants, 1, maxConns},
		{"MaxConns", c.MaxConns, 1, maxConns},
		{"MaxOutbound", c.MaxOutbound, minOut, maxLimit},
		{"Loops", c.Loops, 1, maxLoops},
	}
	for _, f := range ints {
		if f.v < f.lo || f.v > f.hi {
			return &ConfigError{f.field, f.v, fmt.Sprintf("must be %d..%d", f.lo, f.hi)}
		}
	}
	if c.TokenBlock < 2 {
		return &ConfigError{"TokenBlock", c.TokenBlock, "must be at least 2"}
	}
	if c.Drain < minDrain || c.Drain > maxDrain {
		return &ConfigError{"Drain", c.Drain, "must be 1ms..4s"}
	}
	if c.FrameTimeout < MinFrameTimeout || c.FrameTimeout > MaxFrameTimeout {
		return &ConfigError{"FrameTimeout", c.FrameTimeout, "must be 100ms..1h"}
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil {
		return &ConfigError{"TLS", "without a certificate", "must have Certificates, GetCertificate or GetConfigForClient"}
	}
	t := c.Table
	if err := t.Validate(); err != nil {
		return err
	}
	return nil
}
