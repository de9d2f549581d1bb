package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// Forwarding (docs/HTTP.md, "Clusters"). A member that does not serve
// answers M naming the serving member's client address; its front sends
// the request on to that member's HTTP endpoint (the same host, the port
// at PortOffset from the client port) and relays the answer, so a client
// pointed at any member is served — curl without -L and Python's urllib,
// which does not follow a 307 for a POST, included. The forwarded request
// carries the client's basic authentication (the identity travels and is
// checked there) and hdrForwarded, so that a member that does not serve
// either answers 421 instead of forwarding again: the first member then
// asks its own engine again, which names the new active. A request that
// met M was not executed, so sending it again is safe; a forwarded one
// that may have reached the other member is not sent again (§7): a change
// is then 502 indeterminate.

// hdrForwarded marks a request forwarded by another member's front.
const hdrForwarded = "Lockd-Forwarded"

// relayed are the headers of the serving member's answer that are relayed.
var relayed = []string{"Content-Type", "Retry-After", "WWW-Authenticate", "Location", "Cache-Control"}

// forward sends q to the member whose HTTP endpoint is target and relays
// its answer. It returns true when the request was not executed there
// (it was not sent, or that member does not serve either: 421) and is to
// be sent again.
func (c *call) forward(q *spec, target string) bool {
	f := c.f
	body := q.body
	if q.acquire() && q.waitMs > 0 {
		// The wait left, to the millisecond: the other member honours it.
		left := time.Until(q.deadline).Milliseconds()
		if left <= 0 {
			c.fail(http.StatusConflict, CodeTimeout, "wait_ms passed: nothing granted")
			return false
		}
		body = rewriteWait(body, left)
	}
	// The forward ends with the client, with the front (Close: this
	// member shuts down), or at its deadline (the other member's
	// answer is due by then).
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	defer context.AfterFunc(f.ctx, cancel)()
	if q.op != proto.OpWatch {
		var cancelD context.CancelFunc
		ctx, cancelD = context.WithDeadline(ctx, later(q.deadline, time.Now().Add(TransportDeadline)).Add(forwardAllowance))
		defer cancelD()
	}
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	var rd io.Reader
	if c.r.Method == http.MethodPost {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, c.r.Method, f.scheme()+"://"+target+c.r.URL.RequestURI(), rd)
	if err != nil {
		c.fail(http.StatusInternalServerError, CodeInternal, err.Error())
		return false
	}
	if rd != nil {
		req.Header.Set("Content-Type", contentTypeJSON)
	}
	req.Header.Set(hdrForwarded, "1")
	if auth := c.r.Header.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	f.forwarded.Add(1)
	resp, err := f.fwd.Do(req)
	if err != nil {
		return c.forwardFailed(q, target, err, wrote.Load())
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusMisdirectedRequest || resp.StatusCode == http.StatusServiceUnavailable {
		// 421: that member does not serve either; 503 shutting_down: it
		// is going away. Neither executed the request: ask again.
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode == http.StatusMisdirectedRequest || errorCode(data) == CodeShuttingDown {
			if time.Until(q.deadline) <= 0 {
				c.fail(http.StatusServiceUnavailable, CodeNoActive, "no serving member answered before the deadline; nothing was done")
				return false
			}
			return c.sleep(50*time.Millisecond + rand.N(150*time.Millisecond))
		}
		c.copyHeaders(resp.Header)
		c.replyRelayed(resp.StatusCode, data)
		return false
	}
	c.copyHeaders(resp.Header)
	if q.op == proto.OpWatch && resp.StatusCode == http.StatusOK {
		c.relayStream(q, resp.Body)
		return false
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return c.forwardFailed(q, target, err, true)
	}
	ok := c.replyRelayed(resp.StatusCode, data)
	if !ok && resp.StatusCode == http.StatusOK && q.acquire() {
		c.status = statusClientGone
		f.releaseRemote(target, c.r.Header.Get("Authorization"), data)
	}
	return false
}

// copyHeaders sets the relayed headers of the serving member's answer.
func (c *call) copyHeaders(h http.Header) {
	for _, k := range relayed {
		if v := h.Get(k); v != "" {
			c.w.Header().Set(k, v)
		}
	}
}

// errorCode is the code of an error answer's body, "" if it is none.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// forwardFailed answers a forward that got no answer: sent again when it
// did not leave (or changes nothing), else 502 indeterminate.
func (c *call) forwardFailed(q *spec, target string, err error, sent bool) bool {
	if c.r.Context().Err() != nil {
		c.status = statusClientGone
		return false
	}
	if c.f.ctx.Err() != nil {
		// This member is shutting down.
		if sent && q.changes() {
			c.fail(http.StatusBadGateway, CodeIndeterminate, "this member shut down while the serving member "+target+
				" had the request: it may or may not have been executed (a grant made just then ends with its lease)")
			return false
		}
		c.fail(http.StatusServiceUnavailable, CodeShuttingDown, "this member is shutting down; the request was not executed")
		return false
	}
	if !sent || !q.changes() {
		if time.Until(q.deadline) <= 0 {
			c.fail(http.StatusServiceUnavailable, CodeNoActive, "the serving member "+target+" did not answer: "+err.Error())
			return false
		}
		return c.sleep(50*time.Millisecond + rand.N(150*time.Millisecond))
	}
	c.fail(http.StatusBadGateway, CodeIndeterminate,
		"the request was forwarded to the serving member "+target+", which did not answer ("+err.Error()+"): it may or may not have been executed")
	return false
}

// replyRelayed writes the serving member's answer as it is.
func (c *call) replyRelayed(status int, body []byte) bool {
	c.w.Header().Del("Content-Length")
	if c.w.Header().Get("Content-Type") == "" {
		c.w.Header().Set("Content-Type", contentTypeJSON)
	}
	c.status = status
	if c.waitEnded != nil {
		c.waitEnded()
	}
	if c.r.Context().Err() != nil && status == http.StatusOK {
		return false // a grant is not written to a client that went away
	}
	_ = c.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	c.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	c.w.WriteHeader(status)
	if _, err := c.w.Write(body); err != nil {
		return false
	}
	return c.rc.Flush() == nil
}

// releaseRemote releases, on the member that granted it, a forwarded grant
// whose answer could not be delivered to the client.
func (f *Front) releaseRemote(target, auth string, grant []byte) {
	var g struct {
		Key   string `json:"key"`
		Token string `json:"token"`
	}
	if json.Unmarshal(grant, &g) != nil {
		return
	}
	b := append([]byte(`{"key":`), appendString(nil, g.Key)...)
	b = append(append(append(b, `,"token":`...), appendString(nil, g.Token)...), '}')
	ctx, cancel := context.WithTimeout(context.Background(), TransportDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.scheme()+"://"+target+"/v1/release", bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", contentTypeJSON)
	req.Header.Set(hdrForwarded, "1")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := f.fwd.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			f.released.Add(1)
			return
		}
		err = errors.New(resp.Status)
	}
	f.log.Warn("http: a forwarded grant whose answer could not be delivered could not be released; it ends with its lease",
		"key", g.Key, "token", g.Token, "member", target, "err", err)
}

// relayStream relays an SSE stream event by event (so that the lost event
// this member may add is never spliced into one of the other's). A stream
// that breaks before its lost event is ended with a lost event of reason
// 4: the member that could tell is gone; watch again.
func (c *call) relayStream(q *spec, body io.Reader) {
	c.status = http.StatusOK
	c.w.Header().Set("Content-Type", contentTypeEventsUTF8)
	c.w.Header().Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
	br := bufio.NewReaderSize(body, 16<<10)
	var ev []byte
	partial := false // the last line read was cut at the buffer's size
	for {
		line, err := br.ReadSlice('\n')
		ev = append(ev, line...)
		if err == bufio.ErrBufferFull {
			partial = true
			continue
		}
		if err != nil {
			if c.r.Context().Err() == nil {
				c.writeEvent(lostEvent(q.key, q.token, 4))
			}
			return
		}
		end := !partial && len(line) == 1 // a blank line ends an event
		partial = false
		if !end {
			continue
		}
		if !c.writeEvent(ev) || bytes.HasPrefix(ev, []byte("event: lost")) {
			return
		}
		ev = ev[:0]
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// rewriteWait returns body with wait_ms set to ms.
func rewriteWait(body []byte, ms int64) []byte {
	var m map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&m) != nil {
		return body
	}
	m["wait_ms"] = json.RawMessage(strconv.FormatInt(ms, 10))
	out, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return out
}
