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
	h := newHclog(l, hclog.Info).Named("raft").With("id", 3)
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
