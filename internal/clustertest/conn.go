package clustertest

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// DefaultConnTimeout bounds a Conn's dial, each write and each Read.
const DefaultConnTimeout = 5 * time.Second

// ErrBadResponse is a response that is not a PROTOCOL.md frame.
var ErrBadResponse = errors.New("clustertest: bad response frame")

// Conn is a raw protocol connection to a member: frames built with proto's
// AppendX functions go out as they are, responses come back parsed. It is
// for tests that check the wire (an M's address, an E's code) rather than
// the client library. Not safe for concurrent use.
type Conn struct {
	nc      net.Conn
	buf     []byte
	timeout time.Duration
}

// Dial connects to addr (127.0.0.1:port) within DefaultConnTimeout.
func Dial(addr string) (*Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, DefaultConnTimeout)
	if err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	return &Conn{nc: nc, timeout: DefaultConnTimeout}, nil
}

// SetTimeout sets how long a write or a Read may take (default 5s). After a
// Read times out the connection stays usable: an answer that comes later is
// returned by the next Read.
func (c *Conn) SetTimeout(d time.Duration) { c.timeout = d }

// Send writes frames, in one write.
func (c *Conn) Send(frames ...[]byte) error {
	var out []byte
	if len(frames) == 1 {
		out = frames[0]
	} else {
		for _, f := range frames {
			out = append(out, f...)
		}
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
	if _, err := c.nc.Write(out); err != nil {
		return fmt.Errorf("clustertest: send: %w", err)
	}
	return nil
}

// Read returns the next response, waiting up to the timeout. Its Tail is
// the caller's.
func (c *Conn) Read() (proto.Response, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(c.timeout))
	var tmp [4096]byte
	for {
		var r proto.Response
		n, err := proto.ParseResponse(c.buf, &r)
		switch {
		case err == nil:
			r.Tail = append([]byte(nil), r.Tail...)
			c.buf = append(c.buf[:0], c.buf[n:]...)
			return r, nil
		case !errors.Is(err, proto.ErrIncomplete):
			return proto.Response{}, fmt.Errorf("%w: %q: %w", ErrBadResponse, c.buf[:max(n, 1)], err)
		}
		m, err := c.nc.Read(tmp[:])
		c.buf = append(c.buf, tmp[:m]...)
		if m == 0 && err != nil {
			return proto.Response{}, fmt.Errorf("clustertest: read: %w", err)
		}
	}
}

// Do sends one request frame and returns the next response: the request's
// answer when nothing else is outstanding on the connection (a queued
// acquire's answer may come first otherwise).
func (c *Conn) Do(frame []byte) (proto.Response, error) {
	if err := c.Send(frame); err != nil {
		return proto.Response{}, err
	}
	return c.Read()
}

// Ping sends a ping with nonce and returns the answer: a pong with the
// nonce (P), or M on a member that is not the active.
func (c *Conn) Ping(nonce uint64) (proto.Response, error) {
	return c.Do(proto.AppendPing(nil, nonce))
}

// NetConn is the underlying connection (to close it abruptly, say).
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }
