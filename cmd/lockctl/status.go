package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/api"
)

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	var c common
	fs := newFlagSet("status", "status [KEY] [--admin HOST:PORT]", stderr)
	c.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErr("status takes at most one KEY")
	}
	if err := c.finish(); err != nil {
		return err
	}
	hc := &http.Client{Timeout: c.timeout}
	admins := c.adminAddrs()
	if len(pos) == 1 {
		// A key's state is the active's (or leader's): ask the members in
		// turn for the one that says it is.
		base, err := activeAdmin(hc, admins)
		if err != nil {
			return err
		}
		var k api.Key
		if err := getJSON(hc, base+api.PathKeys+api.KeyPath(pos[0]), &k); err != nil {
			return err
		}
		if !k.Held {
			fmt.Fprintf(stdout, "key:        %s\nstate:      free\n", k.Key)
			return nil
		}
		fmt.Fprintf(stdout, "key:        %s\nstate:      held\ntoken:      %s\nlease left: %s\nwaiters:    %d\n",
			k.Key, k.Token, (time.Duration(k.LeaseLeftMs) * time.Millisecond).String(), k.Waiters)
		return nil
	}
	var firstErr error
	shown := 0
	for _, a := range admins {
		var s api.Status
		if err := getJSON(hc, "http://"+a+api.PathStatus, &s); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", a, err)
			}
			if len(admins) > 1 {
				fmt.Fprintf(stdout, "server:      (admin %s unreachable: %v)\n\n", a, err)
			}
			continue
		}
		printStatus(stdout, &s)
		if shown++; len(admins) > 1 {
			fmt.Fprintln(stdout)
		}
	}
	if shown == 0 {
		return firstErr
	}
	return nil
}

// adminAddrs are the admin endpoints to ask: --admin (or LOCKD_ADMIN) if
// given, else every --addr's host at its port + 1 (lockd's default).
func (c *common) adminAddrs() []string {
	if c.admin != "" {
		return []string{c.admin}
	}
	var out []string
	for _, a := range c.addrs {
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

// activeAdmin returns the base URL of the admin endpoint of the member
// that serves (a single node, the active, the leader), else the first
// that answers.
func activeAdmin(hc *http.Client, admins []string) (string, error) {
	var first string
	var firstErr error
	for _, a := range admins {
		var s api.Status
		if err := getJSON(hc, "http://"+a+api.PathStatus, &s); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", a, err)
			}
			continue
		}
		if api.Serving(s.Role) {
			return "http://" + a, nil
		}
		if first == "" {
			first = "http://" + a
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
	if s.Draining {
		state = "shutting down"
	}
	fmt.Fprintf(w, "server:      %s (%s, %s)\n", s.Addr, s.Role, state)
	if s.Mode != "" && s.Mode != api.ModeSingle {
		fmt.Fprintf(w, "cluster:     %s, epoch %d, active %s\n", s.Mode, s.Epoch, orNone(s.Active))
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
			if m.Live {
				live = "live"
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

func getJSON(hc *http.Client, u string, v any) error {
	resp, err := hc.Get(u)
	if err != nil {
		return fmt.Errorf("admin endpoint: %v (lockd serves it on its port + 1 unless started with --admin; set --admin or LOCKD_ADMIN)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("admin endpoint: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("admin endpoint: bad answer: %v", err)
	}
	return nil
}
