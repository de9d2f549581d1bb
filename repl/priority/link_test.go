package priority

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/priority/machine"
)

// TestItemWriterKeepsHeartbeats: an item written in
// place — a snapshot — that writes frames, waits for its window and waits
// for work done beside it never holds the heartbeats back: on the wire,
// heartbeats keep coming every interval while it runs, and what was queued
// behind it follows it in order.
func TestItemWriterKeepsHeartbeats(t *testing.T) {
	cfg := repl.ClusterConfig{Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}, Self: 0, FailoverTimeout: time.Second}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	l := newLink(cfg, hello{Version: protocolVersion}, repltest.Quiet(), linkEvents{}, quit, &wg)
	pe := l.peers[1]
	ours, theirs := net.Pipe()
	defer theirs.Close()

	const (
		every = 10 * time.Millisecond
		runs  = 600 * time.Millisecond
	)
	work := make(chan struct{})
	pe.queue = []outItem{{write: func(w *itemWriter) error {
		for range 5 { // frames, then a window that does not open for a while
			if err := w.frame(appendAck(nil, ackBatch, 1)); err != nil {
				return err
			}
		}
		if err := w.wait(nil, runs/3); err != nil {
			return err
		}
		time.AfterFunc(runs/3, func() { close(work) })
		if err := w.waitFor(work); err != nil { // a shard dumped beside the writer
			return err
		}
		// A burst of frames with no wait between them (a heartbeat at
		// most one frame late), then the end.
		for range 3 {
			time.Sleep(runs / 9)
			if err := w.frame(appendAck(nil, ackBatch, 2)); err != nil {
				return err
			}
		}
		return w.frame(appendAck(nil, ackSnapshot, 3))
	}}, {frame: appendAck(nil, ackReserve, 4)}}
	wg.Go(func() { _ = pe.write(ours) })
	stopBeats := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for probe := uint64(1); ; probe++ {
			select {
			case <-stopBeats:
				return
			case <-tick.C:
			}
			pe.setHeartbeat(&heartbeat{Role: machine.RoleActive, Probe: probe})
		}
	})

	fr := newFrameReader(theirs)
	var last time.Time
	var gaps []time.Duration
	var acks []ackKind
	began := time.Now()
	for len(acks) == 0 || acks[len(acks)-1] != ackReserve {
		_ = theirs.SetReadDeadline(time.Now().Add(5 * time.Second))
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatalf("after %v: %v", time.Since(began), err)
		}
		switch typ {
		case msgHeartbeat:
			if !last.IsZero() {
				gaps = append(gaps, time.Since(last))
			}
			last = time.Now()
		case msgAck:
			var a ack
			if err := a.Decode(p); err != nil {
				t.Fatal(err)
			}
			acks = append(acks, a.Kind)
		}
	}
	close(stopBeats)
	close(quit)
	pe.close()
	ours.Close()
	wg.Wait()
	if n := len(acks); n != 10 || acks[8] != ackSnapshot || acks[9] != ackReserve {
		t.Fatalf("frames out of order: %v", acks)
	}
	worst := time.Duration(0)
	for _, g := range gaps {
		worst = max(worst, g)
	}
	t.Logf("%d heartbeats in %v, the longest gap %v", len(gaps)+1, time.Since(began), worst)
	// Without the interleaving, the gaps would be the item's waits (a
	// third of runs each) and more; on a loaded machine a goroutine may
	// still be late by a few intervals.
	if len(gaps) < int(runs/every)/3 || worst >= runs/3 {
		t.Fatalf("%d heartbeats while the item ran %v, the longest gap %v: the item held them back", len(gaps)+1, time.Since(began), worst)
	}
}

// TestSnapshotWindowByBytes: the snapshot window counts raw
// bytes, not frames. A small table's shards — a frame each, nearly empty —
// all go before the first SnapAck, where a window of eight frames needed a
// round trip per eight shards (over 6 s for one lock's 64 shards with the
// member links delayed 1.5 s, with a handover queued behind it). Full
// frames still stop at 512 KiB in flight, and each SnapAck reopens it.
func TestSnapshotWindowByBytes(t *testing.T) {
	cases := []struct {
		name   string
		raw    int // each frame's raw bytes
		frames int // frames offered
		before int // frames sent before the window closes (no SnapAck)
	}{
		{"64 empty shards", 0, 64, 64},
		{"64 shards of one lock each", 40, 64, 64},
		{"full frames", snapChunk, 20, snapWindow},
		{"frames a little over a chunk", snapChunk + 100, 20, snapWindow - 1},
		{"one frame always goes", 2 * snapWindow * snapChunk, 3, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tg target
			tg.snapCond = make(chan struct{})
			tg.newSnapshot()
			sent := 0
			for range tc.frames {
				if !windowOpen(tg.inFlight(), tc.raw) {
					break
				}
				tg.snapFrameSent(tc.raw)
				sent++
			}
			if sent != tc.before {
				t.Fatalf("sent %d frames before the first SnapAck, want %d", sent, tc.before)
			}
			if sent == tc.frames {
				return
			}
			// One frame acknowledged: exactly room for one more of the same size.
			tg.snapAck = 1
			if !windowOpen(tg.inFlight(), tc.raw) {
				t.Fatalf("after a SnapAck of 1 frame, %d in flight: the window stays closed", tg.inFlight())
			}
			tg.snapFrameSent(tc.raw)
			if windowOpen(tg.inFlight(), tc.raw) {
				t.Fatalf("after one SnapAck, two more frames fit: %d in flight", tg.inFlight())
			}
		})
	}
}
