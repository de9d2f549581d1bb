package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// The watch (PROTOCOL.md §9.4) as Server-Sent Events: GET
// /v1/watch?key=…&token=… registers a W on a local connection of its own;
// its W starts the stream with "event: watching", its L is the one "event:
// lost" (reason 1 released, 2 expired, 3 forced, 4 this member can no
// longer tell: watch again), after which the stream ends. An error before
// the stream is an ordinary JSON error answer. Comment lines keep an idle
// stream alive (Config.KeepAlive). A client that goes away closes the
// connection, which ends the watch.
//
// Reason 4 is passed on, not acted on: the front does not watch again on
// the new active itself. By the time it could, the grant may have ended
// there (released, expired), and a watch then answered N would leave the
// front unable to say why; the client that watches again learns it
// truthfully (409 not_held, or a new stream).

var reasonNames = [...]string{1: "released", 2: "expired", 3: "forced", 4: "cannot_tell"}

// watch serves GET /v1/watch.
func (c *call) watch() {
	qv := c.r.URL.Query()
	var key *string
	if v, ok := qv["key"]; ok && len(v) > 0 {
		key = &v[0]
	}
	k, err := checkKey(key)
	if err != nil {
		c.failWith(err)
		return
	}
	if _, ok := qv["token"]; !ok {
		c.fail(http.StatusBadRequest, CodeBadToken, "token: missing")
		return
	}
	token, err := tokenOf(qv.Get("token"))
	if err != nil {
		c.failWith(err)
		return
	}
	f := c.f
	if !admit(&f.streams, f.cfg.MaxStreams) {
		c.fail(http.StatusServiceUnavailable, CodeTooManyStreams,
			"too many watches are open (--http-max-streams "+strconv.Itoa(f.cfg.MaxStreams)+"); nothing was done")
		return
	}
	defer f.streams.Add(-1)
	c.cred = credsOf(c.r)
	c.run(&spec{op: proto.OpWatch, key: k, token: token, id: token, deadline: c.start.Add(TransportDeadline)})
}

// stream runs a watch whose W was answered on lc, until its L.
func (c *call) stream(q *spec, lc *engine.LocalConn, key string, v *conv) {
	h := c.w.Header()
	h.Set("Content-Type", contentTypeEventsUTF8)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy must not hold events back
	c.status = http.StatusOK
	if c.r.Context().Err() != nil {
		lc.Close()
		c.status = statusClientGone
		return
	}
	_ = c.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	c.w.WriteHeader(http.StatusOK)
	b := append([]byte("event: watching\ndata: {\"key\":"), appendString(nil, q.key)...)
	b = append(appendToken(append(b, `,"token":`...), q.token), "}\n\n"...)
	if !c.writeEvent(b) {
		lc.Close()
		return
	}
	tick := time.NewTicker(c.f.cfg.KeepAlive)
	defer tick.Stop()
	ctx := c.r.Context()
	for {
		for v.next() {
			if r := &v.resp; r.Op == proto.OpLost && r.ID == q.token {
				if c.writeEvent(lostEvent(q.key, q.token, r.Reason)) {
					c.f.pool.put(key, lc) // the watch ended with its L
				} else {
					lc.Close()
				}
				return
			}
		}
		if v.done {
			// Closed without an L (an abandoned change on a raft leader
			// that lost its leadership): this member can no longer tell.
			c.writeEvent(lostEvent(q.key, q.token, 4))
			return
		}
		select {
		case <-lc.Ready():
		case <-lc.Done():
			v.done = true
		case <-tick.C:
			if !c.writeEvent([]byte(": keep-alive\n\n")) {
				lc.Close()
				return
			}
		case <-ctx.Done():
			lc.Close()
			return
		}
	}
}

// lostEvent is the lost event of a watch.
func lostEvent(key string, token uint64, reason uint8) []byte {
	b := append([]byte("event: lost\ndata: {\"key\":"), appendString(nil, key)...)
	b = appendToken(append(b, `,"token":`...), token)
	b = appendInt(append(b, `,"reason":`...), int64(reason))
	name := "unknown"
	if int(reason) < len(reasonNames) && reasonNames[reason] != "" {
		name = reasonNames[reason]
	}
	b = appendString(append(b, `,"reason_name":`...), name)
	return append(b, "}\n\n"...)
}

// writeEvent writes one event (or comment) and flushes it, within
// WriteTimeout; false when the client is gone.
func (c *call) writeEvent(b []byte) bool {
	if c.r.Context().Err() != nil {
		return false
	}
	_ = c.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := c.w.Write(b); err != nil {
		return false
	}
	return c.rc.Flush() == nil
}
