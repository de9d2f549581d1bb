package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/engine"
)

// serveGateway serves POST /v1/acquire and /v1/release — the bodies and
// answers of httpapi — through the bundled Go client to srv's client
// port: the gateway design httpapi did not take (as etcd's gateway dials
// its own gRPC server), kept here to measure it against the in-process
// connection (docs/DESIGN.md "The HTTP front"). It implements only what
// the uncontended, contended and single workloads use; an error is a 409
// with httpapi's code for a timeout, busy or not held, else a 500.
func serveGateway(srv *engine.Server) (string, func(), error) {
	cl, err := client.New(client.Config{Addrs: []string{srv.Addr()}, ConnsPerAddr: 4})
	if err != nil {
		return "", nil, err
	}
	fail := func(w http.ResponseWriter, status int, code string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"code":"`+code+`","message":"`+code+`"}}`)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/acquire", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Key     string `json:"key"`
			WaitMs  int64  `json:"wait_ms"`
			LeaseMs int64  `json:"lease_ms"`
		}
		if json.NewDecoder(r.Body).Decode(&b) != nil {
			fail(w, http.StatusBadRequest, "bad_request")
			return
		}
		ctx := r.Context()
		l, err := cl.Acquire(ctx, b.Key, client.AcquireOptions{Wait: time.Duration(b.WaitMs) * time.Millisecond,
			Lease: time.Duration(b.LeaseMs) * time.Millisecond})
		switch {
		case errors.Is(err, client.ErrTimeout):
			fail(w, http.StatusConflict, "timeout")
			return
		case errors.Is(err, client.ErrBusy):
			fail(w, http.StatusTooManyRequests, "busy")
			return
		case err != nil:
			fail(w, http.StatusInternalServerError, "internal")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, err = io.WriteString(w, `{"key":`+strconv.Quote(b.Key)+`,"token":"`+strconv.FormatUint(l.Token, 10)+`","lease_ms":`+strconv.FormatInt(b.LeaseMs, 10)+"}\n")
		if err != nil {
			_ = cl.Release(context.Background(), l) // not delivered
		}
	})
	mux.HandleFunc("POST /v1/release", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Key   string `json:"key"`
			Token string `json:"token"`
		}
		if json.NewDecoder(r.Body).Decode(&b) != nil {
			fail(w, http.StatusBadRequest, "bad_request")
			return
		}
		tok, _ := strconv.ParseUint(b.Token, 10, 64)
		err := cl.Release(r.Context(), client.Lock{Key: b.Key, Token: tok})
		switch {
		case errors.Is(err, client.ErrNotHeld):
			fail(w, http.StatusConflict, "not_held")
			return
		case err != nil:
			fail(w, http.StatusInternalServerError, "internal")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"key":`+strconv.Quote(b.Key)+`,"token":"`+b.Token+"\"}\n")
	})
	mux.HandleFunc("POST /v1/inspect", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cl.Close()
		return "", nil, err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return ln.Addr().String(), func() { hs.Close(); cl.Close(); srv.Close() }, nil
}
