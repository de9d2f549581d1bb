package engine

import (
	"bytes"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// scratch is a batch's working memory, pooled: the answers being built, the
// offsets of grant frames among them, and the table's effects.
type scratch struct {
	out    []byte
	grants []int // offsets in out of A (acquired) frames
	fx     shard.Out
	req    proto.Request
	local  []*session // sessions of this loop with mail to flush after the batch
	cnt    counts     // this batch's request tally
}

func (s *Server) getScratch() *scratch { return s.scratch.Get().(*scratch) }

func (s *Server) putScratch(sc *scratch) {
	sc.out = sc.out[:0]
	sc.grants = sc.grants[:0]
	sc.fx.Reset()
	clear(sc.local)
	sc.local = sc.local[:0]
	s.scratch.Put(sc)
}

// session is one client connection.
type session struct {
	c    gnet.Conn
	sc   *shard.Conn
	loop gnet.EventLoop // the loop that owns c
	st   *loopStats     // that loop's counters

	// Owned by the connection's event loop.
	written uint64   // bytes handed to c.Write so far
	pend    []pgrant // grants whose frame may still sit in gnet's outbound buffer
	pkeys   []byte   // key bytes of pend
	writing *scratch // the batch inside c.Write (a failed write closes re-entrantly)
	gone    bool     // OnClose ran

	// backlog is what the connection still had buffered at its last batch
	// (outbound bytes plus mail), read by Shutdown from another goroutine.
	backlog atomic.Int64

	// Guarded by mu: answers made on other goroutines.
	mu      sync.Mutex
	mbox    []byte // encoded frames
	mgrants []int  // offsets in mbox of A frames
	woken   bool   // a Wake is on its way
	closed  bool   // no more mail: grants posted now are undeliverable
}

// pgrant is a grant frame that may not have reached the socket.
type pgrant struct {
	end   uint64 // stream offset just past its frame
	token uint64
	koff  int
	klen  int
}

func (ss *session) hasMail() bool {
	ss.mu.Lock()
	n := len(ss.mbox)
	ss.mu.Unlock()
	return n > 0
}

// post appends an effect's answer to the mailbox and wakes the connection.
// It returns false if the connection is gone (the caller releases a grant).
// With local set (the caller runs on ss's own loop and will flush it after
// its batch) no Wake is sent; flush reports whether the caller must flush
// ss (it claimed the pending wake-up).
func (ss *session) post(e *shard.Effect, local bool, moved string) (ok, flush bool) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return false, false
	}
	ss.mbox = appendEffect(ss.mbox, &ss.mgrants, e, moved)
	claim := !ss.woken
	ss.woken = true
	ss.mu.Unlock()
	if claim && !local {
		_ = ss.c.Wake(nil)
	}
	return true, claim && local
}

// takeMail moves the mailbox into sc (called on the session's loop).
func (ss *session) takeMail(sc *scratch) {
	ss.mu.Lock()
	ss.woken = false
	if len(ss.mbox) > 0 {
		base := len(sc.out)
		sc.out = append(sc.out, ss.mbox...)
		for _, off := range ss.mgrants {
			sc.grants = append(sc.grants, base+off)
		}
		ss.mbox = ss.mbox[:0]
		ss.mgrants = ss.mgrants[:0]
	}
	ss.mu.Unlock()
}

// appendEffect encodes e's answer, recording a grant's offset; an
// EffectMoved's M names moved.
func appendEffect(dst []byte, grants *[]int, e *shard.Effect, moved string) []byte {
	switch e.Kind {
	case shard.EffectGrant:
		*grants = append(*grants, len(dst))
		return proto.AppendAcquired(dst, e.Owner, e.Token, e.Key)
	case shard.EffectTimeout:
		return proto.AppendTimeout(dst, e.Owner, e.Key)
	case shard.EffectBusy:
		return proto.AppendBusy(dst, e.Owner, e.Key)
	case shard.EffectMoved:
		return proto.AppendMoved(dst, proto.OpAcquire, e.Owner, moved)
	default: // shard.EffectCancel
		return proto.AppendError(dst, proto.OpAcquire, e.Owner, proto.CodeShutdown, msgShutdown)
	}
}

// grantAt decodes the A frame at off in buf: its token, key and end.
func grantAt(buf []byte, off int) (token uint64, key []byte, end int) {
	token = binary.BigEndian.Uint64(buf[off+9:])
	k := buf[off+17:]
	n := bytes.IndexByte(k, '\n')
	return token, k[:n], off + 17 + n + 1
}

// afterWrite runs after sc.out was handed to c.Write: grants whose bytes
// gnet had to buffer are remembered until they reach the socket.
func (ss *session) afterWrite(sc *scratch) {
	start := ss.written
	ss.written += uint64(len(sc.out))
	buffered := ss.c.OutboundBuffered()
	if buffered == 0 {
		ss.pend = ss.pend[:0]
		ss.pkeys = ss.pkeys[:0]
		return
	}
	delivered := ss.written - uint64(buffered)
	ss.prune(delivered)
	for _, off := range sc.grants {
		token, key, end := grantAt(sc.out, off)
		if start+uint64(end) <= delivered {
			continue
		}
		ss.pend = append(ss.pend, pgrant{end: start + uint64(end), token: token, koff: len(ss.pkeys), klen: len(key)})
		ss.pkeys = append(ss.pkeys, key...)
	}
}

// prune forgets pending grants that reached the socket.
func (ss *session) prune(delivered uint64) {
	i := 0
	for i < len(ss.pend) && ss.pend[i].end <= delivered {
		i++
	}
	if i == len(ss.pend) {
		ss.pend = ss.pend[:0]
		ss.pkeys = ss.pkeys[:0]
		return
	}
	if i > 0 {
		n := copy(ss.pend, ss.pend[i:])
		ss.pend = ss.pend[:n]
	}
}
