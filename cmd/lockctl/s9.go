package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/client"
)

// The JSON documents of validate, inspect and watch (-o json).
type (
	validJSON struct {
		Key         string `json:"key"`
		Token       string `json:"token"`
		Valid       bool   `json:"valid"`
		LeaseLeftMs int64  `json:"lease_left_ms"`
	}
	// inspectJSON is inspect's document. Holders, Limit, Waiters, Token
	// and LeaseLeftMs are lockd's I answer (or the admin endpoint's
	// same numbers); HolderList and Queue come only from the admin
	// endpoint (Source "admin").
	inspectJSON struct {
		Key         string `json:"key"`
		Source      string `json:"source"` // "lockd" (an I request) or "admin" (GET /keys/{key})
		Holders     int    `json:"holders"`
		Limit       int    `json:"limit"`
		Waiters     int    `json:"waiters"`
		Token       string `json:"token,omitempty"` // the newest holder's; absent when free
		LeaseLeftMs int64  `json:"lease_left_ms"`   // the newest holder's
		// Shared tells a key shared with limit 1 from an exclusive one;
		// only the admin endpoint knows it.
		Shared     *bool           `json:"shared,omitempty"`
		HolderList []inspectHolder `json:"holder_list,omitempty"`
		Queue      []inspectWaiter `json:"queue,omitempty"`
	}
	inspectHolder struct {
		Token       string `json:"token"`
		Identity    string `json:"identity,omitempty"`
		LeaseLeftMs int64  `json:"lease_left_ms"`
	}
	inspectWaiter struct {
		Owner        string `json:"owner"`
		Identity     string `json:"identity,omitempty"`
		WaitLeftMs   int64  `json:"wait_left_ms"`
		Shared       bool   `json:"shared"`
		Limit        int    `json:"limit,omitempty"`
		LeaseSeconds int    `json:"lease_seconds"`
	}
	watchJSON struct {
		Key   string `json:"key"`
		Token string `json:"token"`
		Ended bool   `json:"ended"`
		// Reason is how the grant ended: "released", "expired",
		// "forced", or "gone" (it ended while no member could tell how:
		// a watch registered again found it not held); empty while it
		// has not ended (--wait passed).
		Reason string `json:"reason,omitempty"`
	}
)

func (a *app) validateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate KEY TOKEN",
		Short: "ask lockd whether TOKEN is a current holder of KEY",
		Long: `validate asks lockd whether TOKEN is a current holder of KEY — granted, not
released, its lease not ended — and prints the lease time it has left. It
changes nothing (no renewal). It is what a protected resource asks before
acting for a holder; a script can do the same:

    lockctl validate reports/nightly "$TOKEN" && write-the-report

A token that is not held (released, expired, never issued, or another key's)
is exit 13. With lockd's --acl, any identity whose prefixes allow KEY may ask,
a monitor identity included.`,
		Example: `  lockctl validate reports/nightly 1795948991634200642
  lockctl validate jobs/import "$LOCKD_TOKEN" -o json`,
		Args: args(2, "validate takes KEY and TOKEN"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		l, cl, ctx, done, err := a.tokenCall(o, c, pos, nil)
		if err != nil {
			return err
		}
		defer done()
		left, err := cl.Validate(ctx, l.Key, l.Token)
		if err != nil {
			return err
		}
		text := fmt.Sprintf("valid: lease left %s\n", left)
		return o.result(a.stdout, text, validJSON{Key: l.Key, Token: strconv.FormatUint(l.Token, 10), Valid: true, LeaseLeftMs: left.Milliseconds()})
	})
	return cmd
}

func (a *app) inspectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "show who holds KEY and how many wait",
		Long: `inspect shows KEY's state at this moment: how many hold it and with which
limit (1: exclusive; more: a shared key, a semaphore or a read lock), how many
acquires wait for it, and its newest holder's token and lease left. It
changes nothing.

By default it asks lockd (an I request, on the client port). With --admin (or
LOCKD_ADMIN) it reads the admin endpoint's /keys/{key} on the member that
serves instead, which lists every holder (token, identity, lease left) and
every waiter in queue order (identity, wait left, exclusive or shared).`,
		Example: `  lockctl inspect exports/slots
  lockctl inspect exports/slots --admin 127.0.0.1:7071     # every holder and waiter
  lockctl inspect jobs/import -o json | jq .waiters`,
		Args: args(1, "inspect takes one KEY"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	ad := adminFlag(cmd, c)
	cmd.Flags().Lookup("admin").Usage = "read the admin endpoint host:port (env " + envAdmin + ") for every holder and waiter; without it, lockd is asked with an I request"
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if err := c.finish(); err != nil {
			return err
		}
		ad.finish()
		key := pos[0]
		if !validKey(key) {
			return usageErr("KEY %q: %v", key, client.ErrInvalidKey)
		}
		var doc inspectJSON
		if ad.addr != "" {
			d, err := ad.inspect(key)
			if err != nil {
				return err
			}
			doc = d
		} else {
			cl, ctx, done, err := c.dial()
			if err != nil {
				return err
			}
			defer done()
			in, err := cl.Inspect(ctx, key)
			if err != nil {
				return err
			}
			doc = inspectJSON{Key: key, Source: "lockd", Holders: in.Holders, Limit: in.Limit, Waiters: in.Waiters, LeaseLeftMs: in.Remaining.Milliseconds()}
			if in.Token != 0 {
				doc.Token = strconv.FormatUint(in.Token, 10)
			}
		}
		return o.result(a.stdout, inspectText(&doc), &doc)
	})
	return cmd
}

// validKey is the client's rule for a key: 1..1024 bytes of UTF-8
// without a newline (the client says so too; checking here makes it a
// usage error before anything is dialled or read).
func validKey(key string) bool {
	return key != "" && len(key) <= 1024 && !strings.ContainsRune(key, '\n') && utf8.ValidString(key)
}

func inspectText(d *inspectJSON) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key:        %s\n", d.Key)
	if d.Holders == 0 {
		b.WriteString("state:      free\n")
	} else {
		kind := "exclusive"
		switch {
		case d.Shared != nil && *d.Shared || d.Limit > 1:
			kind = fmt.Sprintf("shared, limit %d", d.Limit)
		case d.Shared == nil && d.Limit == 1:
			kind = "exclusive (or shared with limit 1)"
		}
		fmt.Fprintf(&b, "state:      held, %s\n", kind)
		fmt.Fprintf(&b, "holders:    %d\n", d.Holders)
		fmt.Fprintf(&b, "newest:     token %s, lease left %s\n", d.Token, time.Duration(d.LeaseLeftMs)*time.Millisecond)
	}
	fmt.Fprintf(&b, "waiters:    %d\n", d.Waiters)
	for _, h := range d.HolderList {
		fmt.Fprintf(&b, "  holder    token %s, lease left %s%s\n", h.Token, time.Duration(h.LeaseLeftMs)*time.Millisecond, identityText(h.Identity))
	}
	for i, w := range d.Queue {
		kind := "exclusive"
		if w.Shared {
			kind = fmt.Sprintf("shared, limit %d", w.Limit)
		}
		fmt.Fprintf(&b, "  waiter %d  %s, wait left %s, lease %ds%s\n", i+1, kind, time.Duration(w.WaitLeftMs)*time.Millisecond, w.LeaseSeconds, identityText(w.Identity))
	}
	return b.String()
}

func identityText(id string) string {
	if id == "" {
		return ""
	}
	return ", identity " + id
}

func (a *app) watchCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "watch KEY TOKEN",
		Short: "wait until the grant of KEY with TOKEN ends, and say how",
		Long: `watch registers a watch of the grant of KEY whose token is TOKEN and waits
until lockd reports its end, then prints how it ended: released (by any
connection), expired (its lease ended), or forced (released by an operator).
When the member that registered the watch can no longer tell (it is stopping
or stepping down), watch registers again on the member that serves; a grant
that ended meanwhile is reported as gone.

A token that is not held when watch starts is exit 13. --wait bounds the
watch: when it passes with the grant still held, watch exits 10.`,
		Example: `  lockctl watch reports/nightly 1795948991634200642
  lockctl watch jobs/import "$TOKEN" --wait 10m -o json`,
		Args: args(2, "watch takes KEY and TOKEN"),
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "give up after this long with the grant still held (exit 10); 0: until it ends")
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		l, cl, ctx, done, err := a.tokenCall(o, c, pos, func() error {
			if wait < 0 {
				return usageErr("--wait %v: must not be negative", wait)
			}
			return nil
		})
		if err != nil {
			return err
		}
		defer done()
		w, err := cl.Watch(ctx, l)
		if err != nil {
			return err
		}
		defer w.Stop()
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)
		var timeout <-chan time.Time
		if wait > 0 {
			tm := time.NewTimer(wait)
			defer tm.Stop()
			timeout = tm.C
		}
		doc := watchJSON{Key: l.Key, Token: strconv.FormatUint(l.Token, 10)}
		select {
		case <-w.Done():
		case <-timeout:
			if err := o.result(a.stdout, "still held after --wait\n", doc); err != nil {
				return err
			}
			return &exitErr{code: exitTimeout, msg: fmt.Sprintf("timed out: the grant of %q is still held after --wait %v", l.Key, wait)}
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			return &exitErr{code: 128 + int(s), msg: fmt.Sprintf("%v while watching %q", s, l.Key)}
		}
		err = w.Err()
		switch {
		case w.Reason() != 0:
			doc.Reason = w.Reason().String()
		case errors.Is(err, client.ErrNotHeld):
			doc.Reason = "gone"
		default:
			return err // the watch could not go on (closed, unsupported, refused)
		}
		doc.Ended = true
		return o.result(a.stdout, doc.Reason+"\n", doc)
	})
	return cmd
}

// lostText words why run's lock was lost (KeepAlive.Err).
func lostText(err error, margin, grace time.Duration) string {
	var ge *client.GrantEndedError
	switch {
	case errors.As(err, &ge):
		switch ge.Reason {
		case client.Released:
			return "lockd reports it released from elsewhere (someone used its token)"
		case client.Expired:
			return "lockd reports that its lease ended"
		case client.Forced:
			return "lockd reports it released by an operator (an admin identity or the admin endpoint)"
		}
		return "lockd reports its end (" + ge.Reason.String() + ")"
	case errors.Is(err, client.ErrNotHeld):
		return "the server says the lock is no longer held (" + strings.TrimPrefix(err.Error(), "client: lock lost: ") + ")"
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return "the server refused a renewal: " + err.Error()
	}
	return fmt.Sprintf("renewals failed until %v before the lease could end", margin+grace)
}
