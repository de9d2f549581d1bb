package raftnode

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// commitWaiter lets load goroutines wait, as the engine's connections do,
// until the records they made are committed.
type commitWaiter struct {
	raftHost
	done atomic.Uint64
	mu   sync.Mutex
	cond *sync.Cond
}

func newCommitWaiter() *commitWaiter {
	w := &commitWaiter{}
	w.cond = sync.NewCond(&w.mu)
	return w
}

func (w *commitWaiter) Committed(seq uint64) {
	w.mu.Lock()
	w.done.Store(seq)
	w.cond.Broadcast()
	w.mu.Unlock()
}

func (w *commitWaiter) wait(seq uint64) {
	if w.done.Load() >= seq {
		return
	}
	w.mu.Lock()
	for w.done.Load() < seq {
		w.cond.Wait()
	}
	w.mu.Unlock()
}

// BenchmarkRaftLogStore compares the raft log stores under lockd's load: a
// 3-member cluster in this process on loopback, fsync on every append; G
// goroutines act as clients doing acquire+release pairs of their own keys
// on the leader's table, each waiting for its change to commit before the
// next (as the engine holds answers): group commit forms the entries. One
// op is one pair. Reported: entries/s, records/s, records/entry and the
// commit latency p50/p99 (proposal to commit, the last 1024 entries).
//
//	go test ./repl/raftnode -run '^$' -bench RaftLogStore -benchtime 20000x
func BenchmarkRaftLogStore(b *testing.B) {
	for _, kind := range []logStoreKind{logStoreWAL, logStoreBolt} {
		for _, g := range []int{1, 16, 128, 256} {
			b.Run(fmt.Sprintf("%s/g%d", kind, g), func(b *testing.B) { benchRaftStore(b, kind, g) })
		}
	}
}

func benchRaftStore(b *testing.B, kind logStoreKind, g int) {
	const offset = 1000
	peers := repltest.FreeAddrs(b, 3, offset)
	type mem struct {
		n     *node
		table *shard.Table
		w     *commitWaiter
		clock func() int64
	}
	ms := make([]*mem, 3)
	for i := range 3 {
		n, err := newNode(repl.ClusterConfig{Peers: peers, Self: i, Listen: peers[i], PeerOffset: offset,
			FailoverTimeout: time.Second, DataDir: b.TempDir(), TokenBlock: 1 << 22}, kind)
		if err != nil {
			b.Fatal(err)
		}
		m := &mem{n: n, w: newCommitWaiter(), clock: repltest.Clock()}
		if m.table, err = n.Open(shard.Config{}, m.clock, repltest.Quiet()); err != nil {
			b.Fatal(err)
		}
		if err := n.Start(peers[i], m.w); err != nil {
			b.Fatal(err)
		}
		ms[i] = m
	}
	defer func() {
		for _, m := range ms {
			m.n.Close(b.Context(), repl.Discard)
		}
	}()
	var l *mem
	deadline := time.Now().Add(10 * time.Second)
	for l == nil {
		for _, m := range ms {
			if m.n.Gate().State == repl.Serve {
				l = m
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	e0, r0 := l.n.stats.entries.Load(), l.n.stats.records.Load()
	for c := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out shard.Out
			key := []byte(fmt.Sprintf("bench/key/%06d", c))
			for next.Add(1) <= int64(b.N) {
				st, tok := l.table.Acquire(l.clock(), key, 0, 30, 0, nil, &out)
				if st != shard.Granted {
					b.Errorf("acquire: %v", st)
					return
				}
				l.w.wait(l.n.Barrier())
				l.table.Release(l.clock(), key, tok, &out)
				l.w.wait(l.n.Barrier())
			}
		}()
	}
	wg.Wait()
	el := time.Since(began).Seconds()
	b.StopTimer()
	entries := float64(l.n.stats.entries.Load() - e0)
	records := float64(l.n.stats.records.Load() - r0)
	p50, p99 := l.n.stats.percentiles()
	b.ReportMetric(entries/el, "entries/s")
	b.ReportMetric(records/el, "records/s")
	b.ReportMetric(records/max(entries, 1), "records/entry")
	b.ReportMetric(p50*1e3, "p50-ms")
	b.ReportMetric(p99*1e3, "p99-ms")
	b.ReportMetric(float64(b.N)/el, "pairs/s")
}
