package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// Identities and what a connection may do (PROTOCOL.md §8.2, §8.3), when
// the server runs with an ACL (Config.ACL).
//
// Each session has an identity once a hello succeeds, or at its first
// batch when its verified client certificate's Common Name is an identity
// of the file (session.CertCommonName, read once at its first batch and again
// by name at each ACL reload). The identity, its table handle and
// whether it is an admin are the session's, owned by its loop; a copy of
// the handle sits in an atomic for SetACL's sweep. The ACL in force is an
// atomic pointer: a reload swaps it, closes the sessions whose identity it
// removed (from the reloading goroutine: Conn.Close is safe from any
// goroutine), and every other session re-reads its identity by name from
// the new file at its next batch (new keys and role from the next request;
// a changed secret only matters to the next hello). A batch that
// authenticated against the old file looks at the pointer again at its
// end, so a session the sweep could not see yet is closed then.
//
// The checks, in the order of §8.3 and §9.6 around the parser's own (E 1,
// E 5, E 2, E 3, E 7 for limit 0, E 6, then the shutdown drain's E 4, the
// gate's M and the table): admit (E 5 for A, R, K, S, V, W, I without an
// identity; the connection closes), permit (E 6 for a key outside the
// identity's prefixes, or a lock request — A, R, K, S — from a monitor),
// hello (E 5 for a failed hello; close). Each costs a few loads and, for
// permit, a prefix comparison: nothing is allocated.

// Texts of the E frames of §8.3 (E 5 does not say why).
const (
	msgUnauthenticated = "unauthenticated"
	msgDenied          = "permission denied"
)

// aclState is one generation of the ACL with the table handles of its
// identities (interned when the generation is made).
type aclState struct {
	acl     *acl.ACL
	handles []shard.Ident // by acl.Identity.Index()
}

// newACLState interns every identity of a in the table.
func (s *Server) newACLState(a *acl.ACL) *aclState {
	st := &aclState{acl: a, handles: make([]shard.Ident, a.Len())}
	for i, id := range a.Identities() {
		st.handles[i] = s.table.Ident([]byte(id.Name))
	}
	return st
}

// sessAuth is a session's identity, owned by its loop.
type sessAuth struct {
	gen       *aclState     // the generation id was read from
	id        *acl.Identity // nil: not authenticated
	who       shard.Who     // id's table handle and admin flag
	certTried bool          // the client certificate was looked at
}

// setIdentity makes id (of generation st) the session's identity.
func (ss *session) setIdentity(st *aclState, id *acl.Identity) {
	ss.auth.gen, ss.auth.id = st, id
	ss.auth.who = shard.Who{Ident: st.handles[id.Index()], Admin: id.Role == acl.RoleAdmin}
	ss.ident.Store(uint32(ss.auth.who.Ident))
}

// refreshAuth (on ss's loop, once per batch) brings ss's identity up to the
// ACL in force: at the first batch, the client certificate's identity, if
// any; after a reload, the identity of the same name in the new file (its
// keys and role may have changed). It reports false when a reload removed
// the identity: the caller closes the connection without reading.
func (s *Server) refreshAuth(ss *session) bool {
	st := s.acl.Load()
	if ss.auth.gen == st {
		return true
	}
	if !ss.auth.certTried {
		ss.auth.certTried = true
		if id := st.acl.ByCertificate(ss.CertCommonName()); id != nil && ss.auth.id == nil {
			ss.setIdentity(st, id)
			return true
		}
	}
	ss.auth.gen = st
	if ss.auth.id == nil {
		return true
	}
	id := st.acl.Lookup(s.table.IdentName(ss.auth.who.Ident))
	if id == nil {
		if ss.removed.CompareAndSwap(false, true) {
			s.auth.removed.Add(1)
		}
		return false
	}
	ss.setIdentity(st, id)
	return true
}

// What a request needs of the connection's identity (opNeeds).
const (
	needNothing = iota // P, H: answered on any connection
	needLock           // A, R, K, S: a client or admin whose prefixes allow the key
	needKey            // V, W, I: any role whose prefixes allow the key (PROTOCOL.md §9.1)
)

// opNeeds is what each request op needs of the connection's identity.
var opNeeds = [256]uint8{
	proto.OpAcquire: needLock, proto.OpRelease: needLock, proto.OpRenew: needLock, proto.OpShared: needLock,
	proto.OpValidate: needKey, proto.OpWatch: needKey, proto.OpInspect: needKey,
}

// admit answers E 5 to a request about a key (A, R, K, S, V, W, I) on a
// connection that has no identity (PROTOCOL.md §8.3, §9.6) and reports
// false: the caller closes the connection and reads nothing more. Ping
// and hello are always admitted.
func (h *handler) admit(ss *session, b *scratch) bool {
	r := &b.req
	if ss.auth.id != nil || opNeeds[r.Op] == needNothing {
		return true
	}
	b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodeUnauthenticated, msgUnauthenticated)
	b.cnt.error(r.Op, proto.CodeUnauthenticated)
	b.cnt.auth[authUnauthenticated]++
	h.s.logAuth("request before authentication: closing the connection", ss, slog.String("op", r.Op.String()))
	return false
}

// permit answers E 6 to a request on a key outside the identity's
// prefixes, or to a lock request (A, R, K, S) from a monitor, and reports
// false; the connection stays open. V, W and I are any role's whose
// prefixes allow the key (PROTOCOL.md §9.6: a resource checks other
// identities' tokens by design).
func (h *handler) permit(ss *session, b *scratch) bool {
	r := &b.req
	id := ss.auth.id
	need := opNeeds[r.Op]
	if need == needNothing || (need == needKey || id.MayLock()) && id.Allows(r.Key) {
		return true
	}
	b.out = proto.AppendError(b.out, r.Op, r.ID, proto.CodePermissionDenied, msgDenied)
	b.cnt.error(r.Op, proto.CodePermissionDenied)
	b.cnt.auth[authDenied]++
	h.s.logAuth("permission denied", ss, slog.String("identity", id.Name), slog.String("role", id.Role.String()),
		slog.String("op", r.Op.String()), slog.String("key", string(r.Key)))
	return false
}

// hello judges a hello against the ACL: a known identity with its secret
// (any 1..256 bytes, spaces included) becomes the connection's identity
// and is welcomed; anything else is E 5 and the connection closes. The
// log line names the identity only when the file has it (an unknown name
// may be a secret typed in the wrong place), and never the secret.
func (h *handler) hello(ss *session, b *scratch) gnet.Action {
	s, r := h.s, &b.req
	st := s.acl.Load()
	name, secret, ok := proto.SplitHello(r.Key)
	var id *acl.Identity
	if ok {
		id = st.acl.Authenticate(name, secret)
	}
	if id != nil {
		ss.setIdentity(st, id)
		b.out = proto.AppendWelcome(b.out, r.ID, id.Name)
		b.cnt.request(proto.OpHello, resWelcome)
		return gnet.None
	}
	b.out = proto.AppendError(b.out, proto.OpHello, r.ID, proto.CodeUnauthenticated, msgUnauthenticated)
	b.cnt.error(proto.OpHello, proto.CodeUnauthenticated)
	b.cnt.auth[authHello]++
	claimed := "(unknown)"
	if known := st.acl.Lookup(name); known != nil {
		claimed = known.Name
	}
	s.logAuth("hello refused: closing the connection", ss, slog.String("identity", claimed))
	return gnet.Close
}

// Kinds of refusal counted in AuthFailures.
const (
	authHello           = iota // a hello failed
	authUnauthenticated        // a request about a key before any identity
	authDenied                 // outside the identity's keys, or a lock request from a monitor
	nAuth
)

// AuthFailures counts what the ACL refused (PROTOCOL.md §8.3).
type AuthFailures struct {
	Hello           uint64 // hellos answered E 5 (unknown identity, wrong secret, cert-only, malformed)
	Unauthenticated uint64 // A, R, K, S, V, W, I before any identity: E 5
	Denied          uint64 // a key outside the identity's prefixes, or A, R, K, S from a monitor: E 6
	Removed         uint64 // connections closed because a reload removed their identity
}

// authStats are the server-wide ACL counters (rare events: atomics).
type authStats struct {
	removed       atomic.Uint64 // connections closed after a reload
	reloads       atomic.Uint64
	reloadsFailed atomic.Uint64
	// One log line a second at most (an event loop must not wait: no lock).
	log        ratelog.Atomic // refusals
	refusedLog ratelog.Atomic // refused operations on another identity's grant
}

// logAuth logs a refusal, one line a second at most (each counts in
// AuthFailures whether logged or not).
func (s *Server) logAuth(msg string, ss *session, attrs ...slog.Attr) {
	held, ok := s.auth.log.Allow(s.now())
	if !ok {
		return
	}
	attrs = append(attrs, slog.String("remote", remoteAddr(ss)), slog.Int("not_logged_since_last", held))
	s.log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}

// logOther logs a release or renew on another identity's grant: every
// forced one (an admin's deliberate act: an audit trail), refused ones one
// line a second at most (any identity can cause them).
func (s *Server) logOther(res shard.Result, op proto.Op, key []byte, token uint64, by string, holder shard.Ident) {
	attrs := []slog.Attr{slog.String("op", op.String()), slog.String("key", string(key)), slog.Uint64("token", token),
		slog.String("by", by), slog.String("holder", string(s.table.IdentName(holder)))}
	if res == shard.ResultForced {
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "forced: an admin acted on another identity's grant", attrs...)
		return
	}
	if held, ok := s.auth.refusedLog.Allow(s.now()); ok {
		attrs = append(attrs, slog.Int("not_logged_since_last", held))
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "refused: the current token of another identity's grant (answered N)", attrs...)
	}
}

// remoteAddr is ss's peer address, for logs.
func remoteAddr(ss *session) string {
	if a := ss.c.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// ErrNoACL is SetACL's error on a server started without an ACL: turning
// authentication on (or off) needs a restart.
var ErrNoACL = errors.New("engine: the server was started without an ACL")

// ACL returns the ACL in force, nil when the server runs without one. It is
// one atomic load.
func (s *Server) ACL() *acl.ACL {
	if st := s.acl.Load(); st != nil {
		return st.acl
	}
	return nil
}

// SetACL puts a in force (a SIGHUP reload, PROTOCOL.md §8.2): the
// connections of an identity that a no longer has are closed now; every
// other connection reads its identity's keys and role from a at its next
// request (a changed secret only matters to the next hello: connections
// that authenticated stay). It is safe from any goroutine.
func (s *Server) SetACL(a *acl.ACL) error {
	if s.acl.Load() == nil {
		return ErrNoACL
	}
	if a == nil {
		return errors.New("engine: SetACL(nil): authentication cannot be turned off without a restart")
	}
	s.aclMu.Lock()
	defer s.aclMu.Unlock()
	s.acl.Store(s.newACLState(a))
	s.auth.reloads.Add(1)
	closed := 0
	for _, ss := range s.snapshotSessions() {
		h := shard.Ident(ss.ident.Load())
		if h != shard.NoIdent && a.Lookup(s.table.IdentName(h)) == nil {
			_ = ss.c.Close()
			if ss.removed.CompareAndSwap(false, true) {
				s.auth.removed.Add(1)
			}
			closed++
		}
	}
	s.log.Info("ACL in force", "file", a.File(), "identities", a.Len(), "connections_closed", closed)
	return nil
}

// ReloadACL puts the ACL that load returns in force (SetACL). When load
// fails, the ACL in force stays and the failure is counted and returned
// for the caller to log.
func (s *Server) ReloadACL(load func() (*acl.ACL, error)) error {
	if s.acl.Load() == nil {
		return ErrNoACL
	}
	a, err := load()
	if err != nil {
		s.auth.reloadsFailed.Add(1)
		return err
	}
	return s.SetACL(a)
}
