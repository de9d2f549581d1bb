package admin

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/repl"
)

// Handler returns the admin endpoint's handler for srv. version is reported
// by /status and as the lockd_build_info metric.
//
// With an ACL (engine.Config.ACL) every path but OpenPaths needs the basic
// authentication of a monitor or admin identity, and a change (DELETE
// /keys/{key}: an admin's release of a key's grant) an admin
// (PROTOCOL.md §8.5).
func Handler(srv *engine.Server, version string) http.Handler {
	var st authStats
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(srv, version, &st))
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := srv.Health(); err != nil {
			msg := err.Error()
			if errors.Is(err, engine.ErrDraining) {
				msg = "shutting down" // the text scripts already match
			}
			http.Error(w, msg+"\n", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, status(srv, version))
	})
	mux.HandleFunc("GET /keys/{key...}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if key == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "missing key: GET /keys/{key}"})
			return
		}
		writeJSON(w, http.StatusOK, keyState(srv, key))
	})
	mux.HandleFunc("DELETE /keys/{key...}", release(srv))
	mux.HandleFunc("GET /debug/locks", func(w http.ResponseWriter, _ *http.Request) {
		// One line per held key: its token, the lease left in ms and the
		// key (escaped as a Go string), for comparing members' tables.
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

// Status is the JSON document of /status.
type Status struct {
	Version       string  `json:"version"`
	Role          string  `json:"role"` // "active" on a single node
	Addr          string  `json:"addr"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	Draining      bool    `json:"draining"`
	Keys          int     `json:"keys"`
	Waiters       int     `json:"waiters"`
	Connections   int64   `json:"connections"`
	// Tokens are decimal strings: u64 values above 2^53 do not survive
	// JSON numbers in many languages.
	TokenLast     string `json:"token_last"`
	TokenReserved string `json:"token_reserved"`
	Limits        Limits `json:"limits"`

	// Cluster: mode "single", "priority" or "raft"; the active's (or
	// leader's) client address; the epoch (priority) or term (raft); the
	// other members.
	Mode    string   `json:"mode"`
	Active  string   `json:"active"`
	Epoch   uint64   `json:"epoch"`
	InSync  bool     `json:"in_sync,omitempty"` // a standby in sync with its active
	LagSecs float64  `json:"lag_seconds"`       // standby: its lag as its active measures it
	Members []Member `json:"members,omitempty"` // the other members, in --peers order

	Raft *RaftStatus `json:"raft,omitempty"` // a raft member's log figures
}

// RaftStatus is a raft member's log: indexes, group commit, snapshots.
type RaftStatus struct {
	Term              uint64  `json:"term"`
	CommitIndex       uint64  `json:"commit_index"`
	AppliedIndex      uint64  `json:"applied_index"`
	Entries           uint64  `json:"entries"`            // entries this member proposed as leader and saw committed
	RecordsPerEntry   float64 `json:"records_per_entry"`  // lock changes per entry
	CommitP50Seconds  float64 `json:"commit_p50_seconds"` // over the last 1024 entries
	CommitP99Seconds  float64 `json:"commit_p99_seconds"`
	Snapshots         uint64  `json:"snapshots"`
	LastSnapshotBytes uint64  `json:"last_snapshot_bytes"`
	Elections         uint64  `json:"elections"`
	Rebuilds          uint64  `json:"rebuilds"`
}

// Member is what this node knows of another cluster member.
type Member struct {
	Addr       string  `json:"addr"`
	Role       string  `json:"role"`
	Live       bool    `json:"live"`
	InSync     bool    `json:"in_sync"`
	LagSeconds float64 `json:"lag_seconds"` // as the active measures it
	LagRecords uint64  `json:"lag_records"`
	LagBytes   uint64  `json:"lag_bytes"`
}

// Limits are the server's configured limits.
type Limits struct {
	MaxKey           int `json:"max_key"`
	MaxKeys          int `json:"max_keys"`
	MaxWaitersPerKey int `json:"max_waiters_per_key"`
	MaxWaiters       int `json:"max_waiters"`
	MaxConns         int `json:"max_conns"`
	MaxOutbound      int `json:"max_outbound"`
	Loops            int `json:"loops"`
}

func status(srv *engine.Server, version string) Status {
	m, cfg, node := srv.Metrics(), srv.Config(), srv.NodeStatus()
	return Status{
		Version:       version,
		Role:          node.Role,
		Addr:          srv.Addr(),
		UptimeSeconds: m.Uptime.Seconds(),
		Draining:      m.Draining,
		Keys:          m.Keys,
		Waiters:       m.Waiters,
		Connections:   m.Conns,
		TokenLast:     strconv.FormatUint(m.TokenLast, 10),
		TokenReserved: strconv.FormatUint(m.TokenReserved, 10),
		Limits: Limits{
			MaxKey: cfg.MaxKey, MaxKeys: cfg.Table.MaxKeys, MaxWaitersPerKey: cfg.Table.MaxWaitersPerKey,
			MaxWaiters: cfg.Table.MaxWaiters, MaxConns: cfg.MaxConns, MaxOutbound: cfg.MaxOutbound, Loops: cfg.Loops,
		},
		Mode:    node.Mode,
		Active:  node.Active,
		Epoch:   node.Epoch,
		InSync:  node.InSync,
		LagSecs: node.LagSeconds,
		Members: members(node.Members),
		Raft:    raftStatus(node),
	}
}

func raftStatus(n repl.Status) *RaftStatus {
	if n.Mode != "raft" {
		return nil
	}
	r := &RaftStatus{Term: n.Epoch, CommitIndex: n.CommitIndex, AppliedIndex: n.AppliedIndex, Entries: n.Entries,
		CommitP50Seconds: n.CommitP50, CommitP99Seconds: n.CommitP99, Snapshots: n.Snapshots,
		LastSnapshotBytes: n.SnapshotBytes, Elections: n.Elections, Rebuilds: n.Rebuilds}
	if n.Entries > 0 {
		r.RecordsPerEntry = float64(n.EntryRecords) / float64(n.Entries)
	}
	return r
}

func members(ms []repl.Member) []Member {
	var out []Member
	for _, m := range ms {
		out = append(out, Member{Addr: m.Addr, Role: m.Role, Live: m.Live, InSync: m.InSync,
			LagSeconds: m.LagSeconds, LagRecords: m.LagRecords, LagBytes: m.LagBytes})
	}
	return out
}

// Key is the JSON document of /keys/{key}.
type Key struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       string `json:"token,omitempty"` // decimal, see Status
	LeaseLeftMs int64  `json:"lease_left_ms"`
	Waiters     int    `json:"waiters"`
	Identity    string `json:"identity,omitempty"` // the identity the grant was made to (PROTOCOL.md §8.3)
}

func keyState(srv *engine.Server, key string) Key {
	st := srv.Key([]byte(key))
	k := Key{Key: key, Held: st.Held, Waiters: st.Waiters}
	if st.Held {
		k.Token = strconv.FormatUint(st.Token, 10)
		k.LeaseLeftMs = st.LeaseLeft.Milliseconds()
		k.Identity = st.Ident
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
