package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/api"
)

// admin is the --admin flag of the commands that use the admin endpoint,
// and the HTTP client they reach it with: HTTPS with the connection
// flags' TLS settings when TLS is on, basic authentication with the
// identity and its secret when one is given (PROTOCOL.md §8.5).
type admin struct {
	addr string
	c    *conn
	hc   *http.Client
}

func adminFlag(cmd *cobra.Command, c *conn) *admin {
	ad := &admin{c: c}
	cmd.Flags().StringVar(&ad.addr, "admin", "", "admin endpoint host:port (env "+envAdmin+"; default: each --addr's host at its port + 1, as lockd's own default)")
	return ad
}

// finish applies the environment; after conn.finish.
func (ad *admin) finish() {
	if ad.addr == "" {
		ad.addr = os.Getenv(envAdmin)
	}
	ad.hc = &http.Client{Timeout: ad.c.timeout}
	if ad.c.tlsConfig != nil {
		ad.hc.Transport = &http.Transport{TLSClientConfig: ad.c.tlsConfig.Clone(), Proxy: http.ProxyFromEnvironment}
	}
}

// base is the URL of the admin endpoint at addr.
func (ad *admin) base(addr string) string {
	if ad.c.tlsConfig != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// addrs are the admin endpoints to ask: --admin (or LOCKD_ADMIN) if
// given, else every --addr's host at its port + 1 (lockd's default).
func (ad *admin) addrs() []string {
	if ad.addr != "" {
		return []string{ad.addr}
	}
	var out []string
	for _, a := range ad.c.addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if p, err := strconv.Atoi(port); err == nil && p > 0 && p < 65535 {
			out = append(out, net.JoinHostPort(host, strconv.Itoa(p+1)))
		}
	}
	return out
}

// statusJSON is status's -o json document: one entry per admin endpoint
// asked, with its /status or why it could not be read.
type statusJSON struct {
	Servers []serverJSON `json:"servers"`
}

type serverJSON struct {
	Admin  string      `json:"admin"`
	Status *api.Status `json:"status,omitempty"`
	Error  string      `json:"error,omitempty"`
}

func (a *app) statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status [KEY]",
		Short: "show what a server is doing, or one key's holder and waiters",
		Long: `status reads lockd's admin endpoint (HTTP, on lockd's port + 1 unless lockd
was started with --admin): without KEY, each server's /status (role, cluster,
keys held, waiters, connections, token marks, limits, members); with KEY, that
key's state on the member that serves (single node, active or leader): free,
or held with its token, lease left and waiters.

With TLS flags the endpoint is reached over HTTPS with the same CA. With
lockd's --acl it needs a monitor or admin identity: --identity and
--secret-file are sent as HTTP basic authentication.`,
		Example: `  lockctl status
  lockctl status reports/nightly
  lockctl --addr 127.0.0.1:7070 --addr 127.0.0.1:7080 --addr 127.0.0.1:7090 status
  lockctl status -o json | jq '.servers[].status.role'`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageError("status takes at most one KEY")
			}
			return nil
		},
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	ad := adminFlag(cmd, c)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if err := c.finish(); err != nil {
			return err
		}
		ad.finish()
		admins := ad.addrs()
		if len(pos) == 1 {
			// A key's state is the active's (or leader's): ask the members in
			// turn for the one that says it is.
			base, err := ad.active(admins)
			if err != nil {
				return err
			}
			var k api.Key
			if err := ad.getJSON(base+api.PathKeys+api.KeyPath(pos[0]), &k); err != nil {
				return err
			}
			return o.result(a.stdout, keyText(&k), &k)
		}
		var firstErr error
		var doc statusJSON
		var text strings.Builder
		for _, addr := range admins {
			var s api.Status
			if err := ad.getJSON(ad.base(addr)+api.PathStatus, &s); err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", addr, err)
				}
				doc.Servers = append(doc.Servers, serverJSON{Admin: addr, Error: err.Error()})
				if len(admins) > 1 {
					fmt.Fprintf(&text, "server:      (admin %s unreachable: %v)\n\n", addr, err)
				}
				continue
			}
			doc.Servers = append(doc.Servers, serverJSON{Admin: addr, Status: &s})
			printStatus(&text, &s)
			if len(admins) > 1 {
				fmt.Fprintln(&text)
			}
		}
		shown := 0
		for _, sv := range doc.Servers {
			if sv.Status != nil {
				shown++
			}
		}
		if shown == 0 {
			return firstErr
		}
		return o.result(a.stdout, text.String(), &doc)
	})
	return cmd
}

func keyText(k *api.Key) string {
	if !k.Held {
		return fmt.Sprintf("key:        %s\nstate:      free\n", k.Key)
	}
	return fmt.Sprintf("key:        %s\nstate:      held\ntoken:      %s\nlease left: %s\nwaiters:    %d\n",
		k.Key, k.Token, (time.Duration(k.LeaseLeftMs) * time.Millisecond).String(), k.Waiters)
}

// active returns the base URL of the admin endpoint of the member that
// serves (a single node, the active, the leader), else the first that
// answers.
func (ad *admin) active(admins []string) (string, error) {
	var first string
	var firstErr error
	for _, a := range admins {
		var s api.Status
		if err := ad.getJSON(ad.base(a)+api.PathStatus, &s); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", a, err)
			}
			continue
		}
		if api.Serving(s.Role) {
			return ad.base(a), nil
		}
		if first == "" {
			first = ad.base(a)
		}
	}
	if first != "" {
		return first, nil
	}
	if firstErr == nil {
		firstErr = errors.New("no admin endpoint to ask")
	}
	return "", firstErr
}

func printStatus(w io.Writer, s *api.Status) {
	state := "serving"
	switch {
	case s.Draining:
		state = "shutting down"
	case !s.Serving():
		state = "not serving: answers M"
	}
	fmt.Fprintf(w, "server:      %s (%s, %s)\n", s.Addr, s.Role, state)
	// The mode's own counter from its part; "epoch", which has either, from
	// a lockd that does not send the parts yet.
	epoch := s.Epoch
	switch {
	case s.Raft != nil:
		epoch = s.Raft.Term
	case s.Priority != nil:
		epoch = s.Priority.Epoch
	}
	switch s.Mode {
	case "", api.ModeSingle:
	case api.ModeRaft: // raft's words: a term and a leader
		fmt.Fprintf(w, "cluster:     %s, term %d, leader %s\n", s.Mode, epoch, orNone(s.Active))
	default:
		fmt.Fprintf(w, "cluster:     %s, epoch %d, active %s\n", s.Mode, epoch, orNone(s.Active))
	}
	if s.Mode != "" && s.Mode != api.ModeSingle {
		if s.Role == api.RoleStandby {
			fmt.Fprintf(w, "sync:        in sync %v, lag %s\n", s.InSync, seconds(s.LagSeconds))
		}
		if r := s.Raft; r != nil {
			fmt.Fprintf(w, "raft:        term %d, commit %d, applied %d, %.1f changes/entry, commit p50 %s p99 %s\n",
				r.Term, r.CommitIndex, r.AppliedIndex, r.RecordsPerEntry, seconds(r.CommitP50Seconds), seconds(r.CommitP99Seconds))
			fmt.Fprintf(w, "raft log:    %d entries committed as leader, %d elections won, %d snapshots (last %d B), %d rebuilds\n",
				r.Entries, r.Elections, r.Snapshots, r.LastSnapshotBytes, r.Rebuilds)
		}
	}
	l := &s.Limits
	fmt.Fprintf(w, "version:     %s\nuptime:      %s\nheld keys:   %d of %d\nwaiters:     %d of %d (%d per key)\nconnections: %d of %d\ntoken mark:  %s (reserved to %s)\nlimits:      keys of up to %d B, %d B of answers buffered per connection, %d event loops\n",
		s.Version, (time.Duration(s.UptimeSeconds) * time.Second).String(),
		s.Keys, l.MaxKeys, s.Waiters, l.MaxWaiters, l.MaxWaitersPerKey, s.Connections, l.MaxConns, s.TokenLast, s.TokenReserved,
		l.MaxKey, l.MaxOutbound, l.Loops)
	if len(s.Members) > 0 {
		fmt.Fprintln(w, "members:")
		for _, m := range s.Members {
			live := "down"
			switch {
			case m.Live:
				live = "live"
			case m.Unobserved:
				live = "not observed from here (a follower hears only its leader; its status tells)"
			}
			line := fmt.Sprintf("  %-21s %-12s %s", m.Addr, orNone(m.Role), live)
			if m.InSync {
				line += ", in sync"
			}
			if m.LagRecords > 0 || m.LagSeconds > 0 {
				line += fmt.Sprintf(", lag %s (%d records, %d B)", seconds(m.LagSeconds), m.LagRecords, m.LagBytes)
			}
			fmt.Fprintln(w, line)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Microsecond).String()
}

// getJSON reads u's JSON into v, authenticating when an identity is
// given. 401 and 403 map to exit 15 and 16.
func (ad *admin) getJSON(u string, v any) error {
	resp, err := ad.do(http.MethodGet, u, nil, "a monitor or admin identity")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("admin endpoint: %s: %s", resp.Status, errorBody(b))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("admin endpoint: bad answer: %v", err)
	}
	return nil
}

// errorBody is the message of an admin endpoint's error answer: the
// "error" of its JSON body (api.Error), else the body as text.
func errorBody(b []byte) string {
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(b))
}

// do sends one request to the admin endpoint (JSON body when body is not
// nil), with the identity as basic authentication when one is given. A
// 401 or 403 is returned as refused's error (want: the identity the path
// needs), the body closed; otherwise the caller closes resp.Body.
func (ad *admin) do(method, u string, body []byte, want string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if ad.c.identity != "" {
		req.SetBasicAuth(ad.c.identity, string(ad.c.secret))
	}
	resp, err := ad.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin endpoint: %v (lockd serves it on its port + 1 unless started with --admin; set --admin or %s)", err, envAdmin)
	}
	if err := ad.refused(resp, u, want); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// refused maps a 401 or 403 of the admin endpoint at u to exit 15 or 16
// (want says which identity the path needs); nil for any other status.
func (ad *admin) refused(resp *http.Response, u, want string) error {
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		why := "it needs " + want + ": --identity and --secret-file (or " + envIdentity + ", " + envSecretFile + ")"
		if ad.c.identity != "" {
			why = "it refused identity " + strconv.Quote(ad.c.identity) + ": unknown identity or wrong secret"
		}
		return &exitErr{code: exitUnauthenticated, msg: "admin endpoint " + u + ": " + resp.Status + ": " + why}
	case http.StatusForbidden:
		return &exitErr{code: exitPermissionDenied, msg: "admin endpoint " + u + ": " + resp.Status + ": identity " + strconv.Quote(ad.c.identity) + " is not " + want}
	}
	return nil
}

// inspect reads key's state from the admin endpoint of the member that
// serves, as inspect's document.
func (ad *admin) inspect(key string) (inspectJSON, error) {
	base, err := ad.active(ad.addrs())
	if err != nil {
		return inspectJSON{}, err
	}
	var k api.Key
	if err := ad.getJSON(base+api.PathKeys+api.KeyPath(key), &k); err != nil {
		return inspectJSON{}, err
	}
	d := inspectJSON{Key: k.Key, Source: "admin", Holders: len(k.Holders), Limit: k.Limit, Waiters: k.Waiters, Token: k.Token, LeaseLeftMs: k.LeaseLeftMs}
	if k.Held {
		shared := k.Shared
		d.Shared = &shared
	}
	if k.Held && d.Holders == 0 {
		// An admin endpoint older than §9 lists no holders: one.
		d.Holders, d.Limit = 1, 1
	}
	for _, h := range k.Holders {
		d.HolderList = append(d.HolderList, inspectHolder{Token: h.Token, Identity: h.Identity, LeaseLeftMs: h.LeaseLeftMs})
	}
	for _, w := range k.Queue {
		d.Queue = append(d.Queue, inspectWaiter{Owner: w.Owner, Identity: w.Identity, WaitLeftMs: w.WaitLeftMs, Shared: w.Shared, Limit: w.Limit, LeaseSeconds: w.LeaseSeconds})
	}
	return d, nil
}
