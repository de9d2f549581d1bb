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
	"runtime/debug"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/admin"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
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
}

func parseFlags(args []string, stderr io.Writer) (engine.Config, options, error) {
	cfg := engine.DefaultConfig()
	var opt options
	fs := flag.NewFlagSet("lockd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opt.admin, "admin", "127.0.0.1:7071", "admin HTTP address for /metrics, /healthz, /status, /keys/{key}, /debug/pprof/ (empty: off)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "TCP address to serve (host:port)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the token mark and the shutdown snapshot")
	fs.IntVar(&cfg.MaxKey, "max-key", cfg.MaxKey, "longest key in bytes, 1..1024")
	fs.IntVar(&cfg.Table.MaxKeys, "max-keys", cfg.Table.MaxKeys, "distinct keys held at once; a new key beyond it is answered B")
	fs.IntVar(&cfg.Table.MaxWaitersPerKey, "max-waiters-per-key", cfg.Table.MaxWaitersPerKey, "queued acquires per key; more are answered B")
	fs.IntVar(&cfg.Table.MaxWaiters, "max-waiters", cfg.Table.MaxWaiters, "queued acquires over all keys; more are answered B")
	fs.IntVar(&cfg.Table.MaxWaitersPerConn, "max-waiters-per-conn", cfg.Table.MaxWaitersPerConn, "queued acquires of one connection; more are answered B")
	fs.IntVar(&cfg.MaxPendingGrants, "max-pending-grants", cfg.MaxPendingGrants, "grants one connection has not taken from its socket; while it has that many, its acquires are answered B")
	fs.DurationVar(&cfg.FrameTimeout, "frame-timeout", cfg.FrameTimeout, "a connection whose partial frame is older than this is closed (100ms..1h)")
	fs.IntVar(&cfg.MaxConns, "max-conns", cfg.MaxConns, "open client connections; more are closed at once")
	fs.IntVar(&cfg.MaxOutbound, "max-outbound", cfg.MaxOutbound, "bytes of answers buffered for a connection that does not read before it is closed")
	fs.DurationVar(&cfg.Drain, "drain", cfg.Drain, "on shutdown, how long connections stay open answering E 4 before they close (≤ 4s)")
	fs.IntVar(&cfg.Loops, "loops", cfg.Loops, "event loops (default: number of cores)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "text", "log format: text or json")
	fs.BoolVar(&opt.showVersion, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lockd [flags]\n\nlockd is a lock server with fencing tokens. Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, opt, err
	}
	if opt.admin != "" {
		if _, _, err := net.SplitHostPort(opt.admin); err != nil {
			return cfg, opt, usageError{fmt.Sprintf("--admin %q: %v", opt.admin, err)}
		}
	}
	if fs.NArg() > 0 {
		return cfg, opt, usageError{fmt.Sprintf("unexpected argument %q (lockd takes only flags)", fs.Arg(0))}
	}
	check := []struct {
		name      string
		v, lo, hi int
	}{
		{"--max-key", cfg.MaxKey, 1, proto.MaxKey},
		{"--max-keys", cfg.Table.MaxKeys, 1, 1 << 40},
		{"--max-waiters-per-key", cfg.Table.MaxWaitersPerKey, 1, 1 << 40},
		{"--max-waiters", cfg.Table.MaxWaiters, 1, 1 << 40},
		{"--max-waiters-per-conn", cfg.Table.MaxWaitersPerConn, 1, 1 << 40},
		{"--max-pending-grants", cfg.MaxPendingGrants, 1, 1 << 30},
		{"--max-conns", cfg.MaxConns, 1, 1 << 30},
		{"--max-outbound", cfg.MaxOutbound, 64 << 10, 1 << 40},
		{"--loops", cfg.Loops, 1, 1024},
	}
	for _, c := range check {
		if c.v < c.lo || c.v > c.hi {
			return cfg, opt, usageError{fmt.Sprintf("%s %d: must be %d..%d", c.name, c.v, c.lo, c.hi)}
		}
	}
	if cfg.Drain < time.Millisecond || cfg.Drain > 4*time.Second {
		return cfg, opt, usageError{fmt.Sprintf("--drain %v: must be 1ms..4s", cfg.Drain)}
	}
	if cfg.FrameTimeout < engine.MinFrameTimeout || cfg.FrameTimeout > engine.MaxFrameTimeout {
		return cfg, opt, usageError{fmt.Sprintf("--frame-timeout %v: must be %v..%v", cfg.FrameTimeout, engine.MinFrameTimeout, engine.MaxFrameTimeout)}
	}
	if cfg.DataDir == "" {
		return cfg, opt, usageError{"--data-dir: must not be empty"}
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
	if err := cfg.Validate(); err != nil {
		return cfg, opt, usageError{err.Error()}
	}
	return cfg, opt, nil
}

func versionString() string {
	v := version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	return "lockd " + v + " " + runtime.Version()
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
		fmt.Fprintln(os.Stdout, versionString())
		return 0
	}
	log := cfg.Logger
	var adminLn net.Listener
	if opt.admin != "" {
		adminLn, err = net.Listen("tcp", opt.admin)
		if err != nil {
			log.Error("start failed", "err", fmt.Errorf("--admin %s: %w", opt.admin, err))
			return 1
		}
	}
	srv, err := engine.New(cfg)
	if err != nil {
		log.Error("start failed", "err", err)
		if adminLn != nil {
			adminLn.Close()
		}
		return 1
	}
	if adminLn != nil {
		adminSrv := &http.Server{Handler: admin.Handler(srv, versionString()), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = adminSrv.Serve(adminLn) }()
		log.Info("admin endpoint", "addr", adminLn.Addr().String())
		defer adminSrv.Close()
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve() }()

	select {
	case err := <-serveErr:
		log.Error("start failed", "err", fmt.Errorf("--listen %s: %w", cfg.Listen, err))
		return 1
	case sig := <-sigs:
		log.Info("signal received, shutting down", "signal", sig.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*engine.ShutdownGrace)
	defer cancel()
	go func() {
		// A second signal during shutdown exits at once (no snapshot).
		<-sigs
		log.Error("second signal: exiting without snapshot")
		os.Exit(1)
	}()
	if err := srv.Shutdown(ctx); err != nil {
		log.Error("shutdown failed", "err", err)
		return 1
	}
	<-serveErr
	log.Info("stopped", "uptime", time.Since(start).Round(time.Millisecond).String())
	return 0
}

var start = time.Now()
