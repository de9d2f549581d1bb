package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/shard"
	"github.com/lockd-dev/lockd/store"
)

// ShutdownGrace is how long Shutdown waits for answers to reach clients
// before it closes their connections (PROTOCOL.md §4: within 5 s).
const ShutdownGrace = 5 * time.Second

// tickEvery is how often OnTick runs the table's timers; with the wheel's
// 10 ms resolution a deadline fires at most ~15 ms late.
const tickEvery = 5 * time.Millisecond

// Server is one lockd node serving PROTOCOL.md on TCP.
type Server struct {
	cfg    Config
	log    *slog.Logger
	dir    *store.Dir
	table  *shard.Table
	tokens *shard.Tokens
	epoch  time.Time // the table's clock is time.Since(epoch), monotonic

	eng      gnet.Engine
	addr     atomic.Value // string, set in OnBoot
	ready    chan struct{}
	done     chan struct{} // closed when Serve returns
	serveErr error

	conns    atomic.Int64
	gate     sync.RWMutex // Shutdown's write lock orders "draining" after every in-flight batch
	draining atomic.Bool
	stopped  atomic.Bool // set once the engine is stopping: OnTick does nothing more

	sessMu   sync.Mutex
	sessions map[*session]struct{}

	reserveStop chan struct{}
	reserveDone chan struct{}

	scratch sync.Pool // *scratch

	loops     sync.Map      // gnet.EventLoop → *loopStats
	wait      waitHist      // acquire-to-grant of queued acquires
	cancelled atomic.Uint64 // queued acquires answered E 4 at shutdown

	restored   int
	snapLoaded bool // the snapshot was restored; boot removes it
}

// New opens the data directory, reloads the locks of a graceful shutdown's
// snapshot whose lease has not ended, reserves the first block of tokens and
// returns a server ready to Serve. Serve removes the snapshot once its
// listener is bound, before it accepts a connection: a start that fails
// keeps it for the next.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger,
		epoch:       time.Now(),
		ready:       make(chan struct{}),
		done:        make(chan struct{}),
		sessions:    make(map[*session]struct{}),
		reserveStop: make(chan struct{}),
		reserveDone: make(chan struct{}),
	}
	s.scratch.New = func() any { return new(scratch) }
	dir, err := store.Open(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	s.dir = dir
	if err := s.load(); err != nil {
		dir.Close()
		return nil, err
	}
	go s.reserver()
	return s, nil
}

// load computes the first token, reserves a block and restores the snapshot.
func (s *Server) load() error {
	mark, err := s.dir.Mark()
	if err != nil {
		return err
	}
	snap, ok, err := s.dir.ReadSnapshot()
	if errors.Is(err, store.ErrCorrupt) {
		s.log.Error("snapshot corrupt: moved aside, its locks are lost (tokens are not)", "err", err)
	} else if err != nil {
		return err
	}
	start := mark
	if ok && snap.Mark > start {
		start = snap.Mark
	}
	// Never below the wall clock (PROTOCOL.md §5 asks for microseconds;
	// lockd uses nanoseconds, which are larger): a lost data dir cannot make
	// tokens go back, since tokens grow by one per grant and the clock by a
	// billion a second. A reserved block running ahead of the clock after a
	// crash cannot either: a block (4M) is a few milliseconds of clock.
	if wall := uint64(time.Now().UnixNano()); wall > start {
		start = wall
	}
	limit := start + s.cfg.TokenBlock
	if err := s.dir.Reserve(limit); err != nil {
		return fmt.Errorf("reserving tokens in %s: %w", s.dir.Path(), err)
	}
	s.tokens = shard.NewTokens(start, limit)
	tcfg := s.cfg.Table
	s.table, err = shard.New(tcfg, s.tokens)
	if err != nil {
		return err
	}
	if ok {
		wallNow, mono := time.Now(), s.now()
		for _, l := range snap.Locks {
			left := l.Deadline.Sub(wallNow)
			if left <= 0 {
				continue
			}
			if err := s.table.Restore(l.Key, l.Token, mono+int64(left)); err != nil {
				return fmt.Errorf("restoring snapshot: %w", err)
			}
			s.restored++
		}
		s.log.Info("snapshot reloaded", "locks", s.restored, "expired", len(snap.Locks)-s.restored, "mark", snap.Mark)
		s.snapLoaded = true
	}
	s.log.Info("tokens", "start", start, "reserved", limit)
	return nil
}

// reserver extends the token reservation ahead of use.
func (s *Server) reserver() {
	defer close(s.reserveDone)
	for {
		select {
		case <-s.reserveStop:
			return
		case <-s.tokens.Want():
			limit := s.tokens.Limit() + s.cfg.TokenBlock
			for {
				err := s.dir.Reserve(limit)
				if err == nil {
					break
				}
				s.log.Error("reserving tokens failed; grants wait until it succeeds", "err", err)
				select {
				case <-s.reserveStop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
			s.tokens.Extend(limit)
		}
	}
}

// now is the table's clock: monotonic nanoseconds since the server was made.
func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// Now returns the table's clock (monotonic ns), for comparing with lease
// deadlines from Table().Lookup.
func (s *Server) Now() int64 { return s.now() }

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
// a clean shutdown.
func (s *Server) Serve() error {
	defer close(s.done)
	h := &handler{s: s}
	err := gnet.Run(h, "tcp://"+s.cfg.Listen,
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.cfg.Loops),
		gnet.WithTicker(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReuseAddr(true),
		gnet.WithLogger(gnetLogger{s.log}),
	)
	if err == nil && s.serveErr != nil {
		err = s.serveErr // boot refused to serve
	}
	if err != nil {
		s.serveErr = err
		select {
		case <-s.ready:
		default:
			// Never started: release the data directory for the caller.
			s.stopReserver()
			s.dir.Close()
		}
	}
	return err
}

// Done is closed when Serve has returned.
func (s *Server) Done() <-chan struct{} { return s.done }

// boot runs once the listener is bound, before any connection is
// accepted: it consumes the snapshot (a start that failed earlier — the
// address taken, the table too small for it — has kept it for the next
// one; from here on it would be stale) and records the listener's real
// address. false means the server must not serve (serveErr says why).
func (s *Server) boot(eng gnet.Engine) bool {
	if s.snapLoaded {
		if err := s.dir.RemoveSnapshot(); err != nil {
			s.serveErr = fmt.Errorf("removing the snapshot it reloaded from %s: %w", s.dir.Path(), err)
			return false
		}
		s.snapLoaded = false
	}
	s.eng = eng
	addr := s.cfg.Listen
	if fd, err := eng.Dup(); err == nil {
		if sa, err := unix.Getsockname(fd); err == nil {
			switch a := sa.(type) {
			case *unix.SockaddrInet4:
				addr = net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
			case *unix.SockaddrInet6:
				addr = net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
			}
		}
		unix.Close(fd)
	}
	s.addr.Store(addr)
	s.log.Info("ready", "addr", addr, "loops", s.cfg.Loops)
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
// queued acquire with E 4, answer new A/R/K with E 4 (P still pongs), flush
// and close every connection within ShutdownGrace, then write the held
// locks and the token mark to the data directory. Serve returns once the
// engine has stopped. ctx bounds the whole sequence.
func (s *Server) Shutdown(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-s.done:
		return s.serveErr
	}
	if !s.draining.CompareAndSwap(false, true) {
		<-s.done
		return nil
	}
	// Wait for every batch that may have read draining == false.
	s.gate.Lock()
	//lint:ignore SA2001 the empty critical section is the barrier: every batch holds gate.RLock
	s.gate.Unlock()
	s.log.Info("shutting down: answering queued acquires with E 4")

	sc := s.getScratch()
	s.table.CancelWaiters(&sc.fx)
	s.deliver(sc, nil, s.now())
	s.putScratch(sc)

	// Keep connections open for the drain window (new A/R/K get E 4, P
	// still pongs) or until every client has left, with every answer
	// flushed.
	s.drain(ctx)

	// Stop the engine: every loop closes its connections (OnClose releases
	// grants that never reached their socket).
	s.stopped.Store(true)
	if err := s.eng.Stop(ctx); err != nil {
		return err
	}
	<-s.done
	return s.finish()
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
		case <-tick.C:
		}
	}
}

// finish writes the snapshot and releases the data directory.
func (s *Server) finish() error {
	s.stopReserver()
	wallNow, mono := time.Now(), s.now()
	var snap store.Snapshot
	s.table.Held(func(key []byte, token uint64, deadline int64) {
		if deadline <= mono {
			return
		}
		snap.Locks = append(snap.Locks, store.Lock{
			Key:      append([]byte(nil), key...),
			Token:    token,
			Deadline: wallNow.Add(time.Duration(deadline - mono)),
		})
	})
	snap.Mark = s.tokens.Last()
	err := s.dir.WriteSnapshot(snap)
	if err == nil {
		s.log.Info("snapshot written", "locks", len(snap.Locks), "mark", snap.Mark)
	}
	return errors.Join(err, s.dir.Close())
}

func (s *Server) stopReserver() {
	select {
	case <-s.reserveStop:
	default:
		close(s.reserveStop)
	}
	<-s.reserveDone
}

// Close stops the server without the shutdown sequence's answers or
// snapshot (a crash without the process exit, for tests).
func (s *Server) Close() error {
	select {
	case <-s.ready:
	case <-s.done:
		return nil
	}
	s.draining.Store(true)
	s.stopped.Store(true)
	err := s.eng.Stop(context.Background())
	<-s.done
	s.stopReserver()
	return errors.Join(err, s.dir.Close())
}

// gnetLogger sends gnet's logs to slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }
