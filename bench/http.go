package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
)

// The HTTP targets: lockd's HTTP/JSON API against etcd's JSON
// gateway, driven by the same load code — each slot a goroutine with one
// request in flight, on an HTTP/1.1 keep-alive connection of its own (as
// HTTP/1.1 has no multiplexing), with a hand-written client (rawHTTP) and
// the same JSON handling for every target.
//
//   - lockd-http: a lockd child serving httpapi's front (what --http
//     serves): POST /v1/acquire {key, wait_ms, lease_ms} → token, POST
//     /v1/release {key, token}.
//   - lockd-gw: the same routes served by a gateway over the bundled Go
//     client through the client port (gateway.go): the design httpapi did
//     not take, measured for docs/DESIGN.md.
//   - etcd-gw: etcd (started as for the etcd target) through its JSON
//     gateway: POST /v3/lock/lock {name, lease} → the lock's key and the
//     revision (the fencing token), POST /v3/lock/unlock {key}; a lease per
//     slot, granted with /v3/lease/grant before the clock starts. Under
//     contention /v3/lock/lock blocks in etcd's queue (v3lock's Mutex) up
//     to the wait, as lockd's long-poll does.

// openLockdHTTP starts lockd with its HTTP API in a child process.
func openLockdHTTP(t *target, o *options) error {
	t.http = &httpDriver{base: "", dialect: dialectLockd}
	t.queues = true
	httpSkips(t)
	if err := t.startChild("lockd-http", o.loops); err != nil {
		return err
	}
	t.http.base = "http://" + t.addr
	return nil
}

// openLockdGW starts lockd behind a gateway over the bundled client.
func openLockdGW(t *target, o *options) error {
	t.http = &httpDriver{dialect: dialectLockd}
	t.queues = true
	httpSkips(t)
	if err := t.startChild("lockd-gw", o.loops); err != nil {
		return err
	}
	t.http.base = "http://" + t.addr
	return nil
}

// openEtcdGW starts a one-member etcd (or uses -etcd), driven through its
// JSON gateway.
func openEtcdGW(t *target, o *options) error {
	pid, err := t.startPeer(o.etcdURL, startEtcd)
	if err != nil {
		return err
	}
	t.http = &httpDriver{base: t.addr, dialect: dialectEtcd}
	t.queues = true
	t.mem = func() (memStat, error) { return etcdMem(t.addr, pid) }
	httpSkips(t)
	return nil
}

func httpSkips(t *target) {
	t.skip[wlFanin] = "not run over HTTP: its question, memory per connection and lock, is the binary protocol's"
	t.skip[wlHeld] = "not run over HTTP"
	// The HTTP driver acquires exclusively: it sends no limit, and etcd's
	// gateway has no semaphore to send it to.
	t.skip[wlSemaphore] = "not run over HTTP: the HTTP driver takes exclusive locks only"
}

// serveHTTPFront serves httpapi's front for srv on 127.0.0.1 (the child
// of lockd-http).
func serveHTTPFront(srv *engine.Server) (string, func(), error) {
	f, err := httpapi.New(httpapi.Config{Server: srv, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxLongPolls: 1 << 20, MaxStreams: 1 << 10})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := f.Endpoint()
	go func() { _ = hs.Serve(ln) }()
	return ln.Addr().String(), func() { hs.Close(); f.Close(); srv.Close() }, nil
}

// dialect is which API an httpDriver speaks.
type dialect uint8

const (
	dialectLockd dialect = iota // lockd's /v1/
	dialectEtcd                 // etcd's /v3/lock gateway
)

// httpDriver drives an HTTP target.
type httpDriver struct {
	base    string // http://host:port
	dialect dialect
	lastErr atomic.Pointer[error]
	failed  atomic.Int64
}

// httpRun is one workload's connections and slots.
type httpRun struct {
	d     *httpDriver
	host  string // host:port
	slots []httpSlot
}

type httpSlot struct {
	conn    rawHTTP
	lease   int64  // etcd: the slot's lease
	lockKey string // etcd: the key /v3/lock/lock made (base64), for the unlock
	buf     []byte
}

// start prepares the slots of groups: a connection per slot (HTTP/1.1
// has one request in flight per connection), and on etcd a lease per
// slot.
func (d *httpDriver) start(groups [][]*slot) (*httpRun, error) {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	r := &httpRun{d: d, host: strings.TrimPrefix(d.base, "http://"), slots: make([]httpSlot, n)}
	for i := range r.slots {
		r.slots[i].conn.addr = r.host
	}
	if d.dialect == dialectEtcd {
		err := parallel(n, 64, func(i int) error {
			st, body, err := r.slots[i].conn.post("/v3/lease/grant", []byte(`{"TTL":120}`), time.Now().Add(etcdRequestTimeout))
			if err == nil && st != http.StatusOK {
				err = fmt.Errorf("etcd /v3/lease/grant: %d %s", st, body)
			}
			if err != nil {
				return err
			}
			r.slots[i].lease, err = strconv.ParseInt(jsonField(body, "ID"), 10, 64)
			return err
		})
		if err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

// warm opens the connections with one request each, all at once.
func (r *httpRun) warm() error {
	path, body := "/v1/inspect", []byte(`{"key":"bench/warm"}`)
	if r.d.dialect == dialectEtcd {
		path, body = "/v3/kv/range", []byte(`{"key":"`+base64.StdEncoding.EncodeToString([]byte("bench/warm"))+`"}`)
	}
	return parallel(len(r.slots), len(r.slots), func(i int) error {
		_, _, err := r.slots[i].conn.post(path, body, time.Now().Add(etcdRequestTimeout))
		return err
	})
}

// close revokes etcd's leases and closes the connections.
func (r *httpRun) close() {
	_ = parallel(len(r.slots), 64, func(i int) error {
		s := &r.slots[i]
		if r.d.dialect == dialectEtcd && s.lease != 0 {
			_, _, _ = s.conn.post("/v3/lease/revoke", []byte(`{"ID":"`+strconv.FormatInt(s.lease, 10)+`"}`), time.Now().Add(etcdRequestTimeout))
		}
		s.conn.close()
		return nil
	})
}

// do performs a for slot s and waits for its answer.
func (r *httpRun) do(s *slot, a *action) answer {
	kind, token, err := r.op(s, a)
	if err != nil && kind == ansError {
		r.d.lastErr.Store(&err)
		r.d.failed.Add(1)
	}
	return answer{kind: kind, token: token}
}

func (r *httpRun) op(s *slot, a *action) (ansKind, uint64, error) {
	hs := &r.slots[s.id]
	wait := time.Duration(a.wait) * time.Second
	deadline := time.Now().Add(wait + etcdRequestTimeout)
	b := hs.buf[:0]
	var path string
	switch {
	case r.d.dialect == dialectLockd && a.op == opAcquire:
		path = "/v1/acquire"
		b = append(b, `{"key":"`...)
		b = append(b, a.key...)
		b = append(b, `","wait_ms":`...)
		b = strconv.AppendInt(b, wait.Milliseconds(), 10)
		b = append(b, `,"lease_ms":`...)
		b = strconv.AppendInt(b, int64(a.lease)*1000, 10)
		b = append(b, '}')
	case r.d.dialect == dialectLockd && a.op == opRelease:
		path = "/v1/release"
		b = append(b, `{"key":"`...)
		b = append(b, a.key...)
		b = append(b, `","token":"`...)
		b = strconv.AppendUint(b, a.token, 10)
		b = append(b, `"}`...)
	case r.d.dialect == dialectEtcd && a.op == opAcquire:
		// Bounded by the wait: at its end the connection is closed, which
		// cancels the gateway's request (and etcd's queued lock).
		path, deadline = "/v3/lock/lock", time.Now().Add(max(wait, time.Second))
		b = append(b, `{"name":"`...)
		b = base64.StdEncoding.AppendEncode(b, a.key)
		b = append(b, `","lease":"`...)
		b = strconv.AppendInt(b, hs.lease, 10)
		b = append(b, `"}`...)
	case r.d.dialect == dialectEtcd && a.op == opRelease:
		path = "/v3/lock/unlock"
		b = append(append(append(b, `{"key":"`...), hs.lockKey...), `"}`...)
	default:
		return ansError, 0, fmt.Errorf("http: no request for op %d", a.op)
	}
	hs.buf = b
	status, body, err := hs.conn.post(path, b, deadline)
	if err != nil {
		var ne net.Error
		if r.d.dialect == dialectEtcd && a.op == opAcquire && errors.As(err, &ne) && ne.Timeout() {
			return ansRefused, 0, nil // the wait was spent in etcd's queue
		}
		return ansError, 0, err
	}
	switch r.d.dialect {
	case dialectLockd:
		code := jsonField(body, "code")
		switch {
		case status == http.StatusOK && a.op == opAcquire:
			tok, err := strconv.ParseUint(jsonField(body, "token"), 10, 64)
			if err != nil {
				return ansError, 0, fmt.Errorf("lockd: grant %s: %w", body, err)
			}
			return ansGranted, tok, nil
		case status == http.StatusOK:
			return ansReleased, 0, nil
		case code == httpapi.CodeTimeout || code == httpapi.CodeBusy:
			return ansRefused, 0, nil
		case code == httpapi.CodeNotHeld:
			return ansNotHeld, 0, nil
		}
	case dialectEtcd:
		switch {
		case status == http.StatusOK && a.op == opAcquire:
			tok, err := strconv.ParseUint(jsonField(body, "revision"), 10, 64)
			if err != nil {
				return ansError, 0, fmt.Errorf("etcd: lock %s: %w", body, err)
			}
			hs.lockKey = jsonField(body, "key")
			return ansGranted, tok, nil
		case status == http.StatusOK:
			return ansReleased, 0, nil
		}
	}
	return ansError, 0, fmt.Errorf("HTTP %d %s", status, body)
}

// jsonField returns the string value of the first "name":"value" in body
// ("" if none): enough for the few fields the drivers read, and the same
// work for every target.
func jsonField(body []byte, name string) string {
	pat := `"` + name + `":"`
	i := bytes.Index(body, []byte(pat))
	if i < 0 {
		return ""
	}
	v := body[i+len(pat):]
	j := bytes.IndexByte(v, '"')
	if j < 0 {
		return ""
	}
	return string(v[:j])
}

// rawHTTP is a hand-written HTTP/1.1 keep-alive client of one connection,
// the HTTP targets' load generator: as the binary targets' is, it keeps a
// client library's costs (net/http's two goroutines and channel handoffs
// per connection and request) out of the load generator's share of the
// machine, the same for every HTTP target. It sends a POST and reads the
// answer (Content-Length or chunked); an error closes the connection, and
// the next request dials again.
type rawHTTP struct {
	addr string
	nc   net.Conn
	br   *bufio.Reader
	req  []byte
	body []byte
}

func (h *rawHTTP) close() {
	if h.nc != nil {
		h.nc.Close()
		h.nc = nil
	}
}

// post sends body to path and returns the status and the body (valid until
// the next call).
func (h *rawHTTP) post(path string, body []byte, deadline time.Time) (int, []byte, error) {
	if h.nc == nil {
		nc, err := net.DialTimeout("tcp", h.addr, 10*time.Second)
		if err != nil {
			return 0, nil, err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		h.nc, h.br = nc, bufio.NewReaderSize(nc, 4<<10)
	}
	status, resp, err := h.roundTrip(path, body, deadline)
	if err != nil {
		h.close()
	}
	return status, resp, err
}

func (h *rawHTTP) roundTrip(path string, body []byte, deadline time.Time) (int, []byte, error) {
	_ = h.nc.SetDeadline(deadline)
	r := append(h.req[:0], "POST "...)
	r = append(r, path...)
	r = append(r, " HTTP/1.1\r\nHost: "...)
	r = append(r, h.addr...)
	r = append(r, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	r = strconv.AppendInt(r, int64(len(body)), 10)
	r = append(r, "\r\n\r\n"...)
	r = append(r, body...)
	h.req = r
	if _, err := h.nc.Write(r); err != nil {
		return 0, nil, err
	}
	line, err := h.br.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	length, chunked, closing := -1, false, false
	for {
		line, err := h.br.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		if len(line) <= 2 {
			break
		}
		k, v, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":"))
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			length, _ = strconv.Atoi(string(v))
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(v, []byte("chunked"))
		case bytes.EqualFold(k, []byte("Connection")):
			closing = bytes.EqualFold(v, []byte("close"))
		}
	}
	h.body = h.body[:0]
	switch {
	case chunked:
		for {
			line, err := h.br.ReadSlice('\n')
			if err != nil {
				return 0, nil, err
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 32)
			if err != nil {
				return 0, nil, fmt.Errorf("bad chunk size %q", line)
			}
			if n == 0 {
				if _, err := h.br.ReadSlice('\n'); err != nil { // the last CRLF (no trailers)
					return 0, nil, err
				}
				break
			}
			h.body, err = readN(h.br, h.body, int(n))
			if err != nil {
				return 0, nil, err
			}
			if _, err := h.br.ReadSlice('\n'); err != nil {
				return 0, nil, err
			}
		}
	case length >= 0:
		if h.body, err = readN(h.br, h.body, length); err != nil {
			return 0, nil, err
		}
	default:
		return 0, nil, errors.New("an answer without Content-Length or chunks")
	}
	if closing {
		h.close()
	}
	return status, h.body, nil
}

func readN(br *bufio.Reader, dst []byte, n int) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	_, err := io.ReadFull(br, dst[start:])
	return dst, err
}

// failures returns and resets the failed requests and the last failure.
func (d *httpDriver) failures() (int64, error) {
	var last error
	if err := d.lastErr.Swap(nil); err != nil {
		last = *err
	}
	return d.failed.Swap(0), last
}
