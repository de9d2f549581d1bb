package engine_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// committing is a single node whose changes "commit" only when the test
// says so: it numbers the table's records (repl.Committer) and the test
// calls Server.Committed / Server.Abandon.
type committing struct {
	*repl.Local
	records atomic.Uint64
	gate    atomic.Pointer[repl.Gate] // when set, replaces Local's (always serving) gate
	// When stall is set, the next Barrier call blocks: it closes stalled
	// and waits until resume closes (a batch stuck on its loop).
	stall           atomic.Bool
	stalled, resume chan struct{}
}

func (c *committing) Barrier() uint64 {
	if c.stall.CompareAndSwap(true, false) {
		close(c.stalled)
		<-c.resume
	}
	return c.records.Load()
}

func (c *committing) Gate() *repl.Gate {
	if g := c.gate.Load(); g != nil {
		return g
	}
	return c.Local.Gate()
}

// startCommittingWith is startCommitting with the configuration changed by
// mod too.
func startCommittingWith(t *testing.T, mod func(*engine.Config)) (*testServer, *committing) {
	t.Helper()
	return startCommitting(t, mod)
}

func startCommitting(t *testing.T, mods ...func(*engine.Config)) (*testServer, *committing) {
	t.Helper()
	node := &committing{}
	ts := startServer(t, func(cfg *engine.Config) {
		node.Local = repl.NewLocal(repl.LocalConfig{DataDir: cfg.DataDir})
		cfg.Node = node
		cfg.Table.Sink = func(shard.Record) { node.records.Add(1) }
		for _, mod := range mods {
			if mod != nil {
				mod(cfg)
			}
		}
	})
	return ts, node
}

// noAnswer checks that nothing arrives on w within d.
func noAnswer(t *testing.T, w *wire, d time.Duration) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	if n, err := w.c.Read(b[:]); n > 0 || err == nil {
		t.Fatalf("an answer left before its change committed: %q", b[:n])
	}
	_ = w.c.SetReadDeadline(time.Time{})
}

// TestAnswersWaitForCommit: with a node that commits before answering,
// a grant is not answered until the node reports its record committed;
// a ping sent after it on the same connection waits too (answers leave in
// order); an answer that changed nothing on an idle server leaves at once.
func TestAnswersWaitForCommit(t *testing.T) {
	ts, node := startCommitting(t)
	w := dial(t, ts.Addr())
	w.send(append(proto.AppendAcquire(nil, 0, 30, 1, "k"), proto.AppendPing(nil, 2)...))
	noAnswer(t, w, 200*time.Millisecond)
	if node.Barrier() != 1 {
		t.Fatalf("barrier %d after one grant", node.Barrier())
	}
	ts.Committed(1)
	w.expect(proto.OpAcquire, 1)
	w.expect(proto.OpPing, 2)
	// Nothing uncommitted: a ping and a T (no change) leave at once.
	w.send(append(proto.AppendPing(nil, 3), proto.AppendAcquire(nil, 0, 30, 4, "k")...))
	w.expect(proto.OpPing, 3)
	w.expect(proto.OpTimeout, 4)
}

// TestHandoffGrantWaitsForCommit: a grant handed to a waiter on another
// connection by a release leaves only once the release's records commit.
func TestHandoffGrantWaitsForCommit(t *testing.T) {
	ts, node := startCommitting(t)
	a, b := dial(t, ts.Addr()), dial(t, ts.Addr())
	a.send(proto.AppendAcquire(nil, 0, 30, 1, "k"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	ts.Committed(node.Barrier())
	tok := a.expect(proto.OpAcquire, 1).Token
	b.send(proto.AppendAcquire(nil, 10, 30, 2, "k"))
	lockdtest.WaitFor(t, "the waiter to queue", func() bool { return ts.Table().Lookup([]byte("k")).Waiters == 1 })
	a.send(proto.AppendRelease(nil, tok, "k"))
	noAnswer(t, b, 200*time.Millisecond)
	lockdtest.WaitFor(t, "the release's and the handoff's records", func() bool { return node.Barrier() == 3 })
	ts.Committed(node.Barrier())
	a.expect(proto.OpRelease, tok)
	if r := b.expect(proto.OpAcquire, 2); r.Token <= tok {
		t.Fatalf("handoff grant: token %d", r.Token)
	}
}

// TestAbandonClosesWaitingConnections: when the node loses the right to
// commit (its gate closes, then it abandons the records that held answers
// wait for), the connection waiting for them is closed without its grant,
// and the table is left to the node (a node that does not serve releases
// nothing on its own); answers that need no abandoned record (M after the
// gate closed) leave at once.
func TestAbandonClosesWaitingConnections(t *testing.T) {
	ts, node := startCommitting(t)
	w := dial(t, ts.Addr())
	w.send(proto.AppendAcquire(nil, 0, 30, 1, "lost"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	ts.Abandon(0)
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [64]byte
	if n, err := w.c.Read(buf[:]); err == nil {
		t.Fatalf("the abandoned grant reached its client: %q", buf[:n])
	}
	if node.Barrier() != 1 {
		t.Fatalf("a node that does not serve changed its table on a close: barrier %d", node.Barrier())
	}
	other := dial(t, ts.Addr())
	other.send(proto.AppendPing(nil, 7))
	if r := other.expect(proto.OpMoved, 7); r.Tail != "127.0.0.1:1" {
		t.Fatalf("M after the abandon names %q", r.Tail)
	}
}

// TestAbandonRemembersEveryRange: the node loses its leadership twice before
// a connection's loop runs again. The first loss abandons the grant that
// connection's held answer waits for; between the two, a new leadership
// commits records of its own and the second loss abandons later ones. The
// held grant must never reach its client: the connection is closed.
func TestAbandonRemembersEveryRange(t *testing.T) {
	ts, node := startCommittingWith(t, func(cfg *engine.Config) { cfg.Loops = 1 })
	w, other := dial(t, ts.Addr()), dial(t, ts.Addr())
	w.send(proto.AppendAcquire(nil, 0, 30, 1, "lost"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	// Leadership lost: the gate closes (no batch executes from here on).
	node.gate.Store(&repl.Gate{State: repl.Redirect})
	ts.GateChanged()
	// The only loop gets stuck in another connection's batch, so that w's
	// loop cannot run while the node goes through two losses.
	node.stalled, node.resume = make(chan struct{}), make(chan struct{})
	node.stall.Store(true)
	other.send(proto.AppendPing(nil, 2))
	<-node.stalled
	ts.Abandon(0) // records (0, 1] will never commit
	// A new leadership: record 2 commits, record 3 is in flight when it
	// ends too.
	node.records.Add(1)
	ts.Committed(2)
	node.records.Add(1)
	ts.Abandon(2) // records (2, 3] will never commit
	close(node.resume)
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [64]byte
	if n, err := w.c.Read(buf[:]); err == nil {
		t.Fatalf("a grant abandoned by the first of two leadership losses reached its client: %q", buf[:n])
	}
	other.expect(proto.OpMoved, 2)
}

// TestLostWaitsForCommit: the L of a watch whose grant a release ended
// leaves only once the release's record commits (it must not tell the
// watcher of a release that may never happen), on the watcher's connection
// as on the releasing one.
func TestLostWaitsForCommit(t *testing.T) {
	ts, node := startCommitting(t)
	holder, watcher := dial(t, ts.Addr()), dial(t, ts.Addr())
	holder.send(proto.AppendShared(nil, 0, 30, 1, 2, "k"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	ts.Committed(1)
	tok := holder.expect(proto.OpAcquire, 1).Token
	watcher.watch("k", tok)
	holder.watch("k", tok)
	holder.send(proto.AppendRelease(nil, tok, "k"))
	lockdtest.WaitFor(t, "the release's record", func() bool { return node.Barrier() == 2 })
	noAnswer(t, watcher, 200*time.Millisecond)
	noAnswer(t, holder, 10*time.Millisecond)
	ts.Committed(2)
	holder.expect(proto.OpRelease, tok)
	holder.lost("k", tok, shard.ReasonReleased)
	watcher.lost("k", tok, shard.ReasonReleased)
}

// TestValidWaitsForCommit: a V that says "valid" and an I that counts a
// holder rest on the grant's record: while it is not committed they wait,
// and a W too (the L that follows must come after it).
func TestValidWaitsForCommit(t *testing.T) {
	ts, node := startCommitting(t)
	holder, checker := dial(t, ts.Addr()), dial(t, ts.Addr())
	holder.send(proto.AppendAcquire(nil, 0, 30, 1, "k"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	// The grant is made, not committed: the checker learns its token
	// from the table (a client that guessed it).
	tok := ts.Table().Lookup([]byte("k")).Token
	checker.send(proto.AppendValidate(nil, tok, "k"))
	checker.send(proto.AppendInspect(nil, 2, "k"))
	checker.send(proto.AppendWatch(nil, tok, "k"))
	noAnswer(t, checker, 200*time.Millisecond)
	ts.Committed(1)
	if f := checker.expect(proto.OpValidate, tok); f.Remaining == 0 {
		t.Fatalf("V: %+v", f)
	}
	if f := checker.expect(proto.OpInspect, 2); f.Holders != 1 || f.Token != tok {
		t.Fatalf("I: %+v", f)
	}
	checker.expect(proto.OpWatch, tok)
	holder.expect(proto.OpAcquire, 1)
}

// TestLostCannotTellSurvivesAbandon: a leader that loses its leadership
// with records in flight (its gate redirects, then it abandons them) ends
// every watch with an L 4, which rests on no record: a watcher with no
// answer waiting for the abandoned records gets it, where the connection
// waiting for an abandoned grant is closed.
func TestLostCannotTellSurvivesAbandon(t *testing.T) {
	ts, node := startCommitting(t)
	holder, watcher, other := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	holder.send(proto.AppendAcquire(nil, 0, 30, 1, "k"))
	lockdtest.WaitFor(t, "the grant's record", func() bool { return node.Barrier() == 1 })
	ts.Committed(1)
	tok := holder.expect(proto.OpAcquire, 1).Token
	watcher.watch("k", tok)
	other.send(proto.AppendAcquire(nil, 0, 30, 2, "lost"))
	lockdtest.WaitFor(t, "the second grant's record", func() bool { return node.Barrier() == 2 })
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	noAnswer(t, watcher, 100*time.Millisecond) // the L 4 waits behind record 2, which is in flight
	ts.Abandon(1)
	watcher.lost("k", tok, shard.ReasonCannotTell)
	_ = other.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [64]byte
	if n, err := other.c.Read(buf[:]); err == nil {
		t.Fatalf("the abandoned grant reached its client: %q", buf[:n])
	}
}
