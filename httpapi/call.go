package httpapi

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// spec is one request for the engine, parsed from the HTTP request.
type spec struct {
	op     proto.Op // A, S, R, K, V, W or I
	key    string
	id     uint64 // what its answer is correlated by: owner (A, S), token (R, K, V, W), nonce (I)
	token  uint64
	lease  uint8 // seconds (A, S, K)
	limit  uint16
	waitMs int64 // A, S
	// deadline: an acquire with wait_ms > 0 is answered 409 timeout at
	// arrival + wait_ms (docs/PROTOCOL.md decision 39); anything else
	// waits at most TransportDeadline for the engine's answer. An M
	// without an address is retried until then.
	deadline time.Time
	body     []byte // the request's body, for forwarding
}

func (q *spec) acquire() bool { return q.op == proto.OpAcquire || q.op == proto.OpShared }

// changes reports whether executing q may change the table (a request
// that does not can be sent again after a failure).
func (q *spec) changes() bool {
	return q.op != proto.OpValidate && q.op != proto.OpInspect && q.op != proto.OpWatch
}

// request serves the POST routes: read, parse, refuse what the wire
// cannot carry, then run.
func (c *call) request() {
	body, err := c.readBody()
	if err != nil {
		c.failWith(err)
		return
	}
	q, err := c.parse(body)
	if err != nil {
		c.failWith(err)
		return
	}
	if q.acquire() && q.waitMs > 0 {
		f := c.f
		if !admit(&f.longPolls, f.cfg.MaxLongPolls) {
			c.fail(http.StatusServiceUnavailable, CodeTooManyLongPolls,
				"too many acquires are waiting (--http-max-long-polls "+strconv.Itoa(f.cfg.MaxLongPolls)+"); nothing was done")
			return
		}
		// The long-poll ends when its answer is about to be written (a
		// client that sends its next request at once finds the bound
		// freed), or when the handler returns without one.
		c.waitEnded = sync.OnceFunc(func() { f.longPolls.Add(-1) })
		defer c.waitEnded()
	}
	c.cred = credsOf(c.r)
	c.run(q)
}

// parse reads the body of the request's route into a spec.
func (c *call) parse(body []byte) (*spec, error) {
	q := &spec{body: body}
	now := c.start
	q.deadline = now.Add(TransportDeadline)
	var err error
	switch c.route {
	case routeAcquire:
		var b acquireBody
		if q.key, err = decodeKeyed(body, &b); err != nil {
			return nil, err
		}
		if q.waitMs, err = millis(b.WaitMs, "wait_ms", CodeBadWait, maxWireMillis, false, 0); err != nil {
			err.(*badRequest).msg += " (a longer wait is the client's loop, PROTOCOL.md §2)"
			return nil, err
		}
		lease, err := millis(b.LeaseMs, "lease_ms", CodeBadLease, maxWireMillis, true, 0)
		if err != nil {
			return nil, err
		}
		q.lease = leaseSeconds(lease)
		q.op, q.id = proto.OpAcquire, rand.Uint64()
		if b.Limit != nil {
			limit, err := millis(b.Limit, "limit", CodeBadLimit, 65535, true, 0)
			if err != nil {
				return nil, err
			}
			q.op, q.limit = proto.OpShared, uint16(limit)
		}
		if q.waitMs > 0 {
			q.deadline = now.Add(time.Duration(q.waitMs) * time.Millisecond)
		}
	case routeRelease, routeRenew, routeValidate:
		var b tokenBody
		if q.key, err = decodeKeyed(body, &b); err != nil {
			return nil, err
		}
		if q.token, err = parseToken(b.Token); err != nil {
			return nil, err
		}
		q.id = q.token
		switch c.route {
		case routeRelease:
			q.op = proto.OpRelease
		case routeValidate:
			q.op = proto.OpValidate
		default:
			q.op = proto.OpRenew
			lease, err := millis(b.LeaseMs, "lease_ms", CodeBadLease, maxWireMillis, true, 0)
			if err != nil {
				return nil, err
			}
			q.lease = leaseSeconds(lease)
		}
	case routeInspect:
		var b keyBody
		if q.key, err = decodeKeyed(body, &b); err != nil {
			return nil, err
		}
		q.op, q.id = proto.OpInspect, c.f.nonce.Add(1)
	}
	return q, nil
}

// wireWait is the wire's wait for an acquire sent at now: the time left
// until its deadline rounded up to whole seconds (PROTOCOL.md §7), 0 for
// wait_ms 0.
func (q *spec) wireWait(now time.Time) uint8 {
	if q.waitMs == 0 {
		return 0
	}
	left := q.deadline.Sub(now)
	if left <= 0 {
		return 0
	}
	return uint8(min((left+time.Second-1)/time.Second, maxWireSeconds))
}

// frame appends q's request frame, sent at now.
func (q *spec) frame(dst []byte, now time.Time) []byte {
	switch q.op {
	case proto.OpAcquire:
		return proto.AppendAcquire(dst, q.wireWait(now), q.lease, q.id, q.key)
	case proto.OpShared:
		return proto.AppendShared(dst, q.wireWait(now), q.lease, q.id, q.limit, q.key)
	case proto.OpRelease:
		return proto.AppendRelease(dst, q.token, q.key)
	case proto.OpRenew:
		return proto.AppendRenew(dst, q.lease, q.token, q.key)
	case proto.OpValidate:
		return proto.AppendValidate(dst, q.token, q.key)
	case proto.OpWatch:
		return proto.AppendWatch(dst, q.token, q.key)
	default: // OpInspect
		return proto.AppendInspect(dst, q.id, q.key)
	}
}

// matches reports whether r answers q.
func (q *spec) matches(r *proto.Response) bool {
	if r.ID != q.id {
		return false
	}
	switch r.Op {
	case proto.OpError, proto.OpMoved, proto.OpNotHeld:
		return r.ReqOp == q.op
	case proto.OpAcquire, proto.OpTimeout, proto.OpBusy:
		return q.acquire()
	}
	return r.Op == q.op
}

// poolKey is what authenticated a connection (pool.go): "" without an
// ACL, where nothing does.
func (c *call) poolKey(acl bool) string {
	if !acl {
		return ""
	}
	k := c.cred.cn + "\x00"
	if c.cred.basic {
		k += "\x01" + c.cred.user
	}
	return k
}

// hello appends the hello of the request's basic authentication (with an
// ACL). Credentials the wire cannot carry (a user with a space or a
// newline, a newline in the password, a tail over 1024 bytes) become a
// hello that no identity passes, so the engine refuses, counts and logs
// them like any failed hello (E 5).
func (c *call) hello(dst []byte, nonce uint64) []byte {
	u, p := c.cred.user, c.cred.pass
	ok := u != "" && p != "" && len(u)+1+len(p) <= proto.MaxKey
	for i := 0; ok && i < len(u); i++ {
		ok = u[i] != ' ' && u[i] != '\n'
	}
	for i := 0; ok && i < len(p); i++ {
		ok = p[i] != '\n'
	}
	if !ok {
		u, p = "", "-"
	}
	return proto.AppendHello(dst, nonce, u, p)
}

// outcome is how waiting for an answer ended.
type outcome uint8

const (
	answered       outcome = iota // conv.resp answers the request
	helloRefused                  // the hello was answered E 5 (the engine closed the connection)
	closedUnheard                 // the connection closed without the answer
	deadlinePassed                // the request's deadline passed first
	clientGone                    // the HTTP client went away first
)

// conv reads the answers of one local connection.
type conv struct {
	lc   *engine.LocalConn
	buf  []byte
	off  int
	resp proto.Response
	done bool // lc.Done() was seen: what is left is final
}

// next parses the next answer taken from the connection (taking more when
// none is left); false when none is there now. resp.Tail is valid until
// the next call.
func (v *conv) next() bool {
	if v.off == len(v.buf) {
		v.buf, v.off = v.lc.Take(v.buf[:0]), 0
		if len(v.buf) == 0 {
			return false
		}
	}
	n, err := proto.ParseResponse(v.buf[v.off:], &v.resp)
	if err != nil {
		// The engine writes whole frames: a partial one cannot be taken.
		v.off = len(v.buf)
		return false
	}
	v.off += n
	return true
}

// await waits for q's answer on v (after the hello's, when helloNonce is
// not 0) until deadline.
func (c *call) await(v *conv, q *spec, helloNonce uint64, deadline time.Time) outcome {
	var timer *time.Timer // made only if the answer is not there at once
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	ctx := c.r.Context()
	for {
		for v.next() {
			r := &v.resp
			if helloNonce != 0 && r.ID == helloNonce && (r.Op == proto.OpHello || r.Op == proto.OpError && r.ReqOp == proto.OpHello) {
				if r.Op == proto.OpError {
					return helloRefused
				}
				helloNonce = 0
				continue
			}
			if q.matches(r) {
				return answered
			}
		}
		if v.done {
			return closedUnheard
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-v.lc.Ready():
		case <-v.lc.Done():
			v.done = true
		case <-timer.C:
			return deadlinePassed
		case <-ctx.Done():
			return clientGone
		}
	}
}

// statusClientGone is the status counted for a request whose client went
// away before its answer (nginx's convention; nothing is written).
const statusClientGone = 499

// run executes q on a local connection and answers the HTTP request,
// following M (forwarding to the serving member, or redirecting a request
// authenticated by a client certificate) until q's deadline.
func (c *call) run(q *spec) {
	f := c.f
	acl := f.srv.ACL() != nil
	key := c.poolKey(acl)
	sayHello := acl && c.cred.basic
	var frames []byte
	for fresh := false; ; {
		lc := f.pool.get(key)
		if lc == nil || fresh {
			var err error
			if lc, err = f.srv.OpenLocal(c.cred.cn, c.r.RemoteAddr); err != nil {
				c.fail(http.StatusServiceUnavailable, CodeShuttingDown, "the server is shutting down")
				return
			}
		}
		lc.SetRemote(c.r.RemoteAddr)
		now := time.Now()
		var nonce uint64
		frames = frames[:0]
		if sayHello {
			nonce = f.nonce.Add(1)
			frames = c.hello(frames, nonce)
		}
		frames = q.frame(frames, now)
		if err := lc.Send(frames); err != nil {
			// Closed before the frames went in (an ACL reload, the engine
			// stopping): nothing was executed. Once with a new connection.
			if fresh {
				c.fail(http.StatusServiceUnavailable, CodeShuttingDown, "the server is shutting down")
				return
			}
			fresh = true
			continue
		}
		fresh = false
		v := &conv{lc: lc}
		switch c.await(v, q, nonce, q.deadline) {
		case clientGone:
			// Closing withdraws a queued acquire and releases a grant not
			// taken (PROTOCOL.md §4).
			lc.Close()
			c.status = statusClientGone
			return
		case deadlinePassed:
			lc.Close()
			c.deadlinePassed(q)
			return
		case closedUnheard:
			c.closedUnheard(q)
			return
		case helloRefused:
			c.fail(http.StatusUnauthorized, CodeUnauthenticated, "unauthenticated: basic authentication as an identity of the ACL, with its secret")
			return
		}
		r := &v.resp
		if r.Op != proto.OpMoved {
			c.answer(q, lc, key, v)
			return
		}
		f.pool.put(key, lc) // an M is the request's last answer
		if !c.moved(q, string(r.Tail)) {
			return
		}
	}
}

// deadlinePassed answers a request whose deadline passed before its answer
// came (its connection closed: a grant not taken was released).
func (c *call) deadlinePassed(q *spec) {
	switch {
	case q.acquire() && q.waitMs > 0:
		c.fail(http.StatusConflict, CodeTimeout, "wait_ms passed: nothing granted")
	case q.changes() && !q.acquire():
		c.fail(http.StatusBadGateway, CodeIndeterminate,
			"no answer within "+TransportDeadline.String()+": the request may or may not have been executed")
	default:
		c.fail(http.StatusServiceUnavailable, CodeUnavailable, "no answer within "+TransportDeadline.String()+"; nothing changed")
	}
}

// closedUnheard answers a request whose local connection closed without
// its answer: it was not read (an ACL reload removed the identity, the
// engine stopped), or — on a raft leader that lost its leadership — its
// change may commit or not (PROTOCOL.md §6.4: Indeterminate).
func (c *call) closedUnheard(q *spec) {
	if c.f.srv.Draining() {
		c.fail(http.StatusServiceUnavailable, CodeShuttingDown, "the server is shutting down")
		return
	}
	if q.changes() {
		c.fail(http.StatusBadGateway, CodeIndeterminate, "the request may or may not have been executed: the server closed its connection")
		return
	}
	c.fail(http.StatusServiceUnavailable, CodeUnavailable, "no answer: the server closed its connection; nothing changed")
}

// answer maps the engine's answer (anything but M) to the HTTP answer and
// gives the connection back when it is clean.
func (c *call) answer(q *spec, lc *engine.LocalConn, key string, v *conv) {
	f, r := c.f, &v.resp
	var b []byte
	switch r.Op {
	case proto.OpAcquire:
		c.grant(q, lc, key, r.Token)
		return
	case proto.OpWatch:
		c.stream(q, lc, key, v)
		return
	case proto.OpError:
		st, code := statusOf(r.Code)
		msg := string(r.Tail)
		if r.Code == proto.CodeBadLease {
			msg = "bad lease: lease_ms must be 1..255000 (0 is no lease)"
		}
		if r.Code == proto.CodeUnauthenticated || r.Code == proto.CodeBadFrame {
			c.fail(st, code, msg) // the engine closed the connection
			return
		}
		f.pool.put(key, lc)
		c.fail(st, code, msg)
		return
	case proto.OpTimeout:
		f.pool.put(key, lc)
		c.fail(http.StatusConflict, CodeTimeout, "timed out: the key stayed held for the whole wait; nothing granted")
		return
	case proto.OpBusy:
		f.pool.put(key, lc)
		c.fail(http.StatusTooManyRequests, CodeBusy, "busy: the key's queue or the server's capacity is full; nothing granted or queued")
		return
	case proto.OpNotHeld:
		f.pool.put(key, lc)
		c.fail(http.StatusConflict, CodeNotHeld, "not held: the token is not a current grant of the key")
		return
	case proto.OpRelease:
		b = c.open(q, r.ID)
	case proto.OpRenew:
		b = c.open(q, r.ID)
		b = appendInt(append(b, `,"lease_ms":`...), int64(q.lease)*1000)
	case proto.OpValidate:
		b = c.open(q, r.ID)
		b = appendInt(append(b, `,"remaining_ms":`...), int64(r.Remaining))
	case proto.OpInspect:
		b = append(b, `{"key":`...)
		b = appendString(b, q.key)
		b = appendInt(append(b, `,"holders":`...), int64(r.Holders))
		b = appendInt(append(b, `,"limit":`...), int64(r.Limit))
		b = appendInt(append(b, `,"waiters":`...), int64(r.Waiters))
		b = appendToken(append(b, `,"token":`...), r.Token)
		b = appendInt(append(b, `,"remaining_ms":`...), int64(r.Remaining))
	default:
		lc.Close()
		c.fail(http.StatusInternalServerError, CodeInternal, "unexpected answer "+r.Op.String())
		return
	}
	f.pool.put(key, lc)
	c.reply(http.StatusOK, append(b, "}\n"...))
}

// open begins an answer object with the key and the token.
func (c *call) open(q *spec, token uint64) []byte {
	b := make([]byte, 0, 64+len(q.key))
	b = append(b, `{"key":`...)
	b = appendString(b, q.key)
	return appendToken(append(b, `,"token":`...), token)
}

func appendInt(dst []byte, v int64) []byte { return strconv.AppendInt(dst, v, 10) }

// grant answers a grant. A grant whose answer cannot be delivered — the
// client went away, or the write failed — is released at once, that exact
// token, on the connection (and so by the identity) that made it: the
// HTTP form of PROTOCOL.md §4's rule.
func (c *call) grant(q *spec, lc *engine.LocalConn, key string, token uint64) {
	b := c.open(q, token)
	b = appendInt(append(b, `,"lease_ms":`...), int64(q.lease)*1000)
	if q.op == proto.OpShared {
		b = appendInt(append(b, `,"limit":`...), int64(q.limit))
	}
	// A client that went away while the grant was made is not written
	// to; a write that fails did not deliver.
	if c.r.Context().Err() == nil && c.reply(http.StatusOK, append(b, "}\n"...)) {
		c.f.pool.put(key, lc)
		return
	}
	c.status = statusClientGone
	c.f.releaseUndelivered(lc, key, q.key, token)
}

// releaseUndelivered releases a grant whose answer did not reach its
// client (on lc, which made it). On a member that stopped serving in
// between, the grant ends with its lease there, as a connection's
// undelivered grant does (docs/PROTOCOL.md decision 21).
func (f *Front) releaseUndelivered(lc *engine.LocalConn, poolKey, key string, token uint64) {
	q := &spec{op: proto.OpRelease, key: key, token: token, id: token, deadline: time.Now().Add(TransportDeadline)}
	if err := lc.Send(q.frame(nil, time.Now())); err != nil {
		f.log.Warn("http: a grant whose answer could not be delivered was not released: its connection closed (the close released it unless the member stopped serving)",
			"key", key, "token", token)
		return
	}
	c := &call{f: f, r: (&http.Request{}).WithContext(context.Background())}
	v := &conv{lc: lc}
	switch c.await(v, q, 0, q.deadline) {
	case answered:
		if v.resp.Op == proto.OpRelease {
			f.released.Add(1)
			f.pool.put(poolKey, lc)
			return
		}
		f.log.Warn("http: a grant whose answer could not be delivered could not be released; it ends with its lease",
			"key", key, "token", token, "answer", v.resp.Op.String(), "active", string(v.resp.Tail))
	default:
		f.log.Warn("http: a grant whose answer could not be delivered: no answer to its release; it ends with its lease",
			"key", key, "token", token)
	}
	lc.Close()
}

// moved follows an M naming addr ("" while no active is known). It returns
// true when the request is to be sent again (to this member's engine,
// after a pause), false once it is answered.
func (c *call) moved(q *spec, addr string) bool {
	f := c.f
	if f.stopping.Load() || f.srv.Draining() {
		// This member is shutting down (it handed over, or it is a
		// standby going away): it cannot relay a long-poll that outlives
		// it. The request was not executed; the client sends it again,
		// to the member named.
		c.w.Header().Set("Retry-After", retryAfterSeconds)
		msg := "this member is shutting down; the request was not executed"
		if addr != "" {
			msg += ": send it to the active, " + addr
		}
		c.reply(http.StatusServiceUnavailable, errorBody(CodeShuttingDown, msg, addr))
		return false
	}
	if addr == "" {
		pause := 50*time.Millisecond + rand.N(150*time.Millisecond)
		if time.Until(q.deadline) < pause {
			c.fail(http.StatusServiceUnavailable, CodeNoActive, "no active member is known (a failover or an election); nothing was done")
			return false
		}
		return c.sleep(pause)
	}
	if c.r.Header.Get(hdrForwarded) != "" {
		// The member that forwarded it asks its own engine again.
		c.status = http.StatusMisdirectedRequest
		c.reply(http.StatusMisdirectedRequest, errorBody(CodeNotServing, "this member does not serve: the active is "+addr, addr))
		return false
	}
	target, err := f.httpAddr(addr)
	if err != nil {
		c.fail(http.StatusServiceUnavailable, CodeNoActive, err.Error())
		return false
	}
	if f.srv.ACL() != nil && !c.cred.basic && c.cred.cn != "" {
		// A client certificate's identity cannot travel: the client goes
		// to the serving member itself.
		loc := f.scheme() + "://" + target + c.r.URL.RequestURI()
		f.redirects.Add(1)
		c.w.Header().Set("Location", loc)
		c.reply(http.StatusTemporaryRedirect, errorBody(CodeMoved,
			"this member does not serve; a request authenticated by its client certificate is sent to the serving member: "+loc, addr))
		return false
	}
	return c.forward(q, target)
}

// sleep waits d unless the client goes away or the front closes (false,
// answered).
func (c *call) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.r.Context().Done():
		c.status = statusClientGone
		return false
	case <-c.f.ctx.Done():
		c.fail(http.StatusServiceUnavailable, CodeShuttingDown, "this member is shutting down; the request was not executed")
		return false
	}
}

// httpAddr is the HTTP endpoint of the member whose client address is
// addr: the same host, the port + PortOffset.
func (f *Front) httpAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	p, err2 := strconv.Atoi(port)
	if err != nil || err2 != nil || p+f.cfg.PortOffset < 1 || p+f.cfg.PortOffset > 65535 {
		return "", errors.New("the active's address " + strconv.Quote(addr) + " gives no HTTP port with the offset " + strconv.Itoa(f.cfg.PortOffset))
	}
	return net.JoinHostPort(host, strconv.Itoa(p+f.cfg.PortOffset)), nil
}

func (f *Front) scheme() string {
	if f.cfg.ForwardTLS != nil {
		return "https"
	}
	return "http"
}
