package engine

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/proto"
)

// The TLS port (PROTOCOL.md §8.1; docs/DESIGN.md "TLS").
//
// gnet has no TLS, so a TLS connection is not enrolled in the event loops:
// it runs on a goroutine of its own, the reader, which does the handshake
// and then, for as long as the connection lives, reads with crypto/tls
// into a plaintext buffer and runs the very batches of the gnet path
// (handler.traffic: the mailbox, parse → table → answer, the delivery
// tracking, held commits, the gate, draining, --max-outbound,
// --max-pending-grants, --frame-timeout) on a session whose wire is the
// *tlsConn. The reader owns the session's loop-owned fields as an event
// loop owns its connections', and runs the close. A batch takes every
// record that came with the socket read (gather), as a gnet batch takes
// everything one read brought.
//
// Writes never block: tls.Conn writes its records into the sink below it,
// which hands them to the socket without waiting and leaves the waiting
// to a flusher goroutine of its own (tlssink.go).
//
// A Wake (mail, a commit, a gate change) sets a read deadline in the past:
// the reader's Read returns at once with a timeout, which crypto/tls
// treats as temporary (the record being read stays buffered), and the
// reader runs a batch. Close closes the socket: the reader's Read fails,
// the flusher's write fails, and the reader runs the close once the
// flusher has counted its last bytes.

// tlsInbound is the reader's plaintext buffer: a few largest frames.
const tlsInbound = 4 << 10

// tlsConn is one connection of the TLS port: the wire of its session.
type tlsConn struct {
	s   *Server
	h   *handler
	raw *net.TCPConn
	tc  *tls.Conn
	ss  *session // once the handshake is done (the reader's)

	// The reader's: the plaintext read and not yet consumed, in[r:w].
	in   []byte
	r, w int
	// The reader's: where the raw stream stands in its TLS records
	// (sinkConn.Read), so that a record that stays incomplete counts as a
	// partial frame for --frame-timeout.
	hdr      [5]byte
	hdrN     int   // header bytes of the current record seen (5: in its body)
	recLeft  int   // body bytes of the current record still to come
	recSince int64 // table clock when its first byte was read
	nonblock bool  // gather: sinkConn.Read does not read the socket

	woken    atomic.Bool   // a wake's read deadline is set or about to be
	wakeCh   chan struct{} // a wake, for a reader not reading (buffer full)
	closed   chan struct{} // closed by Close
	shutOnce sync.Once

	sink tlsSink // the write side (tlssink.go)
}

// sinkConn is the net.Conn under tls.Conn: reads come from the socket
// (noting record boundaries), writes go to the sink.
type sinkConn struct {
	*net.TCPConn
	t *tlsConn
}

func (c sinkConn) Read(b []byte) (int, error) {
	if c.t.nonblock {
		return 0, errWouldBlock // gather: only what crypto/tls holds already
	}
	n, err := c.TCPConn.Read(b)
	if n > 0 {
		c.t.track(b[:n])
	}
	return n, err
}

func (c sinkConn) Write(b []byte) (int, error) { return c.t.sink.write(b) }

// startTLS takes a new connection of the TLS port (counted in s.conns by
// the accept loop) and starts its reader; false means the engine is
// stopping and the caller closes it.
func (s *Server) startTLS(c net.Conn, h *handler) bool {
	raw, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := raw.SyscallConn()
	if err != nil {
		return false
	}
	t := &tlsConn{s: s, h: h, raw: raw, wakeCh: make(chan struct{}, 1), closed: make(chan struct{})}
	t.sink.init(raw, rc, t)
	t.tc = tls.Server(sinkConn{raw, t}, s.tlsConf)
	s.tlsMu.Lock()
	if s.tlsStop {
		s.tlsMu.Unlock()
		return false
	}
	s.tlsSet[t] = struct{}{}
	s.tlsWG.Add(1)
	s.tlsMu.Unlock()
	go t.serve()
	return true
}

// stopTLS closes every TLS connection, refuses new ones, and waits until
// each has run its close (releasing the grants that never reached it).
func (s *Server) stopTLS() {
	s.tlsMu.Lock()
	s.tlsStop = true
	for t := range s.tlsSet {
		_ = t.Close()
	}
	s.tlsMu.Unlock()
	s.tlsWG.Wait()
}

// serve is the reader: the handshake, the batches, the close.
func (t *tlsConn) serve() {
	s, h := t.s, t.h
	defer func() {
		s.tlsMu.Lock()
		delete(s.tlsSet, t)
		s.tlsMu.Unlock()
		s.tlsWG.Done()
	}()
	// A handshake must finish within --frame-timeout, like a frame; until
	// then the connection holds its place under --max-conns, a goroutine
	// and crypto/tls's buffers (about one record).
	_ = t.raw.SetDeadline(time.Now().Add(s.cfg.FrameTimeout))
	err := t.tc.Handshake()
	if err == nil && s.draining.Load() {
		err = errDrainingHandshake
	}
	if err != nil {
		closing := t.isClosed() // the engine stopping, not the client failing
		if !closing {
			t.answerPlaintext(err)
		}
		t.shut()
		s.conns.Add(-1)
		if err != errDrainingHandshake && !closing {
			h.handshakeFailed(err, t.raw.RemoteAddr())
		}
		return
	}
	_ = t.raw.SetDeadline(time.Time{})
	s.tlsHandshakes.Add(1)
	cn := ""
	if st := t.tc.ConnectionState(); len(st.VerifiedChains) > 0 {
		cn = st.PeerCertificates[0].Subject.CommonName
	}
	t.in = make([]byte, tlsInbound)
	ss := h.open(t, nil, s.tlsStats, cn)
	t.ss = ss
	t.run(ss)
	t.shut()
	mail := h.closeBegin(ss)
	h.closeEnd(ss, &mail)
}

var errDrainingHandshake = errors.New("engine: shutting down")

// PlaintextOnTLS is the message of the E 1 that the TLS port sends a
// client whose first bytes are not TLS (answerPlaintext).
const PlaintextOnTLS = "this port speaks TLS only: connect with TLS"

// plaintextLinger bounds how long a plaintext client's connection is
// read after its E 1, so that the close does not reset the connection
// before the client has read the E 1.
const plaintextLinger = 250 * time.Millisecond

// answerPlaintext answers a client that is not speaking TLS at all (its
// first record is no TLS record; crypto/tls gives up without a word) in
// its own language: one plaintext E 1 whose message says the port speaks
// TLS, so a lockd client can name the cause instead of seeing a silent
// close. Then it stops writing and reads what the client still sends, for
// up to plaintextLinger, before the caller closes: a close with unread
// input resets the connection, which may discard the E 1 at the client.
// Anything else that fails a handshake gets crypto/tls's alert alone.
func (t *tlsConn) answerPlaintext(err error) {
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) || rhe.Conn == nil {
		return
	}
	_ = t.raw.SetDeadline(time.Now().Add(plaintextLinger))
	if _, err := t.raw.Write(proto.AppendError(nil, proto.Op(rhe.RecordHeader[0]), 0, proto.CodeBadFrame, PlaintextOnTLS)); err != nil {
		return
	}
	_ = t.raw.CloseWrite()
	_, _ = io.Copy(io.Discard, t.raw)
}

// run reads and runs batches until the connection ends.
func (t *tlsConn) run(ss *session) {
	h := t.h
	if t.hdrN > 0 {
		// The handshake's last read brought the start of a record.
		h.partialFrame(ss, t.recSince, false)
	}
	for {
		var (
			err error
			got int // plaintext bytes read this round
		)
		if t.w < len(t.in) {
			got, err = t.tc.Read(t.in[t.w:])
			t.w += got
			if err == nil {
				// What came with the same socket read: one batch, one write.
				var more int
				more, err = t.gather()
				got += more
			}
		} else {
			// The buffer is full of requests the gate holds (Hold): read
			// no more until the wake of the gate's next change.
			select {
			case <-t.wakeCh:
			case <-t.closed:
				return
			}
		}
		timedOut := err != nil && errors.Is(err, os.ErrDeadlineExceeded)
		fatal := err != nil && !timedOut // EOF, a reset, a bad record
		if (fatal && got == 0) || t.isClosed() {
			return
		}
		if timedOut || t.woken.Load() {
			// Clear the deadline first, then the flag: a Wake that finds the
			// flag still set relies on this batch, which follows, to read its
			// mail; one that finds it clear sets a new deadline.
			_ = t.raw.SetReadDeadline(time.Time{})
			t.woken.Store(false)
		}
		if h.traffic(ss) == gnet.Close || t.sink.failed() || fatal {
			return // requests read before an EOF were answered first
		}
		if t.hdrN > 0 {
			// A record still incomplete is a partial frame too.
			h.partialFrame(ss, t.recSince, false)
		}
		if t.r == t.w {
			t.r, t.w = 0, 0
		} else if t.r > 0 {
			t.w = copy(t.in, t.in[t.r:t.w])
			t.r = 0
		}
	}
}

// gather reads, without blocking, the plaintext of the records crypto/tls
// already holds (they came with the socket read that brought the first):
// in non-blocking mode sinkConn.Read answers errWouldBlock at once instead
// of reading the socket, so crypto/tls stops at the first record it does
// not hold whole. It returns the bytes added and an error other than that.
func (t *tlsConn) gather() (int, error) {
	t.nonblock = true
	defer func() { t.nonblock = false }()
	total := 0
	for t.w < len(t.in) {
		n, err := t.tc.Read(t.in[t.w:])
		t.w += n
		total += n
		if err == errWouldBlock {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// errWouldBlock is sinkConn.Read's answer in non-blocking mode: a
// temporary net.Error, which crypto/tls does not make sticky.
var errWouldBlock error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "engine: no more buffered TLS records" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

// track follows the raw inbound stream through its records' headers (the
// reader, inside tls.Conn.Read). While a record is incomplete its first
// byte's time is kept, and a session reading it is listed for the
// --frame-timeout sweep (tls.Conn.Read does not return until the record is
// whole).
func (t *tlsConn) track(b []byte) {
	for len(b) > 0 {
		if t.hdrN == 0 {
			t.recSince = t.s.now()
		}
		if t.hdrN < len(t.hdr) {
			k := copy(t.hdr[t.hdrN:], b)
			t.hdrN += k
			b = b[k:]
			if t.hdrN == len(t.hdr) {
				t.recLeft = int(t.hdr[3])<<8 | int(t.hdr[4])
				if t.recLeft == 0 {
					t.hdrN = 0
				}
			}
			continue
		}
		k := min(len(b), t.recLeft)
		t.recLeft -= k
		b = b[k:]
		if t.recLeft == 0 {
			t.hdrN = 0
		}
	}
	if t.hdrN > 0 && t.ss != nil {
		t.h.partialFrame(t.ss, t.recSince, false)
	}
}

// Peek returns the plaintext not yet consumed (the reader only).
func (t *tlsConn) Peek(int) ([]byte, error) { return t.in[t.r:t.w], nil }

// Discard consumes n bytes of it.
func (t *tlsConn) Discard(n int) (int, error) {
	t.r += n
	return n, nil
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// Wake makes the reader run a batch soon: safe from any goroutine.
func (t *tlsConn) Wake(gnet.AsyncCallback) error {
	if t.woken.Swap(true) {
		return nil // a wake is on its way and its batch has not begun
	}
	err := t.raw.SetReadDeadline(aLongTimeAgo)
	select {
	case t.wakeCh <- struct{}{}:
	default:
	}
	return err
}

// Close closes the socket: safe from any goroutine, more than once. The
// reader then runs the close.
func (t *tlsConn) Close() error {
	t.shutOnce.Do(func() {
		close(t.closed)
		_ = t.raw.Close()
	})
	return nil
}

// isClosed reports whether Close was called.
func (t *tlsConn) isClosed() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// shut closes the socket and waits for the flusher (the reader only):
// OutboundBuffered is final once it returns.
func (t *tlsConn) shut() {
	_ = t.Close()
	t.sink.wait()
}

// RemoteAddr is the client's address.
func (t *tlsConn) RemoteAddr() net.Addr { return t.raw.RemoteAddr() }

// handshakeFailed counts a failed handshake and logs it, rate-limited.
func (h *handler) handshakeFailed(err error, remote net.Addr) {
	h.s.tlsFailures.Add(1)
	msg := err.Error() + " (from " + remote.String() + ")"
	h.hsLast.Store(&msg)
	if held, ok := h.hsLog.Allow(h.s.now()); ok {
		h.logHandshakes(held + 1)
	}
}

// logHandshakes logs n failed handshakes and the last one's cause (one
// line a second at most: handshakeFailed, and the sweep for the tail of a
// flood).
func (h *handler) logHandshakes(n int) {
	why := ""
	if p := h.hsLast.Load(); p != nil {
		why = *p
	}
	h.s.log.Warn("TLS handshakes failed; connections closed", "failed", n, "last", why)
}
