package clustertest

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
)

// maxLogBytes bounds the log kept per member; beyond it the oldest half is
// dropped (marks stay valid: they count lines since the member was made).
const maxLogBytes = 32 << 20

// logBuf is a member's output, as lines, across its restarts.
type logBuf struct {
	mu      sync.Mutex
	lines   []string
	base    int // the number of lines dropped from the front
	size    int
	max     int           // bytes kept
	changed chan struct{} // closed and replaced on every line
}

func newLogBuf() *logBuf { return &logBuf{changed: make(chan struct{}), max: maxLogBytes} }

func (l *logBuf) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.size += len(line) + 1
	if l.size > l.max && len(l.lines) > 1 {
		cut := len(l.lines) / 2
		for _, s := range l.lines[:cut] {
			l.size -= len(s) + 1
		}
		l.lines = append([]string(nil), l.lines[cut:]...)
		l.base += cut
	}
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// mark is the number of lines so far (the next line's mark).
func (l *logBuf) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.base + len(l.lines)
}

// since returns a copy of the lines from mark on (those still kept).
func (l *logBuf) since(mark int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := min(max(mark-l.base, 0), len(l.lines))
	return append([]string(nil), l.lines[i:]...)
}

// tail returns a copy of the last n lines.
func (l *logBuf) tail(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[max(len(l.lines)-n, 0):]...)
}

// wait returns the first line from mark on that re matches, waiting up to
// timeout for it.
func (l *logBuf) wait(mark int, re *regexp.Regexp, timeout time.Duration) (string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	next := mark
	for {
		l.mu.Lock()
		for i := max(next-l.base, 0); i < len(l.lines); i++ {
			if re.MatchString(l.lines[i]) {
				line := l.lines[i]
				l.mu.Unlock()
				return line, nil
			}
		}
		next = l.base + len(l.lines)
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return "", fmt.Errorf("%w: no log line matching %q in %v", ErrTimeout, re, timeout)
		}
	}
}

// contains reports whether a kept line contains s.
func (l *logBuf) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}
