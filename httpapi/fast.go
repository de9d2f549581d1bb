package httpapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The fast lane. net/http spends more on a small keep-alive request than
// the front and the engine together: a Request parsed with every header,
// a background read started (a goroutine, a read that finds nothing) and
// aborted (two deadline changes) per request, a header map cloned per
// answer. The fast lane reads a plaintext HTTP/1.1 connection itself, and
// serves the requests it recognizes completely — POST to the five
// request routes with a Content-Length body and a plain header — through
// the same handler (Front.ServeHTTP). The first request it does not
// recognize (any other method or route, Transfer-Encoding, Expect, a
// header it cannot vouch for, a header over fastBufSize) hands the
// connection, with every byte read and not yet served, to net/http,
// which serves it from then on. So every request the fast lane does not
// take is parsed, limited and answered by net/http exactly as without
// it, and TLS connections go to net/http unread.
//
// What a request on the fast lane differs in: its Request carries only
// the headers the handler reads (Authorization for credsOf and forward,
// Lockd-Forwarded for moved); its context learns that
// the client went away only once the handler waits (Done is called: a
// long-poll, a retry's sleep), by a read started then — net/http starts
// that read for every request; and deadlines the handler sets are
// applied lazily, up to a second later than asked (see fastWriter).

// fastBufSize is a fast connection's read buffer: a request's header
// must fit in it (larger ones go to net/http, which allows
// MaxHeaderBytes); the body may be longer and is read on demand.
const fastBufSize = 4 << 10

// fastRoutes are the URLs of the routes the fast lane serves (POST).
var fastRoutes = func() map[string]*url.URL {
	m := map[string]*url.URL{}
	for _, p := range []string{"/v1/acquire", "/v1/release", "/v1/renew", "/v1/validate", "/v1/inspect"} {
		m[p] = &url.URL{Path: p}
	}
	return m
}()

// Endpoint serves a Front on listeners: the fast lane for the requests it
// recognizes, net/http (Front.Server) for everything else. Serve,
// Shutdown and Close are those of http.Server.
type Endpoint struct {
	f  *Front
	hs *http.Server
	hl *handoffListener

	startOnce sync.Once
	shutting  atomic.Bool

	// servedGone counts the requests served on fast connections that
	// ended (servedCount adds the live ones'), handedOff the connections
	// given to net/http (for tests).
	servedGone, handedOff atomic.Uint64

	mu    sync.Mutex
	lns   map[net.Listener]struct{}
	conns map[*fastConn]struct{}
}

// Endpoint returns an Endpoint for f (one per listener set; its
// http.Server is a new Front.Server).
func (f *Front) Endpoint() *Endpoint {
	e := &Endpoint{f: f, hs: f.Server(), lns: map[net.Listener]struct{}{}, conns: map[*fastConn]struct{}{}}
	e.hl = &handoffListener{ch: make(chan net.Conn), done: make(chan struct{})}
	return e
}

// Serve accepts connections on ln until it is closed or the endpoint
// shuts down (http.ErrServerClosed). A plaintext connection starts on
// the fast lane; a TLS one (ln is a tls.Listener) goes to net/http.
func (e *Endpoint) Serve(ln net.Listener) error {
	e.mu.Lock()
	if e.shutting.Load() {
		e.mu.Unlock()
		return http.ErrServerClosed
	}
	e.lns[ln] = struct{}{}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.lns, ln)
		e.mu.Unlock()
	}()
	e.startOnce.Do(func() {
		e.hl.addr = ln.Addr()
		go func() { _ = e.hs.Serve(e.hl) }()
	})
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if e.shutting.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() { // as net/http: back off and go on (EMFILE and the like)
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if _, isTLS := c.(*tls.Conn); isTLS {
			e.hl.push(c)
			continue
		}
		fc := &fastConn{e: e, c: c, remote: c.RemoteAddr().String(), buf: make([]byte, fastBufSize)}
		e.mu.Lock()
		if e.shutting.Load() {
			e.mu.Unlock()
			c.Close()
			return http.ErrServerClosed
		}
		e.conns[fc] = struct{}{}
		e.mu.Unlock()
		go fc.serve()
	}
}

// Shutdown stops accepting, closes idle connections and waits, until ctx
// ends, for the requests in flight to be answered (each connection then
// closes); as http.Server.Shutdown.
func (e *Endpoint) Shutdown(ctx context.Context) error {
	e.closeListeners()
	hsDone := make(chan error, 1)
	go func() { hsDone <- e.hs.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		e.mu.Lock()
		for fc := range e.conns {
			if fc.idle.Load() {
				fc.c.Close()
			}
		}
		n := len(e.conns)
		e.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			<-hsDone
			return ctx.Err()
		case <-tick.C:
		}
	}
	return <-hsDone
}

// Close closes the listeners and every connection at once.
func (e *Endpoint) Close() error {
	e.closeListeners()
	err := e.hs.Close()
	e.mu.Lock()
	for fc := range e.conns {
		fc.c.Close()
	}
	e.mu.Unlock()
	return err
}

func (e *Endpoint) closeListeners() {
	e.mu.Lock()
	e.shutting.Store(true)
	for ln := range e.lns {
		ln.Close()
	}
	e.mu.Unlock()
	// net/http's Serve may not have started (no Serve call): close the
	// hand-off listener here too.
	e.hl.Close()
}

func (e *Endpoint) forget(fc *fastConn) {
	e.mu.Lock()
	delete(e.conns, fc)
	e.servedGone.Add(fc.served.Load())
	e.mu.Unlock()
}

// servedCount is the number of requests the fast lane served. Each
// connection counts its own: no write shared between connections per
// request.
func (e *Endpoint) servedCount() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.servedGone.Load()
	for fc := range e.conns {
		n += fc.served.Load()
	}
	return n
}

// handoffListener is the listener net/http serves: the connections the
// fast lane hands over.
type handoffListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

// push gives c to net/http (closes it when net/http has stopped).
func (l *handoffListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// replayConn is a connection handed to net/http with the bytes the fast
// lane read and did not serve: they are read first.
type replayConn struct {
	net.Conn
	pre []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// fastConn is one plaintext connection on the fast lane.
type fastConn struct {
	e      *Endpoint
	c      net.Conn
	remote string
	buf    []byte // read buffer: buf[start:end] is read and not yet served
	start  int
	end    int
	idle   atomic.Bool // waiting for a request's first byte
	served atomic.Uint64

	// rdl and wdl are the read and write deadlines last set (zero: none).
	rdl, wdl time.Time

	w   fastWriter
	hdr http.Header // the request's, reused (cleared per request)

	// The watcher: a read started by a request's context once the
	// handler waits, which tells that the client went away.
	wmu       sync.Mutex
	watching  bool
	aborting  bool
	gotByte   bool
	oneByte   [1]byte
	watchErr  error
	watchDone chan struct{}
}

// serve reads and serves requests until the connection ends or is handed
// to net/http.
func (fc *fastConn) serve() {
	handedOff := false
	defer func() {
		fc.e.forget(fc)
		if !handedOff {
			fc.c.Close()
		}
	}()
	fc.hdr = http.Header{}
	fc.w.fc = fc
	for {
		hdrLen, st := fc.readHeader()
		if st == headerEnded {
			return
		}
		var rq fastRequest
		fast := st == headerRead
		if fast {
			rq, fast = parseFast(fc.buf[fc.start : fc.start+hdrLen])
		}
		if !fast {
			fc.handOff()
			handedOff = true
			return
		}
		if !fc.serveOne(hdrLen, &rq) || fc.e.shutting.Load() {
			return
		}
	}
}

// handOff gives the connection and what was read of it to net/http.
func (fc *fastConn) handOff() {
	pre := slices.Clone(fc.buf[fc.start:fc.end])
	// net/http sets its own deadlines; clear ours.
	_ = fc.c.SetDeadline(time.Time{})
	fc.e.handedOff.Add(1)
	fc.e.hl.push(&replayConn{Conn: fc.c, pre: pre})
}

// How readHeader ended.
const (
	headerRead       = iota // buf[start:start+n] is a whole header
	headerEnded             // the connection ended (idle or header timeout, EOF, shutting down)
	headerForNetHTTP        // the header does not fit in the buffer, or its lines end in a bare LF
)

// readHeader reads until buf[start:] holds a whole header.
func (fc *fastConn) readHeader() (int, int) {
	for {
		if i := bytes.Index(fc.buf[fc.start:fc.end], crlfcrlf); i >= 0 {
			return i + 4, headerRead
		}
		if fc.end-fc.start == len(fc.buf) || bytes.Contains(fc.buf[fc.start:fc.end], lflf) {
			// Over fastBufSize, or lines ended by a bare LF (which
			// net/http accepts): net/http reads it.
			return 0, headerForNetHTTP
		}
		if fc.end == len(fc.buf) || fc.start == fc.end {
			fc.end = copy(fc.buf, fc.buf[fc.start:fc.end])
			fc.start = 0
		}
		now := time.Now()
		if fc.start == fc.end {
			// Idle between requests: IdleTimeout (set again only when
			// more than a second of it is spent).
			if fc.rdl.IsZero() || fc.rdl.Sub(now) < IdleTimeout {
				fc.setReadDeadline(now.Add(IdleTimeout + time.Second))
			}
			// Shutdown sets shutting, then closes the idle connections:
			// one of the two sees the other (no lock per request).
			fc.idle.Store(true)
			if fc.e.shutting.Load() {
				return 0, headerEnded
			}
		} else if fc.rdl.IsZero() || fc.rdl.Sub(now) > HeaderTimeout {
			// A header begun: the rest within HeaderTimeout (closed
			// without an answer after it, as net/http does).
			fc.setReadDeadline(now.Add(HeaderTimeout))
		}
		n, err := fc.c.Read(fc.buf[fc.end:])
		fc.idle.Store(false)
		fc.end += n
		if err != nil {
			return 0, headerEnded
		}
	}
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

func (fc *fastConn) setReadDeadline(t time.Time) {
	fc.rdl = t
	_ = fc.c.SetReadDeadline(t)
}

// fastRequest is what parseFast takes from a header.
type fastRequest struct {
	url           *url.URL
	contentLength int64
	host          string
	auth          []byte // Authorization, or nil
	forwarded     []byte // Lockd-Forwarded, or nil
	close         bool   // Connection: close
}

// parseFast parses a header (request line to the blank line, included)
// that the fast lane serves: "POST <route> HTTP/1.1", one Host, one
// Content-Length of at most MaxBody, no Transfer-Encoding or Expect, and
// every line a well-formed field. Anything else is false: net/http judges
// it.
func parseFast(h []byte) (fastRequest, bool) {
	var rq fastRequest
	line, rest, _ := bytes.Cut(h, crlf)
	path, ok := bytes.CutPrefix(line, []byte("POST "))
	if !ok {
		return rq, false
	}
	if path, ok = bytes.CutSuffix(path, []byte(" HTTP/1.1")); !ok {
		return rq, false
	}
	if rq.url = fastRoutes[string(path)]; rq.url == nil {
		return rq, false
	}
	haveHost, haveLength := false, false
	for {
		line, rest, _ = bytes.Cut(rest, crlf)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return rq, false
		}
		name, value := line[:colon], trimOWS(line[colon+1:])
		for _, b := range name {
			if !isTokenByte(b) {
				return rq, false
			}
		}
		for _, b := range value {
			if b < ' ' && b != '\t' || b == 0x7f {
				return rq, false
			}
		}
		switch {
		case asciiEqualFold(name, "host"):
			if haveHost || !validHost(value) {
				return rq, false
			}
			haveHost, rq.host = true, string(value)
		case asciiEqualFold(name, "content-length"):
			if haveLength || len(value) == 0 || len(value) > 6 {
				return rq, false
			}
			for _, b := range value {
				if b < '0' || b > '9' {
					return rq, false
				}
				rq.contentLength = rq.contentLength*10 + int64(b-'0')
			}
			if rq.contentLength > MaxBody {
				return rq, false
			}
			haveLength = true
		case asciiEqualFold(name, "transfer-encoding"), asciiEqualFold(name, "expect"):
			return rq, false
		case asciiEqualFold(name, "connection"):
			rq.close = rq.close || hasCloseToken(value)
		case asciiEqualFold(name, "authorization"):
			if rq.auth != nil {
				return rq, false
			}
			rq.auth = value
		case asciiEqualFold(name, hdrForwarded):
			if rq.forwarded != nil {
				return rq, false
			}
			rq.forwarded = value
		}
	}
	return rq, haveHost && haveLength
}

var crlf = []byte("\r\n")

func trimOWS[T string | []byte](b T) T {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// isTokenByte reports whether b may be in a field name (RFC 9110 tchar).
func isTokenByte(b byte) bool {
	switch {
	case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		return true
	}
	return b < 0x80 && bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), b) >= 0
}

// validHost is a conservative Host: a name or address and a port (what
// net/http accepts beyond it, it judges itself).
func validHost(b []byte) bool {
	if len(b) == 0 || len(b) > 255 {
		return false
	}
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_':
		default:
			return false
		}
	}
	return true
}

// asciiEqualFold compares b with the ASCII s, ignoring ASCII case only
// (bytes.EqualFold would also fold U+017F to 's', which net/http does
// not).
func asciiEqualFold[T string | []byte](b T, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		t := s[i]
		if t >= 'A' && t <= 'Z' {
			t += 'a' - 'A'
		}
		if c != t {
			return false
		}
	}
	return true
}

// serveOne serves the request whose header is buf[start:start+hdrLen];
// false when the connection must close after it.
func (fc *fastConn) serveOne(hdrLen int, rq *fastRequest) bool {
	bodyAt := fc.start + hdrLen
	body := &fastBody{fc: fc}
	if have := int64(fc.end - bodyAt); have >= rq.contentLength {
		body.buffered = fc.buf[bodyAt : bodyAt+int(rq.contentLength)]
		body.whole = true
		fc.start = bodyAt + int(rq.contentLength)
	} else {
		body.buffered = fc.buf[bodyAt:fc.end]
		body.left = rq.contentLength - have
		fc.start, fc.end = 0, 0
	}
	clear(fc.hdr)
	if rq.auth != nil {
		fc.hdr["Authorization"] = []string{string(rq.auth)}
	}
	if rq.forwarded != nil {
		fc.hdr[hdrForwarded] = []string{string(rq.forwarded)}
	}
	ctx := &fastCtx{fc: fc}
	r := (&http.Request{
		Method:        http.MethodPost,
		URL:           rq.url,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        fc.hdr,
		Body:          body,
		ContentLength: rq.contentLength,
		Host:          rq.host,
		RemoteAddr:    fc.remote,
		RequestURI:    rq.url.Path,
		Close:         rq.close,
	}).WithContext(ctx)
	w := &fc.w
	w.reset(rq.close, body)
	fc.served.Add(1)
	fc.e.f.ServeHTTP(w, r)
	gone := ctx.finish()
	w.body = nil
	if gone {
		return false
	}
	if !w.wroteHeader {
		// As net/http: an answer the handler did not write is an empty 200.
		w.h["Content-Length"] = []string{"0"}
		w.WriteHeader(http.StatusOK)
	}
	if w.FlushError() != nil || w.closeAfter {
		return false
	}
	if !body.whole && (body.left > 0 || len(body.buffered) > 0) {
		// The body was not read to its end: what follows it cannot be
		// found without reading it; close (net/http would discard it).
		return false
	}
	return true
}

// fastBody is a request's body on the fast lane: what was read with the
// header, then (when the body is longer) reads from the connection.
type fastBody struct {
	fc       *fastConn
	buffered []byte
	whole    bool  // buffered is the whole body
	left     int64 // bytes still to read from the connection
}

// bytes returns the whole body when it was read with the header (the
// handler reads it without a copy; valid until the handler returns).
func (b *fastBody) bytes() ([]byte, bool) {
	if !b.whole {
		return nil, false
	}
	p := b.buffered
	b.buffered = nil
	return p, true
}

func (b *fastBody) Read(p []byte) (int, error) {
	if len(b.buffered) > 0 {
		n := copy(p, b.buffered)
		b.buffered = b.buffered[n:]
		if len(b.buffered) == 0 && b.left == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.fc.c.Read(p)
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *fastBody) Close() error { return nil }

func (b *fastBody) done() bool { return len(b.buffered) == 0 && b.left == 0 }

// fastCtx is a fast request's context: cancelled when the handler has
// returned, or — once the handler asked for Done — when a read shows that
// the client went away.
type fastCtx struct {
	fc   *fastConn
	mu   sync.Mutex
	done chan struct{} // made by the first Done (most requests never ask)
	err  error
	// watched: Done was called (and, when the body had been read and no
	// next request was already read, the watcher runs).
	watched, finished bool
}

func (x *fastCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (x *fastCtx) Value(any) any               { return nil }

func (x *fastCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

func (x *fastCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done == nil {
		x.done = make(chan struct{})
		if x.err != nil {
			close(x.done)
		}
	}
	if !x.watched && !x.finished {
		x.watched = true
		x.fc.watch(x)
	}
	return x.done
}

func (x *fastCtx) cancel(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err == nil {
		x.err = err
		if x.done != nil {
			close(x.done)
		}
	}
}

// finish ends the request's context and stops the watcher; true when the
// client went away.
func (x *fastCtx) finish() bool {
	x.mu.Lock()
	x.finished = true
	x.mu.Unlock()
	gone := x.fc.unwatch()
	x.cancel(context.Canceled)
	return gone
}

// watch starts reading the connection, to learn that the client went
// away while the handler waits: only once the body was read and nothing
// of a next request is buffered (that read would take its bytes; net/http
// does not watch then either).
func (fc *fastConn) watch(x *fastCtx) {
	if body, ok := fc.currentBody(); !ok || !body {
		return
	}
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.watching, fc.aborting, fc.gotByte, fc.watchErr = true, false, false, nil
	fc.watchDone = make(chan struct{})
	fc.rdl = time.Time{}
	_ = fc.c.SetReadDeadline(time.Time{})
	go func() {
		n, err := fc.c.Read(fc.oneByte[:])
		fc.wmu.Lock()
		if n == 1 {
			fc.gotByte = true
		} else if err != nil {
			var ne net.Error
			if !(fc.aborting && errors.As(err, &ne) && ne.Timeout()) {
				fc.watchErr = err
			}
		}
		gone := fc.watchErr != nil
		fc.watching = false
		close(fc.watchDone)
		fc.wmu.Unlock()
		if gone {
			x.cancel(context.Canceled)
		}
	}()
}

// currentBody reports whether the request being served has been read to
// its end and nothing after it is buffered (ok false: no request).
func (fc *fastConn) currentBody() (read bool, ok bool) {
	b, isFast := fc.w.body, fc.w.body != nil
	if !isFast {
		return false, false
	}
	return b.done() && fc.start == fc.end, true
}

// unwatch stops the watcher if it runs; true when it saw the client go.
func (fc *fastConn) unwatch() bool {
	fc.wmu.Lock()
	if !fc.watching {
		gone := fc.watchErr != nil
		got := fc.gotByte
		fc.gotByte, fc.watchErr = false, nil
		fc.wmu.Unlock()
		if got {
			fc.keepByte()
		}
		return gone
	}
	fc.aborting = true
	done := fc.watchDone
	fc.wmu.Unlock()
	_ = fc.c.SetReadDeadline(aLongTimeAgo)
	<-done
	fc.rdl = time.Time{}
	_ = fc.c.SetReadDeadline(time.Time{})
	fc.wmu.Lock()
	gone, got := fc.watchErr != nil, fc.gotByte
	fc.gotByte, fc.watchErr = false, nil
	fc.wmu.Unlock()
	if got {
		fc.keepByte()
	}
	return gone
}

// keepByte puts the byte the watcher read (the next request's first) in
// the buffer, which was empty (watch runs only then).
func (fc *fastConn) keepByte() {
	fc.buf[0] = fc.oneByte[0]
	fc.start, fc.end = 0, 1
}

var aLongTimeAgo = time.Unix(1, 0)

// fastWriter is a fast request's http.ResponseWriter. The answer is
// built in out and written by FlushError (the handler's Flush) or after
// the handler returns. Deadlines the handler sets are applied lazily: a
// write deadline already set within a second after the one asked is kept
// (one deadline change a second, not one per request), so a write may
// get up to a second more than WriteTimeout.
type fastWriter struct {
	fc          *fastConn
	h           http.Header
	body        *fastBody
	status      int
	wroteHeader bool
	reqClose    bool
	closeAfter  bool
	out         []byte
	err         error
}

func (w *fastWriter) reset(reqClose bool, body *fastBody) {
	w.body = body
	if w.h == nil {
		w.h = http.Header{}
	} else {
		clear(w.h)
	}
	w.status, w.wroteHeader, w.reqClose, w.closeAfter, w.err = 0, false, reqClose, false, nil
	if cap(w.out) > 64<<10 {
		w.out = nil // a large answer (an inspect of many holders) is not kept per connection
	}
	w.out = w.out[:0]
}

// Header returns the answer's header.
func (w *fastWriter) Header() http.Header { return w.h }

// WriteHeader writes the status line and header into the answer.
func (w *fastWriter) WriteHeader(status int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader, w.status = true, status
	if w.reqClose || w.fc.e.shutting.Load() || slices.ContainsFunc(w.h["Connection"], hasCloseToken[string]) {
		w.closeAfter = true
		w.h["Connection"] = hdrClose
	}
	if _, ok := w.h["Content-Length"]; !ok && bodyAllowed(status) {
		// Delimited by the end of the connection.
		w.closeAfter = true
		w.h["Connection"] = hdrClose
	}
	b := append(w.out, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(status)...)
	b = append(b, "\r\n"...)
	var keys [16]string
	ks := keys[:0]
	for k := range w.h {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		for _, v := range w.h[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendHeaderValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	if _, ok := w.h["Date"]; !ok {
		b = append(b, "Date: "...)
		b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	w.out = append(b, "\r\n"...)
}

var hdrClose = []string{"close"}

// hasCloseToken reports whether the comma-separated list v (a Connection
// header's value) holds the token "close", ASCII case-insensitively, as
// net/http reads it. It allocates nothing: Node's fetch sends Connection
// on every request.
func hasCloseToken[T string | []byte](v T) bool {
	for len(v) > 0 {
		i := 0
		for i < len(v) && v[i] != ',' {
			i++
		}
		if asciiEqualFold(trimOWS(v[:i]), "close") {
			return true
		}
		if i == len(v) {
			break
		}
		v = v[i+1:]
	}
	return false
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// appendHeaderValue appends v with CR and LF as spaces (as net/http
// does: a value cannot end the header).
func appendHeaderValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}

// Write adds p to the answer's body.
func (w *fastWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	w.out = append(w.out, p...)
	if len(w.out) > 64<<10 {
		if err := w.FlushError(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// FlushError writes what the answer holds to the connection.
func (w *fastWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if len(w.out) == 0 {
		return nil
	}
	fc := w.fc
	if fc.wdl.IsZero() {
		// No deadline asked by the handler: WriteTimeout.
		w.SetWriteDeadline(time.Now().Add(WriteTimeout)) //nolint:errcheck // never fails
	}
	_, err := fc.c.Write(w.out)
	w.out = w.out[:0]
	if err != nil {
		w.err = err
	}
	return err
}

// SetWriteDeadline sets the connection's write deadline to t, or keeps
// the one set when it lies within a second after t.
func (w *fastWriter) SetWriteDeadline(t time.Time) error {
	fc := w.fc
	if !fc.wdl.IsZero() && !fc.wdl.Before(t) && fc.wdl.Sub(t) <= time.Second {
		return nil
	}
	fc.wdl = t.Add(time.Second)
	return fc.c.SetWriteDeadline(fc.wdl)
}

// SetReadDeadline bounds the reading of the rest of the body (nothing to
// do when it was read with the header).
func (w *fastWriter) SetReadDeadline(t time.Time) error {
	if w.body != nil && w.body.done() {
		return nil
	}
	w.fc.setReadDeadline(t)
	return nil
}
