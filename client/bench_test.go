package client

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

// benchKeys are 65,536 distinct keys of about 16 bytes.
var benchKeys = func() []string {
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "bench/key/" + strconv.Itoa(i)
	}
	return keys
}()

// BenchmarkAcquireRelease: one goroutine, one Acquire + Release round trip
// per op through the client; reports allocations.
func BenchmarkAcquireRelease(b *testing.B) {
	srv := sharedServer(b)
	cl := newClient(b, Config{Addrs: []string{srv.Addr()}})
	waitUp(b, cl, 2)
	ctx := context.Background()
	opts := AcquireOptions{Wait: time.Second, Lease: 30 * time.Second}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := cl.Acquire(ctx, benchKeys[i&(len(benchKeys)-1)], opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := cl.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParallel64: 64 goroutines share one Client, each looping
// Acquire + Release on random keys; reports pairs/s. Compare with
// internal/lockdtest's BenchmarkRawPipelined (make bench-client runs
// both). "default" is the default
// configuration for one address (two connections); "conns=1" keeps the
// whole pipeline on one connection.
func BenchmarkParallel64(b *testing.B) {
	b.Run("default", func(b *testing.B) { benchParallel(b, 0) }) // 2 connections to one address
	b.Run("conns=1", func(b *testing.B) { benchParallel(b, 1) })
}

// BenchmarkParallel64Async: 64 goroutines share one Client, each keeping
// depth acquires in flight with AcquireAsync, then releasing the grants
// with ReleaseAsync; reports pairs/s. depth 8 gives 512 requests in flight,
// the raw generator's 16 × 32. Each goroutine takes its own keys, distinct
// within a round (spread over its share of the key set from a random
// start): a goroutine waiting on one ticket while grants of its
// other tickets sit unclaimed would otherwise deadlock with another doing
// the same (until the 5 s wait ends).
func BenchmarkParallel64Async(b *testing.B) {
	for _, depth := range []int{2, 8} {
		b.Run("depth="+strconv.Itoa(depth), func(b *testing.B) { benchParallelAsync(b, depth) })
	}
}

func benchParallelAsync(b *testing.B, depth int) {
	cl := newClient(b, Config{Addrs: []string{benchAddr(b)}})
	opts := AcquireOptions{Wait: 5 * time.Second, Lease: 30 * time.Second}
	part := len(benchKeys) / parallelWorkers
	stride := part / depth
	runWorkers(b, cl, depth, func(w int, rng *rand.Rand, rounds int) error {
		ctx := context.Background()
		keys := benchKeys[w*part : (w+1)*part]
		ts := make([]*Ticket, depth)
		rs := make([]Releasing, depth)
		for i := 0; i < rounds; i++ {
			r := rng.IntN(part)
			for j := range ts {
				ts[j] = cl.AcquireAsync(ctx, keys[(r+j*stride)%part], opts)
			}
			for j, t := range ts {
				l, err := t.Wait()
				if err != nil {
					return err
				}
				rs[j] = cl.ReleaseAsync(ctx, l)
			}
			for _, r := range rs {
				if err := r.Wait(); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func benchParallel(b *testing.B, conns int) {
	cl := newClient(b, Config{Addrs: []string{benchAddr(b)}, ConnsPerAddr: conns})
	opts := AcquireOptions{Wait: 5 * time.Second, Lease: 30 * time.Second}
	runWorkers(b, cl, 1, func(_ int, rng *rand.Rand, rounds int) error {
		ctx := context.Background()
		for i := 0; i < rounds; i++ {
			l, err := cl.Acquire(ctx, benchKeys[rng.IntN(len(benchKeys))], opts)
			if err != nil {
				return err
			}
			if err := cl.Release(ctx, l); err != nil {
				return err
			}
		}
		return nil
	})
}

// parallelWorkers is the number of goroutines sharing the Client.
const parallelWorkers = 64

// runWorkers waits for cl's connections, then runs work on parallelWorkers
// goroutines, each for b.N/(workers·pairsPerRound)+1 rounds of
// pairsPerRound acquire+release pairs, and reports pairs/s.
func runWorkers(b *testing.B, cl *Client, pairsPerRound int, work func(w int, rng *rand.Rand, rounds int) error) {
	waitUp(b, cl, len(*cl.slots.Load()))
	rounds := b.N/(parallelWorkers*pairsPerRound) + 1
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < parallelWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			if err := work(w, rand.New(rand.NewPCG(uint64(w), 3)), rounds); err != nil {
				b.Error(err)
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(rounds*parallelWorkers*pairsPerRound)/el.Seconds(), "pairs/s")
}

// BenchmarkKeptLock: one goroutine, per op an Acquire, a KeepAlive
// started and stopped, and a Release: what a lock kept by WithLock, a
// Semaphore or an RWMutex costs around the work, with its watch (a W,
// its answer, and the L of the release) and without (NoWatch).
func BenchmarkKeptLock(b *testing.B) {
	for _, nowatch := range []bool{false, true} {
		name := "watched"
		if nowatch {
			name = "nowatch"
		}
		b.Run(name, func(b *testing.B) {
			cl := newClient(b, Config{Addrs: []string{benchAddr(b)}})
			waitUp(b, cl, 2)
			ctx := context.Background()
			opts := AcquireOptions{Wait: time.Second, Lease: 30 * time.Second}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				l, err := cl.Acquire(ctx, benchKeys[i&(len(benchKeys)-1)], opts)
				if err != nil {
					b.Fatal(err)
				}
				ka, err := cl.KeepAlive(ctx, l, KeepAliveOptions{Lease: 30 * time.Second, NoWatch: nowatch})
				if err != nil {
					b.Fatal(err)
				}
				if err := ka.Stop(); err != nil {
					b.Fatal(err)
				}
				if err := cl.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
