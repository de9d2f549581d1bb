package shard

import (
	"sync"
	"sync/atomic"
)

// Ident is the identity a grant was made to (PROTOCOL.md §8.3), as the
// table stores it: a small handle for a name interned in the table
// (Table.Ident), below 65,536, so an entry carries 2 bytes instead of a
// string (AcquireAs takes a larger value as the overflow identity). NoIdent
// (0) is no identity: the grant was made without an ACL, and the token
// alone decides who may release or renew it. Handles mean something only
// on the table that made them; records, dumps and snapshots carry the
// name (Table.IdentName).
type Ident uint32

// NoIdent is the identity of a grant made without an ACL.
const NoIdent Ident = 0

// Who is the identity a release or renew comes from.
type Who struct {
	// Ident is the requester's identity; NoIdent (no ACL) means the token
	// alone decides.
	Ident Ident
	// Admin is set for an admin identity (PROTOCOL.md §8.2): it may
	// release or renew any identity's grant (a forced release).
	Admin bool
	// Operator marks a release made through the admin endpoint: the end of
	// the grant is ReasonForced to its watches (PROTOCOL.md §9.6) whoever
	// held it. It does not change who may release (that is Admin's).
	Operator bool
}

// Result is the outcome of an identity-bound release or renew
// (ReleaseAs, RenewAs).
type Result uint8

// Results.
const (
	// ResultNotHeld: the key is free or token is not its current grant
	// (answer N).
	ResultNotHeld Result = iota
	// ResultOK: done — the requester's own grant, a grant of no identity,
	// or a requester of no identity (answer R or K).
	ResultOK
	// ResultForced: done by an admin to another identity's grant (answer R
	// or K; counted, Counters.ForcedReleases and ForcedRenews).
	ResultForced
	// ResultRefused: token is current but the grant is another identity's
	// and the requester is no admin: nothing done (answer N, exactly as
	// for a stale token; counted, Counters.RefusedReleases and
	// RefusedRenews).
	ResultRefused
)

// String names the result.
func (r Result) String() string {
	switch r {
	case ResultNotHeld:
		return "not-held"
	case ResultOK:
		return "ok"
	case ResultForced:
		return "forced"
	case ResultRefused:
		return "refused"
	}
	return "Result(?)"
}

// Done reports whether the release or renew happened (answer R or K).
func (r Result) Done() bool { return r == ResultOK || r == ResultForced }

// judge decides whether who may release or renew a grant of identity
// holder whose token matched.
func judge(holder Ident, who Who) Result {
	switch {
	case who.Ident == NoIdent || holder == NoIdent || holder == who.Ident:
		return ResultOK
	case who.Admin:
		return ResultForced
	}
	return ResultRefused
}

// Bounds of the identity registry: 255 chunks of 256 names (handle 0 is
// NoIdent). Past the last name, every new name interns as identOverflow,
// whose name no ACL identity can have (the charset of §8.2 has no
// parentheses): such a grant can be released or renewed only by an admin,
// or ends with its lease — never by the token alone.
const (
	identChunk    = 256
	maxIdents     = identChunk * identChunk
	identOverflow = Ident(maxIdents - 1)
)

var overflowName = identName{"(overflow)", []byte("(overflow)")}

// identName is a name both ways: records carry bytes, key views a string.
type identName struct {
	s string
	b []byte
}

// idents interns identity names. Names are added, never removed: their
// number is bounded by the distinct names of the ACL files and of the
// records, dumps and snapshots the table was fed (an identity that a
// reload removed keeps its handle, so its grants keep their owner).
//
// Reads of a handle's name are lock-free (an atomic load of its chunk):
// the sink asks for the name under a shard lock on every grant. A name's
// handle is looked up under mu (a hello, a reload, an applied grant).
type idents struct {
	chunks [identChunk]atomic.Pointer[[identChunk]identName]
	mu     sync.Mutex
	byName map[string]Ident // guarded by mu
	n      Ident            // guarded by mu: the last handle given
}

// intern returns name's handle, giving it the next one if it is new.
// name is copied; an empty name is NoIdent.
func (x *idents) intern(name []byte) Ident {
	if len(name) == 0 {
		return NoIdent
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if h, ok := x.byName[string(name)]; ok {
		return h
	}
	if string(name) == overflowName.s {
		return identOverflow
	}
	if x.n+1 >= identOverflow {
		return identOverflow
	}
	if x.byName == nil {
		x.byName = make(map[string]Ident)
	}
	x.n++
	h := x.n
	c := x.chunks[h/identChunk].Load()
	if c == nil {
		c = new([identChunk]identName)
		x.chunks[h/identChunk].Store(c)
	}
	s := string(name)
	x.byName[s] = h
	// The name's bytes are written before the handle is returned, and a
	// handle reaches a reader only through a lock (a shard's, mu) or a
	// channel after that: the plain store is safe.
	c[h%identChunk] = identName{s, []byte(s)}
	return h
}

// lookup returns h's name (empty for NoIdent or a handle not given).
func (x *idents) lookup(h Ident) identName {
	switch {
	case h == NoIdent:
		return identName{}
	case h == identOverflow:
		return overflowName
	}
	c := x.chunks[h/identChunk].Load()
	if c == nil {
		return identName{}
	}
	return c[h%identChunk]
}

// name returns h's name as bytes (nil for NoIdent or a handle not given).
func (x *idents) name(h Ident) []byte { return x.lookup(h).b }

// Ident returns the handle of the identity called name, interning it if it
// is new (NoIdent for an empty name). name is copied. It takes a mutex of
// the table's identity registry (not a shard lock): call it once per
// identity (at a hello, a reload), not per request.
func (t *Table) Ident(name []byte) Ident { return t.idents.intern(name) }

// IdentName returns the name of handle h (nil for NoIdent). The bytes are
// the table's and never change: do not modify them. It takes no lock.
func (t *Table) IdentName(h Ident) []byte { return t.idents.name(h) }
