package admin

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockd-dev/lockd/engine"
)

// Handler returns the admin endpoint's handler for srv. version is reported
// by /status and as the lockd_build_info metric.
func Handler(srv *engine.Server, version string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(srv, version))
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Draining is one atomic: no shard lock, so a probe answers even
		// while a shard is busy.
		if srv.Draining() {
			http.Error(w, "shutting down\n", http.StatusServiceUnavailable)
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
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
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
	m, cfg := srv.Metrics(), srv.Config()
	return Status{
		Version:       version,
		Role:          "active",
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
	}
}

// Key is the JSON document of /keys/{key}.
type Key struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       string `json:"token,omitempty"` // decimal, see Status
	LeaseLeftMs int64  `json:"lease_left_ms"`
	Waiters     int    `json:"waiters"`
}

func keyState(srv *engine.Server, key string) Key {
	info := srv.Table().Lookup([]byte(key))
	k := Key{Key: key, Held: info.Held, Waiters: info.Waiters}
	if info.Held {
		left := time.Duration(info.Deadline - srv.Now())
		if left <= 0 {
			// The lease has ended; the timer has not processed it yet.
			return Key{Key: key}
		}
		k.Token = strconv.FormatUint(info.Token, 10)
		k.LeaseLeftMs = left.Milliseconds()
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
