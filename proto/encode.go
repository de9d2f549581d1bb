package proto

import (
	"bytes"
	"encoding/binary"
	"slices"
	"unicode/utf8"
)

// Request encoders. Each appends one whole frame to dst and returns the
// extended slice. They do not validate their arguments.

// AppendAcquire appends an acquire request.
func AppendAcquire[K ~string | ~[]byte](dst []byte, wait, lease uint8, owner uint64, key K) []byte {
	dst = slices.Grow(dst, 1+AcquireHeaderLen+len(key)+1)
	dst = append(dst, byte(OpAcquire), wait, lease)
	dst = binary.BigEndian.AppendUint64(dst, owner)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendRelease appends a release request.
func AppendRelease[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpRelease, token, key)
}

// AppendRenew appends a renew request.
func AppendRenew[K ~string | ~[]byte](dst []byte, lease uint8, token uint64, key K) []byte {
	return appendOpIDTail(dst, OpRenew, lease, token, key)
}

// AppendPing appends a ping request.
func AppendPing(dst []byte, nonce uint64) []byte {
	return appendIDTail(dst, OpPing, nonce, "")
}

// AppendHello appends a hello request: identity, one 0x20 byte, secret.
// The secret is written verbatim; callers keep it out of logs.
func AppendHello[K ~string | ~[]byte](dst []byte, nonce uint64, identity, secret K) []byte {
	dst = slices.Grow(dst, 1+HelloHeaderLen+len(identity)+1+len(secret)+1)
	dst = append(dst, byte(OpHello))
	dst = binary.BigEndian.AppendUint64(dst, nonce)
	dst = append(dst, identity...)
	dst = append(dst, ' ')
	dst = append(dst, secret...)
	return append(dst, '\n')
}

// AppendShared appends an acquire-shared request (PROTOCOL.md §9.2).
func AppendShared[K ~string | ~[]byte](dst []byte, wait, lease uint8, owner uint64, limit uint16, key K) []byte {
	dst = slices.Grow(dst, 1+SharedHeaderLen+len(key)+1)
	dst = append(dst, byte(OpShared), wait, lease)
	dst = binary.BigEndian.AppendUint64(dst, owner)
	dst = binary.BigEndian.AppendUint16(dst, limit)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendValidate appends a validate request (PROTOCOL.md §9.3).
func AppendValidate[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpValidate, token, key)
}

// AppendWatch appends a watch request (PROTOCOL.md §9.4).
func AppendWatch[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpWatch, token, key)
}

// AppendInspect appends an inspect request (PROTOCOL.md §9.5).
func AppendInspect[K ~string | ~[]byte](dst []byte, nonce uint64, key K) []byte {
	return appendIDTail(dst, OpInspect, nonce, key)
}

// Response encoders.

// AppendAcquired appends an A (acquired) response.
func AppendAcquired[K ~string | ~[]byte](dst []byte, owner, token uint64, key K) []byte {
	dst = slices.Grow(dst, 1+AcquiredHeaderLen+len(key)+1)
	dst = append(dst, byte(OpAcquire))
	dst = binary.BigEndian.AppendUint64(dst, owner)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendTimeout appends a T (timed out) response.
func AppendTimeout[K ~string | ~[]byte](dst []byte, owner uint64, key K) []byte {
	return appendIDTail(dst, OpTimeout, owner, key)
}

// AppendBusy appends a B (busy) response.
func AppendBusy[K ~string | ~[]byte](dst []byte, owner uint64, key K) []byte {
	return appendIDTail(dst, OpBusy, owner, key)
}

// AppendReleased appends an R (released) response.
func AppendReleased[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpRelease, token, key)
}

// AppendRenewed appends a K (renewed) response.
func AppendRenewed[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpRenew, token, key)
}

// AppendNotHeld appends an N (not held) response; op is OpRelease,
// OpRenew, OpValidate or OpWatch.
func AppendNotHeld[K ~string | ~[]byte](dst []byte, op Op, token uint64, key K) []byte {
	return appendOpIDTail(dst, OpNotHeld, byte(op), token, key)
}

// AppendPong appends a P (pong) response.
func AppendPong(dst []byte, nonce uint64) []byte {
	return appendIDTail(dst, OpPing, nonce, "")
}

// AppendWelcome appends an H (welcome) response naming the identity now in
// force on the connection.
func AppendWelcome[K ~string | ~[]byte](dst []byte, nonce uint64, identity K) []byte {
	return appendIDTail(dst, OpHello, nonce, identity)
}

// AppendValid appends a V (valid) response: token is a current holder of
// key with remaining milliseconds of lease left (rounded down).
func AppendValid[K ~string | ~[]byte](dst []byte, token uint64, remaining uint32, key K) []byte {
	dst = slices.Grow(dst, 1+ValidHeaderLen+len(key)+1)
	dst = append(dst, byte(OpValidate))
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint32(dst, remaining)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendWatching appends a W (watching) response: the watch is registered.
func AppendWatching[K ~string | ~[]byte](dst []byte, token uint64, key K) []byte {
	return appendIDTail(dst, OpWatch, token, key)
}

// AppendLost appends an L (grant ended) frame, pushed once per watch, with
// the reason the grant ended (ReasonReleased … ReasonCannotTell).
func AppendLost[K ~string | ~[]byte](dst []byte, token uint64, reason uint8, key K) []byte {
	dst = slices.Grow(dst, 1+LostHeaderLen+len(key)+1)
	dst = append(dst, byte(OpLost))
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = append(dst, reason)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendInspection appends an I (inspection) response: the key's holders,
// its limit (0 free, 1 exclusive), its waiters, and the newest holder's
// token and milliseconds of lease left (0 and 0 when free).
func AppendInspection[K ~string | ~[]byte](dst []byte, nonce uint64, holders, limit uint16, waiters uint32, token uint64, remaining uint32, key K) []byte {
	dst = slices.Grow(dst, 1+InspectionHeaderLen+len(key)+1)
	dst = append(dst, byte(OpInspect))
	dst = binary.BigEndian.AppendUint64(dst, nonce)
	dst = binary.BigEndian.AppendUint16(dst, holders)
	dst = binary.BigEndian.AppendUint16(dst, limit)
	dst = binary.BigEndian.AppendUint32(dst, waiters)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint32(dst, remaining)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendMoved appends an M (moved) response naming the active's address.
// An empty addr means no active is known yet.
func AppendMoved[K ~string | ~[]byte](dst []byte, op Op, id uint64, addr K) []byte {
	return appendOpIDTail(dst, OpMoved, byte(op), id, addr)
}

// AppendError appends an E (error) response. Any 0x0A in msg is replaced by a
// space so the frame stays well formed, and a msg longer than MaxKey bytes is
// cut to at most MaxKey bytes, at a rune boundary when msg is UTF-8, so every
// E frame it writes is one that ParseResponse accepts.
func AppendError[K ~string | ~[]byte](dst []byte, op Op, id uint64, code uint8, msg K) []byte {
	if len(msg) > MaxKey {
		cut := MaxKey
		// Back up over at most UTFMax-1 continuation bytes to a rune start.
		for j := MaxKey; j > MaxKey-utf8.UTFMax && j > 0; j-- {
			if utf8.RuneStart(msg[j]) {
				cut = j
				break
			}
		}
		msg = msg[:cut]
	}
	dst = slices.Grow(dst, 1+ErrorHeaderLen+len(msg)+1)
	dst = append(dst, byte(OpError), byte(op))
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, code)
	start := len(dst)
	dst = append(dst, msg...)
	for t := dst[start:]; ; {
		i := bytes.IndexByte(t, '\n')
		if i < 0 {
			break
		}
		t[i] = ' '
		t = t[i+1:]
	}
	return append(dst, '\n')
}

// appendIDTail appends op | id u64 | tail | 0x0A.
func appendIDTail[K ~string | ~[]byte](dst []byte, op Op, id uint64, tail K) []byte {
	dst = slices.Grow(dst, 1+8+len(tail)+1)
	dst = append(dst, byte(op))
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, tail...)
	return append(dst, '\n')
}

// appendOpIDTail appends op | b u8 | id u64 | tail | 0x0A.
func appendOpIDTail[K ~string | ~[]byte](dst []byte, op Op, b byte, id uint64, tail K) []byte {
	dst = slices.Grow(dst, 1+1+8+len(tail)+1)
	dst = append(dst, byte(op), b)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, tail...)
	return append(dst, '\n')
}
