package engine

import (
	"strconv"
	"testing"
	"time"
)

// TestBarrier: the write lock waits for a reader of any stripe, holds off
// new readers of every stripe until Unlock, and a stripe added while it is
// held (a loop's first connection) is taken by the next Lock and cannot be
// read before this one ends.
func TestBarrier(t *testing.T) {
	const stripes = 3
	for reader := range stripes {
		t.Run("reader on stripe "+strconv.Itoa(reader), func(t *testing.T) {
			var b barrier
			ss := make([]*stripe, stripes)
			for i := range ss {
				ss[i] = new(stripe)
				b.add(ss[i])
			}
			ss[reader].RLock()
			locked := make(chan struct{})
			go func() { b.Lock(); close(locked) }()
			select {
			case <-locked:
				t.Fatalf("Lock returned while stripe %d was read", reader)
			case <-time.After(20 * time.Millisecond):
			}
			ss[reader].RUnlock()
			<-locked
			for i, s := range ss {
				if s.TryRLock() {
					t.Fatalf("stripe %d read under the write lock", i)
				}
			}
			// A stripe made now waits for Unlock to join.
			late := new(stripe)
			added := make(chan struct{})
			go func() { b.add(late); close(added) }()
			select {
			case <-added:
				t.Fatal("a stripe joined while the write lock was held")
			case <-time.After(20 * time.Millisecond):
			}
			b.Unlock()
			<-added
			for i, s := range append(ss, late) {
				if !s.TryRLock() {
					t.Fatalf("stripe %d not readable after Unlock", i)
				}
				s.RUnlock()
			}
			// The next Lock takes the late stripe too.
			late.RLock()
			locked = make(chan struct{})
			go func() { b.Lock(); close(locked) }()
			select {
			case <-locked:
				t.Fatal("Lock returned while the late stripe was read")
			case <-time.After(20 * time.Millisecond):
			}
			late.RUnlock()
			<-locked
			b.Unlock()
		})
	}
}
