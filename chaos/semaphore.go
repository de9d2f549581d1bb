package main

import (
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/internal/history"
)

// The semaphore workload: -sem-workers workers beside the mutex ones, each
// looping take a permit of one of -sem-keys keys (AcquireShared, each key a
// semaphore of -sem-limit permits, PROTOCOL.md §9.2), hold it exactly as a
// mutex worker holds its lock — writes spread over the hold, renewals, a
// few paused holders writing late — and release it. Their writes go
// through a counted fence: the resource admits at most N tokens of a key
// at once, keeps the newest ones when more holders than that turn up, and
// turns away the rest (history.CountedRule says the rule; countedKey below
// is the resource's own implementation, which history.CheckCountedFenced
// checks decision by decision).

func semKeyName(i int) string { return "chaos/sem/" + strconv.Itoa(i) }

// countedKey is the counted fence of one semaphore key: the tokens admitted,
// each with the lease end its holder declared with its last write, and
// the floor at or below which a token is of a generation fenced out.
type countedKey struct {
	limit  int
	tokens map[uint64]time.Duration
	floor  uint64
}

// admit judges a write of token, whose holder declares its lease ends at
// expires, at instant now: forget the tokens whose declared lease is over;
// an admitted token is accepted; one at or below the floor is not; with
// room it is admitted; with every place taken, a write on time whose token
// is above the smallest admitted one evicts it (raising the floor) and is
// admitted; otherwise refused.
func (c *countedKey) admit(token uint64, expires, now time.Duration) bool {
	for t, end := range c.tokens {
		if end < now {
			delete(c.tokens, t)
		}
	}
	if end, ok := c.tokens[token]; ok {
		c.tokens[token] = max(end, expires)
		return true
	}
	if token <= c.floor {
		return false
	}
	if len(c.tokens) < c.limit {
		c.tokens[token] = expires
		return true
	}
	if expires < now {
		return false // its own lease is over: it cannot push out a holder whose lease runs
	}
	oldest := token
	for t := range c.tokens {
		oldest = min(oldest, t)
	}
	if oldest == token {
		return false // every admitted token is newer
	}
	delete(c.tokens, oldest)
	c.floor = max(c.floor, oldest)
	c.tokens[token] = expires
	return true
}

// writeCounted has the counted fence of a semaphore key of limit permits
// judge worker's write under token (whose lease ends at expires, as the
// holder knows it), and records the decision; true if accepted.
func (r *resource) writeCounted(worker, grant int, key string, limit int, token uint64, expires time.Duration, late bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.rec.Now()
	c := r.counted[key]
	if c == nil {
		c = &countedKey{limit: limit, tokens: map[uint64]time.Duration{}}
		r.counted[key] = c
	}
	ok := c.admit(token, expires, now)
	r.seq++
	op := history.Op{Worker: worker, Kind: history.Write, Key: key, Token: token, Call: now, Return: r.rec.Now(),
		Outcome: history.OK, Grant: grant, Seq: r.seq, Late: late, Expires: expires}
	if !ok {
		op.Outcome, op.Detail = history.Fail, history.DetailStale
	}
	r.rec.Add(op)
	return ok
}

// leave tells the counted fence of key that token's holder is done (just
// before it releases), and records it.
func (r *resource) leave(worker, grant int, key string, token uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.rec.Now()
	if c := r.counted[key]; c != nil {
		delete(c.tokens, token)
	}
	r.seq++
	r.rec.Add(history.Op{Worker: worker, Kind: history.Leave, Key: key, Token: token, Call: now, Return: now,
		Outcome: history.OK, Grant: grant, Seq: r.seq})
}
