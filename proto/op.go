package proto

import "errors"

// Op is the one-byte operation code that starts every frame.
type Op byte

// Request and response operation codes (PROTOCOL.md §2–3). Several letters
// are shared by a request and its answer (A, R, K, P); which one a frame is
// depends on its direction.
const (
	OpAcquire Op = 'A' // request: acquire; response: acquired
	OpRelease Op = 'R' // request: release; response: released
	OpRenew   Op = 'K' // request: renew; response: renewed
	OpPing    Op = 'P' // request: ping; response: pong
	OpHello   Op = 'H' // request: hello (an identity and its secret); response: welcome (PROTOCOL.md §8.3)
	OpTimeout Op = 'T' // response: wait over, nothing granted
	OpBusy    Op = 'B' // response: capacity full, nothing granted or queued
	OpNotHeld Op = 'N' // response: token is not the key's current grant
	OpMoved   Op = 'M' // response: not the active node, not executed
	OpError   Op = 'E' // response: rejected, not executed

	// PROTOCOL.md §9.
	OpShared   Op = 'S' // request: acquire shared (answered like an acquire: A, T, B)
	OpValidate Op = 'V' // request: validate a token; response: valid, with the lease time left
	OpWatch    Op = 'W' // request: watch a grant; response: watching
	OpInspect  Op = 'I' // request: inspect a key; response: inspection
	OpLost     Op = 'L' // response: a watched grant ended (pushed once per watch)
)

// String returns the op's name, e.g. "acquire" or "op(0x07)". The letters
// shared by a request and a response (A, R, K, P) are named after the
// request.
func (o Op) String() string {
	switch o {
	case OpAcquire:
		return "acquire"
	case OpRelease:
		return "release"
	case OpRenew:
		return "renew"
	case OpPing:
		return "ping"
	case OpHello:
		return "hello"
	case OpTimeout:
		return "timeout"
	case OpBusy:
		return "busy"
	case OpNotHeld:
		return "not-held"
	case OpMoved:
		return "moved"
	case OpError:
		return "error"
	case OpShared:
		return "acquire-shared"
	case OpValidate:
		return "validate"
	case OpWatch:
		return "watch"
	case OpInspect:
		return "inspect"
	case OpLost:
		return "lost"
	}
	const hex = "0123456789abcdef"
	return "op(0x" + string([]byte{hex[o>>4], hex[o&0xf]}) + ")"
}

// IsRequest reports whether o is a request op (A, R, K, P, H, S, V, W or I).
func (o Op) IsRequest() bool { return requestHeaderLen[o] != 0 }

// RequestOps lists the request ops; RequestIndex gives their positions, so
// per-op tables can be plain arrays.
var RequestOps = [...]Op{OpAcquire, OpRelease, OpRenew, OpPing, OpHello, OpShared, OpValidate, OpWatch, OpInspect}

// RequestIndex returns o's index in RequestOps, or -1 if o is not a
// request op.
func (o Op) RequestIndex() int {
	switch o {
	case OpAcquire:
		return 0
	case OpRelease:
		return 1
	case OpRenew:
		return 2
	case OpPing:
		return 3
	case OpHello:
		return 4
	case OpShared:
		return 5
	case OpValidate:
		return 6
	case OpWatch:
		return 7
	case OpInspect:
		return 8
	}
	return -1
}

// IsResponse reports whether o is a response op (A, T, B, R, K, N, P, M, E,
// H, V, W, L or I).
func (o Op) IsResponse() bool { return responseHeaderLen[o] != 0 }

// Error codes carried by an E frame (PROTOCOL.md §3, §8.3 and §9.1).
const (
	CodeBadFrame         uint8 = 1 // unknown op or no 0x0A within the longest legal frame; the connection closes
	CodeBadKey           uint8 = 2 // key empty, too long or not UTF-8
	CodeBadLease         uint8 = 3 // lease 0
	CodeShutdown         uint8 = 4 // server shutting down
	CodeUnauthenticated  uint8 = 5 // no identity in force, or a hello that failed; the connection closes
	CodePermissionDenied uint8 = 6 // the identity may not do this to this key; the connection stays open
	CodeLimitMismatch    uint8 = 7 // an acquire-shared with limit 0, or a limit other than the key's holders'; stays open
	CodeLimitReached     uint8 = 8 // a watch beyond the connection's bound; stays open

	// MaxCode is the largest error code: per-code tables have MaxCode+1
	// entries.
	MaxCode = CodeLimitReached
)

// Reasons carried by an L frame (PROTOCOL.md §9.4): why the watched grant
// ended.
const (
	ReasonReleased   uint8 = 1 // released, by any connection (the holder's own identity, or no ACL)
	ReasonExpired    uint8 = 2 // its lease ended
	ReasonForced     uint8 = 3 // released by an admin identity or the admin endpoint (forced)
	ReasonCannotTell uint8 = 4 // this member can no longer tell (shutdown, step-down, demotion, freeze)
)

// Protocol limits.
const (
	MaxKey  = 1024 // longest key, and longest tail of any frame, in bytes
	MaxWait = 255  // longest wait in seconds

	// MaxLimit is the largest limit of an acquire-shared (a u16; 0 is
	// refused, E 7).
	MaxLimit = 65535

	// MaxRequestLen is the length of the longest legal request frame: an
	// acquire-shared with a MaxKey-byte key.
	MaxRequestLen = 1 + SharedHeaderLen + MaxKey + 1
	// MaxResponseLen is the length of the longest legal response frame: an
	// inspection with a MaxKey-byte key.
	MaxResponseLen = 1 + InspectionHeaderLen + MaxKey + 1
)

// Header lengths of requests (bytes after the op byte, before the tail).
const (
	AcquireHeaderLen  = 10 // wait u8, lease u8, owner u64
	ReleaseHeaderLen  = 8  // token u64
	RenewHeaderLen    = 9  // lease u8, token u64
	PingHeaderLen     = 8  // nonce u64
	HelloHeaderLen    = 8  // nonce u64
	SharedHeaderLen   = 12 // wait u8, lease u8, owner u64, limit u16
	ValidateHeaderLen = 8  // token u64
	WatchHeaderLen    = 8  // token u64
	InspectHeaderLen  = 8  // nonce u64
)

// MaxSecret is the longest secret a hello may carry, in bytes (PROTOCOL.md
// §8.3).
const MaxSecret = 256

// Header lengths of responses (bytes after the op byte, before the tail).
const (
	AcquiredHeaderLen = 16 // owner u64, token u64
	TimeoutHeaderLen  = 8  // owner u64
	BusyHeaderLen     = 8  // owner u64
	ReleasedHeaderLen = 8  // token u64
	RenewedHeaderLen  = 8  // token u64
	NotHeldHeaderLen  = 9  // op u8, token u64
	PongHeaderLen     = 8  // nonce u64
	MovedHeaderLen    = 9  // op u8, id u64
	ErrorHeaderLen    = 10 // op u8, id u64, code u8
	WelcomeHeaderLen  = 8  // nonce u64
	ValidHeaderLen    = 12 // token u64, remaining u32 (ms)
	WatchingHeaderLen = 8  // token u64
	LostHeaderLen     = 9  // token u64, reason u8
	// InspectionHeaderLen: nonce u64, holders u16, limit u16, waiters u32,
	// token u64, remaining u32 (ms).
	InspectionHeaderLen = 28
)

// requestHeaderLen and responseHeaderLen map an op byte to its fixed header
// length; 0 marks an unknown op (every known op has a header).
var requestHeaderLen = [256]uint8{
	OpAcquire:  AcquireHeaderLen,
	OpRelease:  ReleaseHeaderLen,
	OpRenew:    RenewHeaderLen,
	OpPing:     PingHeaderLen,
	OpHello:    HelloHeaderLen,
	OpShared:   SharedHeaderLen,
	OpValidate: ValidateHeaderLen,
	OpWatch:    WatchHeaderLen,
	OpInspect:  InspectHeaderLen,
}

var responseHeaderLen = [256]uint8{
	OpAcquire:  AcquiredHeaderLen,
	OpTimeout:  TimeoutHeaderLen,
	OpBusy:     BusyHeaderLen,
	OpRelease:  ReleasedHeaderLen,
	OpRenew:    RenewedHeaderLen,
	OpNotHeld:  NotHeldHeaderLen,
	OpPing:     PongHeaderLen,
	OpMoved:    MovedHeaderLen,
	OpError:    ErrorHeaderLen,
	OpHello:    WelcomeHeaderLen,
	OpValidate: ValidHeaderLen,
	OpWatch:    WatchingHeaderLen,
	OpLost:     LostHeaderLen,
	OpInspect:  InspectionHeaderLen,
}

// RequestHeaderLen returns the fixed header length of request op o, and false
// if o is not a request op.
func RequestHeaderLen(o Op) (int, bool) {
	n := requestHeaderLen[o]
	return int(n), n != 0
}

// ResponseHeaderLen returns the fixed header length of response op o, and
// false if o is not a response op.
func ResponseHeaderLen(o Op) (int, bool) {
	n := responseHeaderLen[o]
	return int(n), n != 0
}

// Errors returned by the parsers. They are sentinel values: no allocation.
var (
	// ErrIncomplete means buf does not yet hold a whole frame; read more and call again.
	ErrIncomplete = errors.New("proto: incomplete frame")
	// ErrBadFrame is code 1: framing is lost, answer E 1 and close the connection.
	ErrBadFrame = errors.New("proto: bad frame")
	// ErrBadKey is code 2: the frame was consumed whole; answer E 2 and go on.
	ErrBadKey = errors.New("proto: bad key")
	// ErrBadLease is code 3: the frame was consumed whole; answer E 3 and go on.
	ErrBadLease = errors.New("proto: bad lease")
	// ErrBadLimit is code 7: an acquire-shared with limit 0; the frame was
	// consumed whole; answer E 7 and go on.
	ErrBadLimit = errors.New("proto: bad limit")
)

// Code returns the E-frame code for a parser error, 0 for nil or ErrIncomplete.
// Any other error, wrapped sentinels aside, also gives 0.
func Code(err error) uint8 {
	switch err {
	case nil, ErrIncomplete:
		return 0
	case ErrBadFrame:
		return CodeBadFrame
	case ErrBadKey:
		return CodeBadKey
	case ErrBadLease:
		return CodeBadLease
	case ErrBadLimit:
		return CodeLimitMismatch
	}
	switch {
	case errors.Is(err, ErrBadFrame):
		return CodeBadFrame
	case errors.Is(err, ErrBadKey):
		return CodeBadKey
	case errors.Is(err, ErrBadLease):
		return CodeBadLease
	case errors.Is(err, ErrBadLimit):
		return CodeLimitMismatch
	}
	return 0
}
