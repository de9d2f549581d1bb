package engine

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// scratch is a batch's working memory, pooled: the answers being built
// and the table's effects.
type scratch struct {
	answers // what the batch writes to its connection (one Write)
	fx      shard.Out
	req     proto.Request
	local   []*session // sessions of this loop with mail to flush after the batch
	cnt     counts     // this batch's request tally
	// gen is the number of Abandon calls made before the state its answers
	// come from (commit.go): taken when the scratch is, lowered by mail
	// made earlier.
	gen uint64
}

func (s *Server) getScratch() *scratch {
	b := s.scratch.Get().(*scratch)
	b.gen = s.abandonsA.Load()
	return b
}

func (s *Server) putScratch(b *scratch) {
	b.answers.reset()
	b.fx.Reset()
	clear(b.local)
	b.local = b.local[:0]
	s.scratch.Put(b)
}

// answers is a buffer of encoded answer frames and the A (acquired)
// frames among them: a batch's (scratch), those waiting for a commit
// (session.held) and the mailbox's (session.mbox). grants lists every A
// frame of out, in order, by offsets into out, so that the grants of
// answers that never reached their socket can be released (PROTOCOL.md
// §4). An A frame is appended only by addGrant, and answers are moved
// only by the methods below, which keep the offsets right; other frames
// may be appended to out directly (proto.AppendX).
type answers struct {
	out    []byte     // encoded frames
	grants []grantRef // the A frames in out
}

// grantRef is an A frame in its answers, recorded when the frame is
// appended: what the delivery tracking needs, without reading the frame
// again.
type grantRef struct {
	token uint64
	koff  int // offset of its key in answers.out
	end   int // offset just past the frame (the key, then 0x0A)
}

// key returns the key of g, one of a.grants.
func (a *answers) key(g grantRef) []byte { return a.out[g.koff : g.end-1] }

// empty reports whether a holds no frame.
func (a *answers) empty() bool { return len(a.out) == 0 }

// reset empties a, keeping its buffers.
func (a *answers) reset() {
	a.out = a.out[:0]
	a.grants = a.grants[:0]
}

// addGrant appends an A frame and records it.
func (a *answers) addGrant(owner, token uint64, key []byte) {
	a.out = proto.AppendAcquired(a.out, owner, token, key)
	end := len(a.out)
	a.grants = append(a.grants, grantRef{token: token, koff: end - 1 - len(key), end: end})
}

// addAll appends src's frames and records its grants.
func (a *answers) addAll(src *answers) {
	base := len(a.out)
	a.out = append(a.out, src.out...)
	for _, g := range src.grants {
		g.koff += base
		g.end += base
		a.grants = append(a.grants, g)
	}
}

// moveFront moves the first n bytes of a, whole frames, with their grants
// to the end of dst.
func (a *answers) moveFront(dst *answers, n int) {
	k := 0
	for k < len(a.grants) && a.grants[k].end <= n {
		k++
	}
	dst.addAll(&answers{out: a.out[:n], grants: a.grants[:k]})
	a.out = a.out[:copy(a.out, a.out[n:])]
	a.grants = a.grants[:copy(a.grants, a.grants[k:])]
	for i := range a.grants {
		a.grants[i].koff -= n
		a.grants[i].end -= n
	}
}

// releaseGrants releases the grants in a, answers that never reached
// their socket (PROTOCOL.md §4: no phantom lock); the effects go to b.fx.
func (s *Server) releaseGrants(a *answers, b *scratch, now int64) {
	for _, g := range a.grants {
		s.table.Release(now, a.key(g), g.token, &b.fx)
	}
}

// wire is what a session needs of its connection. A gnet.Conn is one (a
// plaintext connection, on an event loop); a *tlsConn is the other (a TLS
// connection, on goroutines of its own: tlsconn.go). Peek, Discard and
// Write are called by the session's batches only; OutboundBuffered by its
// batches and its close; Wake, Close and RemoteAddr from any goroutine.
type wire interface {
	// Peek(-1) returns every unread inbound byte; Discard consumes n.
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
	// Write hands b to the socket without blocking: what the socket does
	// not take now is buffered and counted by OutboundBuffered until it
	// does (for TLS: until the records holding it reached the kernel).
	Write(b []byte) (int, error)
	OutboundBuffered() int
	// Wake makes the session run a batch soon (its mailbox, held answers,
	// unread requests); Close closes the connection (its batches' owner
	// then runs the close).
	Wake(cb gnet.AsyncCallback) error
	Close() error
	RemoteAddr() net.Addr
}

// session is one client connection, plaintext (gnet) or TLS: the request
// handling (handler.traffic, write, the close) is the same for both.
type session struct {
	c     wire
	tconn *shard.Conn    // the table's handle: this connection's queued acquires
	loop  gnet.EventLoop // the loop that owns c; nil for a TLS or local connection
	local bool           // c is a *localWire (local.go): counted in Server.localConns
	st    *loopStats     // that loop's counters (the TLS connections' own)

	// certCN is the Subject Common Name of the client certificate that the
	// TLS handshake verified against --tls-client-ca: "" on a plaintext
	// connection and without --tls-client-ca. Set before the session's
	// first batch, never changed. The identity code authenticates the
	// connection from it (PROTOCOL.md §8.3: "at once when its verified
	// client certificate's Common Name is an identity of the file").
	certCN string

	// Owned by the connection's event loop.
	written uint64   // bytes handed to c.Write so far
	pend    []pgrant // grants whose frame may still sit in gnet's outbound buffer, in stream order
	pkeys   []byte   // key bytes of pend; pkeys[0] is at offset kbase of the key stream
	kbase   uint64
	writing *scratch // the batch inside c.Write (a failed write closes re-entrantly)
	gone    bool     // OnClose ran

	// Answers waiting for a commit (commit.go), owned by the loop.
	held    answers
	hchunks []heldChunk
	inHeld  bool // in Server.heldSet (commit.go: changed only on this loop, under heldMu)
	// heldWake: a wake for committed answers is on its way.
	heldWake atomic.Bool

	// backlog is what the connection still had buffered at its last batch
	// (outbound bytes plus mail), read by Shutdown from another goroutine.
	backlog atomic.Int64

	// The connection's identity with an ACL (auth.go): auth is the loop's;
	// ident is its table handle for SetACL's sweep, and removed says a
	// reload removed it (counted once).
	auth    sessAuth
	ident   atomic.Uint32
	removed atomic.Bool

	// partialSince is when the partial frame that ends the inbound buffer
	// was first seen (the table's clock, 0: none); listed says the session
	// is in the handler's list of sessions with a partial frame. Written by
	// the loop, read by the frame-timeout sweep.
	partialSince atomic.Int64
	listed       atomic.Bool

	// Guarded by mu: answers made on other goroutines.
	mu     sync.Mutex
	mbox   answers
	woken  bool   // a Wake is on its way
	closed bool   // no more mail: grants posted now are undeliverable
	mgen   uint64 // the lowest scratch.gen of the mail in mbox
	// mspec: some mail in mbox was made from the table's state (every
	// effect but an L with reason 4, which rests on nothing: commit.go).
	mspec bool
}

// pgrant is a grant frame that may not have reached the socket.
type pgrant struct {
	end   uint64 // stream offset just past its frame
	token uint64
	koff  uint64 // offset of its key in the key stream (see kbase)
	klen  int
}

// Capacities that pend and pkeys keep once every pending grant reached the
// socket; larger buffers are given back.
const (
	keepPend  = 256
	keepPKeys = 16 << 10
)

// CertCommonName returns the Subject Common Name of the connection's
// verified client certificate (see certCN), "" if it has none. Safe from
// any goroutine.
func (ss *session) CertCommonName() string { return ss.certCN }

func (ss *session) hasMail() bool {
	ss.mu.Lock()
	empty := ss.mbox.empty()
	ss.mu.Unlock()
	return !empty
}

// post appends an effect's answer to the mailbox and wakes the connection.
// It returns false if the connection is gone (the caller releases a grant).
// With local set (the caller runs on ss's own loop and will flush it after
// its batch) no Wake is sent; flush reports whether the caller must flush
// ss (it claimed the pending wake-up).
func (ss *session) post(e *shard.Effect, local bool, moved string, gen uint64) (ok, flush bool) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return false, false
	}
	if ss.mbox.empty() || gen < ss.mgen {
		ss.mgen = gen
	}
	ss.mspec = ss.mspec || speculative(e)
	ss.mbox.addEffect(e, moved)
	claim := !ss.woken
	ss.woken = true
	ss.mu.Unlock()
	if claim && !local {
		_ = ss.c.Wake(nil)
	}
	return true, claim && local
}

// takeMail moves the mailbox into b (called on the session's loop). spec
// reports whether any of the mail was made from the table's state (see
// hold, commit.go); an empty mailbox gives false.
func (ss *session) takeMail(b *scratch) (spec bool) {
	ss.mu.Lock()
	ss.woken = false
	if !ss.mbox.empty() {
		spec = ss.mspec
		b.gen = min(b.gen, ss.mgen)
		b.addAll(&ss.mbox)
		ss.mbox.reset()
		ss.mspec = false
	}
	ss.mu.Unlock()
	return spec
}

// speculative reports whether e's answer rests on the table's state, so
// that a node that commits before answering must hold it until the
// records before it commit (commit.go). Only an L with reason 4 does not:
// it says that this node can no longer tell (its gate left Serve, or it
// shuts down), which is true whatever becomes of the records in flight.
func speculative(e *shard.Effect) bool {
	return e.Kind != shard.EffectLost || e.Reason != shard.ReasonCannotTell
}

// addEffect appends e's answer, recording a grant; an EffectMoved's M
// names moved.
func (a *answers) addEffect(e *shard.Effect, moved string) {
	switch e.Kind {
	case shard.EffectGrant:
		a.addGrant(e.Owner, e.Token, e.Key)
	case shard.EffectTimeout:
		a.out = proto.AppendTimeout(a.out, e.Owner, e.Key)
	case shard.EffectBusy:
		a.out = proto.AppendBusy(a.out, e.Owner, e.Key)
	case shard.EffectMoved:
		a.out = proto.AppendMoved(a.out, waiterOp(e), e.Owner, moved)
	case shard.EffectLost:
		// A watched grant ended (PROTOCOL.md §9.4): correlated with its
		// W by (op, token).
		a.out = proto.AppendLost(a.out, e.Token, uint8(e.Reason), e.Key)
	default: // shard.EffectCancel
		a.out = proto.AppendError(a.out, waiterOp(e), e.Owner, proto.CodeShutdown, msgShutdown)
	}
}

// waiterOp is the op of the queued acquire an effect answers: S for an
// acquire shared (it has a limit), A otherwise — what an M or E names.
func waiterOp(e *shard.Effect) proto.Op {
	if e.Limit != 0 {
		return proto.OpShared
	}
	return proto.OpAcquire
}

// afterWrite runs after b.out was handed to c.Write: grants whose bytes
// gnet had to buffer are remembered until they reach the socket.
func (ss *session) afterWrite(b *scratch) {
	start := ss.written
	ss.written += uint64(len(b.out))
	buffered := ss.c.OutboundBuffered()
	if buffered == 0 {
		ss.forgetPending()
		return
	}
	delivered := ss.written - uint64(buffered)
	ss.prune(delivered)
	for _, g := range b.grants {
		end := start + uint64(g.end)
		if end <= delivered {
			continue
		}
		key := b.answers.key(g)
		ss.pend = append(ss.pend, pgrant{end: end, token: g.token, koff: ss.kbase + uint64(len(ss.pkeys)), klen: len(key)})
		ss.pkeys = append(ss.pkeys, key...)
	}
}

// pendingKey returns the key of p, one of ss.pend.
func (ss *session) pendingKey(p *pgrant) []byte {
	off := p.koff - ss.kbase
	return ss.pkeys[off : off+uint64(p.klen)]
}

// prune forgets the pending grants that reached the socket. pend and pkeys
// are cut from the front: the next append that outgrows what is left of
// their arrays moves only the live part to new ones (twice its size), so
// their memory follows the live pending grants, whatever the client's
// reading pattern.
func (ss *session) prune(delivered uint64) {
	i := 0
	for i < len(ss.pend) && ss.pend[i].end <= delivered {
		i++
	}
	if i == len(ss.pend) {
		ss.forgetPending()
		return
	}
	if i > 0 {
		cut := ss.pend[i].koff - ss.kbase
		ss.pkeys = ss.pkeys[cut:]
		ss.kbase += cut
		ss.pend = ss.pend[i:]
	}
}

// forgetPending empties pend and pkeys, giving back large arrays.
func (ss *session) forgetPending() {
	if cap(ss.pend) > keepPend {
		ss.pend = nil
	} else {
		ss.pend = ss.pend[:0]
	}
	if cap(ss.pkeys) > keepPKeys {
		ss.pkeys = nil
	} else {
		ss.pkeys = ss.pkeys[:0]
	}
	ss.kbase = 0
}
