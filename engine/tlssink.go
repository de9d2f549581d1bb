package engine

import (
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The write side of a TLS connection (tlsconn.go has the reader).
//
// Writes never block: tls.Conn writes its records into the sink below it
// (tlsSink.write, through sinkConn), which hands each record to the
// socket with one non-blocking write — as gnet's Write does — and keeps
// what the kernel did not take for a flusher goroutine, started only
// then, that waits for the socket to drain. So a batch holds the barrier
// and shard locks only for CPU work, whatever the client reads. Dynamic
// record sizing is off and tlsConn.Write cuts the answers into pieces of
// at most one record, so each record holds a known range of the
// plaintext stream, and OutboundBuffered counts the plaintext whose
// records have not wholly reached the kernel: a frame counts as handed to
// the socket once every record holding it has (PROTOCOL.md §4), exactly
// as the plaintext path counts bytes.

const (
	// tlsRecord is the most plaintext one TLS record carries, and so the
	// most one tls.Conn.Write is given (one record each).
	tlsRecord = 16 << 10
	// tlsKeepOut is the capacity the outbound buffers keep once empty.
	tlsKeepOut = 64 << 10
)

// tlsSink is where tls.Conn's records go. The reader writes into it (its
// batches' answers, the handshake, an alert or key update a Read sends);
// its flusher, running only while the kernel does not take the records,
// writes them out. Both touch its buffers and counters under mu, a leaf
// lock.
type tlsSink struct {
	raw  *net.TCPConn
	rc   syscall.RawConn
	conn io.Closer // the connection, closed when a write fails (the reader then runs the close)

	// The reader's, for the non-blocking write.
	pending int // plaintext bytes of the record tls.Conn.Write is making
	tryBuf  []byte
	tryN    int
	tryErr  error
	tryFn   func(uintptr) bool

	// Shared by the reader and the flusher.
	mu         sync.Mutex
	cbuf, wbuf []byte   // ciphertext the kernel has not taken; wbuf is the flusher's
	recs       []tlsRec // the records in wbuf and cbuf, in stream order
	plainIn    uint64   // plaintext handed to tls.Conn.Write
	plainOut   uint64   // plaintext whose records all reached the kernel
	cipherIn   uint64   // ciphertext the sink was given
	cipherOut  uint64   // ciphertext the kernel took
	flushing   bool     // the flusher runs (cbuf or wbuf holds bytes)
	flushDone  chan struct{}
	werr       error // the socket failed: nothing more reaches it
}

// tlsRec is a record that had not wholly reached the kernel when it was
// written: the plaintext and ciphertext stream offsets just past it.
type tlsRec struct{ plainEnd, cipherEnd uint64 }

// init readies k to write to raw (rc is raw's) and to close conn when a
// write fails.
func (k *tlsSink) init(raw *net.TCPConn, rc syscall.RawConn, conn io.Closer) {
	k.raw, k.rc, k.conn = raw, rc, conn
	k.tryFn = k.tryOnce
}

// Write hands b to tls.Conn in pieces of at most one record each (the
// reader only); it never blocks (see tlsSink.write).
func (t *tlsConn) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		m := min(len(b), tlsRecord)
		t.sink.pending = m
		if _, err := t.tc.Write(b[:m]); err != nil {
			t.sink.pending = 0
			t.sink.fail(err)
			return n - len(b), err
		}
		b = b[m:]
	}
	return n, nil
}

// OutboundBuffered is the plaintext written whose records have not all
// reached the kernel.
func (t *tlsConn) OutboundBuffered() int { return t.sink.buffered() }

// write takes one record from tls.Conn (the reader only: its Write, the
// handshake, an alert or key update a Read sends). With nothing queued it
// tries one non-blocking write; what the kernel does not take is queued
// for the flusher.
func (k *tlsSink) write(p []byte) (int, error) {
	plain := uint64(k.pending)
	k.pending = 0
	all := len(p)
	k.mu.Lock()
	k.plainIn += plain
	k.cipherIn += uint64(all)
	if k.werr != nil {
		k.mu.Unlock()
		return all, nil // the socket failed: nothing more reaches it
	}
	if !k.flushing {
		// Nothing queued, and only this goroutine starts the flusher.
		k.mu.Unlock()
		n, err := k.try(p)
		k.mu.Lock()
		k.cipherOut += uint64(n)
		if err != nil {
			k.werr = err
			k.mu.Unlock()
			return all, nil
		}
		if n == all {
			k.plainOut += plain
			k.mu.Unlock()
			return all, nil
		}
		p = p[n:]
	}
	k.cbuf = append(k.cbuf, p...)
	k.recs = append(k.recs, tlsRec{plainEnd: k.plainIn, cipherEnd: k.cipherIn})
	if !k.flushing {
		k.flushing = true
		k.flushDone = make(chan struct{})
		go k.flush(k.flushDone)
	}
	k.mu.Unlock()
	return all, nil
}

// try writes p with one non-blocking write: what the kernel took, and an
// error if the socket failed (a full socket is not one).
func (k *tlsSink) try(p []byte) (int, error) {
	k.tryBuf = p
	err := k.rc.Write(k.tryFn)
	n, werr := k.tryN, k.tryErr
	k.tryBuf, k.tryErr = nil, nil
	if err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN || werr == unix.EINTR {
		return max(n, 0), nil
	}
	return max(n, 0), werr
}

func (k *tlsSink) tryOnce(fd uintptr) bool {
	k.tryN, k.tryErr = unix.Write(int(fd), k.tryBuf)
	return true // never wait: the flusher does
}

// flush writes the queued ciphertext until none is left, blocking on the
// socket (its own goroutine, started by write). A failed write closes the
// connection.
func (k *tlsSink) flush(done chan struct{}) {
	defer close(done)
	for {
		k.mu.Lock()
		if len(k.cbuf) == 0 || k.werr != nil {
			k.flushing = false
			if cap(k.cbuf) > tlsKeepOut {
				k.cbuf = nil
			}
			if cap(k.wbuf) > tlsKeepOut {
				k.wbuf = nil
			}
			k.mu.Unlock()
			return
		}
		k.cbuf, k.wbuf = k.wbuf[:0], k.cbuf
		buf := k.wbuf
		k.mu.Unlock()
		n, err := k.raw.Write(buf)
		k.mu.Lock()
		k.cipherOut += uint64(n)
		i := 0
		for i < len(k.recs) && k.recs[i].cipherEnd <= k.cipherOut {
			k.plainOut = k.recs[i].plainEnd
			i++
		}
		k.recs = k.recs[:copy(k.recs, k.recs[i:])]
		if err != nil {
			k.werr = err
		}
		k.mu.Unlock()
		if err != nil {
			_ = k.conn.Close()
		}
	}
}

// fail records a write error: the reader closes after its batch.
func (k *tlsSink) fail(err error) {
	k.mu.Lock()
	if k.werr == nil {
		k.werr = err
	}
	k.mu.Unlock()
}

// failed reports whether the socket failed.
func (k *tlsSink) failed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.werr != nil
}

// buffered is the plaintext written whose records have not all reached
// the kernel.
func (k *tlsSink) buffered() int {
	k.mu.Lock()
	n := k.plainIn - k.plainOut
	k.mu.Unlock()
	return int(n)
}

// wait waits for the flusher, if it runs, to end (the reader only, once
// the socket is closed): buffered is final once it returns.
func (k *tlsSink) wait() {
	k.mu.Lock()
	done, running := k.flushDone, k.flushing
	k.mu.Unlock()
	if running {
		<-done
	}
}
