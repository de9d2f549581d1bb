package engine

import "github.com/lockd-dev/lockd/repl"

// Answers that wait for a commit (a repl.Committer node: raft mode).
//
// After a batch the engine reads the node's Barrier — the number of the
// last record the node has received — and, if the node has not yet
// reported it committed, keeps the batch's answers on their connection
// (session.held, in order, one chunk per batch tagged with that number)
// instead of writing them. Host.Committed raises the committed number and
// wakes the connections holding answers; each writes the chunks the
// commit covers, in order, through the usual write path (so the delivered-
// or-not bookkeeping of grants is unchanged). A connection that has held
// chunks holds everything after them too: answers leave in order.
//
// A chunk is speculative when it was made from the table's state (a batch
// that executed requests under a serving gate, or answers made elsewhere:
// mail). Host.Abandon(seq) says that the records above seq, up to the
// barrier at that moment, will never commit: a speculative chunk that
// waits for one of them must never reach its client, so its connection is
// closed (its grants are then undelivered, PROTOCOL.md §6.4); the node has
// closed its gate first, so no batch is still executing from the
// abandoned state. Non-speculative chunks (M, E, pongs after the gate
// closed) are released at once: the committed number jumps to the barrier.
//
// A loop may not run between two Abandon calls (two leadership losses in
// quick succession), so every chunk carries gen, the number of Abandon
// calls made before the state its answers come from (a scratch's gen, the
// lowest of the batch's and of the mail it took), and the engine keeps the
// seq of the last lostKept calls. A speculative chunk of gen g is poisoned
// once a later Abandon exists and its upto is above the seq of the first
// of them, call g+1: what it depends on was committed by then, or never
// will be. The seqs only grow (the node's committed number), so the first
// later call is the one that matters. A chunk older than every call kept is
// poisoned: a closed connection is always safe.
//
// Bounds: a connection's held answers count against --max-outbound like
// its unread ones; past it the connection is closed.

// lostKept is how many Abandon calls the engine remembers.
const lostKept = 64

// heldChunk is one batch's answers waiting for a commit.
type heldChunk struct {
	end  int    // offset in session.held just past the chunk
	upto uint64 // the node's barrier when the batch ended
	spec bool   // made from the table's (possibly uncommitted) state
	gen  uint64 // Abandon calls made before that state (scratch.gen)
}

// hold routes b's answers through ss's held chunks when the node commits
// before answering: it appends them as a chunk if anything waits, then
// moves every chunk that is committed back into b (empty on return
// otherwise). It reports whether the connection must be closed instead
// (an abandoned speculative chunk, or too much held).
func (h *handler) hold(ss *session, b *scratch, spec bool) (closeConn bool) {
	s := h.s
	bar := s.committer.Barrier()
	if !b.answers.empty() && (len(ss.hchunks) > 0 || bar > s.committedA.Load()) {
		if ss.held.empty() {
			// Nothing held yet: the batch's buffers become the held ones
			// (their offsets are the same), the scratch takes the
			// session's empty ones. No copy.
			ss.held, b.answers = b.answers, ss.held
		} else {
			ss.held.addAll(&b.answers)
		}
		ss.hchunks = append(ss.hchunks, heldChunk{end: len(ss.held.out), upto: bar, spec: spec, gen: b.gen})
		b.answers.reset()
	}
	if len(ss.hchunks) == 0 {
		return false
	}
	n, poisoned := s.heldCommitted(ss)
	if poisoned {
		return true
	}
	if n == len(ss.hchunks) && b.answers.empty() {
		// Everything held is committed and the batch has nothing of its
		// own: the held buffers go out as the batch's, no copy.
		b.answers, ss.held = ss.held, b.answers
		ss.held.reset()
		ss.hchunks = ss.hchunks[:0]
		return false
	}
	if n > 0 {
		cut := ss.hchunks[n-1].end
		ss.held.moveFront(&b.answers, cut)
		ss.hchunks = ss.hchunks[:copy(ss.hchunks, ss.hchunks[n:])]
		for i := range ss.hchunks {
			ss.hchunks[i].end -= cut
		}
	}
	return len(ss.held.out) > s.cfg.MaxOutbound
}

// heldCommitted reports how many of ss's chunks (a prefix) are committed,
// or that one is poisoned, and keeps ss in s.heldSet exactly while some
// wait. The set changes only here and in forgetHeld, on ss's own loop, so
// ss.inHeld mirrors ss's membership and heldMu is taken only when the
// membership changes or a chunk may be poisoned: not for a connection
// whose answers keep waiting, nor for one whose answers were committed
// when it looked. The committed number is read before the Abandon count:
// an Abandon raises the count before the number (both under heldMu), so a
// number an Abandon raised comes with that Abandon counted, and a chunk
// made after every Abandon counted cannot be poisoned by them.
func (s *Server) heldCommitted(ss *session) (n int, poisoned bool) {
	n = committedPrefix(ss.hchunks, s.committedA.Load())
	abandons := s.abandonsA.Load()
	fast := true
	for _, ch := range ss.hchunks {
		if ch.spec && ch.gen < abandons {
			fast = false
			break
		}
	}
	if fast && ss.inHeld == (n < len(ss.hchunks)) {
		return n, false
	}
	s.heldMu.Lock()
	n = committedPrefix(ss.hchunks, s.committed)
	for _, ch := range ss.hchunks {
		if ch.spec && ch.gen < s.abandons && ch.upto > s.lostAfter(ch.gen) {
			poisoned = true
		}
	}
	if poisoned || n == len(ss.hchunks) {
		if ss.inHeld {
			delete(s.heldSet, ss)
			ss.inHeld = false
		}
	} else if !ss.inHeld {
		s.heldSet[ss] = struct{}{}
		ss.inHeld = true
	}
	s.heldMu.Unlock()
	return n, poisoned
}

// committedPrefix is how many of chunks, from the first, wait for records
// up to committed at most.
func committedPrefix(chunks []heldChunk, committed uint64) int {
	n := 0
	for n < len(chunks) && chunks[n].upto <= committed {
		n++
	}
	return n
}

// Committed implements repl.Host: records up to seq are committed; the
// connections holding answers for them are woken to write them.
func (s *Server) Committed(seq uint64) {
	s.heldMu.Lock()
	if seq > s.committed {
		s.committed = seq
		s.committedA.Store(seq)
	}
	s.wakeMu.Lock()
	s.wakeList = s.appendHeld(s.wakeList[:0])
	s.heldMu.Unlock()
	wakeAll(s.wakeList)
	clear(s.wakeList) // keeps no closed session alive
	s.wakeMu.Unlock()
}

// Abandon implements repl.Host: records above seq, up to the node's
// barrier now, will never commit; connections holding speculative answers
// that wait for them are woken and close; other held answers leave.
func (s *Server) Abandon(seq uint64) {
	if s.committer == nil {
		return
	}
	s.heldMu.Lock()
	hi := s.committer.Barrier()
	s.abandons++
	s.lost[s.abandons%lostKept] = seq
	s.abandonsA.Store(s.abandons)
	if hi > s.committed {
		s.committed = hi
		s.committedA.Store(hi)
	}
	list := s.appendHeld(nil)
	s.heldMu.Unlock()
	s.log.Warn("changes abandoned: closing the connections whose answers waited for them", "committed", seq, "abandoned_up_to", hi, "connections", len(list))
	wakeAll(list)
}

// lostAfter is the seq of the first Abandon call after gen (< s.abandons)
// ones: the records above it that a chunk of that gen waits for will never
// commit. 0 when that call is no longer kept (s.heldMu held).
func (s *Server) lostAfter(gen uint64) uint64 {
	if s.abandons-gen > lostKept {
		return 0
	}
	return s.lost[(gen+1)%lostKept]
}

// appendHeld appends the sessions holding answers to list (s.heldMu
// held).
func (s *Server) appendHeld(list []*session) []*session {
	for ss := range s.heldSet {
		list = append(list, ss)
	}
	return list
}

// wakeAll wakes each session once (a wake already on its way is enough).
func wakeAll(list []*session) {
	for _, ss := range list {
		if ss.heldWake.CompareAndSwap(false, true) {
			_ = ss.c.Wake(nil)
		}
	}
}

// releaseHeld releases the grants in ss's held answers (its connection
// closed: they were never delivered). The caller holds a scratch for the
// effects.
func (s *Server) releaseHeld(ss *session, b *scratch, now int64) {
	s.releaseGrants(&ss.held, b, now)
	s.forgetHeld(ss)
}

// forgetHeld drops ss's held answers (its connection closed).
func (s *Server) forgetHeld(ss *session) {
	ss.held, ss.hchunks = answers{}, nil
	if !ss.inHeld {
		return
	}
	s.heldMu.Lock()
	delete(s.heldSet, ss)
	ss.inHeld = false
	s.heldMu.Unlock()
}

// serving reports whether the gate lets this node change its table on its
// own (release an undelivered grant): a node that does not serve must not
// (a standby's or follower's table follows the active's or the log).
func (s *Server) serving(now int64) bool { return s.node.Gate().Effective(now) == repl.Serve }
