package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/client"
)

// Exit codes. run exits with the command's own code when it ran to its end.
const (
	exitOK            = 0
	exitError         = 1  // lockd unreachable (no connection), server error, bad answer
	exitUsage         = 2  // bad command line
	exitTimeout       = 10 // the wait ended with the lock still held elsewhere (T)
	exitBusy          = 11 // the server's queue or capacity is full (B)
	exitIndeterminate = 12 // the outcome is unknown: the lock may or may not have been granted
	exitNotHeld       = 13 // release/renew: the token is not the key's current grant (N)
	exitLockLost      = 14 // run: the lock was lost while the command ran; the command was killed
	exitCannotExec    = 126
	exitNotFound      = 127
)

const usageText = `Usage: lockctl COMMAND [flags] [args]

Commands:
  acquire KEY [--wait 10s] [--lease 30s]   take the lock and print its token
  release KEY TOKEN                         release the lock held with TOKEN
  renew KEY TOKEN [--lease 30s]             restart the lease of TOKEN
  ping                                      measure the round trip to a server
  status [KEY]                              server status, or one key's holder and waiters
  run KEY [flags] -- CMD [ARGS...]          run CMD while holding the lock

Common flags (also after the command):
  --addr HOST:PORT   server address, repeatable (env LOCKD_ADDRS, comma-separated; default 127.0.0.1:7070)
  --admin HOST:PORT  admin endpoint for status (env LOCKD_ADMIN; default: each --addr's port + 1)
  --timeout D        network timeout for commands other than waiting for a lock (default 10s)

Exit codes:
  0    success (run: the command's own exit code)
  1    error: lockd unreachable (refused, closed at once, no connection), server error
  2    bad command line
  10   timed out: lockd answered that the lock is held elsewhere
  11   server busy (queue or capacity full)
  12   indeterminate: the lock may or may not have been granted
  13   not held: the token is not the key's current grant
  14   run: the lock was lost while the command ran; the command was killed
  126  run: the command could not be executed
  127  run: the command was not found

Run "lockctl COMMAND --help" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// common are the flags every command takes.
type common struct {
	addrs   addrList
	admin   string
	timeout time.Duration
}

type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(v string) error { *a = append(*a, v); return nil }

func (c *common) register(fs *flag.FlagSet) {
	fs.Var(&c.addrs, "addr", "server address host:port, repeatable (env LOCKD_ADDRS)")
	fs.StringVar(&c.admin, "admin", "", "admin endpoint host:port for status (env LOCKD_ADMIN; default: each --addr's host at its port + 1, as lockd's own default)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "network timeout for everything but the wait for a lock")
}

func (c *common) finish() error {
	if len(c.addrs) == 0 {
		if env := os.Getenv("LOCKD_ADDRS"); env != "" {
			for _, a := range strings.Split(env, ",") {
				if a = strings.TrimSpace(a); a != "" {
					c.addrs = append(c.addrs, a)
				}
			}
		}
	}
	if len(c.addrs) == 0 {
		c.addrs = addrList{"127.0.0.1:7070"}
	}
	if c.admin == "" {
		c.admin = os.Getenv("LOCKD_ADMIN")
	}
	if c.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	return nil
}

// context bounds one command's network work: the client's own transport
// deadline (--timeout) comes first and names what failed; the context is
// only a backstop.
func (c *common) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.timeout+time.Second)
}

// client returns a client for one command and checks, with a ping, that
// a server answers: a refused dial on every address fails at once with
// the dial error (FailFast), and a server that accepts and closes at once
// (lockd at --max-conns) is reported as that, before any request that
// could be left indeterminate is sent.
func (c *common) client(ctx context.Context) (*client.Client, error) {
	cfg := client.DefaultConfig()
	cfg.Addrs = c.addrs
	cfg.DialTimeout = c.timeout
	cfg.TransportTimeout = c.timeout
	cfg.FailFast = true
	cl, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, pingErr(err)
	}
	return cl, nil
}

// pingErr words a failed ping: its ErrTimeout is a pong that did not come
// back, not a lock held elsewhere (exit 10).
func pingErr(err error) error {
	if errors.Is(err, client.ErrTimeout) {
		return &exitErr{code: exitError, msg: "no pong within --timeout (" + err.Error() + ")"}
	}
	return err
}

// usageError is a bad command line (exit 2).
type usageError string

func (e usageError) Error() string { return string(e) }

func usageErr(format string, a ...any) error { return usageError(fmt.Sprintf(format, a...)) }

// checkWaitLease validates --wait (0..255s; nil: the command has none) and
// --lease (1s..255s) with messages that name the flag: lease 0 would
// otherwise be the client's default lease, not the 1s..255s the help
// promises.
func checkWaitLease(wait, lease *time.Duration) error {
	if wait != nil && (*wait < 0 || *wait > 255*time.Second) {
		return usageErr("--wait %v: must be 0..255s", *wait)
	}
	if *lease < time.Second || *lease > 255*time.Second {
		return usageErr("--lease %v: must be 1s..255s", *lease)
	}
	return nil
}

// parse parses fs's flags wherever they stand among args (flags may follow
// positional arguments) and returns the positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lockctl %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	// Common flags may come before the command: move them after it.
	var lead []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "--" {
		a := args[0]
		if a == "-h" || a == "--help" || a == "-help" {
			break
		}
		n := 2
		if strings.Contains(a, "=") {
			n = 1
		}
		n = min(n, len(args))
		lead, args = append(lead, args[:n]...), args[n:]
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	cmd, rest := args[0], append(lead, args[1:]...)
	var err error
	switch cmd {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	case "acquire":
		err = cmdAcquire(rest, stdout, stderr)
	case "release":
		err = cmdRelease(rest, stdout, stderr)
	case "renew":
		err = cmdRenew(rest, stdout, stderr)
	case "ping":
		err = cmdPing(rest, stdout, stderr)
	case "status":
		err = cmdStatus(rest, stdout, stderr)
	case "run":
		err = cmdRun(rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "lockctl: unknown command %q\n\n%s", cmd, usageText)
		return exitUsage
	}
	return report(err, stderr)
}

// exitErr carries an exit code and a message (empty: print nothing).
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

// report prints err in a sentence and maps it to an exit code.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "lockctl: %s\n", ue)
		return exitUsage
	}
	var ee *exitErr
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintf(stderr, "lockctl: %s\n", ee.msg)
		}
		return ee.code
	}
	if strings.Contains(err.Error(), "flag provided but not defined") || strings.Contains(err.Error(), "invalid value") {
		return exitUsage // the flag package has printed it
	}
	code, msg := exitError, err.Error()
	var se *client.ServerError
	switch {
	case errors.Is(err, client.ErrIndeterminate):
		code, msg = exitIndeterminate, "outcome indeterminate: the lock may or may not have been granted; it will be freed at the latest when its lease ends ("+err.Error()+")"
	case errors.Is(err, client.ErrNoConnection):
		msg = "no connection to lockd"
		if cause := errors.Unwrap(err); cause != nil {
			msg += ": " + cause.Error()
		}
		if !errors.Is(err, client.ErrRejected) {
			msg += "; is it running? addresses come from --addr or LOCKD_ADDRS"
		}
	case errors.Is(err, client.ErrTimeout):
		code, msg = exitTimeout, "timed out: the lock is held by someone else ("+err.Error()+")"
	case errors.Is(err, client.ErrBusy):
		code, msg = exitBusy, "server busy: its wait queue or key capacity is full ("+err.Error()+")"
	case errors.Is(err, client.ErrNotHeld):
		code, msg = exitNotHeld, "not held: the token is not the key's current grant (released, or its lease ended)"
	case errors.Is(err, context.DeadlineExceeded):
		msg = "no answer within --timeout (" + err.Error() + ")"
	case errors.As(err, &se):
		msg = "server rejected the request: " + se.Msg
	case errors.Is(err, client.ErrInvalidKey), errors.Is(err, client.ErrInvalidLease), errors.Is(err, client.ErrInvalidWait):
		code = exitUsage
	}
	fmt.Fprintf(stderr, "lockctl: %s\n", msg)
	return code
}

// notAcquireErr words an indeterminate release or renew for what it is
// (exitError's table speaks of acquires).
func notAcquireErr(op string, err error) error {
	if errors.Is(err, client.ErrIndeterminate) {
		return &exitErr{code: exitIndeterminate, msg: "outcome indeterminate: the " + op + " may or may not have been executed (" + err.Error() + ")"}
	}
	return err
}

func parseToken(s string) (uint64, error) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, usageErr("TOKEN %q: want the decimal token printed by acquire", s)
	}
	return t, nil
}

// args parses fs's flags and exactly want positional arguments (usage
// names them when they are wrong), then finishes the common flags.
func (c *common) args(fs *flag.FlagSet, args []string, want int, usage string) ([]string, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != want {
		return nil, usageErr("%s", usage)
	}
	return pos, c.finish()
}

// lockArgs parses the KEY TOKEN arguments of release and renew.
func (c *common) lockArgs(fs *flag.FlagSet, args []string, cmd string) (client.Lock, error) {
	pos, err := c.args(fs, args, 2, cmd+" takes KEY and TOKEN")
	if err != nil {
		return client.Lock{}, err
	}
	tok, err := parseToken(pos[1])
	return client.Lock{Key: pos[0], Token: tok}, err
}

// dial returns a client whose server has answered a ping and the context
// for one command's network work; done releases both.
func (c *common) dial() (*client.Client, context.Context, func(), error) {
	ctx, cancel := c.context()
	cl, err := c.client(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return cl, ctx, func() { cancel(); cl.Close() }, nil
}

func cmdAcquire(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("acquire", "acquire KEY [--wait 10s] [--lease 30s]", stderr)
	c.register(fs)
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for the lock, 0..255s (0: one attempt)")
	lease := fs.Duration("lease", 30*time.Second, "lease, 1s..255s, rounded up to whole seconds")
	pos, err := c.args(fs, args, 1, "acquire takes one KEY")
	if err != nil {
		return err
	}
	if err := checkWaitLease(wait, lease); err != nil {
		return err
	}
	cl, _, done, err := c.dial()
	if err != nil {
		return err
	}
	defer done()
	// The wait bounds the call (the client adds the answer's transit).
	l, err := cl.Acquire(context.Background(), pos[0], client.AcquireOptions{Wait: *wait, Lease: *lease})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, l.Token)
	return nil
}

func cmdRelease(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("release", "release KEY TOKEN", stderr)
	c.register(fs)
	l, err := c.lockArgs(fs, args, "release")
	if err != nil {
		return err
	}
	cl, ctx, done, err := c.dial()
	if err != nil {
		return err
	}
	defer done()
	if err := cl.Release(ctx, l); err != nil {
		return notAcquireErr("release", err)
	}
	fmt.Fprintln(stdout, "released")
	return nil
}

func cmdRenew(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("renew", "renew KEY TOKEN [--lease 30s]", stderr)
	c.register(fs)
	lease := fs.Duration("lease", 30*time.Second, "new lease from now, 1s..255s")
	l, err := c.lockArgs(fs, args, "renew")
	if err != nil {
		return err
	}
	if err := checkWaitLease(nil, lease); err != nil {
		return err
	}
	cl, ctx, done, err := c.dial()
	if err != nil {
		return err
	}
	defer done()
	l, err = cl.Renew(ctx, l, *lease)
	if err != nil {
		return notAcquireErr("renew", err)
	}
	fmt.Fprintf(stdout, "renewed until %s\n", l.Expires.Round(time.Millisecond).Format(time.RFC3339Nano))
	return nil
}

func cmdPing(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("ping", "ping", stderr)
	c.register(fs)
	if _, err := c.args(fs, args, 0, "ping takes no arguments"); err != nil {
		return err
	}
	cl, ctx, done, err := c.dial() // one ping to find a server
	if err != nil {
		return err
	}
	defer done()
	rtt, err := cl.Ping(ctx) // one to measure
	if err != nil {
		return pingErr(err)
	}
	fmt.Fprintf(stdout, "pong from %s in %s\n", strings.Join(c.addrs, ","), rtt.Round(time.Microsecond))
	return nil
}
