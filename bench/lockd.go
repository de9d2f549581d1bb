package main

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/proto"
)

// The lockd-acl target's identity (PROTOCOL.md §8.2): a client whose keys
// are three prefixes, the benchmark's last, so that every request pays for
// a prefix walk that does not stop at the first.
const (
	benchIdentity = "bench"
	benchSecret   = "bench-secret-0123456789abcdef"
	benchKeys     = "orders/,jobs/,bench/"
)

// benchACL is the lockd-acl server's identity file.
func benchACL() (*acl.ACL, error) {
	return acl.Parse("bench-acl", []byte(benchIdentity+" "+acl.Digest([]byte(benchSecret))+" "+benchKeys+" client\n"))
}

// benchHello is the hello the load generator sends first on every
// connection to lockd-acl.
func benchHello() []byte { return proto.AppendHello(nil, 1, benchIdentity, benchSecret) }

// sayHello writes hello on a new connection and reads its answer, which
// must be a welcome: before the load starts, so the codec never sees it.
func sayHello(nc net.Conn, hello []byte) error {
	if _, err := nc.Write(hello); err != nil {
		return err
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetReadDeadline(time.Time{})
	var (
		buf [256]byte
		n   int
		r   proto.Response
	)
	for {
		m, err := nc.Read(buf[n:])
		n += m
		if _, perr := proto.ParseResponse(buf[:n], &r); perr == nil {
			if r.Op != proto.OpHello {
				return errors.New("hello refused: " + string(r.Tail))
			}
			return nil
		} else if perr != proto.ErrIncomplete || n == len(buf) {
			return perr
		}
		if err != nil {
			if err == io.EOF {
				return errors.New("connection closed after the hello")
			}
			return err
		}
	}
}

// lockdCodec speaks the lockd protocol (also to the echo server). An
// acquire's owner carries the slot index in its low 24 bits; release and
// renew answers are routed by token.
type lockdCodec struct {
	seq    uint64
	tokens map[uint64]int32 // token → slot, while granted
	resp   proto.Response
}

const slotBits = 24

func newLockdCodec() codec { return &lockdCodec{tokens: make(map[uint64]int32)} }

func (c *lockdCodec) encode(dst []byte, s *slot, a action) []byte {
	switch a.op {
	case opAcquire:
		c.seq++
		if a.limit > 0 { // a semaphore's permit: S (PROTOCOL.md §9.2), answered like A
			return proto.AppendShared(dst, a.wait, a.lease, c.seq<<slotBits|uint64(s.local), a.limit, a.key)
		}
		return proto.AppendAcquire(dst, a.wait, a.lease, c.seq<<slotBits|uint64(s.local), a.key)
	case opRelease:
		c.tokens[a.token] = int32(s.local)
		return proto.AppendRelease(dst, a.token, a.key)
	case opRenew:
		c.tokens[a.token] = int32(s.local)
		return proto.AppendRenew(dst, a.lease, a.token, a.key)
	}
	return dst
}

func (c *lockdCodec) decode(in []byte, a *answer) (int, error) {
	n, err := proto.ParseResponse(in, &c.resp)
	if err == proto.ErrIncomplete {
		return 0, errIncomplete
	}
	if err != nil {
		return 0, err
	}
	r := &c.resp
	*a = answer{slot: -1}
	bySlot := func() { a.slot = int(r.ID & (1<<slotBits - 1)) }
	byToken := func() {
		if s, ok := c.tokens[r.ID]; ok {
			a.slot = int(s)
			delete(c.tokens, r.ID)
		}
	}
	switch r.Op {
	case proto.OpAcquire:
		a.kind, a.token = ansGranted, r.Token
		bySlot()
	case proto.OpTimeout, proto.OpBusy:
		a.kind = ansRefused
		bySlot()
	case proto.OpRelease:
		a.kind = ansReleased
		byToken()
	case proto.OpRenew:
		a.kind = ansRenewed
		byToken()
	case proto.OpNotHeld:
		a.kind = ansNotHeld
		byToken()
	case proto.OpError, proto.OpMoved:
		a.kind = ansError
		if r.ReqOp == proto.OpAcquire {
			bySlot()
		} else {
			byToken()
		}
	default:
		a.kind = ansError
	}
	return n, nil
}
