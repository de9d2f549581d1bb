package proto

import (
	"bytes"
	"encoding/binary"
	"unicode/utf8"
)

// Request is one decoded client frame. Key points into the parsed buffer and
// is valid only as long as that buffer is.
type Request struct {
	Op    Op     // a request op: OpAcquire, OpRelease, OpRenew, OpPing, OpHello, OpShared, OpValidate, OpWatch or OpInspect
	Wait  uint8  // acquire, acquire-shared: seconds the server may queue the request
	Lease uint8  // acquire, renew, acquire-shared: lease in seconds
	Limit uint16 // acquire-shared: the key's holder limit (1..65535)
	// ID is the owner (acquire, acquire-shared), token (release, renew,
	// validate, watch) or nonce (ping, hello, inspect); 0 if the header was
	// not read.
	ID uint64
	// Key is the key (every op but ping and hello), or for a hello the
	// whole tail (see SplitHello); a slice of the input; nil for ping.
	Key []byte
}

// ParseRequest decodes the first request frame in buf. maxKey is the server's
// key limit (1..MaxKey; values outside that range mean MaxKey).
//
// It returns the number of bytes the frame occupies and nil, or:
//   - 0, ErrIncomplete when buf holds only a prefix of a possibly valid frame;
//   - n, ErrBadKey / ErrBadLease with n the whole frame's length, and r filled
//     (Op, ID, and the other fields that were read) so the caller can answer E
//     and continue after n bytes;
//   - n, ErrBadFrame with r.Op the byte read as op and r.ID the header's id if
//     the whole fixed header was read (else 0); the caller answers E 1 and
//     closes, n is unspecified (in fact the number of bytes examined, at
//     most len(buf); it is not a frame length to skip).
//
// A hello's tail is not validated here (0..MaxKey bytes without 0x0A): what
// makes it acceptable depends on the server's ACL (PROTOCOL.md §8.3), so it
// is returned whole in r.Key and judged with SplitHello or HelloIdentity.
//
// Validation order is frame, then key, then lease, then an acquire-shared's
// limit 0 (ErrBadLimit, E 7: PROTOCOL.md §3, §9.6). A limit other than the
// key's holders' and a watch beyond its bound are decided by state, not
// here. The fixed header is consumed by count before 0x0A is looked for. It
// never allocates.
//
// A bad frame is reported as soon as the bytes at hand prove it: an unknown op
// at once, a key tail once more than MaxKey bytes are present without 0x0A,
// a ping once the byte after its header is not 0x0A. Every result depends
// only on the bytes examined, so more input never changes a decision made on
// a prefix. On ErrBadKey r.Key holds the rejected key. Key's capacity is cut
// to its length, so appending to it cannot overwrite the buffer. On
// ErrIncomplete r's contents are unspecified.
func ParseRequest(buf []byte, maxKey int, r *Request) (int, error) {
	if len(buf) == 0 {
		return 0, ErrIncomplete
	}
	op := Op(buf[0])
	*r = Request{Op: op}
	hl := int(requestHeaderLen[op])
	if hl == 0 {
		return 1, ErrBadFrame
	}
	if len(buf) < 1+hl {
		return 0, ErrIncomplete
	}
	switch op {
	case OpAcquire:
		r.Wait = buf[1]
		r.Lease = buf[2]
		r.ID = binary.BigEndian.Uint64(buf[3:11])
	case OpRenew:
		r.Lease = buf[1]
		r.ID = binary.BigEndian.Uint64(buf[2:10])
	case OpShared:
		r.Wait = buf[1]
		r.Lease = buf[2]
		r.ID = binary.BigEndian.Uint64(buf[3:11])
		r.Limit = binary.BigEndian.Uint16(buf[11:13])
	default: // OpRelease, OpPing, OpHello, OpValidate, OpWatch, OpInspect
		r.ID = binary.BigEndian.Uint64(buf[1:9])
	}
	tail := buf[1+hl:]
	if op == OpPing {
		if len(tail) == 0 {
			return 0, ErrIncomplete
		}
		if tail[0] != '\n' {
			return 1 + hl + 1, ErrBadFrame
		}
		return 1 + hl + 1, nil
	}
	i, n, err := frameEnd(tail, hl)
	if err != nil {
		return n, err
	}
	key := tail[:i:i]
	r.Key = key
	if op == OpHello {
		return n, nil
	}
	if maxKey < 1 || maxKey > MaxKey {
		maxKey = MaxKey
	}
	if i == 0 || i > maxKey || !validKey(key) {
		return n, ErrBadKey
	}
	if r.Lease == 0 && hasLease[op] {
		return n, ErrBadLease
	}
	if r.Limit == 0 && op == OpShared {
		return n, ErrBadLimit
	}
	return n, nil
}

// hasLease marks the request ops whose header carries a lease (0 is E 3).
var hasLease = [256]bool{OpAcquire: true, OpRenew: true, OpShared: true}

// frameEnd finds the 0x0A that ends a frame whose tail starts at tail and
// whose header is hl bytes long. It returns the tail's length and the whole
// frame's length, or the error and n that the parsers report.
func frameEnd(tail []byte, hl int) (i, n int, err error) {
	if len(tail) > MaxKey+1 {
		tail = tail[:MaxKey+1]
	}
	i = bytes.IndexByte(tail, '\n')
	if i < 0 {
		if len(tail) > MaxKey {
			return 0, 1 + hl + len(tail), ErrBadFrame
		}
		return 0, 0, ErrIncomplete
	}
	return i, 1 + hl + i + 1, nil
}

// validKey reports whether key is valid UTF-8. Keys are nearly always ASCII:
// it checks 8 bytes per step and leaves utf8.Valid the rest of the key from
// the first word with a byte of 0x80 or more (utf8.Valid's own ASCII path
// moves byte by byte until its pointer-sized steps pay off).
func validKey(key []byte) bool {
	const hiBits = 0x8080808080808080
	i := 0
	for ; i+8 <= len(key); i += 8 {
		if binary.LittleEndian.Uint64(key[i:])&hiBits != 0 {
			return utf8.Valid(key[i:])
		}
	}
	for ; i < len(key); i++ {
		if key[i] >= utf8.RuneSelf {
			return utf8.Valid(key[i:])
		}
	}
	return true
}

// Response is one decoded server frame. Tail points into the parsed buffer.
type Response struct {
	Op    Op // the response op
	ReqOp Op // N, M, E: the op of the request answered
	// ID is the owner (A, T, B), the token (R, K, N, V, W, L), the nonce
	// (P, H, I) or the request's id (M, E).
	ID    uint64
	Token uint64 // A: the granted token; I: the newest holder's token (for R, K, N, V, W, L the token is ID)
	Code  uint8  // E: error code
	// Reason is why a watched grant ended (L): ReasonReleased …
	// ReasonCannotTell, as read (unchecked).
	Reason uint8
	// Remaining is the lease time left in milliseconds, rounded down (V;
	// I: the newest holder's).
	Remaining uint32
	Holders   uint16 // I: the key's holders
	Limit     uint16 // I: the key's limit (0 free, 1 exclusive or shared with limit 1)
	Waiters   uint32 // I: the key's queued acquires
	Tail      []byte // key (A T B R K N V W L I), address (M), message (E), identity (H), empty (P)
}

// ParseResponse decodes the first response frame in buf, with the same
// contract as ParseRequest: (n, nil), (0, ErrIncomplete) or (n, ErrBadFrame)
// when the bytes cannot be a response (unknown op, tail longer than MaxKey
// without 0x0A, non-empty pong tail). It does not validate keys. It never
// allocates.
//
// As in ParseRequest, a bad frame is reported as soon as the bytes at hand
// prove it, n with ErrBadFrame is the number of bytes examined (at most
// len(buf)), and Tail's capacity is cut to its length. The op byte of N, M and E is
// returned in ReqOp as read, unchecked, and so is an L's reason; a pong's
// Tail is nil. On ErrIncomplete r's contents are unspecified.
func ParseResponse(buf []byte, r *Response) (int, error) {
	if len(buf) == 0 {
		return 0, ErrIncomplete
	}
	op := Op(buf[0])
	*r = Response{Op: op}
	hl := int(responseHeaderLen[op])
	if hl == 0 {
		return 1, ErrBadFrame
	}
	if len(buf) < 1+hl {
		return 0, ErrIncomplete
	}
	switch op {
	case OpAcquire:
		r.ID = binary.BigEndian.Uint64(buf[1:9])
		r.Token = binary.BigEndian.Uint64(buf[9:17])
	case OpNotHeld, OpMoved:
		r.ReqOp = Op(buf[1])
		r.ID = binary.BigEndian.Uint64(buf[2:10])
	case OpError:
		r.ReqOp = Op(buf[1])
		r.ID = binary.BigEndian.Uint64(buf[2:10])
		r.Code = buf[10]
	case OpValidate:
		r.ID = binary.BigEndian.Uint64(buf[1:9])
		r.Remaining = binary.BigEndian.Uint32(buf[9:13])
	case OpLost:
		r.ID = binary.BigEndian.Uint64(buf[1:9])
		r.Reason = buf[9]
	case OpInspect:
		r.ID = binary.BigEndian.Uint64(buf[1:9])
		r.Holders = binary.BigEndian.Uint16(buf[9:11])
		r.Limit = binary.BigEndian.Uint16(buf[11:13])
		r.Waiters = binary.BigEndian.Uint32(buf[13:17])
		r.Token = binary.BigEndian.Uint64(buf[17:25])
		r.Remaining = binary.BigEndian.Uint32(buf[25:29])
	default: // OpTimeout, OpBusy, OpRelease, OpRenew, OpPing, OpHello, OpWatch
		r.ID = binary.BigEndian.Uint64(buf[1:9])
	}
	tail := buf[1+hl:]
	if op == OpPing {
		if len(tail) == 0 {
			return 0, ErrIncomplete
		}
		if tail[0] != '\n' {
			return 1 + hl + 1, ErrBadFrame
		}
		return 1 + hl + 1, nil
	}
	i, n, err := frameEnd(tail, hl)
	if err != nil {
		return n, err
	}
	r.Tail = tail[:i:i]
	return n, nil
}

// SplitHello splits a hello's tail into the identity and the secret
// (PROTOCOL.md §8.3): the first 0x20 byte ends the identity and the rest is
// the secret verbatim, spaces included. ok is false when the tail has no
// 0x20, the identity or the secret is empty, or the secret is longer than
// MaxSecret: a server that checks hellos answers all of those E 5. It does
// not look at what the identity's bytes are (an identity that is not in the
// ACL is refused by the lookup). The results are slices of tail.
func SplitHello(tail []byte) (identity, secret []byte, ok bool) {
	i := bytes.IndexByte(tail, ' ')
	if i <= 0 || i == len(tail)-1 || len(tail)-i-1 > MaxSecret {
		return nil, nil, false
	}
	return tail[:i:i], tail[i+1:], true
}

// HelloIdentity returns the identity a hello names, for a server that does
// not check hellos (no ACL, PROTOCOL.md §8.3): the tail up to its first 0x20
// byte, or the whole tail when it has none. The result is a slice of tail.
func HelloIdentity(tail []byte) []byte {
	if i := bytes.IndexByte(tail, ' '); i >= 0 {
		return tail[:i:i]
	}
	return tail
}
