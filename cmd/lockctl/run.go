package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
)

// killLead is how much earlier than --margin before the lease's end the
// SIGKILL goes out: delivering it and the group's dying take a few ms, and
// --margin is promised for the group dead, not for the signal sent.
const killLead = 100 * time.Millisecond

// run's defaults, from which its help derives the lease arithmetic.
const (
	defaultRunWait   = 10 * time.Second
	defaultRunLease  = 30 * time.Second
	defaultRunMargin = 2 * time.Second
	defaultRunGrace  = 5 * time.Second
)

// runOpts are run's settings.
type runOpts struct {
	key          string
	argv         []string
	shared       int // > 0: a shared lock with this limit (--shared N)
	wait, lease  time.Duration
	margin       time.Duration // the command is dead this long before the lease can end
	grace        time.Duration // SIGTERM → SIGKILL
	renewEvery   time.Duration
	retryRenewIn time.Duration // pause before a failed renewal is retried
}

// stopLead is how long before the lease's conservative end run sends
// SIGTERM when renewals fail: the group is then dead --margin before the
// lease can end.
func stopLead(margin, grace time.Duration) time.Duration { return margin + grace + killLead }

// renewInterval is the renewal interval run uses: every, or a third of
// what is left of the lease once stopLead is set aside, so that two
// intervals of failing renewals still leave one before the stop time.
func renewInterval(lease, margin, grace, every time.Duration) time.Duration {
	if every == 0 {
		return (lease - stopLead(margin, grace)) / 3
	}
	return every
}

// maxRenewRetry bounds the pause between failed renewals and between
// redials: a lockd coming back from a restart is found within it.
const maxRenewRetry = 250 * time.Millisecond

// renewRetry is the pause before a failed renewal is tried again, and
// the client's redial interval: an eighth of the renewal interval, at most
// maxRenewRetry.
func renewRetry(every time.Duration) time.Duration { return min(every/8, maxRenewRetry) }

// leaseFits is run's rule: when renewals fail, the command gets SIGTERM
// stopLead before the lease's conservative end; at least one renewal
// interval must come before that.
func leaseFits(lease, margin, grace, every time.Duration) bool {
	every = renewInterval(lease, margin, grace, every)
	return every > 0 && stopLead(margin, grace)+every < lease
}

// rideOut is the longest outage of lockd (a restart, its drain included)
// that run survives wherever it falls between renewals: the renewal due
// when it starts fails, and a later one must land before the stop time,
// which leaves the lease less stopLead, one renewal interval, and two
// retry pauses (one to redial, one for the next attempt).
func rideOut(lease, margin, grace, every time.Duration) time.Duration {
	every = renewInterval(lease, margin, grace, every)
	return lease - stopLead(margin, grace) - every - 2*renewRetry(every)
}

// minRunLease is the shortest whole-second lease leaseFits accepts, 0 if
// none up to 255 s.
func minRunLease(margin, grace, every time.Duration) time.Duration {
	for l := time.Second; l <= 255*time.Second; l += time.Second {
		if leaseFits(l, margin, grace, every) {
			return l
		}
	}
	return 0
}

// runLong is run's help, its numbers derived from the flags' defaults.
func runLong() string {
	m, g := defaultRunMargin, defaultRunGrace
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf(`run takes the lock on KEY (waiting up to --wait), starts CMD in its own
process group with LOCKD_KEY and LOCKD_TOKEN (the fencing token) in its
environment, and renews the lease while CMD runs. When CMD exits, anything it
left in its process group is stopped, the lock is released, and lockctl exits
with CMD's exit code. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to the
group; sent while run still waits for the lock, they end the wait (exit
128 + the signal) and CMD never starts.

With --shared N, run takes one of N shared grants of KEY instead of the lock
alone (PROTOCOL.md §9.2): at most N copies of CMD run at once, across every
machine that runs them with the same KEY and N (a run with another N while
the key is held exits 17). Each copy gets its own LOCKD_TOKEN.

If the lock is lost — lockd reports it released from elsewhere, expired or
forced (run watches it, so it knows at once), a renewal answered "not held",
or refused for the identity, or renewals failing so long that the lease
could end — run stops the whole group (grandchildren included): SIGTERM,
then SIGKILL after --grace, timed so that the group is dead --margin before
the lease can end on the server; then it exits 14.

Lease arithmetic. When renewals fail, SIGTERM goes out --margin + --grace +
%v before the lease's conservative end (the stop time), so that the group
is dead --margin before the lease can end. The lease is renewed every
--renew-every, by default a third of what is left of the lease once that
is set aside: (lease - margin - grace - %v)/3. A renewal waits about half
the interval for its answer; one that fails is reported on stderr
("renewing KEY failed: ...; retrying") and tried again after an eighth of
the interval (at most %v), on connections redialled as often. At least one
renewal must fit before the stop time:

    --lease > --margin + --grace + %v + the renewal interval

With the defaults (--margin %v, --grace %v) the shortest --lease is %v
(leases are whole seconds). An outage of lockd (a planned restart, its
--drain included) is ridden out wherever it falls between renewals when it
is shorter than the lease less the stop time's lead, one renewal interval
and two retry pauses:

    --lease %v (the default): renewals every %v, outages up to %v
    --lease 15s:              renewals every %v, outages up to %v

A command whose renewals keep failing gets SIGTERM %v before the lease
could end. A shorter lease needs a smaller --margin, --grace or
--renew-every.`,
		killLead, killLead, maxRenewRetry, killLead, m, g, minRunLease(m, g, 0),
		defaultRunLease, ms(renewInterval(defaultRunLease, m, g, 0)), ms(rideOut(defaultRunLease, m, g, 0)),
		ms(renewInterval(15*time.Second, m, g, 0)), ms(rideOut(15*time.Second, m, g, 0)), stopLead(m, g))
}

func (a *app) runCmd() *cobra.Command {
	var o runOpts
	cmd := &cobra.Command{
		Use:   "run KEY [flags] -- CMD [ARGS...]",
		Short: "run a command while holding a lock",
		Long:  runLong(),
		Example: `  lockctl run nightly-report --wait 10s --lease 30s -- ./report.sh
  lockctl run exports/slots --shared 4 --wait 5m -- ./export.sh                     # at most 4 at once, fleet-wide
  lockctl run jobs/import --wait 0 -- sh -c 'import --fence-token "$LOCKD_TOKEN"'   # skip if held (exit 10)
  lockctl run billing/close --lease 8s -- ./close-books                              # the shortest lease with the defaults`,
		DisableFlagsInUseLine: true,
	}
	f := cmd.Flags()
	f.DurationVar(&o.wait, "wait", defaultRunWait, "how long to wait for the lock, 0..255s")
	f.DurationVar(&o.lease, "lease", defaultRunLease, "lease, renewed in the background while the command runs, 1s..255s (see Lease arithmetic)")
	f.DurationVar(&o.margin, "margin", defaultRunMargin, "safety margin: when renewals fail, the command is dead this long before the lease can end")
	f.DurationVar(&o.grace, "grace", defaultRunGrace, "time between SIGTERM and SIGKILL when the lock is lost")
	f.DurationVar(&o.renewEvery, "renew-every", 0, "renewal interval (default: a third of the lease less --margin, --grace and 100ms; see Lease arithmetic)")
	f.IntVar(&o.shared, "shared", 0, "take one of N shared grants (1..65535): at most N copies of the command at once, fleet-wide (0: the lock alone)")
	out := a.outputFlag(cmd)
	cmd.Flags().Lookup("output").Usage = "format of run's own messages on stderr: text or json (the command's output is its own)"
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(cmd *cobra.Command, args []string) error {
		if err := a.checkOutput(out); err != nil {
			return err
		}
		dash := cmd.ArgsLenAtDash()
		if dash < 0 {
			return usageErr("run needs -- before the command: lockctl %s", cmd.Use)
		}
		pos, argv := args[:dash], args[dash:]
		if len(pos) != 1 {
			return usageErr("run takes one KEY before --")
		}
		if len(argv) == 0 {
			return usageErr("run needs a command after --")
		}
		o.key, o.argv = pos[0], argv
		if err := c.finish(); err != nil {
			return err
		}
		if err := checkWaitLease(&o.wait, &o.lease); err != nil {
			return err
		}
		if o.shared < 0 || o.shared > client.MaxSharedLimit {
			return usageErr("--shared %d: must be 1..%d (0: the lock alone)", o.shared, client.MaxSharedLimit)
		}
		o.lease = (o.lease + time.Second - 1) / time.Second * time.Second // what the server will use
		if o.margin < 0 || o.grace < 0 {
			return usageErr("--margin and --grace must not be negative")
		}
		if !leaseFits(o.lease, o.margin, o.grace, o.renewEvery) {
			msg := fmt.Sprintf("--lease %v must exceed --margin %v + --grace %v + %v + the renewal interval", o.lease, o.margin, o.grace, killLead)
			if o.renewEvery > 0 {
				msg += fmt.Sprintf(" %v", o.renewEvery)
			}
			if ml := minRunLease(o.margin, o.grace, o.renewEvery); ml > 0 {
				msg += fmt.Sprintf("; with these, the shortest lease is %v", ml)
			}
			return usageError(msg + " (lockctl run --help: Lease arithmetic)")
		}
		o.renewEvery = renewInterval(o.lease, o.margin, o.grace, o.renewEvery)
		o.retryRenewIn = renewRetry(o.renewEvery)
		// Connections that drop (a lockd restarting) are redialled as
		// often as failed renewals are retried, so that the renewal after
		// a restart is not held up by the default 3 s redial pause.
		c.redial = o.retryRenewIn
		ctx, cancel := c.context()
		cl, err := c.client(ctx)
		cancel()
		if err != nil {
			return err
		}
		defer cl.Close()
		return a.runLocked(cl, c, &o)
	})
	return cmd
}

// runLocked takes the lock, runs the command and guards it.
func (a *app) runLocked(cl *client.Client, c *conn, o *runOpts) error {
	// Forward these to the command's process group rather than dying.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)

	// A signal while waiting for the lock ends the wait: there is no
	// command to forward it to yet.
	actx, acancel := context.WithCancel(context.Background())
	defer acancel()
	type acquired struct {
		l   client.Lock
		err error
	}
	got := make(chan acquired, 1)
	go func() {
		opts := client.AcquireOptions{Wait: o.wait, Lease: o.lease}
		var l client.Lock
		var err error
		if o.shared > 0 {
			l, err = cl.AcquireShared(actx, o.key, o.shared, opts)
		} else {
			l, err = cl.Acquire(actx, o.key, opts)
		}
		got <- acquired{l, err}
	}()
	var intr os.Signal
	var r acquired
	select {
	case r = <-got:
	case intr = <-sigs:
		acancel()
		r = <-got
	}
	l, err := r.l, r.err
	release := func() {
		ctx, cancel := c.context()
		defer cancel()
		if err := cl.Release(ctx, l); err != nil && !errors.Is(err, client.ErrNotHeld) {
			a.warn("releasing %q failed (%v); the lease frees it within %v", o.key, err, o.lease)
		}
	}
	if intr != nil {
		if err == nil {
			release()
		}
		sig := intr.(syscall.Signal)
		return &exitErr{code: 128 + int(sig), msg: fmt.Sprintf("%v while waiting for %q; the command was not started", sig, o.key)}
	}
	if err != nil {
		return err
	}
	// The keep-alive renews every --renew-every and reports the lock lost
	// at its StopBy: early enough to send SIGTERM, wait --grace, SIGKILL
	// (killLead ahead) and have the group dead --margin before the lease
	// can end. It watches the lock too, so that lockd's word that the
	// grant ended (released elsewhere, expired, forced) stops the command
	// at once. A lock granted after a long wait is renewed before the
	// command starts.
	ctx, cancel := c.context()
	ka, err := cl.KeepAlive(ctx, l, client.KeepAliveOptions{
		Lease:  o.lease,
		Every:  o.renewEvery,
		Retry:  o.retryRenewIn,
		Margin: stopLead(o.margin, o.grace),
		OnRenewError: func(err error) {
			a.warn("renewing %q failed: %v; retrying", o.key, err)
		},
	})
	cancel()
	if err != nil {
		if errors.Is(err, client.ErrNotHeld) {
			return &exitErr{code: exitLockLost, msg: fmt.Sprintf("lock %q lost before the command started (renew answered N)", o.key)}
		}
		release()
		return err
	}
	if ka.Err() != nil {
		// Lost already (the watch's first answer can come that soon).
		ka.Stop()
		return &exitErr{code: exitLockLost, msg: fmt.Sprintf("lock %q lost before the command started: %s", o.key, lostText(ka.Err(), o.margin, o.grace))}
	}
	defer ka.Stop()

	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "LOCKD_KEY="+o.key, "LOCKD_TOKEN="+strconv.FormatUint(l.Token, 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group: we can signal it whole
	if err := cmd.Start(); err != nil {
		ka.Stop()
		release()
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return &exitErr{code: code, msg: fmt.Sprintf("cannot run %s: %v", o.argv[0], err)}
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

loop:
	for {
		select {
		case err := <-done:
			// The command ended by itself. Anything it left in its group
			// may still touch the resource: stop it (the lease still
			// renewed) before releasing.
			stopGroup(pgid, o.grace, nil)
			ka.Stop()
			release()
			return exitStatus(err)
		case sig := <-sigs:
			_ = syscall.Kill(-pgid, sig.(syscall.Signal))
		case <-ka.Lost():
			break loop
		}
	}
	a.warn("lock %q lost: %s; stopping the command (SIGTERM, SIGKILL after %v)", o.key, lostText(ka.Err(), o.margin, o.grace), o.grace)
	stopGroup(pgid, o.grace, done)
	// No release: either the grant has ended (an L, an N), or the server
	// cannot be reached; its lease ends it.
	return &exitErr{code: exitLockLost, msg: fmt.Sprintf("lock %q lost; the command was stopped", o.key)}
}

// stopGroup ends every process of group pgid: SIGTERM, then SIGKILL after
// grace. If done is not nil it is the group leader's Wait result, which is
// drained.
func stopGroup(pgid int, grace time.Duration, done <-chan error) {
	leaderGone := done == nil
	reap := func() {
		if !leaderGone {
			select {
			case <-done:
				leaderGone = true
			default:
			}
		}
	}
	if !groupAlive(pgid) {
		if !leaderGone {
			<-done
		}
		return // nothing left
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		reap()
		if !groupAlive(pgid) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if groupAlive(pgid) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		// SIGKILL cannot be caught; wait (bounded) for the kernel.
		for i := 0; i < 200 && groupAlive(pgid); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !leaderGone {
		<-done
	}
}

// groupAlive reports whether a process of group pgid is still running.
// Zombies (dead, waiting for a parent to reap them; orphans may wait for
// an init that never reaps) do not count: they run no code. Linux's /proc
// tells them apart; elsewhere any member counts.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid && pid > 0 {
			return true
		}
	}
	return false
}

// exitStatus maps the command's Wait result to lockctl's exit.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &exitErr{code: 128 + int(ws.Signal())}
		}
		return &exitErr{code: ee.ExitCode()}
	}
	return &exitErr{code: exitError, msg: err.Error()}
}
