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
// nothing once their buffers have grown. With young, grants still held at
// the cut are kept for the next one, as the flusher's cuts keep them (the
// split of the Sink's records, the kept records and skips put back in
// front).
func TestSinkAndCancelAllocs(t *testing.T) {
	for _, shared := range []bool{false, true} {
		for _, young := range []bool{false, true} {
			t.Run(fmt.Sprint("shared=", shared, "/young=", young), func(t *testing.T) { sinkAndCancelAllocs(t, shared, young) })
		}
	}
}

func sinkAndCancelAllocs(t *testing.T, shared, young bool) {
	rig := newCancelRig(t, 4)
	tab := rig.table
	var out shard.Out
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = []byte{'k', byte(i)}
	}
	held := make([][]byte, 8)
	tokens := make([]uint64, len(held))
	for i := range held {
		held[i] = []byte{'h', byte(i)}
	}
	now := int64(1e9)
	pairs := func() {
		for _, k := range keys {
			if shared {
				_, a := tab.AcquireShared(now, k, 0, 30, 1, 4, shard.NoIdent, nil, &out)
				_, b := tab.AcquireShared(now, k, 0, 30, 2, 4, shard.NoIdent, nil, &out)
				tab.Release(now, k, a, &out)
				tab.Release(now, k, b, &out)
			} else {
				_, tok := tab.Acquire(now, k, 0, 30, 1, nil, &out)
				tab.Release(now, k, tok, &out)
			}
			out.Reset()
		}
	}
	var w records.BatchWriter
	kept := 0
	cut := func(since int64, all bool) {
		w.Reset()
		for i := range rig.o.bufs {
			if _, _, k := rig.o.cutShard(i, &w, since, all); k {
				kept++
			}
		}
	}
	batch := func() {
		if !young {
			pairs()
			cut(0, true)
			return
		}
		// Grants made now and still held at a cut at now are kept, with
		// the pairs after them; the next cut sends them, ended.
		now += 1e6
		for i, k := range held {
			_, tokens[i] = tab.Acquire(now, k, 0, 30, 1, nil, &out)
		}
		pairs()
		cut(now, false)
		for i, k := range held {
			tab.Release(now, k, tokens[i], &out)
		}
		out.Reset()
		pairs()
		cut(now, false)
	}
	batch() // grows the buffers and the map
	if n := testing.AllocsPerRun(20, batch); n != 0 {
		t.Errorf("Sink and canceller: %v allocs per batch of 64 pairs", n)
	}
	if young && kept == 0 {
		t.Fatal("no cut kept anything: the young path was not run")
	}
	if w.Count() == 0 || w.Count() > len(rig.o.bufs) {
		t.Errorf("a batch of 64 pairs went as %d records, want one skip per shard", w.Count())
	}
}
