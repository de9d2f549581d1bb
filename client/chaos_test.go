package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/fence"
)

// TestChaos: a proxy cuts every connection at a random byte offset while 32
// goroutines loop acquire/release on 4 keys. Every Lock returned must be
// real — the server holds exactly that token, and a fence that sees every
// grant accepts it as newer than every earlier one — and no two holders of
// a key may overlap. Leases (3 s) are far longer than a holder's critical
// section, so no legitimate lease ends while held.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test skipped in -short mode")
	}
	srv := sharedServer(t)
	p := newProxy(t, srv.Addr(), randCut(uint64(time.Now().UnixNano()), 4<<10))
	cfg := fastConfig(p.addr())
	cfg.ReconnectInterval = 20 * time.Millisecond
	cfg.AnswerAllowance = 500 * time.Millisecond
	cl := newClient(t, cfg)
	waitUp(t, cl, 2)

	const (
		workers = 32
		nkeys   = 4
		run     = 4 * time.Second
		// A grant cut off on its way holds its key until the lease ends,
		// so a run with unlucky cuts can grant little: it goes on (up to
		// run+hardExtra) until it has at least minGrants.
		minGrants = 50
		hardExtra = 12 * time.Second
	)
	var (
		keys    [nkeys]string
		held    [nkeys]atomic.Bool
		fences  [nkeys]fence.Checker
		granted [nkeys]atomic.Int64
		counts  sync.Map // outcome name → *atomic.Int64
	)
	for i := range keys {
		keys[i] = "chaos/" + strconv.Itoa(i)
	}
	count := func(name string) {
		v, _ := counts.LoadOrStore(name, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), run+hardExtra+20*time.Second)
	defer cancel()
	stop := time.Now().Add(run)
	hardStop := stop.Add(hardExtra)
	var grants atomic.Int64
	more := func() bool {
		now := time.Now()
		return now.Before(stop) || grants.Load() < minGrants && now.Before(hardStop)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for more() {
				k := rng.IntN(nkeys)
				l, err := cl.Acquire(ctx, keys[k], AcquireOptions{Wait: 500 * time.Millisecond, Lease: 3 * time.Second})
				switch {
				case err == nil:
				case errors.Is(err, ErrTimeout):
					count("timeout")
					continue
				case errors.Is(err, ErrIndeterminate):
					count("indeterminate") // never enters the section
					continue
				case errors.Is(err, ErrBusy):
					count("busy")
					continue
				default:
					t.Errorf("Acquire: unexpected %v", err)
					return
				}
				if !time.Now().Before(l.Expires) {
					count("expired-before-use")
				} else {
					if !held[k].CompareAndSwap(false, true) {
						t.Errorf("key %d: two holders at once (token %d)", k, l.Token)
						return
					}
					if granted[k].Load() > 0 && fences[k].Largest(keys[k]) >= l.Token {
						t.Errorf("key %d: token %d not above earlier grant %d", k, l.Token, fences[k].Largest(keys[k]))
					}
					if err := fences[k].Check(keys[k], l.Token); err != nil {
						t.Errorf("key %d: fence rejected token %d: %v", k, l.Token, err)
					}
					if info := srv.lookup(t, keys[k]); !info.Held || info.Token != l.Token {
						t.Errorf("key %d: client holds token %d, server %+v", k, l.Token, info)
					}
					granted[k].Add(1)
					grants.Add(1)
					count("granted")
					held[k].Store(false)
				}
				switch err := cl.Release(ctx, l); {
				case err == nil, errors.Is(err, ErrNotHeld), errors.Is(err, ErrIndeterminate), errors.Is(err, ErrNoConnection):
				default:
					t.Errorf("Release: unexpected %v", err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	var total int64
	for i := range granted {
		total += granted[i].Load()
	}
	counts.Range(func(k, v any) bool {
		t.Logf("%s: %d", k, v.(*atomic.Int64).Load())
		return true
	})
	t.Logf("connections cut: %d", p.cuts.Load())
	if total < minGrants {
		t.Fatalf("only %d grants in %v", total, run+hardExtra)
	}
	if p.cuts.Load() < 3 {
		t.Fatalf("only %d cuts: the faults were not exercised", p.cuts.Load())
	}
}
