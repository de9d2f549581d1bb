package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// Config configures a Server. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Listen is the TCP address to serve, host:port (default 127.0.0.1:7070;
	// port 0 picks a free port, see Server.Addr).
	Listen string
	// DataDir holds the token mark and the shutdown snapshot (default ./lockd-data).
	DataDir string
	// MaxKey is the longest key accepted, 1..1024 bytes (default 1024).
	MaxKey int
	// MaxConns bounds open client connections; more are closed at once
	// (default 100,000).
	MaxConns int
	// Loops is the number of event loops (default: the number of cores).
	Loops int
	// MaxOutbound bounds the answers buffered for one connection that does
	// not read them; past it the connection is closed (default 4 MiB).
	MaxOutbound int
	// MaxPendingGrants bounds the grants one connection has not taken from
	// its socket: while that many of its grants are buffered on its way
	// (written, not yet reached the socket), its acquires are answered B
	// (default 4096), so one client that reads slowly pins a bounded number
	// of keys.
	MaxPendingGrants int
	// FrameTimeout is how long a frame may stay incomplete: a connection
	// whose inbound buffer has held the same partial frame for longer is
	// closed (default 10 s, 100 ms..1 h). An idle connection between frames
	// is never closed.
	FrameTimeout time.Duration
	// TokenBlock is how many tokens one durable reservation covers
	// (default 1<<22). Larger blocks mean fewer disk syncs and larger gaps
	// after a crash.
	TokenBlock uint64
	// Drain is how long Shutdown keeps connections open after answering
	// the queued acquires, answering new A/R/K with E 4, unless every client
	// leaves sooner (default 2 s, at most 4 s: connections close within
	// 5 s of the signal).
	Drain time.Duration
	// Table sizes the lock table and its limits (--max-keys,
	// --max-waiters-per-key, --max-waiters).
	Table shard.Config
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// Bounds of Config.FrameTimeout.
const (
	MinFrameTimeout = 100 * time.Millisecond
	MaxFrameTimeout = time.Hour
)

// DefaultConfig returns the defaults documented in README.md.
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
		TokenBlock:       1 << 22,
		Drain:            2 * time.Second,
		Table:            shard.DefaultConfig(),
	}
}

// Validate fills zero fields with defaults and rejects nonsense. Errors name
// the field (as its daemon flag) so cmd/lockd can report them as they are.
func (c *Config) Validate() error {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %v", c.Listen, err)
	}
	if c.DataDir == "" {
		c.DataDir = d.DataDir
	}
	switch {
	case c.MaxKey == 0:
		c.MaxKey = d.MaxKey
	case c.MaxKey < 1 || c.MaxKey > proto.MaxKey:
		return fmt.Errorf("--max-key %d: must be 1..%d", c.MaxKey, proto.MaxKey)
	}
	switch {
	case c.MaxConns == 0:
		c.MaxConns = d.MaxConns
	case c.MaxConns < 0:
		return fmt.Errorf("--max-conns %d: must be positive", c.MaxConns)
	}
	switch {
	case c.Loops == 0:
		c.Loops = d.Loops
	case c.Loops < 0 || c.Loops > 1024:
		return fmt.Errorf("--loops %d: must be 1..1024", c.Loops)
	}
	switch {
	case c.MaxOutbound == 0:
		c.MaxOutbound = d.MaxOutbound
	case c.MaxOutbound < 64<<10:
		return fmt.Errorf("--max-outbound %d: must be at least 65536", c.MaxOutbound)
	}
	switch {
	case c.MaxPendingGrants == 0:
		c.MaxPendingGrants = d.MaxPendingGrants
	case c.MaxPendingGrants < 0:
		return fmt.Errorf("--max-pending-grants %d: must be positive", c.MaxPendingGrants)
	}
	switch {
	case c.FrameTimeout == 0:
		c.FrameTimeout = d.FrameTimeout
	case c.FrameTimeout < MinFrameTimeout || c.FrameTimeout > MaxFrameTimeout:
		return fmt.Errorf("--frame-timeout %v: must be %v..%v", c.FrameTimeout, MinFrameTimeout, MaxFrameTimeout)
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = d.TokenBlock
	}
	if c.TokenBlock < 2 {
		return errors.New("token block must be at least 2")
	}
	switch {
	case c.Drain == 0:
		c.Drain = d.Drain
	case c.Drain < 0 || c.Drain > 4*time.Second:
		return fmt.Errorf("--drain %v: must be 0..4s", c.Drain)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if err := c.Table.Validate(); err != nil {
		return err
	}
	return nil
}
