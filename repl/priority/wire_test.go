package priority

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/priority/machine"
	"github.com/lockd-dev/lockd/repl/records"
)

// wireMsg is what every message struct of the member link implements.
type wireMsg interface {
	Append(dst []byte) []byte
	Decode(p []byte) error
}

// wireCase is a message with its type and its payload written out by hand
// from the member-link format table (hex, spaces ignored).
type wireCase struct {
	name    string
	t       msgType
	m       wireMsg
	payload string
}

func wireCases() []wireCase {
	return []wireCase{
		{"hello", msgHello, &hello{Version: 8, Mode: modePriority, Members: 3, Self: 2, Offset: 10000, Shards: 64, FailoverMS: 1000,
			Peers: []string{"a:1", "b:2", "c:3"}},
			"0008 01 03 02 00002710 00000040 000003e8 0003 613a31 0003 623a32 0003 633a33"},
		{"hello-raft-max", msgHello, &hello{Version: 8, Mode: modeRaft, Members: 2, Self: 1, Offset: 1<<32 - 1, Shards: 1 << 16, FailoverMS: 60000,
			Peers: []string{"h:65535", "[::1]:7"}},
			"0008 02 02 01 ffffffff 00010000 0000ea60 0007 683a3635353335 0007 5b3a3a315d3a37"},
		{"heartbeat-active", msgHeartbeat, &heartbeat{Epoch: 7, Role: machine.RoleActive, Active: 0, InSync: true, Held: true, Serving: true, Probe: 1, Echo: 2,
			TokenLast: 0x1122334455667788, Reserved: 0x1122334455667799, StoredEpoch: 6, LagNS: 0, Mark: 0x11223344556677aa, Pos: 1000000, Verdict: 3,
			Lineage: lineage{{From: 2, Epoch: 5, Pos: 300}, {From: 1, Epoch: 4, Pos: 200}, {From: noActive}, {From: noActive}}, Root: 40},
			"0000000000000007 02 00 07 0000000000000001 0000000000000002 1122334455667788 1122334455667799 0000000000000006 0000000000000000 11223344556677aa 00000000000f4240 0000000000000003" +
				" 02 0000000000000005 000000000000012c 01 0000000000000004 00000000000000c8" + noLineageHex[:2*2*17] + " 0000000000000028"},
		{"heartbeat-standby-none", msgHeartbeat, &heartbeat{Epoch: 1<<64 - 1, Role: machine.RoleStandby, Active: noActive, LagNS: 1500000, Lineage: noLineageWire},
			"ffffffffffffffff 01 ff 00 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 000000000016e360 0000000000000000 0000000000000000 0000000000000000" + noLineageHex + " 0000000000000000"},
		{"heartbeat-handover", msgHeartbeat, &heartbeat{Epoch: 9, Role: machine.RoleHandover, Active: 1, InSync: true, Held: true, Lineage: lineage{{From: noActive, Pos: 7}, {From: noActive}, {From: noActive}, {From: noActive}}, Root: 7},
			"0000000000000009 03 01 03 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000" +
				" ff 0000000000000000 0000000000000007" + noLineageHex[:2*3*17] + " 0000000000000007"},
		{"heartbeat-leaving", msgHeartbeat, &heartbeat{Epoch: 9, Role: machine.RoleLeaving, Active: 1, InSync: true, Lineage: noLineageWire},
			"0000000000000009 04 01 01 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000" + noLineageHex + " 0000000000000000"},
		{"batch-raw", msgBatch, &batch{Seq: 3, Codec: records.CodecRaw, RawLen: 4, Data: []byte("abcd")},
			"0000000000000003 00 00000004 61626364"},
		{"batch-s2", msgBatch, &batch{Seq: 1<<64 - 1, Codec: records.CodecS2, RawLen: 1000, Data: []byte{0xe8, 0x07, 0x00}},
			"ffffffffffffffff 01 000003e8 e80700"},
		{"reserve", msgReserve, &reserve{ID: 5, Limit: 0x0102030405060708},
			"0000000000000005 0102030405060708"},
		{"ack-batch", msgAck, &ack{Kind: ackBatch, Value: 42}, "01 000000000000002a"},
		{"ack-reserve", msgAck, &ack{Kind: ackReserve, Value: 5}, "02 0000000000000005"},
		{"ack-snapshot", msgAck, &ack{Kind: ackSnapshot, Value: 7}, "03 0000000000000007"},
		{"ack-handoff", msgAck, &ack{Kind: ackHandoff, Value: 8}, "04 0000000000000008"},
		{"ack-refused", msgAck, &ack{Kind: ackRefused, Value: 9}, "05 0000000000000009"},
		{"snap-begin", msgSnapBegin, &snapBegin{ID: 3, Epoch: 7, Shards: 64, TokenLast: 100, Reserved: 200, Locks: 10000},
			"0000000000000003 0000000000000007 00000040 0000000000000064 00000000000000c8 0000000000002710"},
		{"snap-shard-raw", msgSnapShard, &snapShard{Shard: 63, Seq: 99, Last: true, Codec: records.CodecRaw, RawLen: 2, Data: []byte("xy")},
			"0000003f 0000000000000063 01 00 00000002 7879"},
		{"snap-shard-s2", msgSnapShard, &snapShard{Shard: 0, Seq: 0, Last: false, Codec: records.CodecS2, RawLen: 5, Data: []byte{5, 1}},
			"00000000 0000000000000000 00 01 00000005 0501"},
		{"snap-end", msgSnapEnd, &snapEnd{ID: 3, TokenLast: 150, Reserved: 300},
			"0000000000000003 0000000000000096 000000000000012c"},
		{"snap-ack", msgSnapAck, &snapAck{ID: 3, Frames: 17}, "0000000000000003 0000000000000011"},
		{"need-snapshot-gap", msgNeedSnapshot, &needSnapshot{Reason: snapGap}, "01"},
		{"need-snapshot-start", msgNeedSnapshot, &needSnapshot{Reason: snapStart}, "02"},
		{"need-snapshot-behind", msgNeedSnapshot, &needSnapshot{Reason: snapBehind}, "03"},
		{"handoff", msgHandoff, &handoff{Epoch: 8, TokenLast: 1000, Reserved: 2000,
			Lineage: lineage{{From: 2, Epoch: 5, Pos: 300}, {From: 0, Epoch: 3, Pos: 100}, {From: noActive}, {From: noActive}}, Root: 16},
			"0000000000000008 00000000000003e8 00000000000007d0 02 0000000000000005 000000000000012c 00 0000000000000003 0000000000000064" + noLineageHex[:2*2*17] + " 0000000000000010"},
		{"handoff-no-base", msgHandoff, &handoff{Epoch: 8, TokenLast: 1000, Reserved: 2000, Lineage: lineage{{From: noActive, Pos: 7}, {From: noActive}, {From: noActive}, {From: noActive}}, Root: 7},
			"0000000000000008 00000000000003e8 00000000000007d0 ff 0000000000000000 0000000000000007" + noLineageHex[:2*3*17] + " 0000000000000007"},
		{"handoff-abort", msgHandoffAbort, &handoffAbort{Epoch: 8}, "0000000000000008"},
	}
}

// wireFrame builds a frame by hand: length, type, payload, CRC-32C.
func wireFrame(t msgType, payload []byte) []byte {
	body := append([]byte{byte(t)}, payload...)
	f := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
	f = append(f, body...)
	return binary.BigEndian.AppendUint32(f, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

// newWireMsg returns a zero message of m's type.
func newWireMsg(m wireMsg) wireMsg {
	return reflect.New(reflect.TypeOf(m).Elem()).Interface().(wireMsg)
}

// TestMessageLayout: every message encodes to the bytes of the format
// table, frames as the header says, decodes back to itself and re-encodes
// to the same frame; the payload after a prefix of bytes appended keeps
// nothing of an earlier decode.
func TestMessageLayout(t *testing.T) {
	for _, c := range wireCases() {
		t.Run(c.name, func(t *testing.T) {
			want := wireFrame(c.t, repltest.Hex(t, c.payload))
			got := c.m.Append([]byte("prefix"))
			if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[6:], want) {
				t.Fatalf("Append:\n got %x\nwant prefix+%x", got, want)
			}
			typ, p, err := newFrameReader(bytes.NewReader(want)).Next()
			if err != nil || typ != c.t {
				t.Fatalf("Next: %v, %v", typ, err)
			}
			back := newWireMsg(c.m)
			if err := back.Decode(p); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(back, c.m) {
				t.Fatalf("Decode: %+v, want %+v", back, c.m)
			}
			if again := back.Append(nil); !bytes.Equal(again, want) {
				t.Fatalf("re-encoded %x, want %x", again, want)
			}
		})
	}
}

// TestMessagePrefixesAndExtras: every proper prefix of a valid payload and
// the payload with a byte added are refused (or, for compressed data,
// refused by Raw); nothing panics.
func TestMessagePrefixesAndExtras(t *testing.T) {
	for _, c := range wireCases() {
		t.Run(c.name, func(t *testing.T) {
			p := repltest.Hex(t, c.payload)
			for i := range len(p) {
				if err := decodeAll(newWireMsg(c.m), p[:i]); err == nil {
					t.Errorf("prefix of %d/%d bytes decoded", i, len(p))
				}
			}
			long := append(append([]byte{}, p...), 0x01)
			err := decodeAll(newWireMsg(c.m), long)
			compressed := c.t == msgBatch && p[8] == byte(records.CodecS2) || c.t == msgSnapShard && p[13] == byte(records.CodecS2)
			if err == nil && !compressed {
				t.Errorf("payload with a byte added decoded")
			}
		})
	}
}

// decodeAll decodes p into m and, for a batch or snapshot frame, its data.
func decodeAll(m wireMsg, p []byte) error {
	if err := m.Decode(p); err != nil {
		return err
	}
	var err error
	switch m := m.(type) {
	case *batch:
		_, err = m.Raw(nil)
	case *snapShard:
		_, err = m.Raw(nil)
	}
	return err
}

// TestMessageBadFields: values the format does not allow are refused.
func TestMessageBadFields(t *testing.T) {
	cases := []struct {
		name    string
		m       wireMsg
		payload string
		want    error
	}{
		{"heartbeat-role-0", &heartbeat{}, "0000000000000007 00 00 01" + strings.Repeat("00", 72+lineageLen+8), errBadField},
		{"heartbeat-role-5", &heartbeat{}, "0000000000000007 05 00 01" + strings.Repeat("00", 72+lineageLen+8), errBadField},
		{"heartbeat-flag-8", &heartbeat{}, "0000000000000007 01 00 08" + strings.Repeat("00", 72+lineageLen+8), errBadField},
		{"heartbeat-v5-length", &heartbeat{}, "0000000000000007 01 00 01" + strings.Repeat("00", 56), errShortPayload},
		{"heartbeat-v7-length", &heartbeat{}, "0000000000000007 01 00 01" + strings.Repeat("00", 72), errShortPayload},
		{"handoff-v7-length", &handoff{}, strings.Repeat("00", 24), errShortPayload},
		{"ack-kind-0", &ack{}, "00 0000000000000001", errBadField},
		{"ack-kind-6", &ack{}, "06 0000000000000001", errBadField},
		{"need-snapshot-0", &needSnapshot{}, "00", errBadField},
		{"need-snapshot-4", &needSnapshot{}, "04", errBadField},
		{"batch-codec-2", &batch{}, "0000000000000001 02 00000001 00", errBadField},
		{"batch-raw-len-short", &batch{}, "0000000000000001 00 00000001 0000", errBadField},
		{"batch-raw-len-long", &batch{}, "0000000000000001 00 00000003 0000", errBadField},
		{"batch-s2-no-data", &batch{}, "0000000000000001 01 00000003", errBadField},
		{"batch-s2-raw-len-over-max", &batch{}, "0000000000000001 01 01000001 00", errBadField},
		{"snap-shard-last-2", &snapShard{}, "00000000 0000000000000000 02 00 00000000", errBadField},
		{"snap-shard-codec-9", &snapShard{}, "00000000 0000000000000000 00 09 00000000", errBadField},
		{"snap-shard-raw-len", &snapShard{}, "00000000 0000000000000000 01 00 00000001", errBadField},
		{"snap-end-short", &snapEnd{}, "00", errShortPayload},
		{"snap-ack-long", &snapAck{}, "0000000000000003 0000000000000011 00", errLongPayload},
		{"handoff-abort-short", &handoffAbort{}, "00000000", errShortPayload},
		{"reserve-short", &reserve{}, "00", errShortPayload},
		{"hello-short", &hello{}, "0008 01", errShortPayload},
		{"hello-long", &hello{}, "0008 01 01 00 00002710 00000040 000003e8 0001 61 00", errLongPayload},
		{"hello-peers-missing", &hello{}, "0008 01 02 00 00002710 00000040 000003e8 0001 61", errShortPayload},
		{"hello-peer-cut", &hello{}, "0008 01 01 00 00002710 00000040 000003e8 0003 6161", errShortPayload},
		{"hello-peer-empty", &hello{}, "0008 01 01 00 00002710 00000040 000003e8 0000", errBadField},
		{"hello-peer-too-long", &hello{}, "0008 01 01 00 00002710 00000040 000003e8 0401", errBadField},
		{"hello-version-1", &hello{}, "0001 01 03 02 00002710 00000040 000003e8", errMismatch},
		{"hello-version-2", &hello{}, "0002", errMismatch},
		{"hello-version-3", &hello{}, "0003 01 03 02 00002710 00000040 000003e8", errMismatch},
		{"hello-version-4", &hello{}, "0004 01 01 00 00002710 00000040 000003e8 0001 61", errMismatch},
		{"hello-version-5", &hello{}, "0005 01 01 00 00002710 00000040 000003e8 0001 61", errMismatch},
		{"hello-version-6", &hello{}, "0006 01 01 00 00002710 00000040 000003e8 0001 61", errMismatch},
		{"hello-version-7", &hello{}, "0007 01 01 00 00002710 00000040 000003e8 0001 61", errMismatch},
		{"hello-version-9", &hello{}, "0009", errMismatch},
		{"hello-version-0-long", &hello{}, "0000 01 03 02 00002710 00000040 000003e8 00", errMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.m.Decode(repltest.Hex(t, c.payload)); !errors.Is(err, c.want) {
				t.Fatalf("Decode: %v, want %v", err, c.want)
			}
		})
	}
	var h hello
	err := h.Decode(repltest.Hex(t, "0009 ffff"))
	if h.Version != 9 || err == nil || !strings.Contains(err.Error(), "protocol version 9, here 8") {
		t.Fatalf("version 9: %+v, %v", h, err)
	}
}

func TestHelloCheck(t *testing.T) {
	local := hello{Version: protocolVersion, Mode: modePriority, Members: 3, Self: 0, Offset: 10000, Shards: 64, FailoverMS: 1000}
	peer := local
	peer.Self = 1
	cases := []struct {
		name  string
		edit  func(h *hello)
		wants []string // fragments of the error; nil: no error
	}{
		{"same", func(*hello) {}, nil},
		{"last-member", func(h *hello) { h.Self = 2 }, nil},
		{"version", func(h *hello) { h.Version = 2 }, []string{"protocol version 2 (here 8)"}},
		{"mode", func(h *hello) { h.Mode = modeRaft }, []string{"mode raft (here priority)"}},
		{"mode-unknown", func(h *hello) { h.Mode = 9 }, []string{"mode ClusterMode(9) (here priority)"}},
		// The member lists may differ (a rolling change of --peers):
		// mapPeers decides who the peer is (TestMapPeers).
		{"members", func(h *hello) { h.Members = 5 }, nil},
		{"offset", func(h *hello) { h.Offset = 20000 }, []string{"peer offset 20000 (here 10000)"}},
		{"shards", func(h *hello) { h.Shards = 128 }, []string{"128 shards (here 64)"}},
		{"failover", func(h *hello) { h.FailoverMS = 2000 }, []string{"failover timeout 2000ms (here 1000ms)"}},
		{"self-outside", func(h *hello) { h.Self = 3 }, []string{"member index 3 outside its 3 members"}},
		{"self-outside-fewer", func(h *hello) { h.Members, h.Self = 2, 2 }, []string{"member index 2 outside its 2 members"}},
		{"several", func(h *hello) { h.Mode, h.Members, h.Shards = modeRaft, 2, 8 },
			[]string{"mode raft (here priority)", "8 shards (here 64)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := peer
			c.edit(&h)
			err := h.Check(local)
			if c.wants == nil {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if !errors.Is(err, errMismatch) {
				t.Fatalf("Check: %v, want ErrMismatch", err)
			}
			for _, w := range c.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestMsgTypeString(t *testing.T) {
	want := []string{"MsgType(0)", "hello", "heartbeat", "batch", "reserve", "ack", "snap-begin",
		"snap-shard", "snap-end", "need-snapshot", "handoff", "handoff-abort", "snap-ack", "MsgType(13)"}
	for i, w := range want {
		if got := msgType(i).String(); got != w {
			t.Errorf("MsgType(%d) = %q, want %q", i, got, w)
		}
	}
	for _, s := range []interface{ String() string }{records.Codec(2), ackKind(0), snapReason(4), machine.Role(0), clusterMode(0)} {
		if !strings.Contains(s.String(), "(") {
			t.Errorf("unknown value named %q", s)
		}
	}
}

// wireStream is every case's frame, one after the other.
func wireStream() ([]byte, []wireCase) {
	var s []byte
	cases := wireCases()
	for _, c := range cases {
		s = c.m.Append(s)
	}
	return s, cases
}

// readAllFrames reads frames until an error and checks them against cases.
func readAllFrames(t *testing.T, fr *frameReader, cases []wireCase) error {
	t.Helper()
	for i := 0; ; i++ {
		typ, p, err := fr.Next()
		if err != nil {
			if i != len(cases) {
				t.Fatalf("frame %d: %v", i, err)
			}
			return err
		}
		if i >= len(cases) {
			t.Fatalf("frame %d beyond the %d written", i, len(cases))
		}
		if want := cases[i].m.Append(nil); typ != cases[i].t || !bytes.Equal(p, want[frameHead:len(want)-frameTail]) {
			t.Fatalf("frame %d: %v %x, want %v %x", i, typ, p, cases[i].t, want[frameHead:len(want)-frameTail])
		}
	}
}

// wireChunks reads the chunks one per Read call.
type wireChunks struct{ chunks [][]byte }

func (r *wireChunks) Read(p []byte) (int, error) {
	for len(r.chunks) > 0 && len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	return n, nil
}

// TestFrameReaderSplits: the stream of every message, cut in two at every
// offset (so every frame is split at each of its bytes), read through a
// reader whose buffer starts at 16 bytes (so it compacts and grows) and
// through the default one, yields every frame, then io.EOF.
func TestFrameReaderSplits(t *testing.T) {
	stream, cases := wireStream()
	for _, small := range []bool{false, true} {
		for i := 0; i <= len(stream); i++ {
			fr := newFrameReader(&wireChunks{chunks: [][]byte{stream[:i:i], stream[i:]}})
			if small {
				fr.buf = make([]byte, 16)
			}
			if err := readAllFrames(t, fr, cases); err != io.EOF {
				t.Fatalf("split at %d (small %v): end %v, want io.EOF", i, small, err)
			}
		}
	}
	readers := map[string]io.Reader{
		"one-byte": iotest.OneByteReader(bytes.NewReader(stream)),
		"half":     iotest.HalfReader(bytes.NewReader(stream)),
		"data-err": iotest.DataErrReader(bytes.NewReader(stream)),
	}
	for name, r := range readers {
		fr := newFrameReader(r)
		fr.buf = make([]byte, 7)
		if err := readAllFrames(t, fr, cases); err != io.EOF {
			t.Fatalf("%s: end %v, want io.EOF", name, err)
		}
	}
}

// TestFrameReaderLargeFrames: frames up to MaxFrame grow the buffer and
// read back whole; the buffer is then reused for the next connection.
func TestFrameReaderLargeFrames(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), (maxFrame-5)/16)
	big = append(big, make([]byte, maxFrame-5-len(big))...)
	var s []byte
	for _, n := range []int{0, 1, readBufStart - 9, readBufStart - 8, 3 * readBufStart, len(big)} {
		s = appendFrame(s, msgBatch, big[:n])
	}
	if l := binary.BigEndian.Uint32(s[len(s)-4-len(big)-5:]); l != maxFrame {
		t.Fatalf("largest frame's length %d, want MaxFrame", l)
	}
	fr := newFrameReader(iotest.HalfReader(bytes.NewReader(s)))
	for _, n := range []int{0, 1, readBufStart - 9, readBufStart - 8, 3 * readBufStart, len(big)} {
		typ, p, err := fr.Next()
		if err != nil || typ != msgBatch || !bytes.Equal(p, big[:n]) {
			t.Fatalf("frame of %d: %v %d bytes %v", n, typ, len(p), err)
		}
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if len(fr.buf) > 2*(4+maxFrame) {
		t.Fatalf("buffer grew to %d", len(fr.buf))
	}
	var zero frameReader // usable after Reset
	zero.Reset(bytes.NewReader(s[:4+5+1]))
	if typ, p, err := zero.Next(); err != nil || typ != msgBatch || len(p) != 0 {
		t.Fatalf("zero FrameReader after Reset: %v %d bytes %v", typ, len(p), err)
	}
	grown := &fr.buf[0]
	fr.Reset(bytes.NewReader(appendFrame(nil, msgSnapEnd, nil)))
	if typ, _, err := fr.Next(); err != nil || typ != msgSnapEnd || &fr.buf[0] != grown {
		t.Fatalf("after Reset: %v %v, buffer kept %v", typ, err, &fr.buf[0] == grown)
	}
}

// TestFrameReaderErrors: oversized, undersized, corrupted and unknown
// frames are refused with their error, which then sticks; truncated
// streams end with io.ErrUnexpectedEOF.
func TestFrameReaderErrors(t *testing.T) {
	good := (&ack{Kind: ackBatch, Value: 1}).Append(nil)
	flip := func(i int) []byte {
		b := append([]byte{}, good...)
		b[i] ^= 0x40
		return b
	}
	withLen := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	cases := []struct {
		name   string
		stream []byte
		want   error
	}{
		{"length-over-max", withLen(maxFrame + 1), errFrameTooLarge},
		{"length-max-u32", withLen(1<<32 - 1), errFrameTooLarge},
		{"length-0", withLen(0), errFrameTooShort},
		{"length-4", append(withLen(4), 1, 0, 0, 0), errFrameTooShort},
		{"crc-flipped", flip(len(good) - 1), errBadCRC},
		{"type-flipped", flip(4), errBadCRC},
		{"payload-flipped", flip(7), errBadCRC},
		{"length-shorter", append(withLen(uint32(len(good)-5)), good[4:]...), errBadCRC},
		{"type-0", wireFrame(0, nil), errUnknownType},
		{"type-13", wireFrame(13, []byte{1, 2}), errUnknownType},
		{"type-255", wireFrame(255, nil), errUnknownType},
		{"truncated-length", good[:3], io.ErrUnexpectedEOF},
		{"truncated-body", good[:len(good)-1], io.ErrUnexpectedEOF},
		{"truncated-huge", append(withLen(maxFrame), make([]byte, 100)...), io.ErrUnexpectedEOF},
		{"empty", nil, io.EOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream := append(append([]byte{}, good...), c.stream...)
			fr := newFrameReader(bytes.NewReader(stream))
			if typ, _, err := fr.Next(); err != nil || typ != msgAck {
				t.Fatalf("first frame: %v %v", typ, err)
			}
			if _, _, err := fr.Next(); err != c.want {
				t.Fatalf("Next: %v, want %v", err, c.want)
			}
			if len(fr.buf) != readBufStart {
				t.Fatalf("buffer grew to %d for a frame that never came", len(fr.buf))
			}
			if protocolErr := c.want != io.EOF && c.want != io.ErrUnexpectedEOF; protocolErr {
				fr.r = bytes.NewReader(good)
				if _, _, err := fr.Next(); err != c.want {
					t.Fatalf("second Next: %v, want the same %v", err, c.want)
				}
			}
		})
	}
}

// wireFlaky returns errTimeout after every chunk, as a connection with a
// read deadline might.
type wireFlaky struct {
	chunks [][]byte
	fail   bool
}

var errWireTimeout = errors.New("timeout")

func (r *wireFlaky) Read(p []byte) (int, error) {
	if r.fail = !r.fail; !r.fail || len(r.chunks) == 0 {
		if len(r.chunks) == 0 {
			return 0, io.EOF
		}
		return 0, errWireTimeout
	}
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

// TestFrameReaderResumes: a read error that is not the protocol's (a
// deadline) is returned, and the next Next carries on with the bytes
// already read; a reader that returns nothing forever ends in
// ErrNoProgress.
func TestFrameReaderResumes(t *testing.T) {
	stream, cases := wireStream()
	var chunks [][]byte
	for i := 0; i < len(stream); i += 7 {
		chunks = append(chunks, stream[i:min(i+7, len(stream))])
	}
	fr := newFrameReader(&wireFlaky{chunks: chunks})
	for i := 0; i < len(cases); {
		typ, p, err := fr.Next()
		if err == errWireTimeout {
			continue
		}
		want := cases[i].m.Append(nil)
		if err != nil || typ != cases[i].t || !bytes.Equal(p, want[frameHead:len(want)-frameTail]) {
			t.Fatalf("frame %d: %v %x %v", i, typ, p, err)
		}
		i++
	}
	if _, _, err := fr.Next(); err != io.EOF && err != errWireTimeout {
		t.Fatalf("end: %v", err)
	}
	fr = newFrameReader(wireNothing{})
	if _, _, err := fr.Next(); err != errNoProgress {
		t.Fatalf("empty reads: %v", err)
	}
}

type wireNothing struct{}

func (wireNothing) Read([]byte) (int, error) { return 0, nil }

// TestAppendFramePanicsAboveMax: a payload that cannot be framed is a bug
// of the caller, not a frame the peer would refuse.
func TestAppendFramePanicsAboveMax(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	appendFrame(nil, msgBatch, make([]byte, maxFrame-4))
}

// noLineageWire and noLineageHex are a lineage that names nobody, as the
// wire carries it.
var (
	noLineageWire = lineage{{From: noActive}, {From: noActive}, {From: noActive}, {From: noActive}}
	noLineageHex  = strings.Repeat("ff"+strings.Repeat("00", 16), machine.LineageLen)
)
