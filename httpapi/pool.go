package httpapi

import (
	"sync"

	"github.com/lockd-dev/lockd/engine"
)

// The pool of local connections (docs/DESIGN.md "The HTTP front").
//
// Every request takes a connection for itself: one request at a time on a
// connection, so its answers are its own, a failed hello (E 5, which
// closes the connection) costs no one else, and a request the front gives
// up on (its client went away, its deadline passed) is ended by closing
// that connection — which withdraws a queued acquire and releases a grant
// not taken (PROTOCOL.md §4) — without touching another's. A request that
// got its answer gives its connection back, clean.
//
// Connections are pooled by what authenticated them, because an identity
// cannot be taken back from a connection: a connection that said hello as
// X serves only requests that claim X (and say hello again, so X's secret
// is checked on every request), one opened with a certificate's Common
// Name only requests with that certificate. Only connections that
// answered are pooled, so the keys are identities of the ACL (or names of
// certificates its CA signed): bounded.

const (
	maxIdle       = 256 // idle connections kept, in all
	maxIdlePerKey = 64  // of one key
)

type pool struct {
	mu   sync.Mutex
	idle map[string][]*engine.LocalConn
	n    int
	shut bool
	// off keeps nothing (every request opens and closes a connection):
	// for the benchmark that measures what the pool saves.
	off bool
}

// get returns an idle connection of key that is still open, or nil.
func (p *pool) get(key string) *engine.LocalConn {
	if p.off {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[key]
	for len(list) > 0 {
		lc := list[len(list)-1]
		list = list[:len(list)-1]
		p.n--
		select {
		case <-lc.Done(): // closed meanwhile (an ACL reload, the engine stopping)
			continue
		default:
		}
		p.idle[key] = list
		return lc
	}
	delete(p.idle, key)
	return nil
}

// put keeps lc for key, or closes it beyond the bounds.
func (p *pool) put(key string, lc *engine.LocalConn) {
	p.mu.Lock()
	if !p.shut && !p.off && p.n < maxIdle && len(p.idle[key]) < maxIdlePerKey {
		if p.idle == nil {
			p.idle = make(map[string][]*engine.LocalConn)
		}
		p.idle[key] = append(p.idle[key], lc)
		p.n++
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	go lc.Close()
}

// idleCount is the number of idle connections kept.
func (p *pool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// close closes every idle connection and keeps no more.
func (p *pool) close() {
	p.mu.Lock()
	p.shut = true
	idle := p.idle
	p.idle, p.n = nil, 0
	p.mu.Unlock()
	for _, list := range idle {
		for _, lc := range list {
			lc.Close()
		}
	}
}
