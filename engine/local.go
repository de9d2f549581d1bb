package engine

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
)

// The in-process connection (docs/DESIGN.md "The HTTP front").
//
// A LocalConn is a third kind of wire, beside gnet.Conn and *tlsConn: a
// connection whose other end is a program in the same process (the HTTP
// front, package httpapi) speaking PROTOCOL.md's frames through memory.
// Its session is an ordinary session: the same batches (handler.traffic),
// the same validation order, ACL checks, identity-bound grants, gate and
// M, held commits, mailboxes, watches and L, the same close. So the front
// re-implements no lock semantics: it encodes requests with proto's
// encoders and reads the answers with proto.ParseResponse.
//
// Who plays the event loop. A Send appends its frames and runs the batch
// at once on the caller's goroutine (no handoff: an acquire of a free key
// is answered before Send returns). Everything else that must run a batch
// — mail (a handoff, a timer's T, an L), a commit, a gate change — calls
// Wake, which signals the connection's driver, a goroutine of its own that
// runs the batch. The run mutex makes Send and the driver take turns, as
// one event loop would; it is the lock that owns the session's loop-owned
// fields.
//
// Delivered. An answer is delivered once the front has taken it (Take):
// until then it sits in the connection's output, counted by
// OutboundBuffered exactly as a socket's unsent bytes are, so a grant the
// front never took is released by the close (PROTOCOL.md §4: no phantom
// lock) and counts toward --max-outbound and --max-pending-grants. A
// grant the front took is the front's: if it cannot hand it on (its HTTP
// client went away) it must release that token itself. At the close the
// answers not taken stay readable, except the grants among them, which the
// close has released: the front still reads an E 5 or an E 4 that came
// just before the close, and never a grant that no longer holds.
//
// The close runs once, on whichever goroutine holds the run mutex: a batch
// that ends in gnet.Close (a bad frame, E 5, --max-outbound), or the
// driver when Close was called (by the front, an ACL reload removing the
// identity, or the engine stopping). Queued acquires leave their queues
// and watches end silently, as for any connection (§4, §9.4).

// ErrLocalClosed is the error of Send on a LocalConn that is closed, and
// of OpenLocal on a server that is not serving (not started yet, or
// stopped).
var ErrLocalClosed = errors.New("engine: the local connection is closed")

// LocalConn is an in-process connection to the server: requests go in as
// PROTOCOL.md frames (Send), answers come out as frames (Ready, Take). It
// is safe for use from any goroutine, but requests are executed in the
// order the Sends were made (one connection's order, §3), so a caller that
// needs one request's answers alone uses a LocalConn for one request at a
// time.
type LocalConn struct{ w *localWire }

// localWire is the session's wire.
type localWire struct {
	s      *Server
	h      *handler
	ss     *session
	remote atomic.Pointer[string]

	// run is the connection's event loop: held by whoever runs a batch or
	// the close (Send, or the driver).
	run sync.Mutex

	mu     sync.Mutex
	in     []byte // requests sent; in[r:] not yet read by a batch
	r      int
	out    []byte // answers not taken by the front
	closed bool   // no more Send; out frozen until final
	final  bool   // the close ran: out holds what is left to take

	ready     chan struct{} // cap 1: answers were appended (or the close ran)
	wake      chan struct{} // cap 1: the driver should run a batch
	closeReq  chan struct{} // closed by Close: the driver runs the close
	closeOnce sync.Once
	done      chan struct{} // closed once the close has run
}

// localAddr is the address a LocalConn reports for logs.
type localAddr string

func (a localAddr) Network() string { return "local" }
func (a localAddr) String() string  { return string(a) }

// localStatsKey is the local connections' entry in Server.loops.
type localStatsKey struct{}

// OpenLocal opens an in-process connection. certCN is the Common Name of
// a client certificate that the caller verified against the server's
// client CA ("" for none): with an ACL, it authenticates the connection
// at its first request, as for a TLS connection (PROTOCOL.md §8.3).
// remote names the peer in logs (SetRemote changes it). It fails with
// ErrLocalClosed until the server is ready and once it stops; it is open
// while the shutdown drains, so that requests still get E 4 or M as on
// any connection.
func (s *Server) OpenLocal(certCN, remote string) (*LocalConn, error) {
	select {
	case <-s.ready:
	default:
		return nil, ErrLocalClosed
	}
	w := &localWire{s: s, h: s.h, ready: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		closeReq: make(chan struct{}), done: make(chan struct{})}
	w.remote.Store(&remote)
	s.localMu.Lock()
	if s.localStop {
		s.localMu.Unlock()
		return nil, ErrLocalClosed
	}
	s.localConns.Add(1)
	w.ss = s.h.open(w, nil, s.localStats, certCN)
	w.ss.local = true
	s.localSet[w] = struct{}{}
	s.localWG.Add(1)
	s.localMu.Unlock()
	go w.drive()
	return &LocalConn{w}, nil
}

// Send appends frames (whole request frames) to the connection and runs a
// batch on the caller's goroutine: what can be answered at once is in the
// output when Send returns. Requests a holding gate leaves unread are read
// by a later batch. ErrLocalClosed means the connection was closed before
// the frames were appended: none of them was executed. Once appended, a
// request is answered, or the connection closes without its answer (Done):
// then it was not executed — it was left unread, or came after an E 5 —
// or, on a node that commits before answering, its change may commit or
// not (PROTOCOL.md §6.4: the client reports Indeterminate).
func (c *LocalConn) Send(frames []byte) error {
	w := c.w
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrLocalClosed
	}
	w.in = append(w.in, frames...)
	w.mu.Unlock()
	w.run.Lock()
	if !w.ss.gone && w.h.traffic(w.ss) == gnet.Close {
		w.closeLocked()
	}
	w.run.Unlock()
	return nil
}

// Ready is signalled (it has room for one signal) whenever answers were
// added to the output, and when the connection closed.
func (c *LocalConn) Ready() <-chan struct{} { return c.w.ready }

// Take appends the answers not taken yet to dst and returns it: from then
// on they are delivered (PROTOCOL.md §4), and a grant among them is the
// caller's to hand on or to release. After the close it returns what was
// left, less the grants, which the close released.
func (c *LocalConn) Take(dst []byte) []byte {
	w := c.w
	w.mu.Lock()
	if !w.closed || w.final {
		dst = append(dst, w.out...)
		w.out = w.out[:0]
	}
	w.mu.Unlock()
	return dst
}

// Done is closed once the connection is closed and its close has run
// (queued acquires withdrawn, watches ended, grants not taken released).
// The answers left then are still taken with Take.
func (c *LocalConn) Done() <-chan struct{} { return c.w.done }

// Close closes the connection and waits for its close: its queued acquires
// leave their queues, its watches end without an L, and the grants it has
// not taken are released.
func (c *LocalConn) Close() {
	_ = c.w.Close()
	<-c.w.done
}

// SetRemote changes the peer named in the connection's log lines (a pooled
// connection serves one HTTP client after another).
func (c *LocalConn) SetRemote(remote string) { c.w.remote.Store(&remote) }

// drive runs the batches that Wake asks for, and the close, until the
// connection is closed.
func (w *localWire) drive() {
	defer w.s.localWG.Done()
	for {
		select {
		case <-w.wake:
			w.run.Lock()
			if !w.ss.gone && w.h.traffic(w.ss) == gnet.Close {
				w.closeLocked()
			}
			gone := w.ss.gone
			w.run.Unlock()
			if gone {
				return
			}
		case <-w.closeReq:
			w.run.Lock()
			w.closeLocked()
			w.run.Unlock()
			return
		}
	}
}

// closeLocked runs the connection's close once (w.run held): the session's
// close (closeBegin, closeEnd: what was not taken is undelivered), then
// the output is cut down to the answers that are not grants.
func (w *localWire) closeLocked() {
	if w.ss.gone {
		return
	}
	w.mu.Lock()
	w.closed = true // out is frozen: OutboundBuffered is final
	w.mu.Unlock()
	mail := w.h.closeBegin(w.ss)
	w.h.closeEnd(w.ss, &mail)
	w.mu.Lock()
	w.out = dropGrants(w.out)
	w.final = true
	w.in = nil
	w.mu.Unlock()
	s := w.s
	s.localMu.Lock()
	delete(s.localSet, w)
	s.localMu.Unlock()
	w.closeOnce.Do(func() { close(w.closeReq) })
	close(w.done)
	w.signal()
}

// dropGrants removes the A (acquired) frames from out, a run of whole
// answer frames: the close released them.
func dropGrants(out []byte) []byte {
	var r proto.Response
	kept := out[:0]
	for len(out) > 0 {
		n, err := proto.ParseResponse(out, &r)
		if err != nil {
			break // cannot happen: the engine wrote whole frames
		}
		if r.Op != proto.OpAcquire {
			kept = append(kept, out[:n]...) // kept never overtakes out
		}
		out = out[n:]
	}
	return kept
}

func (w *localWire) signal() {
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// Peek returns the requests not read yet (the batch only).
func (w *localWire) Peek(int) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.r > 0 {
		// No batch holds a slice of in now (this is the batch): move the
		// unread part to the front.
		w.in = w.in[:copy(w.in, w.in[w.r:])]
		w.r = 0
	}
	return w.in[:len(w.in):len(w.in)], nil
}

// Discard consumes n bytes of them.
func (w *localWire) Discard(n int) (int, error) {
	w.mu.Lock()
	w.r += n
	w.mu.Unlock()
	return n, nil
}

// Write appends answers to the output: the front takes them (Take).
func (w *localWire) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.out = append(w.out, b...)
	w.mu.Unlock()
	w.signal()
	return len(b), nil
}

// OutboundBuffered is the answers the front has not taken.
func (w *localWire) OutboundBuffered() int {
	w.mu.Lock()
	n := len(w.out)
	w.mu.Unlock()
	return n
}

// Wake makes the driver run a batch soon: safe from any goroutine.
func (w *localWire) Wake(gnet.AsyncCallback) error {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

// Close asks the driver to run the close: safe from any goroutine, more
// than once, and it does not wait.
func (w *localWire) Close() error {
	w.closeOnce.Do(func() { close(w.closeReq) })
	return nil
}

// RemoteAddr names the peer for logs.
func (w *localWire) RemoteAddr() net.Addr { return localAddr(*w.remote.Load()) }

// stopLocal closes every local connection, refuses new ones, and waits
// until each has run its close.
func (s *Server) stopLocal() {
	s.localMu.Lock()
	s.localStop = true
	for w := range s.localSet {
		_ = w.Close()
	}
	s.localMu.Unlock()
	s.localWG.Wait()
}
