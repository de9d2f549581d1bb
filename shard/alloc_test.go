//go:build !race

package shard

import "testing"

// TestZeroAllocs checks the steady-state hot paths allocate nothing: entries,
// key buffers, waiters and the Out arena are all reused.
func TestZeroAllocs(t *testing.T) {
	tab, err := New(Config{}, NewTokens(0, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef")
	c := NewConn(nil)
	var out Out
	now := int64(0)
	// Hold a second key for the queue cases.
	hkey := []byte("held-key-0123456")
	_, htok := tab.Acquire(now, hkey, 0, 255, 0, nil, &out)

	tests := []struct {
		name string
		fn   func()
	}{
		{"acquire+release", func() {
			_, tok := tab.Acquire(now, key, 0, 10, 1, c, &out)
			tab.Release(now, key, tok, &out)
		}},
		{"acquire held wait=0", func() {
			tab.Acquire(now, hkey, 0, 10, 1, c, &out)
		}},
		{"renew", func() {
			now += 1000
			tab.Renew(now, hkey, 255, htok, &out)
		}},
		{"queue+handoff", func() {
			tab.Acquire(now, hkey, 5, 255, 2, c, &out)
			tab.Release(now, hkey, htok, &out)
			htok = out.Effects[0].Token
			out.Reset()
		}},
		{"tick with nothing due", func() {
			now += 10_000_000
			tab.Tick(now, &out)
		}},
		{"lookup+stats", func() {
			tab.Lookup(hkey)
			tab.Stats()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn() // warm up pools and the arena
			if n := testing.AllocsPerRun(1000, tc.fn); n != 0 {
				t.Fatalf("%v allocs per run", n)
			}
		})
	}
}
