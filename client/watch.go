package client

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// EndReason is why a watched grant ended: the reason its L carried
// (PROTOCOL.md §9.4).
type EndReason uint8

// The reasons a grant ends. (The protocol's fourth, "this member can no
// longer tell", is no end: the client watches again where the grant now
// lives.)
const (
	Released EndReason = 1 // released, by any connection
	Expired  EndReason = 2 // its lease ended
	Forced   EndReason = 3 // released by an admin identity or the admin endpoint, or its lease, set by an admin, ended
)

// String returns "released", "expired", "forced", or "reason N".
func (r EndReason) String() string {
	switch r {
	case Released:
		return "released"
	case Expired:
		return "expired"
	case Forced:
		return "forced"
	}
	return "reason " + strconv.Itoa(int(r))
}

// GrantEndedError is how a watched grant ended, as lockd reported it
// (an L). It matches ErrLockLost: it is what a KeepAlive's Err, a held
// lock's Err and WithLock return when the lock's watch reported its end.
type GrantEndedError struct {
	Key    string
	Token  uint64
	Reason EndReason
}

func (e *GrantEndedError) Error() string {
	why := "lockd reports it " + e.Reason.String()
	switch e.Reason {
	case Released:
		why = "lockd reports it released (from another connection, or another holder of its token)"
	case Expired:
		why = "lockd reports that its lease ended"
	case Forced:
		why = "lockd reports it released by an operator (an admin identity or the admin endpoint)"
	}
	return "client: lock lost: the grant of " + strconv.Quote(e.Key) + " (token " + strconv.FormatUint(e.Token, 10) + "): " + why
}

// Is reports whether target is ErrLockLost.
func (e *GrantEndedError) Is(target error) bool { return target == ErrLockLost }

// A Watch follows one grant (a Lock's Key and Token) until it ends
// (PROTOCOL.md §9.4). lockd pushes the end to the connection the watch
// was registered on, so it is known at once: Done is closed then, and
// Err says how.
//
// When the member that registered the watch can no longer tell (it is
// shutting down or stepping down, or was demoted or frozen: an L with
// reason 4), or the connection is lost, the grant may live on where the
// cluster now serves: the Watch registers again there (following M like
// every request), and if lockd then answers that the grant is not held,
// it ended while no one could tell how (Err matches ErrNotHeld).
// Its methods are safe for concurrent use.
type Watch struct {
	w *watcher
}

// Watch registers a watch of l's grant and returns once lockd answered:
// ErrNotHeld if the token is not a current holder of l.Key (released,
// expired, or never issued), ErrWatchLimit (E 8: every connection is at
// the server's bound of watches), ErrUnsupported, ErrPermissionDenied,
// ErrNoConnection, ErrTimeout (no answer within
// Config.TransportTimeout), ctx.Err(), ErrClosed. Anyone allowed the key
// may watch any of its holders. ctx bounds only this first
// registration (its values are kept for the later ones); the watch
// follows the grant until it ends, Stop, or Close.
func (cl *Client) Watch(ctx context.Context, l Lock) (*Watch, error) {
	if !validKey(l.Key) {
		return nil, invalidKey(l.Key)
	}
	if cl.isClosed() {
		return nil, ErrClosed
	}
	w := cl.newWatcher(context.WithoutCancel(ctx), l.Key, l.Token)
	reg, err := w.register(ctx)
	if err != nil {
		w.cancel()
		return nil, err
	}
	if !cl.goBackground(func() { w.run(reg) }) {
		w.cancel()
		return nil, ErrClosed
	}
	return &Watch{w: w}, nil
}

// Done is closed when the watch ends: the grant ended, or the watch
// stopped following it (Err says which).
func (w *Watch) Done() <-chan struct{} { return w.w.done }

// Err is nil until Done is closed; then a *GrantEndedError (matching
// ErrLockLost) with the reason lockd gave — released, expired, forced —
// or ErrNotHeld (a registration after a member could no longer tell, or
// after a lost connection, found the grant gone), ErrWatchLimit,
// ErrUnsupported, ErrPermissionDenied, ErrUnauthenticated, ErrClosed, or
// ErrWatchStopped after Stop.
func (w *Watch) Err() error { return w.w.Err() }

// Reason is the reason lockd gave for the grant's end, 0 while it has
// not ended or when it ended otherwise (see Err).
func (w *Watch) Reason() EndReason {
	var ge *GrantEndedError
	if errors.As(w.w.Err(), &ge) {
		return ge.Reason
	}
	return 0
}

// Stop stops following the grant and returns once the watch has ended
// (Err is ErrWatchStopped unless it had ended before). lockd keeps the
// registration until the grant ends (there is no request to end one);
// the connection absorbs its L then.
func (w *Watch) Stop() {
	w.w.cancel()
	<-w.w.done
}

// watchReg is one registration of a watch on one connection: filed in
// conn.watches when its W answer is read, taken out by its L or the
// connection's end.
type watchReg struct {
	w    *watcher // nil: a stand-in's registration, whose L is dropped
	next *watchReg
	// Set once, under w.mu.
	ended  bool
	reason uint8 // the L's reason; 0 when the connection ended
}

// watcher keeps one grant watched until it ends: it registers a W, and
// registers again whenever a registration lapses without the grant's end
// (an L with reason 4, or its connection lost).
type watcher struct {
	cl     *Client
	key    string
	token  uint64
	ctx    context.Context // the requests'; cancelled to stop
	cancel context.CancelFunc
	// onLapse, if set, is called when a registration lapsed without the
	// grant's end, before the watcher registers again (a KeepAlive
	// renews at once: a renewal confirms or denies).
	onLapse func()
	// limitRetry > 0: when every connection refuses a watch (E 8), try
	// again that much later; 0: the watch ends with ErrWatchLimit.
	limitRetry time.Duration

	kick chan struct{} // cap 1: the registration in force lapsed or ended

	mu   sync.Mutex
	err  error         // why the watch ended, set once before done closes
	done chan struct{} // closed when run returns
}

func (cl *Client) newWatcher(ctx context.Context, key string, token uint64) *watcher {
	w := &watcher{cl: cl, key: key, token: token, kick: make(chan struct{}, 1), done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(ctx)
	return w
}

// Err is why the watch ended, nil while it runs.
func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// lapse records that reg ended (an L's reason, or 0 for a lost
// connection) and wakes the watcher; conn.mu held (the lock order is
// conn.mu, then watcher.mu).
func (w *watcher) lapse(reg *watchReg, reason uint8) {
	w.mu.Lock()
	if !reg.ended {
		reg.ended, reg.reason = true, reason
	}
	w.mu.Unlock()
	signal(w.kick)
}

// register sends one W for the grant, with asking's retries for a
// transport timeout, and returns the registration once lockd answered W.
func (w *watcher) register(ctx context.Context) (*watchReg, error) {
	cl := w.cl
	t := cl.getTicket(ctx, proto.OpWatch, w.key)
	defer cl.putTicket(t)
	t.id = w.token
	reg := &watchReg{w: w}
	t.reg = reg
	if err := t.asking(cl.cfg.TransportTimeout); err != nil {
		return nil, err
	}
	return reg, nil
}

// minRegistration is how long a registration must have lasted for the
// next one to be sent at once when it lapses; one that lapsed sooner is
// followed after Config.RetryPause, so that a member that keeps saying
// it cannot tell is not asked in a tight loop.
const minRegistration = 100 * time.Millisecond

// run follows the grant until it ends, the watcher is stopped (ctx) or
// the client closes; reg is the registration in force, nil if none yet.
func (w *watcher) run(reg *watchReg) {
	defer close(w.done)
	since := time.Now()
	for {
		if reg == nil {
			r, err := w.register(w.ctx)
			if err != nil {
				if !w.retry(err) {
					return
				}
				continue
			}
			reg, since = r, time.Now()
		}
		select {
		case <-w.kick:
		case <-w.ctx.Done():
			w.end(ErrWatchStopped)
			return
		case <-w.cl.closing:
			w.end(ErrClosed)
			return
		}
		w.mu.Lock()
		ended, reason := reg.ended, reg.reason
		w.mu.Unlock()
		if !ended {
			continue // a wake-up left by an earlier registration
		}
		if reason >= uint8(Released) && reason <= uint8(Forced) {
			w.end(&GrantEndedError{Key: w.key, Token: w.token, Reason: EndReason(reason)})
			return
		}
		// The member can no longer tell (4), or the connection ended:
		// the grant may live on where the cluster serves now.
		reg = nil
		if w.onLapse != nil {
			w.onLapse()
		}
		if time.Since(since) < minRegistration && !w.pause(w.cl.cfg.RetryPause) {
			w.end(w.stopped())
			return
		}
	}
}

// retry decides after a registration failed with err: true after a
// pause to try again, false once the watch ended with err.
func (w *watcher) retry(err error) bool {
	var se *ServerError
	var pause time.Duration
	switch {
	case w.ctx.Err() != nil || errors.Is(err, ErrClosed):
		w.end(w.stopped())
		return false
	case errors.Is(err, ErrWatchLimit):
		if w.limitRetry <= 0 {
			w.end(err)
			return false
		}
		pause = w.limitRetry
	case errors.Is(err, ErrNoConnection), errors.Is(err, ErrTimeout),
		errors.As(err, &se) && se.Code == proto.CodeShutdown:
		// Transient: the cluster is between members, or a connection
		// is being redialled.
		pause = w.cl.cfg.RetryPause
	default:
		// ErrNotHeld (the grant is gone), ErrUnsupported,
		// ErrPermissionDenied, ErrUnauthenticated, another E.
		w.end(err)
		return false
	}
	if !w.pause(pause) {
		w.end(w.stopped())
		return false
	}
	return true
}

// stopped is the end of a watch stopped by its ctx or the client's Close.
func (w *watcher) stopped() error {
	if w.cl.isClosed() {
		return ErrClosed
	}
	return ErrWatchStopped
}

// pause waits d; false if the watcher was stopped or the client closed
// first.
func (w *watcher) pause(d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-w.ctx.Done():
		return false
	case <-w.cl.closing:
		return false
	}
}

// end records why the watch ended, once; done closes when run returns.
func (w *watcher) end(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.cancel()
}

// addWatchLocked files the registration of t, a W just answered W, in
// c's watches (a stand-in's gets one of its own, so that its L is
// absorbed and not matched to another).
func (c *conn) addWatchLocked(t *Ticket) {
	reg := t.reg
	if reg == nil {
		reg = &watchReg{}
	}
	reg.next = nil
	if c.watches == nil {
		c.watches = make(map[uint64]*watchReg)
	}
	if head := c.watches[t.id]; head != nil {
		for head.next != nil {
			head = head.next
		}
		head.next = reg
	} else {
		c.watches[t.id] = reg
	}
	c.nwatch++
}

// lostLocked takes an L: it ends the oldest registration of token on c
// (an L answers the W that registered it; several for one grant carry
// the same reason, so the order among them does not matter).
func (c *conn) lostLocked(token uint64, reason uint8) {
	reg := c.watches[token]
	if reg == nil {
		return // no registration: not ours to correlate
	}
	if reg.next != nil {
		c.watches[token] = reg.next
	} else {
		delete(c.watches, token)
	}
	reg.next = nil
	c.nwatch--
	c.watchFull.Store(false)
	if reg.w != nil {
		reg.w.lapse(reg, reason)
	}
}

// dropWatchesLocked ends every registration on c, which is closing: the
// server's end of each ended with the connection.
func (c *conn) dropWatchesLocked() {
	for token, reg := range c.watches {
		for reg != nil {
			nx := reg.next
			reg.next = nil
			if reg.w != nil {
				reg.w.lapse(reg, 0)
			}
			reg = nx
		}
		delete(c.watches, token)
	}
	c.nwatch = 0
}

// watchRoom reports whether a live connection to addr has not refused a
// watch (E 8) since one of its watches last ended.
func (cl *Client) watchRoom(addr string) bool {
	for _, s := range *cl.slots.Load() {
		if s.addr != addr {
			continue
		}
		if c := s.cur.Load(); c != nil && !c.isDead.Load() && !c.watchFull.Load() {
			return true
		}
	}
	return false
}
