//go:build !race

package priority

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// The race detector's instrumentation allocates, so these run without it
// (make test runs them with -run 'Allocs$').

// wireSink keeps what a measured call returns, so that nothing is
// optimised away or kept on the stack.
var wireSink []byte

// wireLoop serves its stream over and over, in reads of at most step bytes.
type wireLoop struct {
	stream []byte
	off    int
	step   int
}

func (r *wireLoop) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), r.step)], r.stream[r.off:])
	if r.off += n; r.off == len(r.stream) {
		r.off = 0
	}
	return n, nil
}

// TestFrameReaderAllocs: once its buffer has grown, the reader allocates
// nothing per frame, whether frames arrive whole or split.
func TestFrameReaderAllocs(t *testing.T) {
	stream, _ := wireStream()
	big := appendBatch(nil, 1, make([]byte, 200<<10)) // grows the buffer past its start size
	stream = append(stream, big...)
	cycle := len(wireCases()) + 1
	for _, step := range []int{1 << 20, 7} {
		fr := newFrameReader(&wireLoop{stream: stream, step: step})
		for range 3 * cycle { // warm up: the buffer grows once
			if _, _, err := fr.Next(); err != nil {
				t.Fatal(err)
			}
		}
		// One run reads a whole cycle of frames: AllocsPerRun divides as
		// integers, so an allocation in fewer than every run would not show.
		if n := testing.AllocsPerRun(100, func() {
			for range cycle {
				var err error
				if _, wireSink, err = fr.Next(); err != nil {
					t.Fatal(err)
				}
			}
		}); n != 0 {
			t.Fatalf("reads of %d: %v allocs per cycle of frames, want 0", step, n)
		}
	}
}

// TestMessageAllocs: encoding every message into a buffer with room and
// decoding it allocate nothing.
func TestMessageAllocs(t *testing.T) {
	dst := make([]byte, 0, 4096)
	for _, c := range wireCases() {
		frame := c.m.Append(nil)
		p := frame[frameHead : len(frame)-frameTail]
		back := newWireMsg(c.m)
		if n := testing.AllocsPerRun(100, func() {
			dst = c.m.Append(dst[:0])
			if err := back.Decode(p); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocs, want 0", c.name, n)
		}
	}
}

// TestCompressAllocs: framing a batch into a buffer with room (s2
// included) and decompressing into a large enough buffer allocate
// nothing.
func TestCompressAllocs(t *testing.T) {
	raw := repltest.Batches(t, repltest.Workload(t, 512, 12), 512)[0]
	dst := make([]byte, 0, 2*len(raw)+64)
	scratch := make([]byte, len(raw))
	var b batch
	if n := testing.AllocsPerRun(50, func() {
		dst = appendBatch(dst[:0], 1, raw)
		if err := b.Decode(dst[frameHead : len(dst)-frameTail]); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Raw(scratch); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AppendBatch + Decode + Raw: %v allocs", n)
	}
	if b.Codec != records.CodecS2 {
		t.Fatalf("a batch of 512 records sent %v", b.Codec)
	}
}

// TestSinkAndCancelAllocs: the active's Sink and the grants its table
// holds back (on the event loop, under a shard lock) and the cut of a
// batch of acquire/release pairs
// — exclusive, or two holders of a shared key each released — allocate
// nothing once their buffers have grown.
func TestSinkAndCancelAllocs(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) { sinkAndCancelAllocs(t, shared) })
	}
}

func sinkAndCancelAllocs(t *testing.T, shared bool) {
	rig := newCancelRig(t, 4)
	tab := rig.table
	var out shard.Out
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = []byte{'k', byte(i)}
	}
	pairs := func() {
		for _, k := range keys {
			if shared {
				_, a := tab.AcquireShared(0, k, 0, 30, 1, 4, shard.NoIdent, nil, &out)
				_, b := tab.AcquireShared(0, k, 0, 30, 2, 4, shard.NoIdent, nil, &out)
				tab.Release(0, k, a, &out)
				tab.Release(0, k, b, &out)
			} else {
				_, tok := tab.Acquire(0, k, 0, 30, 1, nil, &out)
				tab.Release(0, k, tok, &out)
			}
			out.Reset()
		}
	}
	var w records.BatchWriter
	cut := func() {
		w.Reset()
		for i := range rig.o.bufs {
			rig.o.cutShard(i, &w, 0, true)
		}
	}
	pairs()
	cut() // grows the buffers and the map
	if n := testing.AllocsPerRun(20, func() { pairs(); cut() }); n != 0 {
		t.Errorf("Sink and canceller: %v allocs per batch of 64 pairs", n)
	}
	if w.Count() == 0 || w.Count() > len(rig.o.bufs) {
		t.Errorf("a batch of 64 pairs went as %d records, want one skip per shard", w.Count())
	}
}
