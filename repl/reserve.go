package repl

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/shard"
)

// Reserver keeps tokens reserved ahead of use, on a goroutine of its own:
// when the allocator signals Want it makes last + 2 blocks safe through
// reserve (a disk write, a replication, a commit: the node's) and then
// extends the allocator. A failing reserve is retried with back-off (10 ms
// doubling to 1 s); meanwhile grants go on until the reserved range is used
// up and then get Busy, and Health reports why. The zero Reserver is
// ready for Start; Health and Status are safe from any goroutine.
type Reserver struct {
	tokens  *shard.Tokens
	block   uint64
	reserve func(limit uint64) error
	log     *slog.Logger

	quit chan struct{}
	done chan struct{}

	mu      sync.Mutex
	failing error // the last error while reservations fail, nil when healthy
	errs    uint64
}

// Start begins reserving for tokens, block tokens at a time.
func (r *Reserver) Start(tokens *shard.Tokens, block uint64, reserve func(uint64) error, log *slog.Logger) {
	r.tokens, r.block, r.reserve, r.log = tokens, block, reserve, log
	r.quit, r.done = make(chan struct{}), make(chan struct{})
	go r.run()
}

func (r *Reserver) run() {
	defer close(r.done)
	for {
		select {
		case <-r.quit:
			return
		case <-r.tokens.Want():
		}
		limit := max(r.tokens.Limit(), r.tokens.Last()) + 2*r.block
		backoff := 10 * time.Millisecond
		logs := ratelog.Limiter{Every: 10 * time.Second} // a line per 10 s of failures
		for {
			err := r.reserve(limit)
			if err == nil {
				break
			}
			r.mu.Lock()
			r.failing = err
			r.errs++
			n := r.errs
			r.mu.Unlock()
			if _, ok := logs.Allow(time.Now().UnixNano()); ok {
				r.log.Error("reserving tokens failed: acquires that need a new token get B once the reserved range is used up; retrying",
					"err", err, "failures", n, "last_token", r.tokens.Last(), "reserved", r.tokens.Limit())
			}
			select {
			case <-r.quit:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
		r.tokens.Extend(limit)
		r.mu.Lock()
		recovered := r.failing != nil
		r.failing = nil
		r.mu.Unlock()
		if recovered {
			r.log.Info("reserving tokens works again", "reserved", limit)
		}
	}
}

// Stop ends the reserver, waiting at most until ctx ends (a reservation
// stuck in a disk write is left behind).
func (r *Reserver) Stop(ctx context.Context) {
	if r.quit == nil {
		return
	}
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}

// Health is nil while reservations succeed, else the last failure.
func (r *Reserver) Health() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return fmt.Errorf("token reservation failing: %w", r.failing)
	}
	return nil
}

// Status fills st's reservation fields.
func (r *Reserver) Status(st *Status) {
	if r.tokens != nil {
		st.TokenReserved = r.tokens.Limit()
	}
	r.mu.Lock()
	st.ReserveErrors = r.errs
	if r.failing != nil {
		st.ReserveError = r.failing.Error()
	}
	r.mu.Unlock()
}
