package priority

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// BenchmarkSinkPairs is what the stream costs the event loop per
// acquire/release pair (ns/op is per pair, on the goroutine that plays the
// loop): the table alone (no-sink), with the Sink and the flusher cutting a
// batch every millisecond on its own goroutine as a member does
// (flusher), and with the same cuts made on the loop's goroutine (inline:
// the cut's own work is counted, but nothing the Sink wrote is read from
// another core). 64 pairs are in flight, as a pipelined client keeps them,
// so most cancel out within their batch. Run it with -cpu 2: the flusher
// case measures what moving the records between cores costs the loop.
func BenchmarkSinkPairs(b *testing.B) {
	for _, mode := range []string{"no-sink", "flusher", "inline"} {
		b.Run(mode, func(b *testing.B) { sinkPairs(b, mode) })
	}
}

func sinkPairs(b *testing.B, mode string) {
	o := newOutStream(nil, repltest.Quiet(), nil, nil)
	cfg := shard.Config{}
	if mode != "no-sink" {
		cfg.SinkRef, cfg.Defer = o.sink, o.deferGrant
	}
	tab, err := shard.New(cfg, shard.NewTokens(1000, 1<<62))
	if err != nil {
		b.Fatal(err)
	}
	o.attach(tab, nil, nil)
	o.active.Store(true)
	o.targets.Store(1)
	keys := make([][]byte, 1<<16)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench/key/%06d", i)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if mode == "flusher" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(batchEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					o.flushNow()
				}
			}
		}()
	}
	const inflight = 64
	const inlineEvery = 4096 // pairs per inline cut: about a millisecond's worth
	tokens := make([]uint64, len(keys))
	var out shard.Out
	for i := 0; b.Loop(); i++ {
		k := i & (len(keys) - 1)
		_, tokens[k] = tab.Acquire(int64(i), keys[k], 0, 10, 1, nil, &out)
		if i >= inflight {
			j := (i - inflight) & (len(keys) - 1)
			tab.Release(int64(i), keys[j], tokens[j], &out)
		}
		out.Reset()
		if mode == "inline" && i%inlineEvery == inlineEvery-1 {
			o.flushNow()
		}
	}
	close(stop)
	wg.Wait()
	if mode != "no-sink" {
		o.flushNow()
		if st := &o.stats; st.records.Load() == 0 || st.cancelled.Load() == 0 {
			b.Fatalf("%d records, %d cancelled: the stream kept nothing", st.records.Load(), st.cancelled.Load())
		}
	}
}
