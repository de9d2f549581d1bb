package repl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/lockd-dev/lockd/repl/records"
)

// The member link's frames (docs: member-link wire format). Every message
// in both directions is one frame:
//
//	length u32 | type u8 | payload | crc u32
//
// big-endian; length counts type, payload and crc (so it is at least 5 and
// at most MaxFrame); crc is CRC-32C (Castagnoli) of type and payload.

// Sizes of the member link.
const (
	// MaxFrame bounds a frame's length field (type + payload + crc): a
	// longer frame is a protocol error. A compressed batch or snapshot
	// frame may not claim a raw size above it either (MaxRaw, the same).
	MaxFrame = 16 << 20
	// ProtocolVersion is the member-link version this code speaks (Hello).
	ProtocolVersion = 1

	frameHead    = 5 // length u32 + type u8
	frameTail    = 4 // crc u32
	minFrameLen  = 5 // type + crc
	readBufStart = 64 << 10
)

// castagnoli is the CRC-32C table (hardware-accelerated on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MsgType is a frame's type byte.
type MsgType uint8

// Message types of the member link.
const (
	MsgHello        MsgType = 1
	MsgHeartbeat    MsgType = 2
	MsgBatch        MsgType = 3
	MsgReserve      MsgType = 4
	MsgAck          MsgType = 5
	MsgSnapBegin    MsgType = 6
	MsgSnapShard    MsgType = 7
	MsgSnapEnd      MsgType = 8
	MsgNeedSnapshot MsgType = 9
	MsgHandoff      MsgType = 10
)

var msgNames = [...]string{
	MsgHello:        "hello",
	MsgHeartbeat:    "heartbeat",
	MsgBatch:        "batch",
	MsgReserve:      "reserve",
	MsgAck:          "ack",
	MsgSnapBegin:    "snap-begin",
	MsgSnapShard:    "snap-shard",
	MsgSnapEnd:      "snap-end",
	MsgNeedSnapshot: "need-snapshot",
	MsgHandoff:      "handoff",
}

// String names the message type.
func (t MsgType) String() string {
	if t.valid() {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

func (t MsgType) valid() bool { return t >= MsgHello && t <= MsgHandoff }

// Errors of the member link's frames and messages. A FrameReader's protocol
// errors are final: the link must be closed (and the reason logged).
var (
	// ErrFrameTooLarge: a frame's length field exceeds MaxFrame.
	ErrFrameTooLarge = errors.New("repl: frame longer than MaxFrame")
	// ErrFrameTooShort: a frame's length field is below 5 (type + crc).
	ErrFrameTooShort = errors.New("repl: frame length below 5")
	// ErrBadCRC: a frame's CRC-32C does not match its type and payload.
	ErrBadCRC = errors.New("repl: frame checksum mismatch")
	// ErrUnknownType: a frame's type byte names no message.
	ErrUnknownType = errors.New("repl: unknown message type")
	// ErrShortPayload: a payload ends before its message's fields do.
	ErrShortPayload = errors.New("repl: payload too short for its message")
	// ErrLongPayload: a payload has bytes after its message's fields.
	ErrLongPayload = errors.New("repl: payload too long for its message")
	// ErrBadField: a field holds a value its message does not allow (an
	// unknown role, ack kind, reason or codec; a flag other than 0/1; a raw
	// length that does not fit the data).
	ErrBadField = errors.New("repl: invalid message field")
	// ErrMismatch: a peer's Hello differs from this node's (Hello.Check),
	// or it speaks another protocol version (Hello.Decode).
	ErrMismatch = errors.New("repl: peer configuration differs")
	// ErrNoProgress: the underlying reader returned no data and no error
	// many times in a row.
	ErrNoProgress = errors.New("repl: reader makes no progress")
)

// AppendFrame appends a frame of type t carrying payload to dst. payload
// must be at most MaxFrame-5 bytes: a longer one panics (batches and
// snapshot frames are cut at 64 KiB, far below it).
func AppendFrame(dst []byte, t MsgType, payload []byte) []byte {
	dst, at := beginFrame(dst, t)
	dst = append(dst, payload...)
	return endFrame(dst, at)
}

// beginFrame appends a frame header with a placeholder length and returns
// where the frame starts.
func beginFrame(dst []byte, t MsgType) ([]byte, int) {
	return append(dst, 0, 0, 0, 0, byte(t)), len(dst)
}

// endFrame fills in the length of the frame that starts at at and appends
// its crc.
func endFrame(dst []byte, at int) []byte {
	n := len(dst) - at - 4 + frameTail
	if n > MaxFrame {
		panic("repl: frame payload exceeds MaxFrame")
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(n))
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[at+4:], castagnoli))
}

// FrameReader reads frames from a byte stream that may deliver them split
// at any byte. It keeps one buffer, grown (by doubling, only as bytes
// arrive) up to the largest frame seen and reused: once grown, Next
// allocates nothing. Not safe for concurrent use.
type FrameReader struct {
	r     io.Reader
	buf   []byte
	start int   // first byte not yet returned
	end   int   // end of the bytes read
	err   error // a protocol error: every later Next returns it
}

// NewFrameReader returns a reader of frames from r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: r, buf: make([]byte, readBufStart)}
}

// Reset makes fr read from r from scratch (a new connection), keeping its
// buffer. A zero FrameReader is ready for use after Reset.
func (fr *FrameReader) Reset(r io.Reader) {
	fr.r, fr.start, fr.end, fr.err = r, 0, 0, nil
	if fr.buf == nil {
		fr.buf = make([]byte, readBufStart)
	}
}

// Next returns the next frame's type and payload. The payload points into
// fr's buffer and is valid until the next call of Next or Reset.
//
// At the end of the stream between frames Next returns io.EOF, in the
// middle of one io.ErrUnexpectedEOF. A protocol error (ErrFrameTooLarge,
// ErrFrameTooShort, ErrBadCRC, ErrUnknownType) is final: Next returns it
// again on every later call. Other errors of the underlying reader (a read
// deadline) are returned as they are, and Next may be called again: the
// bytes already read are kept.
func (fr *FrameReader) Next() (MsgType, []byte, error) {
	if fr.err != nil {
		return 0, nil, fr.err
	}
	if err := fr.fill(4); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(fr.buf[fr.start:])
	switch {
	case n > MaxFrame:
		return 0, nil, fr.fail(ErrFrameTooLarge)
	case n < minFrameLen:
		return 0, nil, fr.fail(ErrFrameTooShort)
	}
	total := 4 + int(n)
	if err := fr.fill(total); err != nil {
		return 0, nil, err
	}
	body := fr.buf[fr.start+4 : fr.start+total-frameTail]
	sum := binary.BigEndian.Uint32(fr.buf[fr.start+total-frameTail:])
	fr.start += total
	if crc32.Checksum(body, castagnoli) != sum {
		return 0, nil, fr.fail(ErrBadCRC)
	}
	t := MsgType(body[0])
	if !t.valid() {
		return 0, nil, fr.fail(ErrUnknownType)
	}
	return t, body[1:], nil
}

func (fr *FrameReader) fail(err error) error {
	fr.err = err
	return err
}

// fill reads until at least n bytes from fr.start are buffered. The buffer
// is compacted or doubled only when it is full.
func (fr *FrameReader) fill(n int) error {
	empty := 0
	for fr.end-fr.start < n {
		if fr.end == len(fr.buf) {
			if fr.start > 0 {
				fr.end = copy(fr.buf, fr.buf[fr.start:fr.end])
				fr.start = 0
			} else {
				nb := make([]byte, min(2*len(fr.buf), 4+MaxFrame))
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
				return ErrNoProgress
			}
		default:
			empty = 0
		}
	}
	return nil
}

// ClusterMode is a cluster's mode as Hello carries it.
type ClusterMode uint8

// Cluster modes.
const (
	ModePriority ClusterMode = 1
	ModeRaft     ClusterMode = 2
)

// String names the mode as --cluster spells it.
func (m ClusterMode) String() string {
	switch m {
	case ModePriority:
		return "priority"
	case ModeRaft:
		return "raft"
	}
	return fmt.Sprintf("ClusterMode(%d)", uint8(m))
}

// Hello opens every link in both directions; a member refuses a peer whose
// Hello differs from its own (Check).
type Hello struct {
	Version    uint16      // ProtocolVersion
	Mode       ClusterMode // --cluster
	Members    uint8       // entries of --peers
	Self       uint8       // the sender's index in --peers
	Offset     uint32      // --peer-offset
	Shards     uint32      // the lock table's shard count
	FailoverMS uint32      // --failover-timeout in milliseconds
}

const helloLen = 2 + 1 + 1 + 1 + 4 + 4 + 4

// Append appends h as a complete frame to dst.
func (h *Hello) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgHello)
	dst = binary.BigEndian.AppendUint16(dst, h.Version)
	dst = append(dst, byte(h.Mode), h.Members, h.Self)
	dst = binary.BigEndian.AppendUint32(dst, h.Offset)
	dst = binary.BigEndian.AppendUint32(dst, h.Shards)
	dst = binary.BigEndian.AppendUint32(dst, h.FailoverMS)
	return endFrame(dst, at)
}

// Decode decodes a Hello payload. A peer speaking another protocol version
// gets an error wrapping ErrMismatch that names both versions, and h holds
// only its Version; the rest of such a payload is not read (its layout
// may differ).
func (h *Hello) Decode(p []byte) error {
	if len(p) < 2 {
		return ErrShortPayload
	}
	if v := binary.BigEndian.Uint16(p); v != ProtocolVersion {
		*h = Hello{Version: v}
		return fmt.Errorf("%w: protocol version %d, here %d", ErrMismatch, v, ProtocolVersion)
	}
	if err := fixedLen(p, helloLen); err != nil {
		return err
	}
	*h = Hello{
		Version:    binary.BigEndian.Uint16(p),
		Mode:       ClusterMode(p[2]),
		Members:    p[3],
		Self:       p[4],
		Offset:     binary.BigEndian.Uint32(p[5:]),
		Shards:     binary.BigEndian.Uint32(p[9:]),
		FailoverMS: binary.BigEndian.Uint32(p[13:]),
	}
	return nil
}

// Check compares a peer's Hello (h) with this node's (local). It returns
// nil when they agree, else an error wrapping ErrMismatch that names every
// field that differs, with both values: protocol version, mode, member
// count, peer offset, shard count, failover timeout; and a peer index that
// is outside the member list or equal to this node's own.
func (h *Hello) Check(local Hello) error {
	var b strings.Builder
	diff := func(format string, args ...any) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, format, args...)
	}
	if h.Version != local.Version {
		diff("protocol version %d (here %d)", h.Version, local.Version)
	}
	if h.Mode != local.Mode {
		diff("mode %v (here %v)", h.Mode, local.Mode)
	}
	if h.Members != local.Members {
		diff("%d members (here %d)", h.Members, local.Members)
	}
	if h.Offset != local.Offset {
		diff("peer offset %d (here %d)", h.Offset, local.Offset)
	}
	if h.Shards != local.Shards {
		diff("%d shards (here %d)", h.Shards, local.Shards)
	}
	if h.FailoverMS != local.FailoverMS {
		diff("failover timeout %dms (here %dms)", h.FailoverMS, local.FailoverMS)
	}
	switch {
	case h.Self >= h.Members:
		diff("member index %d outside its %d members", h.Self, h.Members)
	case h.Self == local.Self:
		diff("member index %d is this node's own", h.Self)
	}
	if b.Len() == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrMismatch, b.String())
}

// HeartbeatRole is a member's role as its heartbeats say it.
type HeartbeatRole uint8

// Heartbeat roles.
const (
	RoleStandby  HeartbeatRole = 1 // follows an active (or none is known yet)
	RoleActive   HeartbeatRole = 2 // executes requests and streams its changes
	RoleHandover HeartbeatRole = 3 // an active handing its work to a successor: executes nothing
	RoleLeaving  HeartbeatRole = 4 // shutting down: count it as not live at once
)

// String names the role.
func (r HeartbeatRole) String() string {
	switch r {
	case RoleStandby:
		return "standby"
	case RoleActive:
		return "active"
	case RoleHandover:
		return "handing-over"
	case RoleLeaving:
		return "leaving"
	}
	return fmt.Sprintf("HeartbeatRole(%d)", uint8(r))
}

// NoActive is Heartbeat.Active when the sender follows no active.
const NoActive = 255

// Heartbeat is what every member sends every other member periodically.
type Heartbeat struct {
	Epoch       uint64
	Role        HeartbeatRole
	Active      uint8 // index of the active the sender follows, NoActive if none
	InSync      bool
	Probe       uint64 // the sender's heartbeat number
	Echo        uint64 // the highest Probe received from the receiver
	TokenLast   uint64
	Reserved    uint64
	StoredEpoch uint64 // the epoch in the sender's data directory
	LagNS       uint64 // active to a standby in its stream: the age of the oldest batch it has not acknowledged; else 0
}

const heartbeatLen = 8 + 3 + 6*8

// Append appends hb as a complete frame to dst.
func (hb *Heartbeat) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgHeartbeat)
	dst = binary.BigEndian.AppendUint64(dst, hb.Epoch)
	dst = append(dst, byte(hb.Role), hb.Active, boolByte(hb.InSync))
	dst = binary.BigEndian.AppendUint64(dst, hb.Probe)
	dst = binary.BigEndian.AppendUint64(dst, hb.Echo)
	dst = binary.BigEndian.AppendUint64(dst, hb.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, hb.Reserved)
	dst = binary.BigEndian.AppendUint64(dst, hb.StoredEpoch)
	dst = binary.BigEndian.AppendUint64(dst, hb.LagNS)
	return endFrame(dst, at)
}

// Decode decodes a Heartbeat payload.
func (hb *Heartbeat) Decode(p []byte) error {
	if err := fixedLen(p, heartbeatLen); err != nil {
		return err
	}
	role := HeartbeatRole(p[8])
	insync, ok := byteBool(p[10])
	if role < RoleStandby || role > RoleLeaving || !ok {
		return ErrBadField
	}
	*hb = Heartbeat{
		Epoch:       binary.BigEndian.Uint64(p),
		Role:        role,
		Active:      p[9],
		InSync:      insync,
		Probe:       binary.BigEndian.Uint64(p[11:]),
		Echo:        binary.BigEndian.Uint64(p[19:]),
		TokenLast:   binary.BigEndian.Uint64(p[27:]),
		Reserved:    binary.BigEndian.Uint64(p[35:]),
		StoredEpoch: binary.BigEndian.Uint64(p[43:]),
		LagNS:       binary.BigEndian.Uint64(p[51:]),
	}
	return nil
}

// Batch is a frame of the replication stream: records (see BatchWriter),
// encoded by Codec. AppendBatch builds one from raw records; Raw returns
// them.
type Batch struct {
	Seq    uint64 // batch number on this stream: 1, 2, 3, …
	Codec  records.Codec
	RawLen uint32 // length of the raw records
	Data   []byte // the records as Codec encodes them; after Decode it points into the payload
}

const batchHead = 8 + 1 + 4

// AppendBatch appends to dst a Batch frame numbered seq that carries the
// raw records, compressed as Compress decides. raw must be at most
// MaxFrame-32 bytes (batches are cut at 64 KiB).
func AppendBatch(dst []byte, seq uint64, raw []byte) []byte {
	dst, at := beginFrame(dst, MsgBatch)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(raw)))
	codec, dst := records.Compress(dst, raw)
	dst[at+frameHead+8] = byte(codec)
	return endFrame(dst, at)
}

// Append appends b as a complete frame to dst, with Data as it is.
func (b *Batch) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgBatch)
	dst = binary.BigEndian.AppendUint64(dst, b.Seq)
	dst = append(dst, byte(b.Codec))
	dst = binary.BigEndian.AppendUint32(dst, b.RawLen)
	dst = append(dst, b.Data...)
	return endFrame(dst, at)
}

// Decode decodes a Batch payload; b.Data points into p. It checks the
// codec and, for raw data, that RawLen is the data's length; for
// compressed data, that RawLen is at most MaxFrame.
func (b *Batch) Decode(p []byte) error {
	if len(p) < batchHead {
		return ErrShortPayload
	}
	codec, raw, data := records.Codec(p[8]), binary.BigEndian.Uint32(p[9:]), p[batchHead:]
	if err := checkCodec(codec, raw, data); err != nil {
		return err
	}
	*b = Batch{Seq: binary.BigEndian.Uint64(p), Codec: codec, RawLen: raw, Data: data}
	return nil
}

// Raw returns b's raw records, decompressed into dst's memory when they
// are compressed (see Decompress).
func (b *Batch) Raw(dst []byte) ([]byte, error) {
	return records.Decompress(dst, b.Codec, b.Data, int(b.RawLen))
}

// checkCodec validates a codec and its raw length against the data.
func checkCodec(c records.Codec, rawLen uint32, data []byte) error {
	switch {
	case c == records.CodecRaw && int(rawLen) == len(data):
	case c == records.CodecS2 && rawLen <= MaxFrame && len(data) > 0:
	default:
		return ErrBadField
	}
	return nil
}

// Reserve tells a standby that tokens up to Limit are reserved by the
// active: it records that durably, then acks (AckReserve with ID).
type Reserve struct {
	ID    uint64
	Limit uint64
}

// Append appends r as a complete frame to dst.
func (r *Reserve) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgReserve)
	dst = binary.BigEndian.AppendUint64(dst, r.ID)
	dst = binary.BigEndian.AppendUint64(dst, r.Limit)
	return endFrame(dst, at)
}

// Decode decodes a Reserve payload.
func (r *Reserve) Decode(p []byte) error {
	if err := fixedLen(p, 16); err != nil {
		return err
	}
	*r = Reserve{ID: binary.BigEndian.Uint64(p), Limit: binary.BigEndian.Uint64(p[8:])}
	return nil
}

// AckKind says what an Ack acknowledges.
type AckKind uint8

// Ack kinds.
const (
	AckBatch    AckKind = 1 // Value: the batch's Seq
	AckReserve  AckKind = 2 // Value: the Reserve's ID
	AckSnapshot AckKind = 3 // snapshot applied; Value: the epoch
	AckHandoff  AckKind = 4 // handoff done; Value: the epoch
)

// String names the ack kind.
func (k AckKind) String() string {
	switch k {
	case AckBatch:
		return "batch"
	case AckReserve:
		return "reserve"
	case AckSnapshot:
		return "snapshot"
	case AckHandoff:
		return "handoff"
	}
	return fmt.Sprintf("AckKind(%d)", uint8(k))
}

// Ack acknowledges a batch, a reservation, a snapshot or a handoff.
type Ack struct {
	Kind  AckKind
	Value uint64
}

// Append appends a as a complete frame to dst.
func (a *Ack) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgAck)
	dst = append(dst, byte(a.Kind))
	dst = binary.BigEndian.AppendUint64(dst, a.Value)
	return endFrame(dst, at)
}

// Decode decodes an Ack payload.
func (a *Ack) Decode(p []byte) error {
	if err := fixedLen(p, 9); err != nil {
		return err
	}
	k := AckKind(p[0])
	if k < AckBatch || k > AckHandoff {
		return ErrBadField
	}
	*a = Ack{Kind: k, Value: binary.BigEndian.Uint64(p[1:])}
	return nil
}

// SnapBegin opens a snapshot: SnapShard frames follow, then SnapEnd.
type SnapBegin struct {
	Epoch     uint64
	Shards    uint32
	TokenLast uint64
	Reserved  uint64
	Locks     uint64 // total held keys (informative)
}

// Append appends s as a complete frame to dst.
func (s *SnapBegin) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgSnapBegin)
	dst = binary.BigEndian.AppendUint64(dst, s.Epoch)
	dst = binary.BigEndian.AppendUint32(dst, s.Shards)
	dst = binary.BigEndian.AppendUint64(dst, s.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, s.Reserved)
	dst = binary.BigEndian.AppendUint64(dst, s.Locks)
	return endFrame(dst, at)
}

// Decode decodes a SnapBegin payload.
func (s *SnapBegin) Decode(p []byte) error {
	if err := fixedLen(p, 8+4+3*8); err != nil {
		return err
	}
	*s = SnapBegin{
		Epoch:     binary.BigEndian.Uint64(p),
		Shards:    binary.BigEndian.Uint32(p[8:]),
		TokenLast: binary.BigEndian.Uint64(p[12:]),
		Reserved:  binary.BigEndian.Uint64(p[20:]),
		Locks:     binary.BigEndian.Uint64(p[28:]),
	}
	return nil
}

// SnapShard carries snapshot entries (AppendSnapEntry) of one shard, cut
// at Seq; a shard's entries may span several frames, the last with Last.
type SnapShard struct {
	Shard  uint32
	Seq    uint64 // the shard's record Seq the dump was cut at
	Last   bool   // the shard's last frame
	Codec  records.Codec
	RawLen uint32 // length of the raw entries
	Data   []byte // the entries as Codec encodes them; after Decode it points into the payload
}

const snapShardHead = 4 + 8 + 1 + 1 + 4

// AppendSnapShard appends to dst a SnapShard frame of shard, cut at seq,
// carrying the raw entries compressed as Compress decides. raw must be at
// most MaxFrame-32 bytes (snapshot frames are cut at 64 KiB).
func AppendSnapShard(dst []byte, shard uint32, seq uint64, last bool, raw []byte) []byte {
	dst, at := beginFrame(dst, MsgSnapShard)
	dst = binary.BigEndian.AppendUint32(dst, shard)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = append(dst, boolByte(last), 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(raw)))
	codec, dst := records.Compress(dst, raw)
	dst[at+frameHead+13] = byte(codec)
	return endFrame(dst, at)
}

// Append appends s as a complete frame to dst, with Data as it is.
func (s *SnapShard) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgSnapShard)
	dst = binary.BigEndian.AppendUint32(dst, s.Shard)
	dst = binary.BigEndian.AppendUint64(dst, s.Seq)
	dst = append(dst, boolByte(s.Last), byte(s.Codec))
	dst = binary.BigEndian.AppendUint32(dst, s.RawLen)
	dst = append(dst, s.Data...)
	return endFrame(dst, at)
}

// Decode decodes a SnapShard payload; s.Data points into p. It checks the
// codec and raw length as Batch.Decode does.
func (s *SnapShard) Decode(p []byte) error {
	if len(p) < snapShardHead {
		return ErrShortPayload
	}
	last, ok := byteBool(p[12])
	codec, raw, data := records.Codec(p[13]), binary.BigEndian.Uint32(p[14:]), p[snapShardHead:]
	if !ok {
		return ErrBadField
	}
	if err := checkCodec(codec, raw, data); err != nil {
		return err
	}
	*s = SnapShard{
		Shard:  binary.BigEndian.Uint32(p),
		Seq:    binary.BigEndian.Uint64(p[4:]),
		Last:   last,
		Codec:  codec,
		RawLen: raw,
		Data:   data,
	}
	return nil
}

// Raw returns s's raw entries, decompressed into dst's memory when they
// are compressed (see Decompress).
func (s *SnapShard) Raw(dst []byte) ([]byte, error) {
	return records.Decompress(dst, s.Codec, s.Data, int(s.RawLen))
}

// AppendSnapEnd appends a SnapEnd frame (no payload) to dst.
func AppendSnapEnd(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgSnapEnd)
	return endFrame(dst, at)
}

// DecodeSnapEnd checks a SnapEnd payload (empty).
func DecodeSnapEnd(p []byte) error { return fixedLen(p, 0) }

// SnapReason says why a standby asks for a snapshot.
type SnapReason uint8

// Snapshot reasons.
const (
	SnapGap    SnapReason = 1 // a batch or record sequence gap
	SnapStart  SnapReason = 2 // the standby starts (or follows a new active)
	SnapBehind SnapReason = 3 // the standby fell behind the active's buffer
)

// String names the reason.
func (r SnapReason) String() string {
	switch r {
	case SnapGap:
		return "gap"
	case SnapStart:
		return "start"
	case SnapBehind:
		return "fell behind"
	}
	return fmt.Sprintf("SnapReason(%d)", uint8(r))
}

// NeedSnapshot asks the active for a snapshot.
type NeedSnapshot struct {
	Reason SnapReason
}

// Append appends n as a complete frame to dst.
func (n *NeedSnapshot) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgNeedSnapshot)
	return endFrame(append(dst, byte(n.Reason)), at)
}

// Decode decodes a NeedSnapshot payload.
func (n *NeedSnapshot) Decode(p []byte) error {
	if err := fixedLen(p, 1); err != nil {
		return err
	}
	r := SnapReason(p[0])
	if r < SnapGap || r > SnapBehind {
		return ErrBadField
	}
	n.Reason = r
	return nil
}

// Handoff asks the receiver to take over as active with Epoch, above the
// tokens the sender handed out and reserved.
type Handoff struct {
	Epoch     uint64 // the epoch the successor must take
	TokenLast uint64
	Reserved  uint64
}

// Append appends h as a complete frame to dst.
func (h *Handoff) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, MsgHandoff)
	dst = binary.BigEndian.AppendUint64(dst, h.Epoch)
	dst = binary.BigEndian.AppendUint64(dst, h.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, h.Reserved)
	return endFrame(dst, at)
}

// Decode decodes a Handoff payload.
func (h *Handoff) Decode(p []byte) error {
	if err := fixedLen(p, 24); err != nil {
		return err
	}
	*h = Handoff{
		Epoch:     binary.BigEndian.Uint64(p),
		TokenLast: binary.BigEndian.Uint64(p[8:]),
		Reserved:  binary.BigEndian.Uint64(p[16:]),
	}
	return nil
}

// fixedLen checks that a fixed-size payload has exactly n bytes.
func fixedLen(p []byte, n int) error {
	switch {
	case len(p) < n:
		return ErrShortPayload
	case len(p) > n:
		return ErrLongPayload
	}
	return nil
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// byteBool decodes a 0/1 byte; ok is false for any other value.
func byteBool(b byte) (v, ok bool) { return b == 1, b <= 1 }
