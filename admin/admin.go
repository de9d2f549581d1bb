package admin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/repl"
)

// Build is what the binary knows of its own build (lockd --version, from
// internal/version): reported by /status and as lockd_build_info.
type Build struct {
	Line     string // the version line, as --version prints it: /status's "version"
	Version  string // the module version ("v0.1.0", "(devel)"): lockd_build_info's version label
	Revision string // the VCS revision, "" when the build stamped none: its revision label
}

// Option adds to what the admin endpoint serves.
type Option func(*options)

type options struct {
	http *httpapi.Front
}

// WithHTTP adds the HTTP API's metrics (package httpapi: requests by route
// and status, long-polls and streams open, forwards, redirects, grants
// released undelivered) to /metrics.
func WithHTTP(f *httpapi.Front) Option { return func(o *options) { o.http = f } }

// Handler returns the admin endpoint's handler for srv, reporting build.
//
// With an ACL (engine.Config.ACL) every path but OpenPaths needs the basic
// authentication of a monitor or admin identity, and a change (DELETE
// /keys/{key}: an admin's release of a key's grant) an admin
// (PROTOCOL.md §8.5).
func Handler(srv *engine.Server, build Build, opts ...Option) http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var st authStats
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(srv, build, &st))
	if o.http != nil {
		reg.MustRegister(newHTTPCollector(o.http))
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", probe(srv.Health))
	mux.HandleFunc("GET /livez", probe(srv.Live))
	mux.HandleFunc("GET /readyz", probe(func() error { return readiness(srv) }))
	mux.HandleFunc("GET "+api.PathStatus, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, status(srv, build.Line))
	})
	mux.HandleFunc("GET "+api.PathKeys+"{key...}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if key == "" {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: "missing key: GET /keys/{key}"})
			return
		}
		writeJSON(w, http.StatusOK, keyState(srv, key))
	})
	mux.HandleFunc("DELETE /keys/{key...}", release(srv))
	membersRoutes(mux, srv) // members.go: GET, POST /members, DELETE /members/{id}
	mux.HandleFunc("GET /debug/locks", func(w http.ResponseWriter, _ *http.Request) {
		// One line per holder of a held key (a shared key has several):
		// its token, the lease left in ms and the key (escaped as a Go
		// string), for comparing members' tables.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		bw := bufio.NewWriterSize(w, 64<<10)
		var line []byte
		srv.Locks(func(key []byte, token uint64, left time.Duration) {
			line = strconv.AppendUint(line[:0], token, 10)
			line = append(line, ' ')
			line = strconv.AppendInt(line, left.Milliseconds(), 10)
			line = append(line, ' ')
			line = strconv.AppendQuote(line, string(key))
			line = append(line, '\n')
			_, _ = bw.Write(line)
		})
		_ = bw.Flush()
	})
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return authorize(srv, &st, mux)
}

// probe answers a health probe: 200 "ok" while check is nil, else 503
// with its reason (ErrDraining as "shutting down", the text scripts
// already match).
func probe(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			msg := err.Error()
			if errors.Is(err, engine.ErrDraining) {
				msg = "shutting down"
			}
			http.Error(w, msg, http.StatusServiceUnavailable) // one line: Error adds the newline
			return
		}
		w.Write([]byte("ok\n"))
	}
}

// readiness is /readyz: nil when this node should get traffic — it
// executes requests (a single node, the active, the leader), or it is a
// standby or follower in sync with a known active or leader (it answers
// M naming it at once) — and it is not starting, not shutting down, and
// its token reservations succeed (engine.Server.Health).
func readiness(srv *engine.Server) error {
	select {
	case <-srv.Ready():
	default:
		return errors.New("starting: not listening yet")
	}
	if err := srv.Health(); err != nil {
		return err
	}
	st := srv.NodeStatus()
	switch {
	case api.Serving(st.Role):
		return nil
	case st.Role == api.RoleStandby || st.Role == api.RoleFollower:
		if st.InSync && st.Active != "" {
			return nil
		}
		return fmt.Errorf("%s not in sync with an active or leader yet", st.Role)
	}
	return fmt.Errorf("role %s: neither serving nor an in-sync standby or follower", orNone(st.Role))
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// status maps the engine's figures and the node's repl.Status onto the
// /status document.
func status(srv *engine.Server, version string) api.Status {
	m, cfg, node := srv.Metrics(), srv.Config(), srv.NodeStatus()
	return api.Status{
		Version:       version,
		Role:          node.Role,
		Addr:          srv.Addr(),
		UptimeSeconds: m.Uptime.Seconds(),
		Draining:      m.Draining,
		Keys:          m.Keys,
		Waiters:       m.Waiters,
		Connections:   m.Conns,
		SharedHolders: m.Holders,
		Watches:       m.Watches,
		TokenLast:     strconv.FormatUint(m.TokenLast, 10),
		TokenReserved: strconv.FormatUint(m.TokenReserved, 10),
		Limits: api.Limits{
			MaxKey: cfg.MaxKey, MaxKeys: cfg.Table.MaxKeys, MaxWaitersPerKey: cfg.Table.MaxWaitersPerKey,
			MaxWaiters: cfg.Table.MaxWaiters, MaxConns: cfg.MaxConns, MaxOutbound: cfg.MaxOutbound, Loops: cfg.Loops,
			MaxHolders: cfg.Table.MaxHolders, MaxWatchesPerConn: cfg.Table.MaxWatchesPerConn,
		},
		Mode:       node.Mode,
		Active:     node.Active,
		Leader:     leader(node),
		Epoch:      epoch(node),
		InSync:     node.InSync,
		LagSeconds: priorityPart(node).LagSeconds,
		Members:    node.Members,
		Priority:   priorityStatus(node),
		Raft:       raftStatus(node),
	}
}

// leader is a raft member's leader (Active, named for raft); "" in the
// other modes.
func leader(n repl.Status) string {
	if n.Mode != api.ModeRaft {
		return ""
	}
	return n.Active
}

// epoch is the document's and lockd_cluster_epoch's "epoch": a priority
// member's epoch, or a raft member's term, 0 on a single node. The two
// counters are apart in "priority" and "raft"; "epoch" keeps serving both,
// as it did before they were, for the programs and dashboards that read
// it.
func epoch(n repl.Status) uint64 {
	switch {
	case n.Priority != nil:
		return n.Priority.Epoch
	case n.Raft != nil:
		return n.Raft.Term
	}
	return 0
}

// priorityPart is a priority member's figures, zero in the other modes.
func priorityPart(n repl.Status) repl.PriorityStatus {
	if n.Priority == nil {
		return repl.PriorityStatus{}
	}
	return *n.Priority
}

func priorityStatus(n repl.Status) *api.PriorityStatus {
	p := n.Priority
	if p == nil {
		return nil
	}
	return &api.PriorityStatus{Epoch: p.Epoch, Failovers: p.Failovers, Handovers: p.Handovers, Demotions: p.Demotions,
		SnapshotsSent: p.SnapshotsSent, SnapshotsReceived: p.SnapshotsReceived}
}

func raftStatus(n repl.Status) *api.RaftStatus {
	rs := n.Raft
	if rs == nil {
		return nil
	}
	r := &api.RaftStatus{Term: rs.Term, CommitIndex: rs.CommitIndex, AppliedIndex: rs.AppliedIndex, Entries: rs.Entries,
		CommitP50Seconds: rs.CommitP50, CommitP99Seconds: rs.CommitP99, Snapshots: rs.Snapshots,
		LastSnapshotBytes: rs.SnapshotBytes, Elections: rs.Elections, Rebuilds: rs.Rebuilds,
		Configuration: rs.Configuration}
	if rs.Entries > 0 {
		r.RecordsPerEntry = float64(rs.EntryRecords) / float64(rs.Entries)
	}
	return r
}

// keyState is /keys/{key}: every holder and every waiter of the key in
// queue order (PROTOCOL.md §9.5), and the newest holder's token, lease
// and identity in the fields a key had before it could be shared.
func keyState(srv *engine.Server, key string) api.Key {
	d := srv.KeyDetail([]byte(key))
	k := api.Key{Key: key, Held: len(d.Holders) > 0, Waiters: len(d.Waiters), Limit: d.Limit, Shared: d.Shared}
	for _, h := range d.Holders {
		k.Holders = append(k.Holders, api.KeyHolder{Token: strconv.FormatUint(h.Token, 10), Identity: h.Ident,
			LeaseLeftMs: h.LeaseLeft.Milliseconds()})
	}
	if n := len(k.Holders); n > 0 {
		newest := k.Holders[n-1] // oldest first: the newest is the last
		k.Token, k.LeaseLeftMs, k.Identity = newest.Token, newest.LeaseLeftMs, newest.Identity
	}
	for _, w := range d.Waiters {
		k.Queue = append(k.Queue, api.KeyWaiter{Owner: strconv.FormatUint(w.Owner, 10), Identity: w.Ident,
			WaitLeftMs: w.WaitLeft.Milliseconds(), Shared: w.Limit != 0, Limit: int(w.Limit), LeaseSeconds: int(w.Lease)})
	}
	return k
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
