package main

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// The failover mode's load: library workers and raw probes, both given
// every member's address, writing what they get into the recorder and the
// outcomes.

// loadGen is the failover mode's clients.
type loadGen struct {
	rec   *recorder
	out   *outcomes
	cl    *client.Client
	addrs []string
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	seq   atomic.Uint64
}

// startLoad starts workers library goroutines and probes raw probes
// against addrs.
func startLoad(addrs []string, workers, probes int, rec *recorder) (*loadGen, error) {
	cl, err := client.New(client.Config{Addrs: addrs})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{rec: rec, out: &outcomes{}, cl: cl, addrs: addrs, ctx: ctx, stop: cancel}
	for w := range workers {
		g.wg.Add(1)
		go g.worker(w)
	}
	for p := range probes {
		g.wg.Add(1)
		go g.probe(p)
	}
	return g, nil
}

// close stops the clients and waits for them.
func (g *loadGen) close() {
	g.stop()
	g.wg.Wait()
	g.cl.Close()
}

// pause sleeps d unless the load is stopping; it reports whether to go on.
func (g *loadGen) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// worker loops Acquire(wait 0) → Release with the library on keys of its
// own.
func (g *loadGen) worker(w int) {
	defer g.wg.Done()
	opts := client.AcquireOptions{Lease: 10 * time.Second}
	for n := 0; g.ctx.Err() == nil; n++ {
		key := "failover/w" + strconv.Itoa(w) + "/" + strconv.Itoa(n)
		s := g.rec.now()
		l, err := g.cl.Acquire(g.ctx, key, opts)
		if err != nil {
			if k := clientOutcome(err); k != "" {
				g.out.add(k, g.rec.now())
			}
			if !g.pause(time.Millisecond) {
				return
			}
			continue
		}
		g.rec.add(event{start: s, end: g.rec.now(), member: -1, kind: evGrant})
		s = g.rec.now()
		if err := g.cl.Release(g.ctx, l); err != nil {
			if k := clientOutcome(err); k != "" {
				g.out.add(k, g.rec.now())
			}
			continue
		}
		g.rec.add(event{start: s, end: g.rec.now(), member: -1, kind: evRelease})
	}
}

// probe is a raw client that knows which member answers: it sends one
// request at a time to the member it takes for the active, follows an M
// with an address at once, and moves to the next member 1 ms after a
// refused dial, a lost connection, an E or an M without an address.
func (g *loadGen) probe(id int) {
	defer g.wg.Done()
	conns := make([]*clustertest.Conn, len(g.addrs))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	cur := 0
	next := func() bool {
		cur = (cur + 1) % len(g.addrs)
		return g.pause(time.Millisecond)
	}
	drop := func() {
		conns[cur].Close()
		conns[cur] = nil
	}
	var frame []byte
	for n := uint64(0); g.ctx.Err() == nil; n++ {
		if conns[cur] == nil {
			c, err := clustertest.Dial(g.addrs[cur])
			if err != nil {
				g.out.add("probe dial refused", g.rec.now())
				if !next() {
					return
				}
				continue
			}
			c.SetTimeout(2 * time.Second)
			conns[cur] = c
		}
		c := conns[cur]
		key := "failover/p" + strconv.Itoa(id) + "/" + strconv.FormatUint(n, 10)
		owner := g.seq.Add(1)
		s := g.rec.now()
		frame = proto.AppendAcquire(frame[:0], 0, 10, owner, key)
		resp, err := c.Do(frame)
		if err != nil {
			g.out.add("probe connection lost", g.rec.now())
			drop()
			if !next() {
				return
			}
			continue
		}
		switch resp.Op {
		case proto.OpAcquire:
			g.rec.add(event{start: s, end: g.rec.now(), member: int8(cur), kind: evGrant})
			s = g.rec.now()
			frame = proto.AppendRelease(frame[:0], resp.Token, key)
			r, err := c.Do(frame)
			switch {
			case err != nil:
				g.out.add("probe connection lost", g.rec.now())
				drop()
				next()
			case r.Op == proto.OpRelease:
				g.rec.add(event{start: s, end: g.rec.now(), member: int8(cur), kind: evRelease})
			case r.Op == proto.OpError:
				g.out.add(probeErrorOutcome(true, r.Code), g.rec.now())
			default:
				g.out.add("probe release "+r.Op.String(), g.rec.now())
			}
		case proto.OpMoved:
			g.out.add("probe M", g.rec.now())
			if i := slices.Index(g.addrs, string(resp.Tail)); i >= 0 && i != cur {
				cur = i
			} else if !next() {
				return
			}
		case proto.OpError:
			g.out.add(probeErrorOutcome(false, resp.Code), g.rec.now())
			if !next() {
				return
			}
		default:
			g.out.add("probe "+resp.Op.String(), g.rec.now())
			if !g.pause(time.Millisecond) {
				return
			}
		}
	}
}
