package priority

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl/records"
)

// The member link's frames (docs: member-link wire format). Every message
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
	maxFrame = 16 << 20
	// protocolVersion is the member-link version this code speaks (Hello):
	// 2 since grants carry their identity (records of kind 0x81,
	// SnapShard entries in the format version 2); 3 since issue 18 (the
	// snapshot's id, epoch, window acks and reservation mark, the
	// heartbeat's mark, the handover's abort and refusal); 4 since the
	// Hello carries the sender's --peers (peers.go: a rolling change of
	// --peers); 5 since Ack(refused) carries the epoch up to which the
	// sender refuses handoffs. A member of an older version would misread
	// them, so the hello refuses it.
	protocolVersion = 5

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
func (t msgType) String() string { return nameOf(msgNames[:], uint8(t), "MsgType") }

func (t msgType) valid() bool { return t >= msgHello && t <= msgSnapAck }

// nameOf names value v of a small enum from names (indexed by value, ""
// for none), or as typ(v).
func nameOf(names []string, v uint8, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

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

// clusterMode is a cluster's mode as Hello carries it.
type clusterMode uint8

// Cluster modes.
const (
	modePriority clusterMode = 1
	modeRaft     clusterMode = 2
)

// String names the mode as --cluster spells it.
func (m clusterMode) String() string { return nameOf(modeNames[:], uint8(m), "ClusterMode") }

var modeNames = [...]string{modePriority: api.ModePriority, modeRaft: api.ModeRaft}

// hello opens every link in both directions; a member refuses a peer whose
// Hello differs from its own (Check), or that its --peers does not name
// (peers.go: mapPeers).
type hello struct {
	Version    uint16      // protocolVersion
	Mode       clusterMode // --cluster
	Members    uint8       // entries of --peers
	Self       uint8       // the sender's index in --peers
	Offset     uint32      // --peer-offset
	Shards     uint32      // the lock table's shard count
	FailoverMS uint32      // --failover-timeout in milliseconds
	// Peers is the sender's --peers as it writes it, Members entries
	// (Peers[Self] is its --self).
	Peers []string
}

// helloLen is the length of the Hello's fixed part; the Members entries of
// Peers follow, each as len u16 | bytes.
const helloLen = 2 + 1 + 1 + 1 + 4 + 4 + 4

// maxPeerLen bounds an entry of Peers (a host name of 253 bytes, a port).
const maxPeerLen = 1024

// Append appends h as a complete frame to dst.
func (h *hello) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHello)
	dst = binary.BigEndian.AppendUint16(dst, h.Version)
	dst = append(dst, byte(h.Mode), h.Members, h.Self)
	dst = binary.BigEndian.AppendUint32(dst, h.Offset)
	dst = binary.BigEndian.AppendUint32(dst, h.Shards)
	dst = binary.BigEndian.AppendUint32(dst, h.FailoverMS)
	for _, p := range h.Peers {
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(p)))
		dst = append(dst, p...)
	}
	return endFrame(dst, at)
}

// Decode decodes a Hello payload. A peer speaking another protocol version
// gets an error wrapping errMismatch that names both versions, and h holds
// only its Version; the rest of such a payload is not read (its layout
// may differ).
func (h *hello) Decode(p []byte) error {
	if len(p) < 2 {
		return errShortPayload
	}
	if v := binary.BigEndian.Uint16(p); v != protocolVersion {
		*h = hello{Version: v}
		return fmt.Errorf("%w: protocol version %d, here %d", errMismatch, v, protocolVersion)
	}
	if len(p) < helloLen {
		return errShortPayload
	}
	old := h.Peers // an entry decoded before is kept, not allocated again
	*h = hello{
		Version:    binary.BigEndian.Uint16(p),
		Mode:       clusterMode(p[2]),
		Members:    p[3],
		Self:       p[4],
		Offset:     binary.BigEndian.Uint32(p[5:]),
		Shards:     binary.BigEndian.Uint32(p[9:]),
		FailoverMS: binary.BigEndian.Uint32(p[13:]),
	}
	rest := p[helloLen:]
	peers := old[:0]
	for i := range int(h.Members) {
		if len(rest) < 2 {
			return errShortPayload
		}
		n := int(binary.BigEndian.Uint16(rest))
		if n == 0 || n > maxPeerLen {
			return errBadField
		}
		if len(rest) < 2+n {
			return errShortPayload
		}
		if e := rest[2 : 2+n]; i < len(old) && old[i] == string(e) {
			peers = append(peers, old[i])
		} else {
			peers = append(peers, string(e))
		}
		rest = rest[2+n:]
	}
	h.Peers = peers
	if len(rest) > 0 {
		return errLongPayload
	}
	return nil
}

// Check compares a peer's Hello (h) with this node's (local). It returns
// nil when they agree, else an error wrapping errMismatch that names every
// field that differs, with both values: protocol version, mode, peer
// offset, shard count, failover timeout; and a peer index that is outside
// its member list. The member lists may differ (a rolling change of
// --peers): mapPeers decides who the peer is here.
func (h *hello) Check(local hello) error {
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
	if h.Offset != local.Offset {
		diff("peer offset %d (here %d)", h.Offset, local.Offset)
	}
	if h.Shards != local.Shards {
		diff("%d shards (here %d)", h.Shards, local.Shards)
	}
	if h.FailoverMS != local.FailoverMS {
		diff("failover timeout %dms (here %dms)", h.FailoverMS, local.FailoverMS)
	}
	if h.Self >= h.Members {
		diff("member index %d outside its %d members", h.Self, h.Members)
	}
	if b.Len() == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", errMismatch, b.String())
}

// role is a member's role in a priority cluster, as its heartbeats say it
// (the role machine, roles.go, decides it).
type role uint8

// Roles.
const (
	roleStandby  role = 1 // follows an active (or none is known yet)
	roleActive   role = 2 // executes requests and streams its changes
	roleHandover role = 3 // an active handing its work to a successor: executes nothing
	roleLeaving  role = 4 // shutting down: count it as not live at once
)

// String names the role (as /status and the logs show it).
func (r role) String() string { return nameOf(roleNames[:], uint8(r), "role") }

var roleNames = [...]string{roleStandby: api.RoleStandby, roleActive: api.RoleActive, roleHandover: api.RoleHandingOver, roleLeaving: api.RoleLeaving}

// noActive is heartbeat.Active when the sender follows no active.
const noActive = 255

// heartbeat is what every member sends every other member periodically.
type heartbeat struct {
	Epoch       uint64
	Role        role
	Active      uint8 // index of the active the sender follows, noActive if none
	InSync      bool
	Probe       uint64 // the sender's heartbeat number
	Echo        uint64 // the highest Probe received from the receiver
	TokenLast   uint64
	Reserved    uint64
	StoredEpoch uint64 // the epoch in the sender's data directory
	LagNS       uint64 // active to a standby in its stream: the age of the oldest batch it has not acknowledged; else 0
	// Mark is the token reservation mark in the sender's data directory:
	// above every token it ever issued, also before a restart (an active
	// raises its counter above every member's mark).
	Mark uint64
}

const heartbeatLen = 8 + 3 + 7*8

// Append appends hb as a complete frame to dst.
func (hb *heartbeat) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHeartbeat)
	dst = binary.BigEndian.AppendUint64(dst, hb.Epoch)
	dst = append(dst, byte(hb.Role), hb.Active, boolByte(hb.InSync))
	dst = binary.BigEndian.AppendUint64(dst, hb.Probe)
	dst = binary.BigEndian.AppendUint64(dst, hb.Echo)
	dst = binary.BigEndian.AppendUint64(dst, hb.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, hb.Reserved)
	dst = binary.BigEndian.AppendUint64(dst, hb.StoredEpoch)
	dst = binary.BigEndian.AppendUint64(dst, hb.LagNS)
	dst = binary.BigEndian.AppendUint64(dst, hb.Mark)
	return endFrame(dst, at)
}

// Decode decodes a Heartbeat payload.
func (hb *heartbeat) Decode(p []byte) error {
	if err := fixedLen(p, heartbeatLen); err != nil {
		return err
	}
	role := role(p[8])
	insync, ok := byteBool(p[10])
	if role < roleStandby || role > roleLeaving || !ok {
		return errBadField
	}
	*hb = heartbeat{
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
		Mark:        binary.BigEndian.Uint64(p[59:]),
	}
	return nil
}

// batch is a frame of the replication stream: records (see BatchWriter),
// encoded by Codec. appendBatch builds one from raw records; Raw returns
// them.
type batch struct {
	Seq    uint64 // batch number on this stream: 1, 2, 3, …
	Codec  records.Codec
	RawLen uint32 // length of the raw records
	Data   []byte // the records as Codec encodes them; after Decode it points into the payload
}

const batchHead = 8 + 1 + 4

// appendBatch appends to dst a Batch frame numbered seq that carries the
// raw records, compressed as records.Compress decides. raw must be at most
// maxFrame-32 bytes (batches are cut at 64 KiB).
func appendBatch(dst []byte, seq uint64, raw []byte) []byte {
	dst, at := beginFrame(dst, msgBatch)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(raw)))
	codec, dst := records.Compress(dst, raw)
	dst[at+frameHead+8] = byte(codec)
	return endFrame(dst, at)
}

// Append appends b as a complete frame to dst, with Data as it is.
func (b *batch) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgBatch)
	dst = binary.BigEndian.AppendUint64(dst, b.Seq)
	dst = append(dst, byte(b.Codec))
	dst = binary.BigEndian.AppendUint32(dst, b.RawLen)
	dst = append(dst, b.Data...)
	return endFrame(dst, at)
}

// Decode decodes a Batch payload; b.Data points into p. It checks the
// codec and, for raw data, that RawLen is the data's length; for
// compressed data, that RawLen is at most maxFrame.
func (b *batch) Decode(p []byte) error {
	if len(p) < batchHead {
		return errShortPayload
	}
	codec, raw, data := records.Codec(p[8]), binary.BigEndian.Uint32(p[9:]), p[batchHead:]
	if err := checkCodec(codec, raw, data); err != nil {
		return err
	}
	*b = batch{Seq: binary.BigEndian.Uint64(p), Codec: codec, RawLen: raw, Data: data}
	return nil
}

// Raw returns b's raw records, decompressed into dst's memory when they
// are compressed (see Decompress).
func (b *batch) Raw(dst []byte) ([]byte, error) {
	return records.Decompress(dst, b.Codec, b.Data, int(b.RawLen))
}

// checkCodec validates a codec and its raw length against the data.
func checkCodec(c records.Codec, rawLen uint32, data []byte) error {
	switch {
	case c == records.CodecRaw && int(rawLen) == len(data):
	case c == records.CodecS2 && rawLen <= maxFrame && len(data) > 0:
	default:
		return errBadField
	}
	return nil
}

// reserve tells a standby that tokens up to Limit are reserved by the
// active: it records that durably, then acks (AckReserve with ID).
type reserve struct {
	ID    uint64
	Limit uint64
}

// Append appends r as a complete frame to dst.
func (r *reserve) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgReserve)
	dst = binary.BigEndian.AppendUint64(dst, r.ID)
	dst = binary.BigEndian.AppendUint64(dst, r.Limit)
	return endFrame(dst, at)
}

// Decode decodes a Reserve payload.
func (r *reserve) Decode(p []byte) error {
	if err := fixedLen(p, 16); err != nil {
		return err
	}
	*r = reserve{ID: binary.BigEndian.Uint64(p), Limit: binary.BigEndian.Uint64(p[8:])}
	return nil
}

// ackKind says what an Ack acknowledges.
type ackKind uint8

// Ack kinds.
const (
	ackBatch    ackKind = 1 // Value: the batch's Seq
	ackReserve  ackKind = 2 // Value: the Reserve's ID
	ackSnapshot ackKind = 3 // snapshot applied, in sync; Value: the snapshot's ID
	ackHandoff  ackKind = 4 // handoff taken: this member is the active at Value, the epoch
	// ackRefused: handoffs at every epoch up to Value are refused, now and
	// forever: this member will never take such an epoch (an answer to a
	// Handoff it cannot take, or to a HandoffAbort that arrived before the
	// Handoff; Value is at least the epoch refused).
	ackRefused ackKind = 5
)

// String names the ack kind.
func (k ackKind) String() string { return nameOf(ackNames[:], uint8(k), "AckKind") }

var ackNames = [...]string{ackBatch: "batch", ackReserve: "reserve", ackSnapshot: "snapshot", ackHandoff: "handoff", ackRefused: "refused"}

// ack acknowledges a batch, a reservation, a snapshot or a handoff.
type ack struct {
	Kind  ackKind
	Value uint64
}

// Append appends a as a complete frame to dst.
func (a *ack) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgAck)
	dst = append(dst, byte(a.Kind))
	dst = binary.BigEndian.AppendUint64(dst, a.Value)
	return endFrame(dst, at)
}

// Decode decodes an Ack payload.
func (a *ack) Decode(p []byte) error {
	if err := fixedLen(p, 9); err != nil {
		return err
	}
	k := ackKind(p[0])
	if k < ackBatch || k > ackRefused {
		return errBadField
	}
	*a = ack{Kind: k, Value: binary.BigEndian.Uint64(p[1:])}
	return nil
}

// snapBegin opens a snapshot: SnapShard frames follow, then SnapEnd.
type snapBegin struct {
	ID        uint64 // the snapshot's number on this link (SnapAck, SnapEnd and Ack(snapshot) repeat it)
	Epoch     uint64 // the sender's epoch as the active: the snapshot is applied only by a standby that follows it at this epoch
	Shards    uint32
	TokenLast uint64
	Reserved  uint64
	Locks     uint64 // total held keys (informative)
}

const snapBeginLen = 8 + 8 + 4 + 3*8

// Append appends s as a complete frame to dst.
func (s *snapBegin) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgSnapBegin)
	dst = binary.BigEndian.AppendUint64(dst, s.ID)
	dst = binary.BigEndian.AppendUint64(dst, s.Epoch)
	dst = binary.BigEndian.AppendUint32(dst, s.Shards)
	dst = binary.BigEndian.AppendUint64(dst, s.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, s.Reserved)
	dst = binary.BigEndian.AppendUint64(dst, s.Locks)
	return endFrame(dst, at)
}

// Decode decodes a SnapBegin payload.
func (s *snapBegin) Decode(p []byte) error {
	if err := fixedLen(p, snapBeginLen); err != nil {
		return err
	}
	*s = snapBegin{
		ID:        binary.BigEndian.Uint64(p),
		Epoch:     binary.BigEndian.Uint64(p[8:]),
		Shards:    binary.BigEndian.Uint32(p[16:]),
		TokenLast: binary.BigEndian.Uint64(p[20:]),
		Reserved:  binary.BigEndian.Uint64(p[28:]),
		Locks:     binary.BigEndian.Uint64(p[36:]),
	}
	return nil
}

// snapShard carries snapshot entries (AppendSnapEntryIdent) of one shard, cut
// at Seq; a shard's entries may span several frames, the last with Last.
type snapShard struct {
	Shard  uint32
	Seq    uint64 // the shard's record Seq the dump was cut at
	Last   bool   // the shard's last frame
	Codec  records.Codec
	RawLen uint32 // length of the raw entries
	Data   []byte // the entries as Codec encodes them; after Decode it points into the payload
}

const snapShardHead = 4 + 8 + 1 + 1 + 4

// appendSnapShard appends to dst a SnapShard frame of shard, cut at seq,
// carrying the raw entries compressed as records.Compress decides. raw must be at
// most maxFrame-32 bytes (snapshot frames are cut at 64 KiB).
func appendSnapShard(dst []byte, shard uint32, seq uint64, last bool, raw []byte) []byte {
	dst, at := beginFrame(dst, msgSnapShard)
	dst = binary.BigEndian.AppendUint32(dst, shard)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = append(dst, boolByte(last), 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(raw)))
	codec, dst := records.Compress(dst, raw)
	dst[at+frameHead+13] = byte(codec)
	return endFrame(dst, at)
}

// Append appends s as a complete frame to dst, with Data as it is.
func (s *snapShard) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgSnapShard)
	dst = binary.BigEndian.AppendUint32(dst, s.Shard)
	dst = binary.BigEndian.AppendUint64(dst, s.Seq)
	dst = append(dst, boolByte(s.Last), byte(s.Codec))
	dst = binary.BigEndian.AppendUint32(dst, s.RawLen)
	dst = append(dst, s.Data...)
	return endFrame(dst, at)
}

// Decode decodes a SnapShard payload; s.Data points into p. It checks the
// codec and raw length as Batch.Decode does.
func (s *snapShard) Decode(p []byte) error {
	if len(p) < snapShardHead {
		return errShortPayload
	}
	last, ok := byteBool(p[12])
	codec, raw, data := records.Codec(p[13]), binary.BigEndian.Uint32(p[14:]), p[snapShardHead:]
	if !ok {
		return errBadField
	}
	if err := checkCodec(codec, raw, data); err != nil {
		return err
	}
	*s = snapShard{
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
func (s *snapShard) Raw(dst []byte) ([]byte, error) {
	return records.Decompress(dst, s.Codec, s.Data, int(s.RawLen))
}

// snapEnd closes snapshot ID. It carries the sender's last token and its
// reservation mark as they stand when the snapshot ends: every token range
// the active may use from then on is at most Reserved, or is reserved with
// a Reserve that follows on the link (docs/DESIGN.md, "Tokens across a
// failover"), so a standby that records Reserved durably before it counts
// itself in sync has seen every reservation in use.
type snapEnd struct {
	ID        uint64
	TokenLast uint64
	Reserved  uint64
}

// Append appends s as a complete frame to dst.
func (s *snapEnd) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgSnapEnd)
	dst = binary.BigEndian.AppendUint64(dst, s.ID)
	dst = binary.BigEndian.AppendUint64(dst, s.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, s.Reserved)
	return endFrame(dst, at)
}

// Decode decodes a SnapEnd payload.
func (s *snapEnd) Decode(p []byte) error {
	if err := fixedLen(p, 24); err != nil {
		return err
	}
	*s = snapEnd{ID: binary.BigEndian.Uint64(p), TokenLast: binary.BigEndian.Uint64(p[8:]), Reserved: binary.BigEndian.Uint64(p[16:])}
	return nil
}

// snapAck is a standby's progress through snapshot ID: it has applied (or
// discarded) the snapshot's first Frames SnapShard frames. The active sends
// at most snapWindow × snapChunk raw bytes ahead of it (stream.go), so a
// snapshot in flight holds a bounded number of bytes in the link and in the
// standby.
type snapAck struct {
	ID     uint64
	Frames uint64
}

// Append appends a as a complete frame to dst.
func (a *snapAck) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgSnapAck)
	dst = binary.BigEndian.AppendUint64(dst, a.ID)
	dst = binary.BigEndian.AppendUint64(dst, a.Frames)
	return endFrame(dst, at)
}

// Decode decodes a SnapAck payload.
func (a *snapAck) Decode(p []byte) error {
	if err := fixedLen(p, 16); err != nil {
		return err
	}
	*a = snapAck{ID: binary.BigEndian.Uint64(p), Frames: binary.BigEndian.Uint64(p[8:])}
	return nil
}

// snapReason says why a standby asks for a snapshot.
type snapReason uint8

// Snapshot reasons.
const (
	snapGap    snapReason = 1 // a batch or record sequence gap
	snapStart  snapReason = 2 // the standby starts (or follows a new active)
	snapBehind snapReason = 3 // the standby fell behind the active's buffer
)

// String names the reason.
func (r snapReason) String() string { return nameOf(reasonNames[:], uint8(r), "SnapReason") }

var reasonNames = [...]string{snapGap: "gap", snapStart: "start", snapBehind: "fell behind"}

// needSnapshot asks the active for a snapshot.
type needSnapshot struct {
	Reason snapReason
}

// Append appends n as a complete frame to dst.
func (n *needSnapshot) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgNeedSnapshot)
	return endFrame(append(dst, byte(n.Reason)), at)
}

// Decode decodes a NeedSnapshot payload.
func (n *needSnapshot) Decode(p []byte) error {
	if err := fixedLen(p, 1); err != nil {
		return err
	}
	r := snapReason(p[0])
	if r < snapGap || r > snapBehind {
		return errBadField
	}
	n.Reason = r
	return nil
}

// handoff asks the receiver to take over as active with Epoch, above the
// tokens the sender handed out and reserved.
type handoff struct {
	Epoch     uint64 // the epoch the successor must take
	TokenLast uint64
	Reserved  uint64
}

// Append appends h as a complete frame to dst.
func (h *handoff) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHandoff)
	dst = binary.BigEndian.AppendUint64(dst, h.Epoch)
	dst = binary.BigEndian.AppendUint64(dst, h.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, h.Reserved)
	return endFrame(dst, at)
}

// Decode decodes a Handoff payload.
func (h *handoff) Decode(p []byte) error {
	if err := fixedLen(p, 24); err != nil {
		return err
	}
	*h = handoff{
		Epoch:     binary.BigEndian.Uint64(p),
		TokenLast: binary.BigEndian.Uint64(p[8:]),
		Reserved:  binary.BigEndian.Uint64(p[16:]),
	}
	return nil
}

// handoffAbort asks the successor of a handover that went unconfirmed to
// decide it: it answers Ack(handoff, Epoch) if it took the epoch, else
// Ack(refused, Epoch), after which it never takes it (MEMBER-LINK.md,
// "Planned handover").
type handoffAbort struct {
	Epoch uint64
}

// Append appends h as a complete frame to dst.
func (h *handoffAbort) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHandoffAbort)
	dst = binary.BigEndian.AppendUint64(dst, h.Epoch)
	return endFrame(dst, at)
}

// Decode decodes a HandoffAbort payload.
func (h *handoffAbort) Decode(p []byte) error {
	if err := fixedLen(p, 8); err != nil {
		return err
	}
	h.Epoch = binary.BigEndian.Uint64(p)
	return nil
}

// appendNeedSnapshot, appendReserve, appendHandoff, appendHandoffAbort,
// appendSnapAck and appendAck build control frames.
func appendNeedSnapshot(dst []byte, reason snapReason) []byte {
	m := needSnapshot{Reason: reason}
	return m.Append(dst)
}

func appendReserve(dst []byte, id, limit uint64) []byte {
	m := reserve{ID: id, Limit: limit}
	return m.Append(dst)
}

func appendHandoff(dst []byte, epoch, token, reserved uint64) []byte {
	m := handoff{Epoch: epoch, TokenLast: token, Reserved: reserved}
	return m.Append(dst)
}

func appendHandoffAbort(dst []byte, epoch uint64) []byte {
	m := handoffAbort{Epoch: epoch}
	return m.Append(dst)
}

func appendSnapAck(dst []byte, id, frames uint64) []byte {
	m := snapAck{ID: id, Frames: frames}
	return m.Append(dst)
}

func appendAck(dst []byte, kind ackKind, v uint64) []byte {
	m := ack{Kind: kind, Value: v}
	return m.Append(dst)
}

// fixedLen checks that a fixed-size payload has exactly n bytes.
func fixedLen(p []byte, n int) error {
	switch {
	case len(p) < n:
		return errShortPayload
	case len(p) > n:
		return errLongPayload
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
