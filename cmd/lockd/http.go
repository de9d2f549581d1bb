package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/tlsconf"
)

// The HTTP/JSON API (--http, package httpapi, docs/HTTP.md). It is off
// unless --http is given: a listener is attack surface, and PROTOCOL.md
// §8's rule is that nothing changes unless its flag is given.

// httpOptions are the flags of the HTTP API.
type httpOptions struct {
	addr      string // --http, "" off
	maxConns  int    // --http-max-conns
	longPolls int    // --http-max-long-polls
	streams   int    // --http-max-streams
	// offset is the HTTP port less the client port, in a cluster: every
	// member's (docs/HTTP.md, "Clusters").
	offset int
}

// Defaults of the HTTP API's limits. Each long-poll and each stream holds
// a connection: their bounds below --http-max-conns leave connections for
// the short requests.
const (
	defaultHTTPConns     = 4096
	defaultHTTPLongPolls = 2048
	defaultHTTPStreams   = 1024
)

func httpFlagSet(fs *flag.FlagSet, o *httpOptions) {
	fs.StringVar(&o.addr, "http", "", "HTTP/JSON API address, host:port (HTTPS with --tls-cert; docs/HTTP.md); off unless given. "+
		"In a cluster every member's HTTP port is its client port + the same offset")
	fs.IntVar(&o.maxConns, "http-max-conns", defaultHTTPConns, "HTTP connections open at once; more wait in the kernel's queue (needs --http)")
	fs.IntVar(&o.longPolls, "http-max-long-polls", defaultHTTPLongPolls, "acquires with wait_ms > 0 waiting at once over HTTP; more are answered 503 (needs --http)")
	fs.IntVar(&o.streams, "http-max-streams", defaultHTTPStreams, "watches (SSE streams) open at once over HTTP; more are answered 503 (needs --http)")
}

// httpFlags checks the HTTP flags once the others are parsed: the address
// as every address flag is checked, the limits, and in a cluster the
// offset (a fixed port, away from every member's other ports: checkPorts
// does that).
func httpFlags(fs *flag.FlagSet, cfg *engine.Config, opt *options) error {
	o := &opt.http
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true }) // the environment's too (applyEnv sets them)
	if o.addr == "" {
		for _, name := range []string{"http-max-conns", "http-max-long-polls", "http-max-streams"} {
			if set[name] {
				return usageError{fmt.Sprintf("--%s needs --http", name)}
			}
		}
		return nil
	}
	if err := checkAddr("--http", o.addr); err != nil {
		return err
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"--http-max-conns", o.maxConns}, {"--http-max-long-polls", o.longPolls}, {"--http-max-streams", o.streams}} {
		if l.v < 1 || l.v > 1<<20 {
			return usageError{fmt.Sprintf("%s %d: must be 1..%d", l.name, l.v, 1<<20)}
		}
	}
	hh, hp, _ := net.SplitHostPort(o.addr)
	lh, lp, _ := net.SplitHostPort(cfg.Listen)
	httpPort, _ := strconv.Atoi(hp)
	listenPort, _ := strconv.Atoi(lp)
	if httpPort != 0 && httpPort == listenPort && sameHost(hh) == sameHost(lh) {
		return usageError{fmt.Sprintf("--http %s: the same port as --listen %s", o.addr, cfg.Listen)}
	}
	if ah, ap, err := net.SplitHostPort(opt.admin); err == nil && opt.admin != "" && ap == hp && httpPort != 0 && sameHost(ah) == sameHost(hh) {
		return usageError{fmt.Sprintf("--http %s: the same port as --admin %s", o.addr, opt.admin)}
	}
	if opt.cluster != "" {
		if httpPort == 0 || listenPort == 0 {
			return usageError{fmt.Sprintf("--http %s: a cluster member needs a fixed HTTP port and --listen port: a member that does not serve forwards a request to the serving member's HTTP port, found at the same offset from its client port as this member's", o.addr)}
		}
		o.offset = httpPort - listenPort
	}
	return nil
}

// listenHTTP binds --http (before anything else starts, as --admin is),
// bounded to --http-max-conns connections, behind TLS with the admin
// endpoint's configuration (client certificates asked for, not required:
// basic authentication is the other way in).
func listenHTTP(o httpOptions, st *tlsconf.Store) (net.Listener, error) {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w (give --http another address)", o.addr, err)
	}
	ln = limitListen(ln, o.maxConns)
	if st != nil {
		ln = tls.NewListener(ln, st.AdminConfig())
	}
	return ln, nil
}

// httpEndpoint is the running HTTP API.
type httpEndpoint struct {
	front    *httpapi.Front
	hs       *httpapi.Endpoint
	done     chan struct{} // closed when Serve returned
	shutDone chan struct{} // closed when shutdown returned
}

// startHTTP serves the front on ln once srv is ready (a request that comes
// sooner waits in the listener's queue).
func startHTTP(srv *engine.Server, ln net.Listener, o httpOptions, st *tlsconf.Store, log *slog.Logger) (*httpEndpoint, error) {
	cfg := httpapi.Config{Server: srv, PortOffset: o.offset, MaxLongPolls: o.longPolls, MaxStreams: o.streams}
	if st != nil {
		// Another member's HTTPS endpoint presents its member
		// certificate: verified against the member link's CAs, for the
		// host of its --peers entry. No client certificate is presented:
		// a member's own could name an identity of the ACL.
		cfg.ForwardTLS = func() *tls.Config { return &tls.Config{RootCAs: st.PeerCAs(), MinVersion: tls.VersionTLS12} }
	}
	front, err := httpapi.New(cfg)
	if err != nil {
		return nil, err
	}
	e := &httpEndpoint{front: front, hs: front.Endpoint(), done: make(chan struct{}), shutDone: make(chan struct{})}
	go func() {
		defer close(e.done)
		select {
		case <-srv.Ready():
			_ = e.hs.Serve(ln)
		case <-srv.Done():
			ln.Close()
		}
	}()
	log.Info("http endpoint", "addr", ln.Addr().String(), "tls", st != nil, "port_offset", o.offset)
	return e, nil
}

// shutdown stops accepting HTTP connections and lets the requests in
// flight finish (a long-poll gets its E 4 or its M from the engine's
// shutdown, which runs meanwhile) until ctx ends.
func (e *httpEndpoint) shutdown(ctx context.Context) {
	defer close(e.shutDone)
	_ = e.hs.Shutdown(ctx)
}

// close ends what is left, once the engine has stopped (its requests are
// answered): the front ends the requests it forwarded to another member
// and still waits for (answering their clients), the connections get a
// second to take those answers, then close.
func (e *httpEndpoint) close(shuttingDown bool) {
	e.front.Close()
	if shuttingDown {
		select {
		case <-e.shutDone:
		case <-time.After(time.Second):
		}
	}
	_ = e.hs.Close()
	select {
	case <-e.done:
	case <-time.After(time.Second):
	}
}
