package admin

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/ratelog"
)

// OpenPaths answer anyone, with or without --acl (PROTOCOL.md §8.5: the
// health probes). Every other path needs the HTTP basic authentication of
// a monitor or admin identity when the server has an ACL. A health path
// added later is opened by adding it here.
var OpenPaths = []string{"/healthz", "/livez", "/readyz"}

// realm is the WWW-Authenticate challenge of a 401.
const realm = `Basic realm="lockd admin", charset="UTF-8"`

// authStats counts the admin endpoint's refusals, by status.
type authStats struct {
	unauthorized atomic.Uint64  // 401: no or invalid credentials
	forbidden    atomic.Uint64  // 403: a client identity, or a monitor asking for a change
	logs         ratelog.Shared // refusals: a line a second
}

// identityKey carries the authenticated identity in a request's context.
type identityKey struct{}

// identityOf returns the identity that authenticated r (nil without an ACL).
func identityOf(r *http.Request) *acl.Identity {
	id, _ := r.Context().Value(identityKey{}).(*acl.Identity)
	return id
}

// changesState reports whether r asks for a change (anything but a read).
func changesState(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
}

// authorize wraps next with §8.5's rules while srv has an ACL (read at
// every request, so a reload applies to the next one): the open paths for
// anyone; otherwise basic authentication (user = identity, password =
// secret, compared in constant time by acl.Authenticate) of a monitor or
// an admin — 401 with a challenge without valid credentials, 403 for a
// client identity, and 403 for a monitor asking for a change.
func authorize(srv *engine.Server, st *authStats, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := srv.ACL()
		if a == nil || slices.Contains(OpenPaths, r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		user, pass, ok := r.BasicAuth()
		var id *acl.Identity
		if ok {
			id = a.Authenticate([]byte(user), []byte(pass))
		}
		switch {
		case id == nil:
			st.unauthorized.Add(1)
			st.log(srv.Logger(), r, "admin endpoint: no valid credentials", "")
			w.Header().Set("WWW-Authenticate", realm)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "unauthorized: basic authentication of a monitor or admin identity needed"})
			return
		case id.Role == acl.RoleClient || changesState(r) && id.Role != acl.RoleAdmin:
			st.forbidden.Add(1)
			st.log(srv.Logger(), r, "admin endpoint: forbidden for this identity", id.Name)
			msg := "forbidden: the admin endpoint is for monitor and admin identities"
			if id.Role != acl.RoleClient {
				msg = "forbidden: a change needs an admin identity"
			}
			writeJSON(w, http.StatusForbidden, map[string]string{"error": msg})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// log logs a refusal, one line a second at most; never the password, and
// the user only when it is an identity of the file.
func (st *authStats) log(l *slog.Logger, r *http.Request, msg, identity string) {
	held, ok := st.logs.Allow(time.Now().UnixNano())
	if !ok {
		return
	}
	if identity == "" {
		identity = "(none or unknown)"
	}
	l.Warn(msg, "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "identity", identity,
		"not_logged_since_last", held)
}

// release serves DELETE /keys/{key...}[?token=T]: an operator frees a
// key's grant, that one grant when token is given (so a grant made since
// the operator looked is never released by mistake), else whatever grant
// holds the key now. It needs an admin identity with an ACL (authorize).
func release(srv *engine.Server) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		var token uint64
		if t := r.URL.Query().Get("token"); t != "" {
			var err error
			if token, err = strconv.ParseUint(t, 10, 64); err != nil || token == 0 {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "token: want a decimal token (1..2^64-1)"})
				return
			}
		}
		by := ""
		if id := identityOf(r); id != nil {
			by = id.Name
		}
		rel, err := srv.AdminRelease(r.Context(), []byte(key), token, by)
		var ns *engine.NotServingError
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, releaseDoc(key, rel))
		case errors.Is(err, engine.ErrBadKey):
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad key: DELETE /keys/{key} with 1..max-key bytes of UTF-8"})
		case errors.Is(err, engine.ErrNotHeld):
			msg := "not held"
			if token != 0 {
				msg = "not held by token " + strconv.FormatUint(token, 10)
			}
			writeJSON(w, http.StatusNotFound, map[string]string{"error": msg})
		case errors.As(err, &ns):
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "this member does not execute requests", "active": ns.Active})
		case errors.Is(err, engine.ErrDraining):
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "shutting down"})
		default: // engine.ErrOutcomeUnknown
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error(),
				"token": strconv.FormatUint(rel.Token, 10), "identity": rel.Ident})
		}
	}
}

// releaseDoc is the answer of a release that happened: the grant, or, when
// a shared key was released without a token, its newest holder and every
// holder released (docs/PROTOCOL.md decision 50).
func releaseDoc(key string, rel engine.Released) api.Release {
	doc := api.Release{Key: key, Released: true, Token: strconv.FormatUint(rel.Token, 10), Identity: rel.Ident}
	if len(rel.All) > 1 {
		for _, r := range rel.All {
			doc.Holders = append(doc.Holders, api.ReleasedGrant{Token: strconv.FormatUint(r.Token, 10), Identity: r.Ident})
		}
	}
	return doc
}
