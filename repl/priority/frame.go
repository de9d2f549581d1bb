package priority

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"

	"github.com/lockd-dev/lockd/repl/priority/machine"
)

// The member link's frames (docs/MEMBER-LINK.md). Every message
// in both directions is one frame:
//
//	length u32 | type u8 | payload | crc u32
//
// big-endian; length counts type, payload and crc (so it is at least 5 and
// at most maxFrame); crc is CRC-32C (Castagnoli) of type and payload.

// Sizes of the member link.
const (
	// maxFrame bounds a frame's length field (type + payload + crc): a
	// longer frame is a protocol error. A compressed batch or snapshot
	// frame may not claim a raw size above it either (MaxRaw, the same).
	maxFrame     = 16 << 20
	frameHead    = 5 // length u32 + type u8
	frameTail    = 4 // crc u32
	minFrameLen  = 5 // type + crc
	readBufStart = 64 << 10
)

// castagnoli is the CRC-32C table (hardware-accelerated on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// msgType is a frame's type byte.
type msgType uint8

// Message types of the member link.
const (
	msgHello        msgType = 1
	msgHeartbeat    msgType = 2
	msgBatch        msgType = 3
	msgReserve      msgType = 4
	msgAck          msgType = 5
	msgSnapBegin    msgType = 6
	msgSnapShard    msgType = 7
	msgSnapEnd      msgType = 8
	msgNeedSnapshot msgType = 9
	msgHandoff      msgType = 10
	msgHandoffAbort msgType = 11
	msgSnapAck      msgType = 12
)

var msgNames = [...]string{
	msgHello:        "hello",
	msgHeartbeat:    "heartbeat",
	msgBatch:        "batch",
	msgReserve:      "reserve",
	msgAck:          "ack",
	msgSnapBegin:    "snap-begin",
	msgSnapShard:    "snap-shard",
	msgSnapEnd:      "snap-end",
	msgNeedSnapshot: "need-snapshot",
	msgHandoff:      "handoff",
	msgHandoffAbort: "handoff-abort",
	msgSnapAck:      "snap-ack",
}

// String names the message type.
func (t msgType) String() string { return machine.NameOf(msgNames[:], uint8(t), "MsgType") }

func (t msgType) valid() bool { return t >= msgHello && t <= msgSnapAck }

// Errors of the member link's frames and messages. A frameReader's protocol
// errors are final: the link must be closed (and the reason logged).
var (
	// errFrameTooLarge: a frame's length field exceeds maxFrame.
	errFrameTooLarge = errors.New("priority: frame longer than maxFrame")
	// errFrameTooShort: a frame's length field is below 5 (type + crc).
	errFrameTooShort = errors.New("priority: frame length below 5")
	// errBadCRC: a frame's CRC-32C does not match its type and payload.
	errBadCRC = errors.New("priority: frame checksum mismatch")
	// errUnknownType: a frame's type byte names no message.
	errUnknownType = errors.New("priority: unknown message type")
	// errShortPayload: a payload ends before its message's fields do.
	errShortPayload = errors.New("priority: payload too short for its message")
	// errLongPayload: a payload has bytes after its message's fields.
	errLongPayload = errors.New("priority: payload too long for its message")
	// errBadField: a field holds a value its message does not allow (an
	// unknown role, ack kind, reason or codec; a flag other than 0/1; a raw
	// length that does not fit the data).
	errBadField = errors.New("priority: invalid message field")
	// errMismatch: a peer's Hello differs from this node's (hello.Check),
	// or it speaks another protocol version (hello.Decode).
	errMismatch = errors.New("priority: peer configuration differs")
	// errNoProgress: the underlying reader returned no data and no error
	// many times in a row.
	errNoProgress = errors.New("priority: reader makes no progress")
)

// appendFrame appends a frame of type t carrying payload to dst. payload
// must be at most maxFrame-5 bytes: a longer one panics (batches and
// snapshot frames are cut at 64 KiB, far below it).
func appendFrame(dst []byte, t msgType, payload []byte) []byte {
	dst, at := beginFrame(dst, t)
	dst = append(dst, payload...)
	return endFrame(dst, at)
}

// beginFrame appends a frame header with a placeholder length and returns
// where the frame starts.
func beginFrame(dst []byte, t msgType) ([]byte, int) {
	return append(dst, 0, 0, 0, 0, byte(t)), len(dst)
}

// endFrame fills in the length of the frame that starts at at and appends
// its crc.
func endFrame(dst []byte, at int) []byte {
	n := len(dst) - at - 4 + frameTail
	if n > maxFrame {
		panic("priority: frame payload exceeds maxFrame")
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(n))
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[at+4:], castagnoli))
}

// frameReader reads frames from a byte stream that may deliver them split
// at any byte. It keeps one buffer, grown (by doubling, only as bytes
// arrive) up to the largest frame seen and reused: once grown, Next
// allocates nothing. Not safe for concurrent use.
type frameReader struct {
	r     io.Reader
	buf   []byte
	start int   // first byte not yet returned
	end   int   // end of the bytes read
	err   error // a protocol error: every later Next returns it
}

// newFrameReader returns a reader of frames from r.
func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: r, buf: make([]byte, readBufStart)}
}

// Reset makes fr read from r from scratch (a new connection), keeping its
// buffer. A zero frameReader is ready for use after Reset.
func (fr *frameReader) Reset(r io.Reader) {
	fr.r, fr.start, fr.end, fr.err = r, 0, 0, nil
	if fr.buf == nil {
		fr.buf = make([]byte, readBufStart)
	}
}

// Next returns the next frame's type and payload. The payload points into
// fr's buffer and is valid until the next call of Next or Reset.
//
// At the end of the stream between frames Next returns io.EOF, in the
// middle of one io.ErrUnexpectedEOF. A protocol error (errFrameTooLarge,
// errFrameTooShort, errBadCRC, errUnknownType) is final: Next returns it
// again on every later call. Other errors of the underlying reader (a read
// deadline) are returned as they are, and Next may be called again: the
// bytes already read are kept.
func (fr *frameReader) Next() (msgType, []byte, error) {
	if fr.err != nil {
		return 0, nil, fr.err
	}
	if err := fr.fill(4); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(fr.buf[fr.start:])
	switch {
	case n > maxFrame:
		return 0, nil, fr.fail(errFrameTooLarge)
	case n < minFrameLen:
		return 0, nil, fr.fail(errFrameTooShort)
	}
	total := 4 + int(n)
	if err := fr.fill(total); err != nil {
		return 0, nil, err
	}
	body := fr.buf[fr.start+4 : fr.start+total-frameTail]
	sum := binary.BigEndian.Uint32(fr.buf[fr.start+total-frameTail:])
	fr.start += total
	if crc32.Checksum(body, castagnoli) != sum {
		return 0, nil, fr.fail(errBadCRC)
	}
	t := msgType(body[0])
	if !t.valid() {
		return 0, nil, fr.fail(errUnknownType)
	}
	return t, body[1:], nil
}

func (fr *frameReader) fail(err error) error {
	fr.err = err
	return err
}

// fill reads until at least n bytes from fr.start are buffered. The buffer
// is compacted or doubled only when it is full.
func (fr *frameReader) fill(n int) error {
	empty := 0
	for fr.end-fr.start < n {
		if fr.end == len(fr.buf) {
			if fr.start > 0 {
				fr.end = copy(fr.buf, fr.buf[fr.start:fr.end])
				fr.start = 0
			} else {
				nb := make([]byte, min(2*len(fr.buf), 4+maxFrame))
				copy(nb, fr.buf[:fr.end])
				fr.buf = nb
			}
		}
		m, err := fr.r.Read(fr.buf[fr.end:])
		fr.end += m
		if fr.end-fr.start >= n {
			return nil // a later Read reports err again, if it persists
		}
		switch {
		case err == io.EOF && fr.end == fr.start:
			return io.EOF
		case err == io.EOF:
			return io.ErrUnexpectedEOF
		case err != nil:
			return err
		case m == 0:
			if empty++; empty >= 100 {
				return errNoProgress
			}
		default:
			empty = 0
		}
	}
	return nil
}
