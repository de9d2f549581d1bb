package proto

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"
)

// Raw frame builders. They concatenate bytes by hand, independently of the
// encoders under test.

func be64(v uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return string(b[:])
}

func rawAcquire(wait, lease byte, owner uint64, key string) string {
	return "A" + string([]byte{wait, lease}) + be64(owner) + key + "\n"
}

func rawRelease(token uint64, key string) string { return "R" + be64(token) + key + "\n" }

func rawRenew(lease byte, token uint64, key string) string {
	return "K" + string([]byte{lease}) + be64(token) + key + "\n"
}

func rawPing(nonce uint64) string { return "P" + be64(nonce) + "\n" }

func be16(v uint16) string { return string([]byte{byte(v >> 8), byte(v)}) }

func be32(v uint32) string {
	return string([]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func rawShared(wait, lease byte, owner uint64, limit uint16, key string) string {
	return "S" + string([]byte{wait, lease}) + be64(owner) + be16(limit) + key + "\n"
}

func rawValid(token uint64, remaining uint32, key string) string {
	return "V" + be64(token) + be32(remaining) + key + "\n"
}

func rawLost(token uint64, reason byte, key string) string {
	return "L" + be64(token) + string([]byte{reason}) + key + "\n"
}

func rawInspection(nonce uint64, holders, limit uint16, waiters uint32, token uint64, remaining uint32, key string) string {
	return "I" + be64(nonce) + be16(holders) + be16(limit) + be32(waiters) + be64(token) + be32(remaining) + key + "\n"
}

func rawAcquired(owner, token uint64, key string) string {
	return "A" + be64(owner) + be64(token) + key + "\n"
}

func rawIDTail(op byte, id uint64, tail string) string {
	return string([]byte{op}) + be64(id) + tail + "\n"
}

func rawOpIDTail(op, reqOp byte, id uint64, tail string) string {
	return string([]byte{op, reqOp}) + be64(id) + tail + "\n"
}

func rawError(reqOp byte, id uint64, code byte, msg string) string {
	return string([]byte{'E', reqOp}) + be64(id) + string([]byte{code}) + msg + "\n"
}

// nl8 is an id whose every byte is 0x0A.
const nl8 = 0x0A0A0A0A0A0A0A0A

// within reports whether the non-empty or non-nil slice s points into buf.
func within(s, buf []byte) bool {
	if len(buf) == 0 {
		return false
	}
	b := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	return p >= b && p+uintptr(len(s)) <= b+uintptr(len(buf))
}

func sameRequest(a, b *Request) bool {
	return a.Op == b.Op && a.Wait == b.Wait && a.Lease == b.Lease && a.Limit == b.Limit && a.ID == b.ID &&
		bytes.Equal(a.Key, b.Key) && (a.Key == nil) == (b.Key == nil)
}

func sameResponse(a, b *Response) bool {
	return a.Op == b.Op && a.ReqOp == b.ReqOp && a.ID == b.ID && a.Token == b.Token &&
		a.Code == b.Code && a.Reason == b.Reason && a.Remaining == b.Remaining && a.Holders == b.Holders &&
		a.Limit == b.Limit && a.Waiters == b.Waiters &&
		bytes.Equal(a.Tail, b.Tail) && (a.Tail == nil) == (b.Tail == nil)
}

// encodeRequest re-encodes a parsed request with the matching encoder.
func encodeRequest(t testing.TB, dst []byte, r *Request) []byte {
	t.Helper()
	switch r.Op {
	case OpAcquire:
		return AppendAcquire(dst, r.Wait, r.Lease, r.ID, r.Key)
	case OpRelease:
		return AppendRelease(dst, r.ID, r.Key)
	case OpRenew:
		return AppendRenew(dst, r.Lease, r.ID, r.Key)
	case OpPing:
		return AppendPing(dst, r.ID)
	case OpHello:
		return appendIDTail(dst, OpHello, r.ID, r.Key) // the raw tail, space or not
	case OpShared:
		return AppendShared(dst, r.Wait, r.Lease, r.ID, r.Limit, r.Key)
	case OpValidate:
		return AppendValidate(dst, r.ID, r.Key)
	case OpWatch:
		return AppendWatch(dst, r.ID, r.Key)
	case OpInspect:
		return AppendInspect(dst, r.ID, r.Key)
	}
	t.Fatalf("encodeRequest: op %v", r.Op)
	return nil
}

// encodeResponse re-encodes a parsed response with the matching encoder.
func encodeResponse(t testing.TB, dst []byte, r *Response) []byte {
	t.Helper()
	switch r.Op {
	case OpAcquire:
		return AppendAcquired(dst, r.ID, r.Token, r.Tail)
	case OpTimeout:
		return AppendTimeout(dst, r.ID, r.Tail)
	case OpBusy:
		return AppendBusy(dst, r.ID, r.Tail)
	case OpRelease:
		return AppendReleased(dst, r.ID, r.Tail)
	case OpRenew:
		return AppendRenewed(dst, r.ID, r.Tail)
	case OpNotHeld:
		return AppendNotHeld(dst, r.ReqOp, r.ID, r.Tail)
	case OpPing:
		return AppendPong(dst, r.ID)
	case OpMoved:
		return AppendMoved(dst, r.ReqOp, r.ID, r.Tail)
	case OpError:
		return AppendError(dst, r.ReqOp, r.ID, r.Code, r.Tail)
	case OpHello:
		return AppendWelcome(dst, r.ID, r.Tail)
	case OpValidate:
		return AppendValid(dst, r.ID, r.Remaining, r.Tail)
	case OpWatch:
		return AppendWatching(dst, r.ID, r.Tail)
	case OpLost:
		return AppendLost(dst, r.ID, r.Reason, r.Tail)
	case OpInspect:
		return AppendInspection(dst, r.ID, r.Holders, r.Limit, r.Waiters, r.Token, r.Remaining, r.Tail)
	}
	t.Fatalf("encodeResponse: op %v", r.Op)
	return nil
}
