package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	buildinfo "github.com/lockd-dev/lockd/internal/version"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/priority"
	"github.com/lockd-dev/lockd/repl/raftnode"
	"github.com/lockd-dev/lockd/tlsconf"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used
// (internal/version).
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// usageError is a bad command line: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// options are the flags that are not engine.Config fields.
type options struct {
	admin       string
	showVersion bool
	cluster     string             // "", "priority" or "raft"
	member      repl.ClusterConfig // the cluster flags, when cluster != ""
	// tls is the TLS material of --tls-cert, --tls-key, --tls-client-ca and
	// --tls-peer-ca (nil: plaintext): the client port's and the admin
	// endpoint's configurations, and the member link's certificate and
	// peer CAs (Certificate, PeerCAs), all following SIGHUP reloads.
	tls *tlsconf.Store
	acl string // --acl FILE, "" for none
	// http is the HTTP API's flags (http.go).
	http httpOptions
	// fromEnv are the flags the environment set (LOCKD_*, env.go), and
	// envUnknown the LOCKD_ variables that name no flag (warned about).
	fromEnv    map[string]envSet
	envUnknown []string
}

// parseFlags parses the command line, then the environment for the flags
// it did not set (env.go); an error names the variable of a flag that
// came from there.
func parseFlags(args []string, stderr io.Writer) (engine.Config, options, error) {
	cfg, opt, err := parseArgs(args, os.LookupEnv, os.Environ(), stderr)
	var ue usageError
	if errors.As(err, &ue) {
		err = usageError{withEnv(ue.msg, opt.fromEnv)}
	}
	return cfg, opt, err
}

func parseArgs(args []string, lookup func(string) (string, bool), environ []string, stderr io.Writer) (engine.Config, options, error) {
	cfg := engine.DefaultConfig()
	var opt options
	fs := flag.NewFlagSet("lockd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var tlsFiles tlsconf.Files
	fs.StringVar(&tlsFiles.Cert, "tls-cert", "", "PEM certificate chain: the client port speaks TLS (1.2 or later) only, the admin endpoint HTTPS; needs --tls-key")
	fs.StringVar(&tlsFiles.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&tlsFiles.ClientCA, "tls-client-ca", "", "PEM CA bundle: clients must present a certificate that verifies against it (mutual TLS); needs --tls-cert")
	fs.StringVar(&tlsFiles.PeerCA, "tls-peer-ca", "", "PEM CA bundle for the member link's certificates (default: --tls-client-ca); needs --tls-cert")
	fs.StringVar(&opt.admin, "admin", "", "admin HTTP address (HTTPS with --tls-cert) for /metrics, /livez, /readyz, /healthz, /status, /keys/{key}, /debug/pprof/ (default: --listen's host, its port + 1; \"\" turns it off)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "TCP address to serve (host:port)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the token mark and the shutdown snapshot")
	fs.IntVar(&cfg.MaxKey, "max-key", cfg.MaxKey, "longest key in bytes, 1..1024")
	fs.IntVar(&cfg.Table.MaxKeys, "max-keys", cfg.Table.MaxKeys, "distinct keys held at once; a new key beyond it is answered B")
	fs.IntVar(&cfg.Table.MaxWaitersPerKey, "max-waiters-per-key", cfg.Table.MaxWaitersPerKey, "queued acquires per key; more are answered B")
	fs.IntVar(&cfg.Table.MaxWaiters, "max-waiters", cfg.Table.MaxWaiters, "queued acquires over all keys; more are answered B")
	fs.IntVar(&cfg.Table.MaxWaitersPerConn, "max-waiters-per-conn", cfg.Table.MaxWaitersPerConn, "queued acquires of one connection; more are answered B")
	fs.IntVar(&cfg.Table.MaxHolders, "max-holders", cfg.Table.MaxHolders, "holders of shared keys beyond each key's first (PROTOCOL.md §9.2), over all keys; an acquire shared beyond it is answered B")
	fs.IntVar(&cfg.Table.MaxWatchesPerConn, "max-watches-per-conn", cfg.Table.MaxWatchesPerConn, "watches one connection may register (PROTOCOL.md §9.4); a watch beyond it is answered E 8")
	fs.IntVar(&cfg.MaxPendingGrants, "max-pending-grants", cfg.MaxPendingGrants, "grants one connection has not taken from its socket; while it has that many, its acquires are answered B")
	fs.DurationVar(&cfg.FrameTimeout, "frame-timeout", cfg.FrameTimeout, "a connection whose partial frame is older than this is closed (100ms..1h)")
	fs.IntVar(&cfg.MaxConns, "max-conns", cfg.MaxConns, "open client connections; more are closed at once")
	fs.IntVar(&cfg.MaxOutbound, "max-outbound", cfg.MaxOutbound, "bytes of answers buffered for a connection that does not read before it is closed")
	fs.DurationVar(&cfg.Drain, "drain", cfg.Drain, "on shutdown, how long connections stay open answering E 4 before they close (≤ 4s)")
	fs.IntVar(&cfg.Loops, "loops", cfg.Loops, "event loops, 1..1024; one per core unless set")
	fs.Uint64Var(&cfg.TokenBlock, "token-block", cfg.TokenBlock, "tokens reserved in the data dir per disk write; up to two blocks are reserved ahead")
	fs.StringVar(&opt.cluster, "cluster", "", "cluster mode: priority or raft (PROTOCOL.md §6); empty: a single node")
	peers := fs.String("peers", "", "every member's client address, comma-separated, the same on every member (priority: first = highest priority)")
	self := fs.String("self", "", "this member's entry in --peers, compared as text (default: --listen as written)")
	fs.IntVar(&opt.member.PeerOffset, "peer-offset", repl.DefaultPeerOffset, "members talk on client port + this offset")
	fs.DurationVar(&opt.member.FailoverTimeout, "failover-timeout", repl.DefaultFailoverTimeout, "priority: how long the active may be silent before a standby takes over; raft: the election timeout scale (100ms..60s)")
	membershipFlags(fs, &opt.member) // members.go: --join, --force-new-cluster
	secretFile := fs.String("cluster-secret", "", "file holding the cluster secret, the same on every member: every member connection proves it both ways (PROTOCOL.md §8.4)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "text", "log format: text or json")
	httpFlagSet(fs, &opt.http)
	fs.StringVar(&opt.acl, "acl", "", "identity file (PROTOCOL.md §8.2): turns authentication and authorization on; SIGHUP re-reads it")
	fs.BoolVar(&opt.showVersion, "version", false, "print the version and exit")
	envUsage(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lockd [flags]\n\nlockd is a lock server with fencing tokens. Every flag but --version may also be\n"+
			"given in the environment as LOCKD_<FLAG> (upper case, '-' as '_': --data-dir is LOCKD_DATA_DIR,\n"+
			"shown in brackets below); a flag on the command line wins over its variable. Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, opt, err
	}
	if fs.NArg() > 0 {
		return cfg, opt, usageError{fmt.Sprintf("unexpected argument %q (lockd takes only flags)", fs.Arg(0))}
	}
	var err error
	if opt.fromEnv, err = applyEnv(fs, lookup); err != nil {
		return cfg, opt, err
	}
	opt.envUnknown = envUnknown(fs, environ)
	if err := cfg.Validate(); err != nil {
		return cfg, opt, usageError{flagError(err).Error()}
	}
	if err := checkAddr("--listen", cfg.Listen); err != nil {
		return cfg, opt, err
	}
	if err := clusterFlags(fs, &cfg, &opt, *peers, *self); err != nil {
		return cfg, opt, err
	}
	if opt.tls, err = loadTLS(tlsFiles); err != nil {
		return cfg, opt, err
	}
	if opt.tls != nil {
		cfg.TLS = opt.tls.ServerConfig()
	}
	if err := memberSecurity(&opt, tlsFiles, *secretFile); err != nil {
		return cfg, opt, err
	}
	if opt.acl != "" {
		a, err := acl.Load(opt.acl)
		if err != nil {
			return cfg, opt, usageError{aclError(opt.acl, err)}
		}
		cfg.ACL = a
	}
	adminSet := false
	fs.Visit(func(f *flag.Flag) { adminSet = adminSet || f.Name == "admin" })
	if !adminSet {
		opt.admin = adminBeside(cfg.Listen)
	} else if opt.admin != "" {
		if _, _, err := net.SplitHostPort(opt.admin); err != nil {
			return cfg, opt, usageError{fmt.Sprintf("--admin %q: %v", opt.admin, err)}
		}
		if err := checkAddr("--admin", opt.admin); err != nil {
			return cfg, opt, err
		}
	}
	if err := httpFlags(fs, &cfg, &opt); err != nil {
		return cfg, opt, err
	}
	if opt.cluster != "" {
		if err := checkPorts(opt.member.Peers, opt.member.Self, cfg.Listen, opt.member.PeerOffset, opt.admin, adminSet, opt.http.offset); err != nil {
			return cfg, opt, err
		}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return cfg, opt, usageError{fmt.Sprintf("--log-level %q: want debug, info, warn or error", *level)}
	}
	var h slog.Handler
	switch *format {
	case "text":
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv})
	case "json":
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lv})
	default:
		return cfg, opt, usageError{fmt.Sprintf("--log-format %q: want text or json", *format)}
	}
	cfg.Logger = slog.New(h)
	return cfg, opt, nil
}

// clusterFlags checks the flags of PROTOCOL.md §6.1 and fills opt.member.
func clusterFlags(fs *flag.FlagSet, cfg *engine.Config, opt *options, peers, self string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch opt.cluster {
	case "":
		for _, name := range []string{"peers", "self", "peer-offset", "failover-timeout", "join", "force-new-cluster"} {
			if set[name] {
				return usageError{fmt.Sprintf("--%s needs --cluster priority or --cluster raft", name)}
			}
		}
		return nil
	case api.ModePriority, api.ModeRaft:
	default:
		return usageError{fmt.Sprintf("--cluster %q: want priority or raft", opt.cluster)}
	}
	if peers == "" {
		return usageError{"--peers: a cluster needs every member's address (host:port,host:port,...)"}
	}
	m := &opt.member
	m.Peers = strings.Split(peers, ",")
	for i := range m.Peers {
		m.Peers[i] = strings.TrimSpace(m.Peers[i])
	}
	if self == "" {
		self = cfg.Listen
	}
	m.Self = repl.SelfIndex(m.Peers, self)
	if m.Self < 0 {
		if set["self"] {
			return usageError{fmt.Sprintf("--self %q: not an entry of --peers %q", self, peers)}
		}
		return usageError{fmt.Sprintf("--self: --listen %q is not an entry of --peers %q; give --self as this member appears there", self, peers)}
	}
	m.Listen, m.DataDir, m.TokenBlock = cfg.Listen, cfg.DataDir, cfg.TokenBlock
	if err := checkMembership(opt.cluster, m); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return usageError{flagError(err).Error()}
	}
	return nil
}

// aclModeWarning is the warning for an ACL file that group or others may
// read or write ("" when they may not, or it cannot be read): it holds the
// secrets' digests, unsalted, from which a guessable secret can be found,
// and whoever writes it gives identities keys.
func aclModeWarning(path string) string {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("--acl: the file's mode is %04o: group or others may read it (the secrets' digests: a guessable secret can be found from them) or change it; make it readable by lockd only (chmod 600)", fi.Mode().Perm())
}

// aclError words a failure to load the ACL file with the flag's name (a
// bad line already names the file and the line).
func aclError(path string, err error) string {
	var le *acl.LineError
	if errors.As(err, &le) {
		return "--acl: " + le.Error()
	}
	return fmt.Sprintf("--acl %s: %v", path, err)
}

// flags maps the fields of engine.Config and of the nodes' configuration
// (repl.ClusterConfig, repl.LocalConfig) onto the daemon's flags.
var flags = map[string]string{
	"Listen":                  "--listen",
	"DataDir":                 "--data-dir",
	"MaxKey":                  "--max-key",
	"Table.MaxKeys":           "--max-keys",
	"Table.MaxWaitersPerKey":  "--max-waiters-per-key",
	"Table.MaxWaiters":        "--max-waiters",
	"MaxConns":                "--max-conns",
	"MaxOutbound":             "--max-outbound",
	"Loops":                   "--loops",
	"Drain":                   "--drain",
	"Table.MaxWaitersPerConn": "--max-waiters-per-conn",
	"Table.MaxHolders":        "--max-holders",
	"Table.MaxWatchesPerConn": "--max-watches-per-conn",
	"MaxPendingGrants":        "--max-pending-grants",
	"FrameTimeout":            "--frame-timeout",
	"TokenBlock":              "--token-block",
	"Peers":                   "--peers",
	"Self":                    "--self",
	"PeerOffset":              "--peer-offset",
	"FailoverTimeout":         "--failover-timeout",
	"Join":                    "--join",
	"ForceNewCluster":         "--force-new-cluster",
	"MemberTLS":               "--tls-peer-ca",
	"Secret":                  "--cluster-secret",
}

// flagError words an engine.ConfigError or a repl.FieldError with the
// flag's name; other errors are returned as they are.
func flagError(err error) error {
	var (
		ce    *engine.ConfigError
		fe    *repl.FieldError
		field string
		value any
		why   string
	)
	switch {
	case errors.As(err, &ce):
		field, value, why = ce.Field, ce.Value, ce.Want
	case errors.As(err, &fe):
		field, value, why = fe.Field, fe.Value, fe.Want
		if fe.Err != nil {
			why = fe.Err.Error()
		}
	default:
		return err
	}
	name, ok := flags[field]
	if !ok {
		return err
	}
	return fmt.Errorf("%s %v: %s", name, value, why)
}

// checkAddr checks an address flag's port before anything is started or
// reserved: a decimal number 0..65535 (0: any free port). net.Listen
// would refuse another only once the data dir is locked and tokens are
// reserved, and would look a name such as "http" up as a service.
func checkAddr(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usageError{fmt.Sprintf("%s %q: must be host:port (%v)", flag, addr, err)}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return usageError{fmt.Sprintf("%s %q: the port must be a number 0..65535", flag, addr)}
	}
	return nil
}

// adminBeside is the default admin address: --listen's host, its port + 1
// (port 0 stays 0: any free port), so that a second lockd on the host
// needs no flag beyond its own --listen.
func adminBeside(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return net.JoinHostPort(host, "0")
	}
	if p >= 65535 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

// build is what lockd --version prints and the admin endpoint reports:
// the module version and the VCS revision from the build information.
func build() admin.Build {
	i := buildinfo.Read(version)
	return admin.Build{Line: "lockd " + i.String(), Version: i.Version, Revision: i.Revision}
}

func run(args []string, stderr io.Writer) int {
	cfg, opt, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "lockd: %s\n", ue.msg)
		}
		// The flag package has already printed its own message.
		return 2
	}
	if opt.showVersion {
		fmt.Fprintln(os.Stdout, build().Line)
		return 0
	}
	log := cfg.Logger
	if len(opt.envUnknown) > 0 {
		log.Warn("environment variables that name no lockd flag are ignored (misspelt?)", "variables", strings.Join(opt.envUnknown, ","))
	}
	httpConns := 0
	if opt.http.addr != "" {
		httpConns = opt.http.maxConns
	}
	if cfg.MaxConns, err = fitConns(cfg.MaxConns, cfg.Loops, httpConns, log); err != nil {
		log.Error("start failed", "err", err)
		return 1
	}
	if opt.cluster != "" {
		if w := memberPortWarning(cfg.Listen, opt.member.PeerOffset, ephemeralFile); w != "" {
			log.Warn(w)
		}
	}
	if n := clusterProcs(opt.cluster, cfg.Loops, os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n > 0 {
		runtime.GOMAXPROCS(n)
		log.Info("GOMAXPROCS raised: one processor more than the event loops, for the cluster's goroutines",
			"gomaxprocs", n, "loops", cfg.Loops)
	}
	var adminLn net.Listener
	if opt.admin != "" {
		adminLn, err = net.Listen("tcp", opt.admin)
		if err != nil {
			log.Error("start failed", "err", fmt.Errorf("--admin %s: %w (give --admin another address, or --admin \"\" to turn it off)", opt.admin, err))
			return 1
		}
		adminLn = limitListen(adminLn, adminMaxConns)
		if opt.tls != nil {
			adminLn = adminTLS(adminLn, opt.tls)
		}
	}
	var httpLn net.Listener
	if opt.http.addr != "" {
		if httpLn, err = listenHTTP(opt.http, opt.tls); err != nil {
			log.Error("start failed", "err", err)
			if adminLn != nil {
				adminLn.Close()
			}
			return 1
		}
	}
	switch opt.cluster {
	case api.ModePriority:
		cfg.Node, err = priority.New(opt.member)
	case api.ModeRaft:
		cfg.Node, err = raftnode.New(opt.member)
	}
	var srv *engine.Server
	if err == nil {
		srv, err = engine.New(cfg)
	}
	if err != nil {
		log.Error("start failed", "err", flagError(err))
		if adminLn != nil {
			adminLn.Close()
		}
		if httpLn != nil {
			httpLn.Close()
		}
		return 1
	}
	var (
		httpEnd   *httpEndpoint
		adminOpts []admin.Option
	)
	if httpLn != nil {
		if httpEnd, err = startHTTP(srv, httpLn, opt.http, opt.tls, log); err != nil {
			log.Error("start failed", "err", err)
			httpLn.Close()
			if adminLn != nil {
				adminLn.Close()
			}
			_ = srv.Close()
			return 1
		}
		defer httpEnd.close(false)
		adminOpts = append(adminOpts, admin.WithHTTP(httpEnd.front))
	}
	if adminLn != nil {
		adminSrv := &http.Server{Handler: admin.Handler(srv, build(), adminOpts...),
			ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, ErrorLog: limitedLog(log)}
		go func() { _ = adminSrv.Serve(adminLn) }()
		log.Info("admin endpoint", "addr", adminLn.Addr().String())
		defer adminSrv.Close()
	}
	var reload reloaders
	if opt.tls != nil {
		reload.add("TLS certificate, key and CA files", func() error {
			if err := opt.tls.Reload(); err != nil {
				return errors.New(tlsFlagError(err))
			}
			return nil
		})
	}
	if opt.acl != "" {
		if w := aclModeWarning(opt.acl); w != "" {
			log.Warn(w, "file", opt.acl)
		}
		if cfg.ACL.Len() == 0 {
			log.Warn("--acl names a file without any identity: every lock request will be refused", "file", opt.acl)
		}
		path := opt.acl
		reload.add("--acl "+path, func() error {
			err := srv.ReloadACL(func() (*acl.ACL, error) { return acl.Load(path) })
			if err != nil {
				return errors.New(aclError(path, err))
			}
			if w := aclModeWarning(path); w != "" {
				log.Warn(w, "file", path)
			}
			return nil
		})
		log.Info("authentication on", "acl", path, "identities", cfg.ACL.Len())
	}
	defer reload.watch(log)()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve() }()

	select {
	case err := <-serveErr:
		if errors.Is(err, engine.ErrStopped) {
			log.Error("stopped serving on its own; exiting", "err", err)
		} else if errors.As(err, new(*repl.FieldError)) {
			log.Error("start failed", "err", flagError(err))
		} else {
			log.Error("start failed", "err", fmt.Errorf("--listen %s: %w", cfg.Listen, err))
		}
		return 1
	case sig := <-sigs:
		log.Info("signal received, shutting down", "signal", sig.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*engine.ShutdownGrace)
	defer cancel()
	go signalsDuringShutdown(srv, sigs, log)
	if httpEnd != nil {
		// The HTTP endpoint stops accepting with the client port; the
		// requests in flight get their E 4 or M from the engine's
		// shutdown below (or, once the engine stopped, their end), and
		// an M is answered, not forwarded (httpapi.Front.Stopping).
		httpEnd.front.Stopping()
		go httpEnd.shutdown(ctx)
	}
	err = srv.Shutdown(ctx)
	if httpEnd != nil {
		httpEnd.close(true)
	}
	if err != nil {
		log.Error("shutdown failed", "err", err)
		return 1
	}
	<-serveErr
	log.Info("stopped", "uptime", time.Since(start).Round(time.Millisecond).String())
	return 0
}

var start = time.Now()

// signalsDuringShutdown follows the shutdown's signals (docs/OPERATING.md,
// "Shutdown and restarts"): the second cuts the drain short (engine.Hurry),
// and the shutdown still writes the snapshot; the third exits at once,
// with what that loses.
func signalsDuringShutdown(srv *engine.Server, sigs <-chan os.Signal, log *slog.Logger) {
	sig := <-sigs
	log.Warn("second signal: skipping the rest of the drain; the held locks are still written to the data directory (a third signal exits at once and loses them)",
		"signal", sig.String())
	srv.Hurry()
	sig = <-sigs
	n, why := lostOnExit(srv)
	log.Error("third signal: exiting at once, without writing the snapshot", "signal", sig.String(), "held_locks_lost", n, "why", why)
	os.Exit(1)
}

// lostOnExit is how many held locks an exit now loses, and why: a
// single node's (and a priority member's that has not handed over) are
// in no snapshot yet; a raft member's are in the log; a priority member
// that handed over gave them to the active.
func lostOnExit(srv *engine.Server) (int, string) {
	st := srv.NodeStatus()
	switch {
	case st.Mode == api.ModeRaft:
		return 0, "a raft member's committed locks are in its log and on the other members"
	case st.Mode == api.ModePriority && st.Active != "" && st.Active != st.Self:
		return 0, "handed over to the active " + st.Active
	}
	return srv.Table().Stats().Keys, "the locks held now are in no snapshot yet (tokens are never lost)"
}
