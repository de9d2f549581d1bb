package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// Errors of AdminRelease.
var (
	// ErrNotHeld: the key is free, or its grant is not the one named.
	ErrNotHeld = errors.New("engine: the key is not held by that grant")
	// ErrBadKey: not a key the protocol could hold (1..--max-key bytes of
	// UTF-8 without 0x0A).
	ErrBadKey = errors.New("engine: bad key")
	// ErrOutcomeUnknown: the release was made but its commit could not be
	// confirmed (the leader lost its leadership, or the wait ended): it
	// may or may not survive.
	ErrOutcomeUnknown = errors.New("engine: release made, commit not confirmed: outcome unknown")
)

// NotServingError is AdminRelease's error on a member that does not
// execute requests (a standby, a follower, a member handing over): Active
// names the member that does ("" while none is known).
type NotServingError struct{ Active string }

func (e *NotServingError) Error() string {
	if e.Active == "" {
		return "engine: this member does not execute requests, and no active is known"
	}
	return "engine: this member does not execute requests; the active is " + e.Active
}

// Released is what AdminRelease released.
type Released struct {
	Token uint64 // the grant's token (several released: the newest)
	Ident string // the identity it was made to ("": none)
	// All lists every grant the call released, oldest first: one, but
	// every holder of a shared key released without a token.
	All []Released
}

// commitWait bounds how long AdminRelease waits for its release to commit.
const commitWait = 5 * time.Second

// AdminRelease releases key's grant on behalf of the admin endpoint (an
// operator freeing a lock whose holder is stuck): the grant with token, or
// — token 0 — whatever holds the key now: its grant, or every holder of a
// shared key (docs/PROTOCOL.md decision 50). by is the admin identity
// that asked ("" without an ACL). The release is an admin's forced
// release (PROTOCOL.md §8.2): it does not need the grant's identity; it
// is counted (Metrics.AdminReleases, one per grant, and as forced when the
// grant was another identity's), logged with both identities, ends the
// grant's watches with reason 3 whoever held it (§9.6), and hands the key
// to its next waiters as any release does.
//
// It runs like a batch: under the batch barrier and the node's gate, so
// only a member that executes requests does it (else *NotServingError), and
// not once the shutdown has begun (ErrDraining). On a node that commits
// before answering (raft) it returns once the release is committed, within
// ctx and at most 5 s; ErrOutcomeUnknown if that cannot be confirmed.
func (s *Server) AdminRelease(ctx context.Context, key []byte, token uint64, by string) (Released, error) {
	if len(key) == 0 || len(key) > s.cfg.MaxKey || !utf8.Valid(key) || containsNL(key) {
		return Released{}, ErrBadKey
	}
	who := shard.Who{Ident: s.table.Ident([]byte(by)), Admin: true, Operator: true}
	s.adminBar.RLock()
	now := s.now()
	if s.draining.Load() {
		s.adminBar.RUnlock()
		return Released{}, ErrDraining
	}
	if g := s.node.Gate(); g.Effective(now) != repl.Serve {
		s.adminBar.RUnlock()
		return Released{}, &NotServingError{Active: g.Addr}
	}
	gen := s.abandonsA.Load() // Abandon calls before the state this release acts on
	b := s.getScratch()
	var rel Released
	release := func(tok uint64) {
		res, holder := s.table.ReleaseAs(now, key, tok, who, &b.fx)
		if !res.Done() {
			return
		}
		r := Released{Token: tok, Ident: string(s.table.IdentName(holder))}
		rel.Token, rel.Ident = r.Token, r.Ident
		rel.All = append(rel.All, r)
		s.log.Info("admin release", "key", string(key), "token", tok, "by", by, "holder", r.Ident,
			"forced", res == shard.ResultForced)
	}
	if token != 0 {
		release(token)
	} else {
		// Every holder the key has now (Detail lists them oldest first);
		// the grants may change between the look and the releases (an
		// expiry, a release), so look again if none was released.
		for range 3 {
			d := s.table.Detail(key)
			for _, x := range d.Holders {
				release(x.Token)
			}
			if len(d.Holders) == 0 || len(rel.All) > 0 {
				break
			}
		}
	}
	s.deliver(b, nil, now) // a handoff, an expiry the release processed first, the L 3s
	s.putScratch(b)
	var bar uint64
	if s.committer != nil {
		bar = s.committer.Barrier()
	}
	s.adminBar.RUnlock()
	if len(rel.All) == 0 {
		return Released{}, ErrNotHeld
	}
	s.adminReleases.Add(uint64(len(rel.All)))
	if s.committer != nil {
		ctx, cancel := context.WithTimeout(ctx, commitWait)
		defer cancel()
		if err := s.waitCommitted(ctx, bar, gen); err != nil {
			return rel, err
		}
	}
	return rel, nil
}

// waitCommitted waits until record bar, made from state of generation gen
// (Abandon calls before it), is committed, or ctx ends; a record that an
// Abandon after gen gave up is ErrOutcomeUnknown (the rule of a held
// chunk, commit.go).
func (s *Server) waitCommitted(ctx context.Context, bar, gen uint64) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if s.committedA.Load() >= bar {
			s.heldMu.Lock()
			lost := gen < s.abandons && bar > s.lostAfter(gen)
			s.heldMu.Unlock()
			if lost {
				return ErrOutcomeUnknown
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
		case <-tick.C:
		}
	}
}

func containsNL(b []byte) bool {
	for _, c := range b {
		if c == '\n' {
			return true
		}
	}
	return false
}
