package raftnode

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/shard"
)

// lingerNode is a node with only what the proposer's linger uses: the Sink
// side and the linger's fields, no raft.
func lingerNode(lingerTo int, sinceCommit, lingerFor time.Duration) *node {
	n := &node{proposing: true, kick: make(chan struct{}, 1), quit: make(chan struct{}),
		lingered: make(chan struct{}, 1), lingerFor: lingerFor, lingerTo: lingerTo}
	n.lastCommit.Store(time.Now().Add(-sinceCommit).UnixNano())
	return n
}

func sinkGrants(n *node, from, count int) {
	for i := range count {
		key := []byte(fmt.Sprintf("linger/%d", from+i))
		n.sink(shard.Record{Kind: shard.RecordGrant, Shard: 1, Seq: uint64(from + i + 1), Key: key, Token: 5, Lease: 3})
	}
}

// TestProposerLinger: after a commit the proposer waits for the records
// the commit's answers bring back, and no longer: until the buffer holds
// lingerTo records (ended by the Sink at once), at most lingerFor after
// the commit; it does not wait when the buffer holds enough already, when
// the commit is older than lingerFor, or for a sealed entry.
func TestProposerLinger(t *testing.T) {
	cases := []struct {
		name        string
		lingerTo    int
		buffered    int           // records in the buffer when the proposer looks
		sinceCommit time.Duration // how long ago the last entry committed
		lingerFor   time.Duration
		later       int  // records the Sink adds 20 ms after the proposer began to wait
		sealed      bool // a sealed entry waits
		waits       bool
		atMost      time.Duration // the wait ends within this
		atLeast     time.Duration
	}{
		{name: "the answers come back: ended by the Sink at the target", lingerTo: 8, buffered: 1, lingerFor: 5 * time.Second,
			later: 7, waits: true, atLeast: 15 * time.Millisecond, atMost: 2 * time.Second},
		{name: "they do not all come back: ended by the time bound", lingerTo: 8, buffered: 1, lingerFor: 100 * time.Millisecond,
			later: 3, waits: true, atLeast: 80 * time.Millisecond, atMost: 3 * time.Second},
		{name: "a lone sequential request (one record per entry)", lingerTo: 1, buffered: 1, lingerFor: 5 * time.Second},
		{name: "a full buffer", lingerTo: lingerMax, buffered: lingerMax, lingerFor: 5 * time.Second},
		{name: "a commit older than lingerFor", lingerTo: 8, buffered: 1, sinceCommit: time.Second, lingerFor: 200 * time.Microsecond},
		{name: "a sealed entry", lingerTo: 8, buffered: 1, lingerFor: 5 * time.Second, sealed: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := lingerNode(c.lingerTo, c.sinceCommit, c.lingerFor)
			sinkGrants(n, 0, c.buffered)
			if c.sealed {
				n.full = append(n.full, sealed{})
			}
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			done := make(chan bool, 1)
			began := time.Now()
			go func() {
				n.mu.Lock()
				waited := n.lingerLocked(timer)
				n.mu.Unlock()
				done <- waited
			}()
			if c.later > 0 {
				time.Sleep(20 * time.Millisecond)
				sinkGrants(n, c.buffered, c.later)
			}
			var waited bool
			select {
			case waited = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the linger did not end")
			}
			took := time.Since(began)
			if waited != c.waits {
				t.Fatalf("waited %v, want %v", waited, c.waits)
			}
			if c.waits && (took < c.atLeast || took > c.atMost) {
				t.Fatalf("the wait took %v, want %v..%v", took, c.atLeast, c.atMost)
			}
			if !c.waits && took > time.Second {
				t.Fatalf("no wait, yet lingerLocked took %v", took)
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.lingerWant != 0 {
				t.Fatalf("lingerWant %d left set", n.lingerWant)
			}
		})
	}
}

// TestRaftLingerTarget: a commit sets the next linger's target to what the
// buffer held at that moment plus the records of the committed entry.
// The leader's fsync is held so that one record's entry is in flight while
// four more are buffered: its commit must set the target to 5.
func TestRaftLingerTarget(t *testing.T) {
	c := newRaftCluster(t, 3)
	l := c.leader()
	lm := c.ms[l]
	c.settle(l)
	targets := map[uint64]int{}
	lm.host.mu.Lock()
	lm.host.onCommit = func(seq uint64) {
		lm.n.mu.Lock()
		targets[seq] = lm.n.lingerTo
		lm.n.mu.Unlock()
	}
	lm.host.mu.Unlock()

	held := make(chan struct{})
	hold := func() { <-held }
	lm.n.dur.hold.Store(&hold)
	lm.grant(t, "target/0", 10)
	first := lm.n.Barrier()
	wait.For(t, "the one-record entry to be in flight", func() bool { return lm.n.busy.Load() == 1 })
	for i := 1; i <= 4; i++ {
		lm.grant(t, fmt.Sprintf("target/%d", i), 10)
	}
	lm.n.dur.hold.Store(nil)
	close(held)
	c.settle(l)
	lm.host.mu.Lock()
	lm.host.onCommit = nil
	lm.host.mu.Unlock()
	lm.n.mu.Lock()
	got, ok := targets[first]
	lm.n.mu.Unlock()
	if !ok || got != 5 {
		t.Fatalf("the target after the commit of record %d: %d (seen %v), want 5 (4 buffered + 1 committed)", first, got, ok)
	}
}
