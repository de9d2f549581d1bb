package shard

import (
	"errors"
	"time"
)

// Config sizes and limits a Table. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Shards is the number of shards, a power of two (default 64).
	Shards int
	// MaxKeys bounds the number of distinct keys held at once across the
	// table (PROTOCOL.md §4 --max-keys, default 16,777,216). An acquire of a
	// new key beyond it answers Busy.
	MaxKeys int
	// MaxWaitersPerKey bounds one key's wait queue (default 4096).
	MaxWaitersPerKey int
	// MaxWaiters bounds queued acquires across all keys (default 1,048,576).
	MaxWaiters int
	// MaxWaitersPerConn bounds the queued acquires of one Conn (default
	// 16,384, 1/64 of the default MaxWaiters), so that one connection
	// cannot take every waiter slot.
	MaxWaitersPerConn int
	// MaxHolders bounds the holders of shared keys beyond the first of each
	// key, across the table (default 1,048,576): a shared key with n
	// holders counts 1 toward MaxKeys and n−1 toward MaxHolders (PROTOCOL.md
	// §9.2). An acquire shared that would go beyond it answers Busy; a
	// queued one that would be granted beyond it gets EffectBusy.
	MaxHolders int
	// MaxWatchesPerConn bounds the watches registered by one Conn
	// (PROTOCOL.md §9.4 --max-watches-per-conn, default 1024): a watch
	// beyond it answers WatchLimit (E 8).
	MaxWatchesPerConn int
	// Tick is the timer wheel's resolution (default and maximum 10 ms).
	Tick time.Duration
	// Sink, if not nil, receives every state change as a Record, in the
	// order the changes happen on each key. It is called with the shard's
	// lock held: it must not block and must not call back into the Table.
	// Record.Key is valid only during the call.
	Sink func(Record)
	// SinkRef, if not nil, receives every state change as Sink does (Sink
	// is then not called), by reference: the Record is the shard's own,
	// rewritten for its next change, so it is valid only during the call
	// and must not be modified or kept. It spares each change the copy of
	// a Record on the way to the Sink.
	SinkRef func(*Record)
	// Defer, with Sink or SinkRef, lets the Sink's owner take the records
	// of exclusive grants later (Table.LockedTake) instead of at each
	// change. It is called under the shard's lock before each exclusive
	// grant's record, with the number of grants the shard holds back
	// already, and reports whether to hold this one back too. A grant held
	// back whose lease ends (release, expiry) before it is taken is never
	// sent: LockedTake hands its record's Seq and its end's as skips, and a
	// renew of it is held back with it. So a pipelined client's
	// acquire/release pairs, which mostly end within one batch, cost the
	// shard no record at all. Without a Sink it is not called.
	Defer func(shard uint32, pending int) bool
}

// Defaults and bounds of Config.
const (
	// DefaultShards is the default Config.Shards.
	DefaultShards = 64
	// DefaultMaxKeys is the default Config.MaxKeys (--max-keys, 16,777,216).
	DefaultMaxKeys = 1 << 24
	// DefaultMaxWaitersPerKey is the default Config.MaxWaitersPerKey.
	DefaultMaxWaitersPerKey = 4096
	// DefaultMaxWaiters is the default Config.MaxWaiters (1,048,576).
	DefaultMaxWaiters = 1 << 20
	// DefaultMaxWaitersPerConn is the default Config.MaxWaitersPerConn (16,384).
	DefaultMaxWaitersPerConn = 1 << 14
	// DefaultMaxHolders is the default Config.MaxHolders (1,048,576).
	DefaultMaxHolders = 1 << 20
	// DefaultMaxWatchesPerConn is the default Config.MaxWatchesPerConn.
	DefaultMaxWatchesPerConn = 1024
	// DefaultTick is the default Config.Tick.
	DefaultTick = 10 * time.Millisecond

	// MaxShards bounds Config.Shards.
	MaxShards = 1 << 16
	// MaxTick bounds Config.Tick (PROTOCOL.md §4 allows deadlines to fire
	// at most 50 ms late).
	MaxTick = 10 * time.Millisecond
	// MinTick is the smallest Config.Tick.
	MinTick = time.Microsecond
)

// Errors of Validate.
var (
	// ErrShards rejects a shard count that is not a power of two in 1..MaxShards.
	ErrShards = errors.New("shard: Shards must be a power of two between 1 and 65536")
	// ErrLimit rejects a negative MaxKeys, MaxWaitersPerKey, MaxWaiters,
	// MaxWaitersPerConn, MaxHolders or MaxWatchesPerConn.
	ErrLimit = errors.New("shard: negative limit")
	// ErrTick rejects a Tick outside MinTick..MaxTick.
	ErrTick = errors.New("shard: Tick must be between 1µs and 10ms")
)

// DefaultConfig returns the defaults of PROTOCOL.md §4 and the project's
// bounds for §9 (MaxHolders, MaxWatchesPerConn).
func DefaultConfig() Config {
	return Config{
		Shards:            DefaultShards,
		MaxKeys:           DefaultMaxKeys,
		MaxWaitersPerKey:  DefaultMaxWaitersPerKey,
		MaxWaiters:        DefaultMaxWaiters,
		MaxWaitersPerConn: DefaultMaxWaitersPerConn,
		MaxHolders:        DefaultMaxHolders,
		MaxWatchesPerConn: DefaultMaxWatchesPerConn,
		Tick:              DefaultTick,
	}
}

// Validate fills zero fields with defaults and rejects nonsense (negative
// limits, a shard count that is not a power of two, Tick over 10 ms).
func (c *Config) Validate() error {
	d := DefaultConfig()
	if c.Shards == 0 {
		c.Shards = d.Shards
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = d.MaxKeys
	}
	if c.MaxWaitersPerKey == 0 {
		c.MaxWaitersPerKey = d.MaxWaitersPerKey
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = d.MaxWaiters
	}
	if c.MaxWaitersPerConn == 0 {
		c.MaxWaitersPerConn = d.MaxWaitersPerConn
	}
	if c.MaxHolders == 0 {
		c.MaxHolders = d.MaxHolders
	}
	if c.MaxWatchesPerConn == 0 {
		c.MaxWatchesPerConn = d.MaxWatchesPerConn
	}
	if c.Tick == 0 {
		c.Tick = d.Tick
	}
	if c.Shards < 0 || c.Shards > MaxShards || c.Shards&(c.Shards-1) != 0 {
		return ErrShards
	}
	if c.MaxKeys < 0 || c.MaxWaitersPerKey < 0 || c.MaxWaiters < 0 || c.MaxWaitersPerConn < 0 ||
		c.MaxHolders < 0 || c.MaxWatchesPerConn < 0 {
		return ErrLimit
	}
	if c.Tick < MinTick || c.Tick > MaxTick {
		return ErrTick
	}
	return nil
}
