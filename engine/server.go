package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/shard"
)

// ShutdownGrace is how long Shutdown waits for answers to reach clients
// before it closes their connections (PROTOCOL.md §4: within 5 s).
const ShutdownGrace = 5 * time.Second

// tickEvery is how often OnTick runs the table's timers; with the wheel's
// 10 ms resolution a deadline fires at most ~15 ms late.
const tickEvery = 5 * time.Millisecond

// Server is one lockd node serving PROTOCOL.md on TCP.
type Server struct {
	cfg   Config
	log   *slog.Logger
	node  repl.Node
	table *shard.Table
	epoch time.Time // the table's clock is time.Since(epoch), monotonic

	cli       *gnet.Client  // the event loops (connections are enrolled, see Serve)
	lnMu      sync.Mutex    // guards ln
	ln        net.Listener  // the client listener, set once serving
	stop      chan struct{} // closed when the loops are being stopped
	loopsDone chan struct{} // closed once they have stopped
	stopOnce  sync.Once
	addr      atomic.Value // string, set by boot
	ready     chan struct{}
	done      chan struct{} // closed when Serve returns
	serveErr  error

	conns atomic.Int64
	h     *handler // set by Serve before the loops start

	// The in-process connections (local.go).
	localMu    sync.Mutex
	localSet   map[*localWire]struct{} // guarded by localMu
	localStop  bool                    // guarded by localMu: no new local connection
	localWG    sync.WaitGroup          // one per local connection's driver
	localConns atomic.Int64
	localStats *loopStats // the counters of every local connection's batches

	// The TLS port (tlsconn.go): nil when plaintext.
	tlsConf       *tls.Config
	tlsStats      *loopStats // the counters of every TLS connection's batches
	tlsMu         sync.Mutex
	tlsSet        map[*tlsConn]struct{} // guarded by tlsMu
	tlsStop       bool                  // guarded by tlsMu: no new TLS connection
	tlsWG         sync.WaitGroup        // one per TLS connection's reader
	tlsHandshakes atomic.Uint64
	tlsFailures   atomic.Uint64

	// barrier is held for reading by every batch while it applies requests
	// under the gate and the draining flag it read; its write lock waits
	// for those batches (Shutdown, GateChanged).
	barrier  sync.RWMutex
	draining atomic.Bool
	stopped  atomic.Bool // set once the engine is stopping: OnTick does nothing more

	// ops.go: Hurry cuts the drain short; lastTick is OnTick's last run
	// (the table's clock), for Live.
	hurry     chan struct{}
	hurryOnce sync.Once
	lastTick  atomic.Int64

	sessMu   sync.Mutex
	sessions map[*session]struct{}

	scratch sync.Pool // *scratch

	loops     sync.Map      // gnet.EventLoop → *loopStats
	wait      waitHist      // acquire-to-grant of queued acquires
	cancelled atomic.Uint64 // queued acquires answered E 4 at shutdown
	moved     atomic.Uint64 // queued acquires answered M when the gate closed
	// lostL counts the L frames handed to their connection (written, or
	// posted to its mailbox), by reason.
	lostL [shard.ReasonCannotTell + 1]atomic.Uint64

	// The ACL in force (auth.go): nil without Config.ACL. aclMu orders
	// reloads.
	acl   atomic.Pointer[aclState]
	aclMu sync.Mutex
	auth  authStats

	adminReleases atomic.Uint64 // AdminRelease calls that released a grant

	// Answers waiting for a commit (commit.go); committer is nil when the
	// node answers at once.
	committer  repl.Committer
	heldMu     sync.Mutex
	heldSet    map[*session]struct{} // sessions holding answers
	committed  uint64                // guarded by heldMu
	committedA atomic.Uint64         // committed, for the fast path
	abandons   uint64                // guarded by heldMu: Abandon calls so far
	abandonsA  atomic.Uint64         // abandons, for stamping answers without the lock
	lost       [lostKept]uint64      // guarded by heldMu: lost[k % lostKept] is the seq of Abandon number k
	wakeMu     sync.Mutex            // Committed's wakes, one call at a time
	wakeList   []*session            // guarded by wakeMu: reused by Committed
}

// ErrStopped is Serve's error when the engine stopped while no Shutdown
// was asked for (the listener failed for good: accept errors that come
// and go only back off): the node has written what a shutdown writes, and
// the process should exit.
var ErrStopped = errors.New("engine: the listener failed; stopped without a shutdown")

// New builds the server's node (Config.Node, or a single node on
// Config.DataDir), which reloads what it keeps — for a single node, the
// locks of a graceful shutdown's snapshot whose lease has not ended — and
// reserves the first block of tokens. Serve consumes the snapshot once its
// listener is bound, before it accepts a connection: a start that fails
// keeps it for the next.
func New(cfg Config) (*Server, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Node == nil {
		cfg.Node = repl.NewLocal(repl.LocalConfig{DataDir: cfg.DataDir, TokenBlock: cfg.TokenBlock})
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		node:       cfg.Node,
		epoch:      time.Now(),
		ready:      make(chan struct{}),
		done:       make(chan struct{}),
		stop:       make(chan struct{}),
		loopsDone:  make(chan struct{}),
		hurry:      make(chan struct{}),
		sessions:   make(map[*session]struct{}),
		heldSet:    make(map[*session]struct{}),
		localSet:   make(map[*localWire]struct{}),
		localStats: new(loopStats),
	}
	s.loops.Store(localStatsKey{}, s.localStats)
	s.committer, _ = cfg.Node.(repl.Committer)
	if cfg.TLS != nil {
		s.tlsConf = serverTLS(cfg.TLS)
		s.tlsSet = make(map[*tlsConn]struct{})
		s.tlsStats = new(loopStats)
		s.loops.Store(tlsStatsKey{}, s.tlsStats)
	}
	s.scratch.New = func() any { return new(scratch) }
	table, err := s.node.Open(cfg.Table, s.now, s.log)
	if err != nil {
		return nil, err
	}
	s.table = table
	if cfg.ACL != nil {
		s.acl.Store(s.newACLState(cfg.ACL))
	}
	return s, nil
}

// now is the table's clock: monotonic nanoseconds since the server was made.
func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// Now returns the table's clock (monotonic ns), for comparing with lease
// deadlines from Table().Lookup.
func (s *Server) Now() int64 { return s.now() }

// Logger returns the server's logger (for the admin endpoint's lines).
func (s *Server) Logger() *slog.Logger { return s.log }

// Config returns the server's validated configuration.
func (s *Server) Config() Config { return s.cfg }

// Table returns the server's lock table (for tests and the admin endpoint).
func (s *Server) Table() *shard.Table { return s.table }

// Ready is closed once the listener accepts connections.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr returns the address the server listens on, once Ready.
func (s *Server) Addr() string {
	a, _ := s.addr.Load().(string)
	return a
}

// Serve runs the event loops until Shutdown completes. It returns nil after
// a clean shutdown; ErrStopped (joined with the cause) when serving ended
// on its own, after the node has written what a shutdown writes.
//
// lockd accepts connections itself, on a net.Listener, and enrolls them in
// gnet's event loops (a gnet Client's loops: the same reactor, without
// gnet's acceptor). gnet's own acceptor tears its whole engine down when
// accept fails (EMFILE), so a flood of connections could end the daemon;
// this loop instead backs off and goes on, refuses a connection beyond
// --max-conns by closing it at once (so descriptors never pile up), and is
// simply closed at shutdown: lockd then really stops accepting.
func (s *Server) Serve() error {
	defer close(s.done)
	h := &handler{s: s}
	s.h = h
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		s.serveErr = err
		_ = s.closeNode(repl.FailedStart)
		return err
	}
	cli, err := gnet.NewClient(h,
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.cfg.Loops),
		gnet.WithTicker(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(gnetLogger{s.log}),
	)
	if err == nil {
		err = cli.Start() // OnBoot, then the loops
	}
	if err == nil {
		// Set before boot closes ready: Close and Shutdown wait for ready
		// and then stop these.
		s.cli = cli
		s.lnMu.Lock()
		s.ln = ln
		s.lnMu.Unlock()
		if !s.boot(ln.Addr().String()) {
			err = s.serveErr
			s.cli = nil
			_ = cli.Stop()
		}
	}
	if err != nil {
		ln.Close()
		s.serveErr = err
		_ = s.closeNode(repl.FailedStart)
		return err
	}
	acceptErr := make(chan error, 1)
	go func() { acceptErr <- s.accept(ln, h) }()
	select {
	case <-s.stop:
		// Shutdown or Close stops the loops.
		<-s.loopsDone
		return s.serveErr
	case err = <-acceptErr:
	}
	if s.stopped.Load() || s.draining.Load() {
		// Shutdown closed the listener first; it stops the loops after the
		// drain.
		<-s.loopsDone
		return s.serveErr
	}
	// The listener failed for good while nobody asked to stop: keep what a
	// shutdown keeps.
	s.serveErr = errors.Join(ErrStopped, err)
	s.log.Error("cannot accept connections any more; writing the snapshot", "err", err)
	s.stopped.Store(true)
	s.stopLoops()
	_ = s.closeNode(repl.Crashed)
	return s.serveErr
}

// accept takes connections until the listener is closed, and enrolls them
// in the event loops. Errors that come and go (EMFILE, ENFILE, ENOBUFS)
// back off for up to a second and go on.
func (s *Server) accept(ln net.Listener, h *handler) error {
	backoff := 5 * time.Millisecond
	var (
		failures int                                        // failed accepts (EMFILE, …) since start
		logs     = ratelog.Limiter{Every: 10 * time.Second} // a line about them per 10 s
	)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			failures++
			if _, ok := logs.Allow(s.now()); ok {
				s.log.Error("accepting a connection failed; retrying", "err", err, "failures", failures)
			}
			select {
			case <-time.After(backoff):
			case <-s.stop:
				return net.ErrClosed
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		if s.draining.Load() || s.conns.Load() >= int64(s.cfg.MaxConns) {
			c.Close()
			if !s.draining.Load() {
				h.connRefused(s.now())
			}
			continue
		}
		if s.tlsConf != nil {
			// A TLS connection runs on goroutines of its own (tlsconn.go);
			// it counts under --max-conns from here, handshake included.
			s.conns.Add(1)
			if !s.startTLS(c, h) {
				s.conns.Add(-1)
				c.Close()
			}
			continue
		}
		if _, err := s.cli.Enroll(c); err != nil {
			c.Close()
			if s.stopped.Load() {
				return net.ErrClosed
			}
			s.log.Warn("handing a connection to the event loops failed", "err", err)
		}
	}
}

// stopListening closes the listener: no connection is accepted any more.
func (s *Server) stopListening() {
	s.lnMu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	s.lnMu.Unlock()
}

// stopLoops stops the event loops once: each closes its connections
// (OnClose releases grants that never reached their socket).
func (s *Server) stopLoops() {
	s.stopOnce.Do(func() {
		s.stopListening()
		close(s.stop)
		if s.tlsConf != nil {
			s.stopTLS()
		}
		s.stopLocal()
		if s.cli != nil {
			if err := s.cli.Stop(); err != nil {
				s.log.Warn("stopping the event loops", "err", err)
			}
		}
		close(s.loopsDone)
	})
}

// closeNode closes the node within ShutdownGrace.
func (s *Server) closeNode(why repl.CloseReason) error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	return s.node.Close(ctx, why)
}

// Done is closed when Serve has returned.
func (s *Server) Done() <-chan struct{} { return s.done }

// boot runs once the listener is bound, before any connection is
// accepted: the node starts (a single node consumes the snapshot: a start
// that failed earlier — the address taken, the table too small for it —
// has kept it for the next one; from here on it would be stale), and the
// listener's real address is recorded. false means the server must not
// serve (serveErr says why).
func (s *Server) boot(addr string) bool {
	s.addr.Store(addr)
	if err := s.node.Start(addr, s); err != nil {
		s.serveErr = err
		return false
	}
	s.log.Info("ready", "addr", addr, "loops", s.cfg.Loops, "tls", s.tlsConf != nil)
	s.lastTick.Store(s.now()) // Live counts the ticker's silence from here
	close(s.ready)
	return true
}

func (s *Server) addSession(ss *session) {
	s.sessMu.Lock()
	s.sessions[ss] = struct{}{}
	s.sessMu.Unlock()
}

func (s *Server) removeSession(ss *session) {
	s.sessMu.Lock()
	delete(s.sessions, ss)
	s.sessMu.Unlock()
}

func (s *Server) snapshotSessions() []*session {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	list := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		list = append(list, ss)
	}
	return list
}

// Shutdown runs PROTOCOL.md §4's shutdown: stop accepting, answer every
// queued acquire with E 4 and end every watch with an L of reason 4 (§9.6),
// answer new requests with E 4 (P still pongs), flush
// and close every connection within ShutdownGrace, then let the node write
// what must survive (a single node: the held locks and the token mark).
// A cluster node first hands its work to a live successor (Node.Stop);
// then queued and new requests are answered M naming it, never E 4
// (PROTOCOL.md §6.2). Serve returns once the engine has stopped. ctx bounds
// the whole sequence: Shutdown returns by its deadline whatever the disk
// or the node does.
func (s *Server) Shutdown(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-s.done:
		return s.serveErr
	}
	if s.draining.Load() {
		<-s.done
		return nil
	}
	successor := s.node.Stop(ctx)
	if !s.draining.CompareAndSwap(false, true) {
		<-s.done
		return nil
	}
	s.stopListening() // PROTOCOL.md §4: stop accepting connections
	// Wait for every batch that may have read draining == false.
	if err := s.wait4Batches(ctx); err != nil {
		return err
	}
	sc := s.getScratch()
	if successor == "" {
		s.log.Info("shutting down: answering queued acquires with E 4")
		s.table.CancelWaiters(&sc.fx)
	} else {
		s.log.Info("shutting down: handed over, answering with M", "successor", successor)
	}
	// Every watch gets its L 4 before its connection closes (PROTOCOL.md
	// §9.6): from here on this node tells nothing more of its grants. A
	// node that handed over ended them when its gate left Serve; the
	// drain below writes them with the other answers.
	s.table.EndWatches(&sc.fx)
	s.deliver(sc, nil, s.now())
	s.putScratch(sc)

	// Keep connections open for the drain window (new A/R/K get E 4, P
	// still pongs) or until every client has left, with every answer
	// flushed.
	s.drain(ctx)

	// Stop the loops: every loop closes its connections (OnClose releases
	// grants that never reached their socket).
	s.stopped.Store(true)
	stopped := make(chan struct{})
	go func() { s.stopLoops(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		_ = s.node.Close(ctx, repl.Shutdown)
		return ctx.Err()
	}
	<-s.done
	return s.node.Close(ctx, repl.Shutdown)
}

// wait4Batches takes and drops barrier's write lock: once it returns, no
// batch that read the old gate or draining flag is still running. It gives
// up at ctx's end.
func (s *Server) wait4Batches(ctx context.Context) error {
	locked := make(chan struct{})
	go func() {
		s.barrier.Lock()
		close(locked)
	}()
	select {
	case <-locked:
		s.barrier.Unlock()
		return nil
	case <-ctx.Done():
		go func() { <-locked; s.barrier.Unlock() }()
		return fmt.Errorf("engine: waiting for running batches: %w", ctx.Err())
	}
}

// GateChanged applies the node's current gate (repl.Host): once no batch
// that read the old gate is running, a gate that redirects answers every
// queued acquire with M and ends every watch with an L of reason 4 (this
// node can no longer tell: a step-down, a demotion, a planned handover, a
// raft leader that lost its leadership; PROTOCOL.md §9.4), and a gate
// that holds keeps both (a pause: the node will serve again, or redirect,
// and nothing changes its table meanwhile — docs/DESIGN.md "Watches and
// the gate"); then every connection is woken so that what it left unread
// is read under the new gate.
func (s *Server) GateChanged() {
	_ = s.wait4Batches(context.Background())
	g := s.node.Gate()
	s.log.Info("gate", "state", g.State.String(), "active", g.Addr)
	if g.State == repl.Redirect {
		sc := s.getScratch()
		s.table.MoveWaiters(&sc.fx)
		s.table.EndWatches(&sc.fx)
		s.deliver(sc, nil, s.now())
		s.putScratch(sc)
	}
	for _, ss := range s.snapshotSessions() {
		_ = ss.c.Wake(nil)
	}
}

// drain waits until every session's answers are written and either the
// drain window has passed or no client is left, or until ShutdownGrace less
// a second (for the engine's stop) has passed. Sessions with something left
// are woken, so their batch writes their mail and reports what gnet still
// buffers.
func (s *Server) drain(ctx context.Context) {
	began := time.Now()
	grace, cancel := context.WithTimeout(ctx, ShutdownGrace-time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		sessions := s.snapshotSessions()
		pending := 0
		for _, ss := range sessions {
			if ss.backlog.Load() != 0 || ss.hasMail() {
				pending++
				_ = ss.c.Wake(nil)
			}
		}
		if pending == 0 && (len(sessions) == 0 || time.Since(began) >= s.cfg.Drain) {
			return
		}
		select {
		case <-grace.Done():
			s.log.Warn("shutdown grace over", "unflushed", pending)
			return
		case <-s.hurry:
			s.log.Warn("drain cut short (Hurry): closing the connections now", "unflushed", pending, "clients", len(sessions))
			return
		case <-tick.C:
		}
	}
}

// Close stops the server without the shutdown sequence's answers or the
// node's snapshot (a crash without the process exit, for tests).
func (s *Server) Close() error {
	select {
	case <-s.ready:
	case <-s.done:
		return nil
	}
	s.draining.Store(true)
	s.stopped.Store(true)
	s.stopLoops()
	<-s.done
	return s.closeNode(repl.Discard)
}

// tlsStatsKey is the TLS connections' entry in Server.loops.
type tlsStatsKey struct{}

// serverTLS is the client port's configuration made from the caller's:
// at least TLS 1.2, and dynamic record sizing off (each Write of at most
// tlsRecord bytes then makes one record: the delivery tracking relies on
// it), also in what GetConfigForClient returns (cloned per handshake
// unless it is so already).
func serverTLS(c *tls.Config) *tls.Config {
	fix := func(c *tls.Config) *tls.Config {
		if c.MinVersion >= tls.VersionTLS12 && c.DynamicRecordSizingDisabled {
			return c
		}
		c = c.Clone()
		c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
		c.DynamicRecordSizingDisabled = true
		return c
	}
	out := c.Clone()
	out.MinVersion = max(out.MinVersion, tls.VersionTLS12)
	out.DynamicRecordSizingDisabled = true
	if get := c.GetConfigForClient; get != nil {
		out.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hi)
			if err != nil || cc == nil {
				return cc, err
			}
			return fix(cc), nil
		}
	}
	return out
}

// gnetLogger sends gnet's logs to slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }
