package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/repl"
)

// Raft membership through the admin endpoint (docs/ADMIN.md
// "Members"): GET /members on any member (its view), POST /members and
// DELETE /members/{id-or-address} on the leader — a member that does not
// lead answers 421 with the leader's client address and changes nothing
// (it does not forward: it knows the leader's client address, not its
// admin endpoint; lockctl asks the leader itself). With --acl a change
// needs an admin identity (authorize), a read a monitor.

// Bounds of POST /members?wait=D: how long the leader waits for the new
// member to catch up before it makes it a voter.
const (
	defaultMemberWait = time.Minute
	maxMemberWait     = 10 * time.Minute
)

// membersRoutes registers the /members paths on mux.
func membersRoutes(mux *http.ServeMux, srv *engine.Server) {
	mux.HandleFunc("GET "+api.PathMembers, func(w http.ResponseWriter, _ *http.Request) {
		m, ok := membership(w, srv)
		if !ok {
			return
		}
		ms, err := m.Members()
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, api.Error{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, ms)
	})
	mux.HandleFunc("POST "+api.PathMembers, func(w http.ResponseWriter, r *http.Request) {
		m, ok := membership(w, srv)
		if !ok {
			return
		}
		var req api.AddMember
		d := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
		d.DisallowUnknownFields()
		if err := d.Decode(&req); err != nil || req.Addr == "" {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: `want a JSON body {"addr": "host:port"}: the new member's client address, as its --self`})
			return
		}
		wait := defaultMemberWait
		if s := r.URL.Query().Get("wait"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > maxMemberWait {
				writeJSON(w, http.StatusBadRequest, api.Error{Error: "wait: want a duration in (0, 10m]"})
				return
			}
			wait = d
		}
		ch, err := m.AddMember(r.Context(), req.Addr, wait)
		answerChange(w, r, srv, "added", req.Addr, ch, err)
	})
	mux.HandleFunc("DELETE "+api.PathMembers+"/{member}", func(w http.ResponseWriter, r *http.Request) {
		m, ok := membership(w, srv)
		if !ok {
			return
		}
		who := r.PathValue("member")
		ch, err := m.RemoveMember(r.Context(), who)
		answerChange(w, r, srv, "removed", who, ch, err)
	})
}

// membership is the node's Membership, or false after answering 404 (a
// single node, a priority cluster).
func membership(w http.ResponseWriter, srv *engine.Server) (repl.Membership, bool) {
	m, ok := srv.Config().Node.(repl.Membership)
	if !ok {
		writeJSON(w, http.StatusNotFound, api.Error{Error: "this lockd has no raft membership: members are listed and changed in a raft cluster (--cluster raft); a priority cluster's members are its --peers, changed by a rolling restart (docs/CLUSTER.md), and a single node has none"})
	}
	return m, ok
}

// answerChange answers a POST or DELETE of /members.
func answerChange(w http.ResponseWriter, r *http.Request, srv *engine.Server, verb, who string, ch api.MemberChange, err error) {
	var nl *repl.NotLeaderError
	switch {
	case err == nil:
		by := ""
		if id := identityOf(r); id != nil {
			by = id.Name
		}
		srv.Logger().Info("member "+verb+" through the admin endpoint", "member", who, "id", ch.Member.ID,
			"members", len(ch.Members.Members), "by", by)
		writeJSON(w, http.StatusOK, ch)
	case errors.As(err, &nl):
		writeJSON(w, http.StatusMisdirectedRequest, api.NotLeader{Error: err.Error(), Leader: nl.Leader})
	case errors.Is(err, repl.ErrBadMember):
		writeJSON(w, http.StatusBadRequest, api.Error{Error: err.Error()})
	case errors.Is(err, repl.ErrNoMember):
		writeJSON(w, http.StatusNotFound, api.Error{Error: err.Error()})
	case errors.Is(err, repl.ErrMemberExists), errors.Is(err, repl.ErrMembersFull), errors.Is(err, repl.ErrQuorumAtRisk):
		writeJSON(w, http.StatusConflict, api.Error{Error: err.Error()})
	case errors.Is(err, repl.ErrNotCaughtUp):
		writeJSON(w, http.StatusGatewayTimeout, api.Error{Error: err.Error()})
	default:
		writeJSON(w, http.StatusServiceUnavailable, api.Error{Error: err.Error()})
	}
}
