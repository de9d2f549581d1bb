package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
)

// The JSON documents of -o json. Tokens are decimal strings, as in the
// admin endpoint's JSON: they exceed 2^53, which JSON numbers do not
// carry exactly in many languages.
type (
	lockJSON struct {
		Key          string `json:"key"`
		Token        string `json:"token"`
		LeaseSeconds int    `json:"lease_seconds"`
		// Expires is the client's conservative end of the lease (RFC 3339):
		// the request's send instant plus the lease; the server's is later.
		Expires string `json:"expires"`
	}
	releasedJSON struct {
		Key      string `json:"key"`
		Token    string `json:"token"`
		Released bool   `json:"released"`
	}
	pongJSON struct {
		Addrs      []string `json:"addrs"`
		RTTSeconds float64  `json:"rtt_seconds"`
	}
)

func toLockJSON(l client.Lock, lease time.Duration) lockJSON {
	return lockJSON{Key: l.Key, Token: strconv.FormatUint(l.Token, 10), LeaseSeconds: int((lease + time.Second - 1) / time.Second),
		Expires: l.Expires.Round(time.Millisecond).Format(time.RFC3339Nano)}
}

// args returns a cobra.PositionalArgs that wants exactly n arguments and
// says msg otherwise.
func args(n int, msg string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError(msg)
		}
		return nil
	}
}

func (a *app) acquireCmd() *cobra.Command {
	var wait, lease time.Duration
	cmd := &cobra.Command{
		Use:   "acquire KEY",
		Short: "take a lock and print its fencing token",
		Long: `acquire waits up to --wait for KEY, takes it with a lease of --lease and prints
its fencing token in decimal. The lock is not tied to lockctl: it stays held
until it is released (lockctl release), or its lease ends; renew it with
lockctl renew. Pass the token to the resource the lock protects, which rejects
tokens smaller than the largest it has seen.

Exit 10 means lockd answered that the lock is held elsewhere; an outage is
exit 1, never 10.`,
		Example: `  lockctl acquire reports/nightly --wait 10s --lease 30s
  TOKEN=$(lockctl acquire jobs/import --wait 0) || exit    # one attempt, no queueing
  lockctl acquire jobs/import -o json                       # {"key": …, "token": "…", …}`,
		Args: args(1, "acquire takes one KEY"),
	}
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long to wait for the lock, 0..255s (0: one attempt)")
	cmd.Flags().DurationVar(&lease, "lease", 30*time.Second, "lease, 1s..255s, rounded up to whole seconds")
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if err := c.finish(); err != nil {
			return err
		}
		if err := checkWaitLease(&wait, &lease); err != nil {
			return err
		}
		cl, _, done, err := c.dial()
		if err != nil {
			return err
		}
		defer done()
		// The wait bounds the call (the client adds the answer's transit).
		l, err := cl.Acquire(context.Background(), pos[0], client.AcquireOptions{Wait: wait, Lease: lease})
		if err != nil {
			return err
		}
		return o.result(a.stdout, strconv.FormatUint(l.Token, 10)+"\n", toLockJSON(l, lease))
	})
	return cmd
}

// tokenCall is how every KEY TOKEN command (release, renew, validate,
// watch) begins: its output flag and arguments checked, then its own flags
// (check, when it has any), then the connection flags, and last a client
// whose server answered; done releases the client and the context.
func (a *app) tokenCall(o *output, c *conn, pos []string, check func() error) (client.Lock, *client.Client, context.Context, func(), error) {
	fail := func(err error) (client.Lock, *client.Client, context.Context, func(), error) {
		return client.Lock{}, nil, nil, nil, err
	}
	if err := a.checkOutput(o); err != nil {
		return fail(err)
	}
	l, err := lockArg(pos)
	if err != nil {
		return fail(err)
	}
	if check != nil {
		if err := check(); err != nil {
			return fail(err)
		}
	}
	if err := c.finish(); err != nil {
		return fail(err)
	}
	cl, ctx, done, err := c.dial()
	if err != nil {
		return fail(err)
	}
	return l, cl, ctx, done, nil
}

// lockArg parses the KEY TOKEN arguments of release, renew, validate and
// watch.
func lockArg(pos []string) (client.Lock, error) {
	tok, err := parseToken(pos[1])
	return client.Lock{Key: pos[0], Token: tok}, err
}

func (a *app) releaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release KEY TOKEN",
		Short: "release the lock held with TOKEN",
		Long: `release ends the grant of KEY whose fencing token is TOKEN (as printed by
acquire). It acts on that exact token only, and is retried for 5 s while
lockd cannot be reached; a release already done, or of a lease that ended,
is exit 13 (not held) — after a retry that can also be this release's own
first attempt, executed with its answer lost. With lockd's --acl, only the identity that took the
lock (or an admin identity) can release it.`,
		Example: `  lockctl release reports/nightly 1795948991634200642
  lockctl release reports/nightly "$TOKEN" -o json`,
		Args: args(2, "release takes KEY and TOKEN"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		l, cl, ctx, done, err := a.tokenCall(o, c, pos, nil)
		if err != nil {
			return err
		}
		defer done()
		if err := cl.Release(ctx, l); err != nil {
			return notAcquireErr("release", err)
		}
		return o.result(a.stdout, "released\n", releasedJSON{Key: l.Key, Token: strconv.FormatUint(l.Token, 10), Released: true})
	})
	return cmd
}

func (a *app) renewCmd() *cobra.Command {
	var lease time.Duration
	cmd := &cobra.Command{
		Use:   "renew KEY TOKEN",
		Short: "restart the lease of the lock held with TOKEN",
		Long: `renew restarts the lease of KEY's grant whose token is TOKEN at --lease from
now, and prints the client's conservative end of the new lease. The token
does not change. A lock no longer held (released, or its lease ended) is
exit 13.`,
		Example: `  lockctl renew reports/nightly 1795948991634200642 --lease 60s
  lockctl renew reports/nightly "$TOKEN" -o json`,
		Args: args(2, "renew takes KEY and TOKEN"),
	}
	cmd.Flags().DurationVar(&lease, "lease", 30*time.Second, "new lease from now, 1s..255s")
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		l, cl, ctx, done, err := a.tokenCall(o, c, pos, func() error { return checkWaitLease(nil, &lease) })
		if err != nil {
			return err
		}
		defer done()
		l, err = cl.Renew(ctx, l, lease)
		if err != nil {
			return notAcquireErr("renew", err)
		}
		return o.result(a.stdout, fmt.Sprintf("renewed until %s\n", l.Expires.Round(time.Millisecond).Format(time.RFC3339Nano)), toLockJSON(l, lease))
	})
	return cmd
}

func (a *app) pingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ping",
		Short: "measure the round trip to a server",
		Long: `ping checks that a server answers (behind the hello, when an identity is
given, so refused credentials show here) and prints one round trip.`,
		Example: `  lockctl ping
  lockctl ping --addr 10.0.0.5:7070 --tls-ca ca.pem --identity orders --secret-file orders.secret
  lockctl ping -o json`,
		Args: args(0, "ping takes no arguments"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(*cobra.Command, []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if err := c.finish(); err != nil {
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
		text := fmt.Sprintf("pong from %s in %s\n", strings.Join(c.addrs, ","), rtt.Round(time.Microsecond))
		return o.result(a.stdout, text, pongJSON{Addrs: c.addrs, RTTSeconds: rtt.Seconds()})
	})
	return cmd
}
