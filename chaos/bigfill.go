package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// The large-state phase's fill: Config.BigLocks held locks taken over a
// few pipelined connections, pass after pass until every key is held.

// fill takes BigLocks locks over pipelined raw connections to the
// active/leader and returns their tokens (0: unknown). A key whose
// acquire got no answer — the connection closed (raft: a proposal that
// could not commit), M (an election), B — is sent again in a next pass,
// to the member that serves then; a key answered T then was taken by an
// acquire whose answer was lost: its token is unknown, and the checks skip
// it. In priority mode every pass after the first is a violation (nothing
// should have interrupted the active); in raft mode they are counted.
func (b *bigPhase) fill(m int) ([]uint64, error) {
	n := b.cfg.BigLocks
	tokens := make([]uint64, n)
	b.sentAt = make([]int64, n)
	state := make([]uint8, n) // 0 to send, 1 granted, 2 taken by a lost answer
	deadline := time.Now().Add(bigWithin)
	var missed atomicTime // when the last pass first got no grant
	for pass := 0; ; pass++ {
		var todo []int
		for j, st := range state {
			if st == 0 {
				todo = append(todo, j)
			}
		}
		if len(todo) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %d of %d locks not taken in %v", clustertest.ErrTimeout, len(todo), n, bigWithin)
		}
		if pass > 0 {
			prev := m
			lead, err := b.c.WaitLeader(bigStepWithin, clustertest.Every)
			if err != nil {
				return nil, err
			}
			m = lead
			b.mu.Lock()
			b.res.Figures["fill_passes"] = float64(pass + 1)
			b.mu.Unlock()
			at := missed.get()
			if at.IsZero() {
				at = time.Now()
			}
			if why, ok := b.stalledAny(at); ok {
				b.note("taking the locks was interrupted after a stall (%s): %d of %d to send again, to member %d from member %d", why, len(todo), n, m, prev)
			} else if b.cfg.Mode == api.ModePriority {
				b.bad("taking the locks was interrupted: %d of %d to send again, to member %d", len(todo), n, m)
			}
		}
		missed.set(time.Time{})
		if err := b.fillPass(m, todo, tokens, state, time.Now().UnixNano(), &missed); err != nil {
			b.logf("large-state: fill pass %d on member %d: %v", pass, m, err)
		}
	}
	unknown := 0
	for _, st := range state {
		if st == 2 {
			unknown++
		}
	}
	b.res.Figures["fill_unknown"] = float64(unknown)
	return tokens, nil
}

// atomicTime is a time shared by goroutines: the first one set since
// the last reset.
type atomicTime struct {
	mu sync.Mutex
	t  time.Time
}

func (a *atomicTime) get() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.t
}

func (a *atomicTime) set(t time.Time) {
	a.mu.Lock()
	a.t = t
	a.mu.Unlock()
}

// first sets t if no time is set.
func (a *atomicTime) first(t time.Time) {
	a.mu.Lock()
	if a.t.IsZero() {
		a.t = t
	}
	a.mu.Unlock()
}

// fillPass sends the acquires of keys todo to member m, pipelined over
// bigFillConns connections, and records what comes back.
func (b *bigPhase) fillPass(m int, todo []int, tokens []uint64, state []uint8, began int64, missed *atomicTime) error {
	errs := make(chan error, 2*bigFillConns)
	var wg sync.WaitGroup
	per := (len(todo) + bigFillConns - 1) / bigFillConns
	for k := range bigFillConns {
		part := todo[min(k*per, len(todo)):min((k+1)*per, len(todo))]
		if len(part) == 0 {
			break
		}
		conn, err := clustertest.Dial(b.c.Member(m).Addr())
		if err != nil {
			// The connections already made finish first: their readers
			// must not record answers once the next pass has begun.
			errs <- err
			break
		}
		defer conn.Close()
		conn.SetTimeout(bigStepWithin)
		window := make(chan struct{}, bigFillWindow)
		failed := make(chan struct{})
		wg.Go(func() {
			var out []byte
			for i, j := range part {
				select {
				case window <- struct{}{}:
				case <-failed:
					return
				}
				out = proto.AppendAcquire(out, 0, bigLease, uint64(j+1), bigKey(j))
				if len(out) >= 16<<10 || i == len(part)-1 || len(window) == cap(window) {
					if err := conn.Send(out); err != nil {
						errs <- err
						return
					}
					out = out[:0]
				}
			}
		})
		wg.Go(func() {
			defer close(failed)
			for range part {
				r, err := conn.Read()
				if err != nil {
					missed.first(time.Now())
					b.mu.Lock()
					b.res.Figures["fill_connections_lost"]++
					b.mu.Unlock()
					errs <- err
					return
				}
				<-window
				j := int(r.ID - 1)
				if j < 0 || j >= len(state) {
					errs <- fmt.Errorf("an answer for owner %d", r.ID)
					return
				}
				switch r.Op {
				case proto.OpAcquire:
					tokens[j], state[j], b.sentAt[j] = r.Token, 1, began
				case proto.OpTimeout:
					state[j] = 2
				default: // M, B, E: not executed; sent again
					missed.first(time.Now())
					b.mu.Lock()
					b.res.Figures[fmt.Sprintf("fill_answers_%c", r.Op)]++
					b.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
}
