package priority

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

func frameSeeds() repltest.Seeds {
	var seeds repltest.Seeds
	add := seeds.Add
	// Every message, alone and in one stream; batches and snapshot frames
	// with real records, raw and compressed; broken frames.
	stream, cases := wireStream()
	for _, c := range cases {
		add("FuzzFrameReader", c.name, c.m.Append(nil), uint16(3))
	}
	add("FuzzFrameReader", "all-messages", stream, uint16(37))
	small, large := repltest.FuzzBatch(repltest.FuzzRecords(5)), repltest.FuzzBatch(repltest.FuzzRecords(64))
	add("FuzzFrameReader", "batch-raw-records", appendBatch(nil, 1, small), uint16(20))
	add("FuzzFrameReader", "batch-s2-records", appendBatch(nil, 2, large), uint16(100))
	// Shared grants (records of kinds 0x41 and 0xC1) and snapshot entries
	// in the format version 3, one per holder with its key's limit: what
	// this link version carries (recordsVersion).
	add("FuzzFrameReader", "batch-shared-records", appendBatch(nil, 3, repltest.FuzzBatch(repltest.FuzzSharedRecords(48))), uint16(70))
	add("FuzzFrameReader", "snap-shard-s2-entries", appendSnapShard(nil, 5, 9, true, repltest.FuzzSharedEntries(64)), uint16(50))
	add("FuzzFrameReader", "snap-shard-raw-entries", appendSnapShard(nil, 5, 9, false, repltest.FuzzSharedEntries(3)), uint16(1))
	bad := (&ack{Kind: ackBatch, Value: 1}).Append(nil)
	bad[len(bad)-1] ^= 1
	add("FuzzFrameReader", "bad-crc", bad, uint16(0))
	add("FuzzFrameReader", "too-large", []byte{0x01, 0, 0, 1, 1}, uint16(2))
	add("FuzzFrameReader", "unknown-type", wireFrame(13, []byte("x")), uint16(4))

	return seeds
}

// TestFuzzCorpus: the seed corpus under testdata/fuzz holds every seed
// above as it is built now (go test -run TestFuzzCorpus -write-corpus
// rewrites it).
func TestFuzzCorpus(t *testing.T) { repltest.CheckCorpus(t, frameSeeds()) }

// fuzzFrame is what a FrameReader returned.
type fuzzFrame struct {
	t   msgType
	p   []byte
	err error
}

func fuzzReadFrames(r io.Reader, bufSize int) []fuzzFrame {
	fr := newFrameReader(r)
	if bufSize > 0 {
		fr.buf = make([]byte, bufSize)
	}
	var out []fuzzFrame
	for {
		t, p, err := fr.Next()
		out = append(out, fuzzFrame{t, append([]byte(nil), p...), err})
		if err != nil {
			return out
		}
	}
}

// FuzzFrameReader: a byte stream read whole, split in two at split, and
// through a tiny buffer yields the same frames and the same final error
// (one the reader documents); every frame re-frames to its own bytes, and
// a payload that decodes as its message re-encodes to the same frame (its
// records or entries too, when they decode).
func FuzzFrameReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		whole := fuzzReadFrames(bytes.NewReader(data), 0)
		cut := int(split) % (len(data) + 1)
		parts := fuzzReadFrames(&wireChunks{chunks: [][]byte{data[:cut:cut], data[cut:]}}, 0)
		tiny := fuzzReadFrames(fuzzOneByte(data), 5)
		for _, other := range [][]fuzzFrame{parts, tiny} {
			if len(other) != len(whole) {
				t.Fatalf("%d frames whole, %d split", len(whole), len(other))
			}
			for i := range whole {
				a, b := whole[i], other[i]
				if a.t != b.t || !bytes.Equal(a.p, b.p) || a.err != b.err {
					t.Fatalf("frame %d: whole %v %x %v, split %v %x %v", i, a.t, a.p, a.err, b.t, b.p, b.err)
				}
			}
		}
		last := whole[len(whole)-1].err
		known := []error{io.EOF, io.ErrUnexpectedEOF, errFrameTooLarge, errFrameTooShort, errBadCRC, errUnknownType}
		if !slices.Contains(known, last) {
			t.Fatalf("final error %v", last)
		}
		off := 0
		for _, fr := range whole[:len(whole)-1] {
			frame := appendFrame(nil, fr.t, fr.p)
			if !bytes.HasPrefix(data[off:], frame) {
				t.Fatalf("frame at %d re-frames to %x", off, frame)
			}
			off += len(frame)
			fuzzMessage(t, fr.t, fr.p, frame)
		}
	})
}

// fuzzOneByte reads data one byte at a time.
func fuzzOneByte(data []byte) io.Reader {
	chunks := make([][]byte, len(data))
	for i := range data {
		chunks[i] = data[i : i+1]
	}
	return &wireChunks{chunks: chunks}
}

// fuzzProtos is a message of every type (each has a wire case).
var fuzzProtos = func() map[msgType]wireMsg {
	protos := map[msgType]wireMsg{}
	for _, c := range wireCases() {
		protos[c.t] = c.m
	}
	return protos
}()

// fuzzMessage decodes a payload as its type's message; what decodes must
// re-encode to frame.
func fuzzMessage(t *testing.T, typ msgType, p, frame []byte) {
	proto, ok := fuzzProtos[typ]
	if !ok {
		t.Fatalf("reader returned type %v", typ)
	}
	m := newWireMsg(proto)
	err := m.Decode(p)
	if err != nil {
		if !errors.Is(err, errShortPayload) && !errors.Is(err, errLongPayload) && !errors.Is(err, errBadField) &&
			!(typ == msgHello && errors.Is(err, errMismatch)) {
			t.Fatalf("%v: Decode: %v", typ, err)
		}
		return
	}
	if again := m.Append(nil); !bytes.Equal(again, frame) {
		t.Fatalf("%v %+v re-encodes to %x, frame %x", typ, m, again, frame)
	}
	switch m := m.(type) {
	case *batch:
		if raw, err := m.Raw(nil); err == nil {
			repltest.RecordsRoundTrip(t, raw)
		}
	case *snapShard:
		if raw, err := m.Raw(nil); err == nil {
			repltest.EntriesVersionRoundTrip(t, raw, recordsVersion)
		}
	}
}
