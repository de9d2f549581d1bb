package priority

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

// TestItemWriterKeepsHeartbeats (issue 18, hole 1): an item written in
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
			pe.setHeartbeat(&heartbeat{Role: roleActive, Probe: probe})
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
