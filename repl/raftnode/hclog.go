package raftnode

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends hashicorp/raft's log lines (an hclog.Logger) to the
// node's slog logger: Trace and Debug become slog Debug, Info, Warn and
// Error keep their level. Lines below min are dropped before they are
// formatted. The name raft gives a subsystem ("raft", "raft-net") becomes
// the attribute "component".
type hclogAdapter struct {
	log  *slog.Logger
	name string
	min  hclog.Level
	args []any
	mute *atomic.Bool // when set, drops every line (a closing transport's noise)
}

// newHclog returns an hclog.Logger writing to l from level min.
func newHclog(l *slog.Logger, min hclog.Level) hclog.Logger {
	return &hclogAdapter{log: l, min: min}
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
	all := make([]any, 0, 2+len(h.args)+len(args))
	if h.name != "" {
		all = append(all, "component", h.name)
	}
	all = append(all, h.args...)
	all = append(all, args...)
	h.log.Log(context.Background(), sl, msg, all...)
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
