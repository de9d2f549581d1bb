package raftnode

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/ratelog"
)

// hclogAdapter sends hashicorp/raft's log lines (an hclog.Logger) to the
// node's slog logger: Trace and Debug become slog Debug, Info, Warn and
// Error keep their level. Lines below min are dropped before they are
// formatted. The name raft gives a subsystem ("raft", "raft-net") becomes
// the attribute "component". Every adapter of a node shares its raftLogs
// (nil: none): one rate limit and one view of the configuration.
type hclogAdapter struct {
	log    *slog.Logger
	name   string
	min    hclog.Level
	args   []any
	mute   *atomic.Bool // when set, drops every line (a closing transport's noise)
	shared *raftLogs
}

// newHclog returns an hclog.Logger writing to l from level min, sharing
// shared (nil: no rate limit).
func newHclog(l *slog.Logger, min hclog.Level, shared *raftLogs) hclog.Logger {
	return &hclogAdapter{log: l, min: min, shared: shared}
}

// raftLogEvery is how often a warning or error of hashicorp/raft about
// one peer is written: a member that is down makes raft's replication and
// heartbeat goroutines fail several times a second, each with a line.
const raftLogEvery = 10 * time.Second

// raftLogs is what the hclog adapters of one node share:
//   - a rate limit on raft's warnings and errors: one line per subsystem,
//     message and peer every raftLogEvery, the next one carrying how many
//     were suppressed meanwhile;
//   - the configuration: a line about a peer that is no longer in it is
//     dropped. hashicorp/raft stops replicating to a removed member only
//     when its replication goroutine's failure backoff (up to tens of
//     seconds) ends, and its heartbeats fail and log until then.
type raftLogs struct {
	// config is the node's raft, once started: its latest configuration
	// says which peers are members (GetConfiguration reads a copy, safe
	// from any goroutine).
	config atomic.Pointer[raft.Raft]

	lines ratelog.Keyed // by subsystem, message and peer
	now   func() int64  // the clock of the rate limit (ns; tests set it)
}

func newRaftLogs() *raftLogs {
	return &raftLogs{lines: ratelog.Keyed{Every: raftLogEvery}, now: func() int64 { return time.Now().UnixNano() }}
}

// peerOf is the peer a raft log line names (its "peer" or "server-id"
// argument: an address, an ID or a raft.Server), "" when none.
func peerOf(args []any) (addr, id string) {
	for i := 0; i+1 < len(args); i += 2 {
		k, _ := args[i].(string)
		if k != "peer" && k != "server-id" {
			continue
		}
		switch v := args[i+1].(type) {
		case raft.Server:
			return string(v.Address), string(v.ID)
		case raft.ServerAddress:
			return string(v), ""
		case raft.ServerID:
			return "", string(v)
		case string:
			if k == "server-id" {
				return "", v
			}
			return v, ""
		}
	}
	return "", ""
}

// member reports whether the configuration has a server with addr or id
// (true while no configuration is known).
func (r *raftLogs) member(addr, id string) bool {
	rf := r.config.Load()
	if rf == nil {
		return true
	}
	f := rf.GetConfiguration()
	if f.Error() != nil {
		return true
	}
	for _, s := range f.Configuration().Servers {
		if addr != "" && string(s.Address) == addr || id != "" && string(s.ID) == id {
			return true
		}
	}
	return false
}

// admit decides whether a line is written, and with how many like it
// suppressed since the last one.
func (r *raftLogs) admit(level hclog.Level, name, msg string, args []any) (suppressed int, ok bool) {
	addr, id := peerOf(args)
	if (addr != "" || id != "") && !r.member(addr, id) {
		return 0, false
	}
	if level < hclog.Warn {
		return 0, true
	}
	key := name + "\x00" + msg + "\x00" + addr + "\x00" + id
	return r.lines.Allow(key, r.now())
}

// reservedKeys are the keys a raft argument may not take in a line: slog's
// own, and those lockd's loggers add. Such an argument is written as
// "raft_" and its key (raft's "time" of "failed to contact" would
// otherwise be a second "time").
var reservedKeys = map[string]bool{
	slog.TimeKey: true, slog.LevelKey: true, slog.MessageKey: true, slog.SourceKey: true,
	"component": true, "self": true, "suppressed": true,
}

func slogLevel(l hclog.Level) slog.Level {
	switch {
	case l <= hclog.Debug:
		return slog.LevelDebug
	case l == hclog.Info:
		return slog.LevelInfo
	case l == hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// Log writes msg at level with args as key/value pairs.
func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	if level < h.min || h.min == hclog.Off || (h.mute != nil && h.mute.Load()) {
		return
	}
	sl := slogLevel(level)
	if !h.log.Enabled(context.Background(), sl) {
		return
	}
	suppressed := 0
	if h.shared != nil {
		var ok bool
		if suppressed, ok = h.shared.admit(level, h.name, msg, args); !ok {
			return
		}
	}
	all := make([]any, 0, 4+len(h.args)+len(args))
	if h.name != "" {
		all = append(all, "component", h.name)
	}
	all = appendArgs(all, h.args)
	all = appendArgs(all, args)
	if suppressed > 0 {
		all = append(all, "suppressed", suppressed)
	}
	h.log.Log(context.Background(), sl, msg, all...)
}

// appendArgs appends raft's key/value pairs to dst, a reserved key
// renamed.
func appendArgs(dst, args []any) []any {
	for i := 0; i < len(args); i += 2 {
		k := args[i]
		if s, ok := k.(string); ok && reservedKeys[s] {
			k = "raft_" + s
		}
		dst = append(dst, k)
		if i+1 < len(args) {
			dst = append(dst, args[i+1])
		}
	}
	return dst
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) IsTrace() bool { return h.min <= hclog.Trace }
func (h *hclogAdapter) IsDebug() bool { return h.min <= hclog.Debug }
func (h *hclogAdapter) IsInfo() bool  { return h.min <= hclog.Info }
func (h *hclogAdapter) IsWarn() bool  { return h.min <= hclog.Warn }
func (h *hclogAdapter) IsError() bool { return h.min <= hclog.Error }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

func (h *hclogAdapter) SetLevel(level hclog.Level) { h.min = level }

func (h *hclogAdapter) GetLevel() hclog.Level { return h.min }

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return hclogWriter{h}
}

// hclogWriter turns lines written by a standard library logger into Info
// lines (a "[WARN]" or "[ERR" prefix, as hashicorp's libraries write them,
// picks the level).
type hclogWriter struct{ h *hclogAdapter }

func (w hclogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := hclog.Info
	switch {
	case strings.Contains(msg, "[ERR"):
		level = hclog.Error
	case strings.Contains(msg, "[WARN"):
		level = hclog.Warn
	case strings.Contains(msg, "[DEBUG"), strings.Contains(msg, "[TRACE"):
		level = hclog.Debug
	}
	w.h.Log(level, msg)
	return len(p), nil
}
