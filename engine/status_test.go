package engine_test

import (
	"fmt"
	"testing"
	"time"
)

// TestLocksHoldsNoShardLockDuringFn: Locks lists every held key with its
// token, and its callback may look at the table (as a slow /debug/locks
// reader may take its time): no shard lock is held while it runs.
func TestLocksHoldsNoShardLockDuringFn(t *testing.T) {
	ts := startServer(t, nil)
	w := dial(t, ts.Addr())
	want := map[string]uint64{}
	for i := range 40 {
		key := fmt.Sprintf("locks/%d", i)
		want[key] = w.grant(key, 30, uint64(i+1))
	}
	got := map[string]uint64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts.Locks(func(key []byte, token uint64, left time.Duration) {
			// Lookup takes the key's shard lock: with that lock held by
			// Locks this would never return.
			if st := ts.Key(key); !st.Held || st.Token != token || left <= 0 {
				t.Errorf("%s: Locks says token %d, %v left; Key says %+v", key, token, left, st)
			}
			got[string(key)] = token
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Locks' callback could not look a key up: a shard lock is held during it")
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Locks listed %v, want %v", got, want)
	}
}
