package engine

import (
	"math"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// The requests of PROTOCOL.md §9 (S, V, W, I), once a request has passed
// the checks that need no state (E 1, E 5, E 2, E 3, E 7 for limit 0,
// E 6) and the gate (E 4, M): what is left of the validation order is
// the table's (E 7 for another limit, E 8 for a watch beyond the bound,
// then N, T, B). Each appends its answer to the batch like A, R and K do,
// allocates nothing, and takes one shard lock. A grant of an S is an A
// frame like any other (tracked until it reaches the socket, released at
// once if it cannot, PROTOCOL.md §4); an L is an effect delivered through
// the mailboxes like a handoff's grant (handler.go, deliver).

// acquireShared answers an S: A, T, B or E 7 now; a queued one is answered
// later through the mailbox, as a queued A is.
func (h *handler) acquireShared(ss *session, b *scratch, now int64, who shard.Who) {
	s, r := h.s, &b.req
	if len(ss.pend)+len(b.grants) >= s.cfg.MaxPendingGrants && h.pendingFull(ss, b) {
		// B, as for an A, unless the limit differs from the holders':
		// E 7 comes before every B (docs/PROTOCOL.md decision 44).
		if s.limitMismatch(now, r.Key, r.Limit) {
			b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeLimitMismatch, msgBadLimit)
			b.cnt.error(r.Op, proto.CodeLimitMismatch)
			return
		}
		b.out = proto.AppendBusy(b.out, r.ID, r.Key)
		b.cnt.request(proto.OpShared, resBusy)
		return
	}
	st, token := s.table.AcquireShared(now, r.Key, r.Wait, r.Lease, r.ID, r.Limit, who.Ident, ss.tconn, &b.fx)
	switch st {
	case shard.Granted:
		b.addGrant(r.ID, token, r.Key)
	case shard.TimedOut:
		b.out = proto.AppendTimeout(b.out, r.ID, r.Key)
	case shard.Busy:
		b.out = proto.AppendBusy(b.out, r.ID, r.Key)
	case shard.Mismatch:
		b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeLimitMismatch, msgBadLimit)
		b.cnt.error(r.Op, proto.CodeLimitMismatch)
		return
	}
	b.cnt.request(proto.OpShared, acquireResult[st])
}

// limitMismatch reports whether key is shared with a limit other than
// limit by holders whose lease has not ended at now: what an S would be
// answered E 7 for. It allocates (shard.Table.Detail): only for an S that
// is answered B anyway (its connection reads too slowly).
func (s *Server) limitMismatch(now int64, key []byte, limit uint16) bool {
	d := s.table.Detail(key)
	if !d.Shared || d.Limit == int(limit) {
		return false
	}
	for _, x := range d.Holders {
		if x.Deadline > now {
			return true
		}
	}
	return false
}

// validate answers a V: V with the holder's lease time left when the
// token is a current holder of the key, else N (PROTOCOL.md §9.3).
func (h *handler) validate(b *scratch, now int64) {
	r := &b.req
	if deadline, ok := h.s.table.Validate(now, r.Key, r.ID, &b.fx); ok {
		b.out = proto.AppendValid(b.out, r.ID, millisLeft(deadline, now), r.Key)
		b.cnt.request(proto.OpValidate, resValid)
		return
	}
	b.out = proto.AppendNotHeld(b.out, proto.OpValidate, r.ID, r.Key)
	b.cnt.request(proto.OpValidate, resNotHeld)
}

// watch answers a W: E 8 when the connection has its bound of watches
// (before the token is looked at, PROTOCOL.md §9.6), W once the watch is
// registered (its L follows through the mailbox when the grant ends), N
// when the token holds no grant of the key.
func (h *handler) watch(ss *session, b *scratch, now int64) {
	r := &b.req
	switch h.s.table.Watch(now, r.Key, r.ID, ss.tconn, &b.fx) {
	case shard.Watching:
		b.out = proto.AppendWatching(b.out, r.ID, r.Key)
		b.cnt.request(proto.OpWatch, resWatching)
	case shard.WatchNotHeld:
		b.out = proto.AppendNotHeld(b.out, proto.OpWatch, r.ID, r.Key)
		b.cnt.request(proto.OpWatch, resNotHeld)
	default: // shard.WatchLimit
		b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeLimitReached, msgLimitReached)
		b.cnt.error(r.Op, proto.CodeLimitReached)
	}
}

// inspect answers an I: the key's holders, limit, waiters and newest
// holder (PROTOCOL.md §9.5).
func (h *handler) inspect(b *scratch, now int64) {
	r := &b.req
	in := h.s.table.Inspect(now, r.Key, &b.fx)
	var left uint32
	if in.Holders > 0 {
		left = millisLeft(in.Deadline, now)
	}
	b.out = proto.AppendInspection(b.out, r.ID, uint16(min(in.Holders, math.MaxUint16)), uint16(min(in.Limit, math.MaxUint16)),
		uint32(min(in.Waiters, math.MaxUint32)), in.Token, left, r.Key)
	b.cnt.request(proto.OpInspect, resInspected)
}

// millisLeft is the time from now to deadline in whole milliseconds,
// rounded down (0 when it has passed), as V and I answer it.
func millisLeft(deadline, now int64) uint32 {
	if deadline <= now {
		return 0
	}
	return uint32(min((deadline-now)/1e6, math.MaxUint32))
}
