package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestHclogAdapter: raft's log lines reach slog at the mapped level with
// their name and arguments; lines below the adapter's level, or below the
// slog handler's, are dropped; a muted adapter drops everything.
func TestHclogAdapter(t *testing.T) {
	var b bytes.Buffer
	l := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := newHclog(l, hclog.Info, nil).Named("raft").With("id", 3)
	tests := []struct {
		log  func()
		want string // "" = dropped
	}{
		{func() { h.Trace("t") }, ""},
		{func() { h.Debug("d") }, ""},
		{func() { h.Info("entering follower state", "term", 5) }, `level=INFO msg="entering follower state" component=raft id=3 term=5`},
		{func() { h.Warn("heartbeat timeout") }, `level=WARN msg="heartbeat timeout" component=raft id=3`},
		{func() { h.Named("net").Error("failed", "err", "x") }, `level=ERROR msg=failed component=raft.net id=3 err=x`},
		{func() { h.StandardLogger(nil).Print("[WARN] raft: old style") }, `level=WARN msg="[WARN] raft: old style" component=raft id=3`},
	}
	for _, tc := range tests {
		b.Reset()
		tc.log()
		got := strings.TrimSpace(b.String())
		if tc.want == "" && got != "" || tc.want != "" && !strings.HasSuffix(got, tc.want) {
			t.Fatalf("got %q, want …%q", got, tc.want)
		}
	}
	if !h.IsInfo() || h.IsDebug() || h.Name() != "raft" {
		t.Fatalf("levels or name: info %v debug %v name %q", h.IsInfo(), h.IsDebug(), h.Name())
	}
	muted := &hclogAdapter{log: l, min: hclog.Trace, mute: new(atomic.Bool)}
	muted.mute.Store(true)
	b.Reset()
	muted.Error("closing")
	if b.Len() != 0 {
		t.Fatalf("a muted adapter wrote %q", b.String())
	}
}

// TestHclogShared: raft's warnings and errors about one peer are written
// once per raftLogEvery, the next with the count suppressed meanwhile
// (other messages and peers apart, Info untouched); an argument whose key
// slog or lockd uses is renamed raft_KEY.
func TestHclogShared(t *testing.T) {
	var b bytes.Buffer
	l := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo}))
	shared := newRaftLogs()
	now := int64(0)
	shared.now = func() int64 { return now }
	h := newHclog(l, hclog.Info, shared).Named("raft")
	count := func(f func()) string {
		b.Reset()
		f()
		return b.String()
	}
	out := count(func() {
		for range 5 {
			h.Error("failed to heartbeat to", "peer", "10.0.0.2:17070", "error", "refused")
			h.Error("failed to heartbeat to", "peer", "10.0.0.3:17070", "error", "refused")
			h.Warn("failed to contact", "server-id", "2", "time", 5)
			h.Info("entering follower state", "term", 5)
		}
	})
	for want, n := range map[string]int{`peer=10.0.0.2:17070`: 1, `peer=10.0.0.3:17070`: 1, `server-id=2`: 1, "entering follower state": 5, "raft_time=5": 1} {
		if got := strings.Count(out, want); got != n {
			t.Errorf("%d lines with %q, want %d:\n%s", got, want, n, out)
		}
	}
	if strings.Contains(out, " time=5") {
		t.Errorf("raft's time argument kept its key:\n%s", out)
	}
	// The next one after the interval carries the count.
	now += int64(raftLogEvery)
	out = count(func() { h.Error("failed to heartbeat to", "peer", "10.0.0.2:17070", "error", "refused") })
	if !strings.Contains(out, "suppressed=4") {
		t.Errorf("after the interval: %q, want suppressed=4", out)
	}
}
