package engine

import "sync"

// barrier is the batch barrier (server.go): every batch holds it for
// reading while it applies requests under the gate and the draining flag
// it read, and its write lock waits for those batches (GateChanged,
// Shutdown).
//
// It is striped: each event loop reads its own stripe (a sync.RWMutex on
// a cache line of its own, in the loop's loopStats), so that a batch
// writes nothing that another loop's batches write — one RWMutex for the
// whole server took two atomic adds on one shared line per batch, from
// every loop. The write lock takes every stripe, in the order they were
// made, while holding mu, so a stripe made meanwhile (a loop's first
// connection) waits for it to end before its first batch.
type barrier struct {
	mu      sync.Mutex // held from Lock to Unlock, and while a stripe is added
	stripes []*stripe  // guarded by mu; only appended to
}

// stripe is one reader's part of the barrier.
type stripe struct {
	sync.RWMutex
	_ [64 - 24]byte // a line of its own, with what precedes it in loopStats
}

// add makes s a stripe of b: the write lock takes it from now on.
func (b *barrier) add(s *stripe) {
	b.mu.Lock()
	b.stripes = append(b.stripes, s)
	b.mu.Unlock()
}

// Lock waits until no batch holds any stripe, and holds them all.
func (b *barrier) Lock() {
	b.mu.Lock()
	for _, s := range b.stripes {
		s.Lock()
	}
}

// Unlock releases what Lock took.
func (b *barrier) Unlock() {
	for _, s := range b.stripes {
		s.Unlock()
	}
	b.mu.Unlock()
}
