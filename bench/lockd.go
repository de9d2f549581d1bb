package main

import (
	"github.com/lockd-dev/lockd/proto"
)

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
