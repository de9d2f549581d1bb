package httpapi

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/lockd-dev/lockd/engine"
)

// Config configures a Front. New fills zero fields with DefaultConfig's
// and checks the rest.
type Config struct {
	// Server is the engine the front opens its local connections on.
	Server *engine.Server
	// PortOffset is every member's HTTP port less its client port, the
	// same on every member of a cluster: an M naming host:P is followed
	// to host:(P + PortOffset). Unused by a single node (it never
	// answers M).
	PortOffset int
	// ForwardTLS, when not nil, says that the members' HTTP endpoints
	// speak HTTPS (--tls-cert) and returns the client configuration for
	// forwarding to one (its CAs: the member link's). It is called per
	// connection, so a reload of the files applies to the next one.
	ForwardTLS func() *tls.Config
	// MaxLongPolls bounds the acquires with wait_ms > 0 waiting at once
	// (forwarded ones included); one more is answered 503
	// too_many_long_polls (default 10,000).
	MaxLongPolls int
	// MaxStreams bounds the watches (SSE streams) open at once; one more
	// is answered 503 too_many_streams (default 10,000).
	MaxStreams int
	// KeepAlive is the interval of an SSE stream's comment lines (default
	// 15 s), which let proxies and clients tell an idle stream from a
	// dead one.
	KeepAlive time.Duration
	// Logger receives the front's log lines (default: the engine's).
	Logger *slog.Logger
}

// Limits of the front that are not configurable (docs/HTTP.md, "Limits").
const (
	// MaxBody is the largest request body: a key of 1024 bytes written
	// with \u escapes throughout is 6 KiB.
	MaxBody = 16 << 10
	// MaxHeaderBytes bounds a request's header (net/http answers 431).
	MaxHeaderBytes = 16 << 10
	// HeaderTimeout bounds the reading of a request's header (net/http
	// closes the connection without an answer when it passes).
	HeaderTimeout = 10 * time.Second
	// BodyTimeout bounds the reading of a request's body, from the end
	// of its header: 408 request_timeout when it passes.
	BodyTimeout = 10 * time.Second
	// WriteTimeout bounds each write of an answer or an event to a client
	// that does not read: the connection is closed when it passes (a
	// grant in that answer is released).
	WriteTimeout = 10 * time.Second
	// IdleTimeout closes a keep-alive connection idle that long.
	IdleTimeout = 60 * time.Second
	// TransportDeadline bounds a request that does not wait (wait_ms 0, a
	// release, renew, validate, inspect, a watch's registration): the
	// engine's answer, following M included (PROTOCOL.md §7's 5 s).
	TransportDeadline = 5 * time.Second
	// forwardAllowance is how long after its deadline a forwarded
	// request's answer may take (the network, the other member's own
	// deadline).
	forwardAllowance = 2 * time.Second
)

// DefaultConfig returns the defaults (Server and PortOffset unset).
func DefaultConfig() Config {
	return Config{MaxLongPolls: 10_000, MaxStreams: 10_000, KeepAlive: 15 * time.Second}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.MaxLongPolls == 0 {
		c.MaxLongPolls = d.MaxLongPolls
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = d.MaxStreams
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = d.KeepAlive
	}
	if c.Logger == nil && c.Server != nil {
		c.Logger = c.Server.Logger()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// ConfigError is a Config field out of bounds; Field is its Go name (the
// daemon maps it onto its flag).
type ConfigError struct {
	Field string
	Value any
	Want  string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("httpapi: %s %v: %s", e.Field, e.Value, e.Want)
}

// Validate checks the fields (after the defaults are filled).
func (c *Config) Validate() error {
	if c.Server == nil {
		return &ConfigError{"Server", nil, "must be set"}
	}
	if c.MaxLongPolls < 1 || c.MaxLongPolls > 1<<24 {
		return &ConfigError{"MaxLongPolls", c.MaxLongPolls, "must be 1..16777216"}
	}
	if c.MaxStreams < 1 || c.MaxStreams > 1<<24 {
		return &ConfigError{"MaxStreams", c.MaxStreams, "must be 1..16777216"}
	}
	if c.PortOffset < -65535 || c.PortOffset > 65535 {
		return &ConfigError{"PortOffset", c.PortOffset, "must be -65535..65535"}
	}
	if c.KeepAlive < 10*time.Millisecond {
		return &ConfigError{"KeepAlive", c.KeepAlive, "must be at least 10ms"}
	}
	return nil
}
