package raftnode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

// logBuf collects a node's log lines (JSON), safe for concurrent writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines written since mark (a byte offset) and the new
// mark.
func (l *logBuf) lines(mark int) ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()[mark:]
	return strings.Split(strings.TrimSpace(s), "\n"), l.b.Len()
}

// dupKeys returns the keys a JSON log line has more than once.
func dupKeys(line string) ([]string, error) {
	d := json.NewDecoder(strings.NewReader(line))
	if _, err := d.Token(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var dup []string
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return nil, err
		}
		key := k.(string)
		if seen[key] {
			dup = append(dup, key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
	}
	return dup, nil
}

// TestRaftLogLines: a member that is down costs the log a line per
// message and peer every raftLogEvery, not hashicorp/raft's several a
// second; once it is removed, nothing more is logged about it; and no
// line (raft's, the membership's) has a key twice.
func TestRaftLogLines(t *testing.T) {
	var buf logBuf
	testLogOverride = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() { testLogOverride = nil })
	c := newRaftCluster(t, 3)
	l := c.leader()
	dead := (l + 1) % 3
	deadAddr := c.ms[dead].n.cfg.MemberAddr(dead)
	c.kill(dead)
	_, mark := buf.lines(0)
	time.Sleep(3 * time.Second)
	down, mark := buf.lines(mark)
	about := func(lines []string) (n int, msgs map[string]int) {
		msgs = map[string]int{}
		for _, line := range lines {
			if strings.Contains(line, deadAddr) {
				n++
				var m struct{ Msg string }
				_ = json.Unmarshal([]byte(line), &m)
				msgs[m.Msg]++
			}
		}
		return n, msgs
	}
	n, msgs := about(down)
	for msg, k := range msgs {
		if k > 1 {
			t.Errorf("%d lines %q about the down member in 3 s, want at most 1", k, msg)
		}
	}
	t.Logf("%d lines about the down member in 3 s: %v", n, msgs)

	l = c.leader()
	if _, err := c.ms[l].n.RemoveMember(ctx10s(t), fmt.Sprint(dead)); err != nil {
		t.Fatal(err)
	}
	_, mark = buf.lines(mark)
	time.Sleep(3 * time.Second)
	after, _ := buf.lines(mark)
	if n, msgs := about(after); n > 0 {
		t.Errorf("%d lines about the removed member in 3 s after its removal: %v", n, msgs)
	}
	all, _ := buf.lines(0)
	for _, line := range all {
		dup, err := dupKeys(line)
		if err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		if len(dup) > 0 {
			t.Errorf("keys %v twice in %s", dup, line)
		}
	}
	_ = io.Discard
	_ = repltest.Quiet
}
