package priority

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/repl/priority/machine"
	"github.com/lockd-dev/lockd/repl/records"
)

// The member link's messages (docs/MEMBER-LINK.md, "Message types"): what
// each frame's payload carries, with an Append that writes the whole
// frame and a Decode that checks every field. The frames are frame.go's.

// protocolVersion is the member-link version this code speaks (Hello): 2
// since grants carry their identity (records of kind 0x81, SnapShard
// entries in the format version 2); 3 since the snapshot's id, epoch,
// window acks and reservation mark, the heartbeat's mark, the handover's
// abort and refusal; 4 since the Hello carries the sender's --peers
// (peers.go: a rolling change of --peers); 5 since Ack(refused) carries the
// epoch up to which the sender refuses handoffs; 6 since the heartbeat
// carries the sender's position, whether it is final (held) and whether
// it serves, and a later active's verdict on the receiver (PROTOCOL.md
// §6.3, "Whoever would lose more stays"), and a successor's Ack(handoff)
// means it serves; 7 since Batches carry shared grants (records of kinds
// 0x41 and 0xC1, records.Version 3) and SnapShard frames carry snapshot
// entries in the format version 3, one per holder with its key's limit
// (PROTOCOL.md §9.2); 8 since an active's heartbeat and a Handoff carry
// its lineage (the tables of earlier actives its table holds whole), by
// which a later active judges a contest (PROTOCOL.md §6.3: a handover's
// successor keeps its predecessors' changes, and a standby promoted with
// its active's whole table holds what that one held). A member of another version would misread them: the
// Hello is refused, and the refusal logged with both versions
// (hello.Decode). A change of what the replication records or snapshot
// entries carry (repl/records) raises it too (recordsVersion):
// a mixed-version cluster is refused at the Hello, never misread.
const protocolVersion = 8

// recordsVersion is the format version of repl/records that this
// member-link version carries (records in Batches, snapshot entries in
// SnapShard frames): the Hello's version implies it, so two members that
// accept each other's Hello read each other's records alike.
// TestLinkVersionFollowsRecords fails when records.Version moves without
// it (and protocolVersion).
const recordsVersion = 3

// clusterMode is a cluster's mode as Hello carries it.
type clusterMode uint8

// Cluster modes.
const (
	modePriority clusterMode = 1
	modeRaft     clusterMode = 2
)

// String names the mode as --cluster spells it.
func (m clusterMode) String() string { return machine.NameOf(modeNames[:], uint8(m), "ClusterMode") }

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

// helloVersion is the member-link version of a Hello of any version (its
// first field); false if too short.
func helloVersion(p []byte) (uint16, bool) {
	if len(p) < 2 {
		return 0, false
	}
	return binary.BigEndian.Uint16(p), true
}

// helloSelf is the sender's index in a Hello of any version (they all
// begin version u16, mode u8, members u8, self u8), -1 if too short.
func helloSelf(p []byte) int {
	if len(p) < 5 {
		return -1
	}
	return int(p[4])
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

// noActive is heartbeat.Active when the sender follows no active.
const noActive = 255

// heartbeat is what every member sends every other member every tenth of
// the failover timeout (machine.Heartbeat on the wire; the member indexes
// are the sender's).
type heartbeat struct {
	Epoch       uint64
	Role        machine.Role
	Active      uint8 // index of the active the sender follows, noActive if none
	InSync      bool
	Held        bool   // an active whose Pos is final (machine.Heartbeat.Held)
	Serving     bool   // the sender's gate serves
	Probe       uint64 // the sender's heartbeat number
	Echo        uint64 // the probe received last from the receiver
	TokenLast   uint64
	Reserved    uint64
	StoredEpoch uint64 // the epoch in the sender's data directory
	LagNS       uint64 // active to a standby in its stream: the age of the oldest batch it has not acknowledged; else 0
	// Mark is the token reservation mark in the sender's data directory:
	// above every token it ever issued, also before a restart (an active
	// raises its counter above every member's mark).
	Mark uint64
	// Pos is the sender's position: the changes its table made or
	// applied, summed over its shards' record sequences.
	Pos uint64
	// Verdict is the receiver's epoch when the sender, an active that
	// became active later, found the receiver would lose less by stepping
	// down (0: none).
	Verdict uint64
	// Lineage is the sender's when it is an active or hands over
	// (machine.Lineage), else names nobody; Root is its root (the
	// position below which its table counts as nothing in a contest).
	Lineage lineage
	Root    uint64
}

// lineage is machine.Lineage on the wire: machine.LineageLen entries of
// member u8 (noActive: none), epoch u64, pos u64, with the sender's
// member indexes.
type lineage [machine.LineageLen]struct {
	From  uint8
	Epoch uint64
	Pos   uint64
}

const lineageLen = machine.LineageLen * 17

func (l *lineage) append(dst []byte) []byte {
	for _, b := range l {
		dst = append(dst, b.From)
		dst = binary.BigEndian.AppendUint64(dst, b.Epoch)
		dst = binary.BigEndian.AppendUint64(dst, b.Pos)
	}
	return dst
}

// decode reads a lineage from p, which holds at least lineageLen bytes.
func (l *lineage) decode(p []byte) {
	for i := range l {
		e := p[i*17:]
		l[i].From, l[i].Epoch, l[i].Pos = e[0], binary.BigEndian.Uint64(e[1:]), binary.BigEndian.Uint64(e[9:])
	}
}

// wireLineage is l with this member's indexes (None: noActive).
func wireLineage(l *machine.Lineage) lineage {
	var w lineage
	for i, b := range l {
		w[i].From, w[i].Epoch, w[i].Pos = noActive, b.Epoch, b.Pos
		if b.From >= 0 && b.From < noActive {
			w[i].From = uint8(b.From)
		}
	}
	return w
}

// machineLineage is w with the peer's indexes mapped onto this member's
// list (a member not listed here names nobody).
func machineLineage(w *lineage, pm *peerMap) machine.Lineage {
	var l machine.Lineage
	for i, b := range w {
		l[i] = machine.Base{From: pm.index(b.From), Epoch: b.Epoch, Pos: b.Pos}
	}
	return l
}

// Heartbeat flags (the byte after Active).
const (
	flagInSync  = 1 << 0
	flagHeld    = 1 << 1
	flagServing = 1 << 2
	flagsKnown  = flagInSync | flagHeld | flagServing
)

const heartbeatLen = 8 + 3 + 9*8 + lineageLen + 8

// Append appends hb as a complete frame to dst.
func (hb *heartbeat) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHeartbeat)
	dst = binary.BigEndian.AppendUint64(dst, hb.Epoch)
	var flags byte
	if hb.InSync {
		flags |= flagInSync
	}
	if hb.Held {
		flags |= flagHeld
	}
	if hb.Serving {
		flags |= flagServing
	}
	dst = append(dst, byte(hb.Role), hb.Active, flags)
	for _, v := range [...]uint64{hb.Probe, hb.Echo, hb.TokenLast, hb.Reserved, hb.StoredEpoch, hb.LagNS, hb.Mark, hb.Pos, hb.Verdict} {
		dst = binary.BigEndian.AppendUint64(dst, v)
	}
	dst = hb.Lineage.append(dst)
	dst = binary.BigEndian.AppendUint64(dst, hb.Root)
	return endFrame(dst, at)
}

// Decode decodes a Heartbeat payload.
func (hb *heartbeat) Decode(p []byte) error {
	if err := fixedLen(p, heartbeatLen); err != nil {
		return err
	}
	role, flags := machine.Role(p[8]), p[10]
	if !role.Valid() || flags&^flagsKnown != 0 {
		return errBadField
	}
	u := func(at int) uint64 { return binary.BigEndian.Uint64(p[at:]) }
	*hb = heartbeat{
		Epoch:       u(0),
		Role:        role,
		Active:      p[9],
		InSync:      flags&flagInSync != 0,
		Held:        flags&flagHeld != 0,
		Serving:     flags&flagServing != 0,
		Probe:       u(11),
		Echo:        u(19),
		TokenLast:   u(27),
		Reserved:    u(35),
		StoredEpoch: u(43),
		LagNS:       u(51),
		Mark:        u(59),
		Pos:         u(67),
		Verdict:     u(75),
	}
	hb.Lineage.decode(p[83:])
	hb.Root = binary.BigEndian.Uint64(p[83+lineageLen:])
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
func (k ackKind) String() string { return machine.NameOf(ackNames[:], uint8(k), "AckKind") }

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

// snapShard carries snapshot entries of one shard in the format version
// recordsVersion (records.AppendSnapEntryVersion: one per holder, with its
// identity and its key's limit), cut at Seq; a shard's entries may span
// several frames, the last with Last.
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
func (r snapReason) String() string { return machine.NameOf(reasonNames[:], uint8(r), "SnapReason") }

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
// tokens the sender handed out and reserved. Lineage (its base first)
// and Root are the sender's: the successor takes them as its own, so the
// changes made since that base count as its own in a contest (PROTOCOL.md
// §6.3).
type handoff struct {
	Epoch     uint64 // the epoch the successor must take
	TokenLast uint64
	Reserved  uint64
	Lineage   lineage
	Root      uint64
}

// Append appends h as a complete frame to dst.
func (h *handoff) Append(dst []byte) []byte {
	dst, at := beginFrame(dst, msgHandoff)
	dst = binary.BigEndian.AppendUint64(dst, h.Epoch)
	dst = binary.BigEndian.AppendUint64(dst, h.TokenLast)
	dst = binary.BigEndian.AppendUint64(dst, h.Reserved)
	dst = h.Lineage.append(dst)
	dst = binary.BigEndian.AppendUint64(dst, h.Root)
	return endFrame(dst, at)
}

// Decode decodes a Handoff payload. (Whether the lineage names members of
// the receiver's cluster is the machine's check.)
func (h *handoff) Decode(p []byte) error {
	if err := fixedLen(p, 24+lineageLen+8); err != nil {
		return err
	}
	h.Epoch = binary.BigEndian.Uint64(p)
	h.TokenLast = binary.BigEndian.Uint64(p[8:])
	h.Reserved = binary.BigEndian.Uint64(p[16:])
	h.Lineage.decode(p[24:])
	h.Root = binary.BigEndian.Uint64(p[24+lineageLen:])
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

func appendHandoff(dst []byte, epoch, token, reserved uint64, l *machine.Lineage, root uint64) []byte {
	m := handoff{Epoch: epoch, TokenLast: token, Reserved: reserved, Lineage: wireLineage(l), Root: root}
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
