package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The admin endpoint's documents (see package admin; decoded here by field
// name so lockctl does not link the server).
type statusDoc struct {
	Version       string  `json:"version"`
	Role          string  `json:"role"`
	Addr          string  `json:"addr"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	Draining      bool    `json:"draining"`
	Keys          int     `json:"keys"`
	Waiters       int     `json:"waiters"`
	Connections   int64   `json:"connections"`
	TokenLast     string  `json:"token_last"`
	Limits        struct {
		MaxKeys          int `json:"max_keys"`
		MaxWaitersPerKey int `json:"max_waiters_per_key"`
		MaxWaiters       int `json:"max_waiters"`
		MaxConns         int `json:"max_conns"`
	} `json:"limits"`
	Mode       string  `json:"mode"`
	Active     string  `json:"active"`
	Epoch      uint64  `json:"epoch"`
	InSync     bool    `json:"in_sync"`
	LagSeconds float64 `json:"lag_seconds"`
	Members    []struct {
		Addr       string  `json:"addr"`
		Role       string  `json:"role"`
		Live       bool    `json:"live"`
		InSync     bool    `json:"in_sync"`
		LagSeconds float64 `json:"lag_seconds"`
		LagRecords uint64  `json:"lag_records"`
		LagBytes   uint64  `json:"lag_bytes"`
	} `json:"members"`
	Raft *struct {
		Term            uint64  `json:"term"`
		CommitIndex     uint64  `json:"commit_index"`
		AppliedIndex    uint64  `json:"applied_index"`
		RecordsPerEntry float64 `json:"records_per_entry"`
		CommitP50       float64 `json:"commit_p50_seconds"`
		CommitP99       float64 `json:"commit_p99_seconds"`
	} `json:"raft"`
}

type keyDoc struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       string `json:"token"`
	LeaseLeftMs int64  `json:"lease_left_ms"`
	Waiters     int    `json:"waiters"`
}

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
		var k keyDoc
		if err := getJSON(hc, base+"/keys/"+keyPath(pos[0]), &k); err != nil {
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
		var s statusDoc
		if err := getJSON(hc, "http://"+a+"/status", &s); err != nil {
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
		var s statusDoc
		if err := getJSON(hc, "http://"+a+"/status", &s); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", a, err)
			}
			continue
		}
		if s.Role == "active" || s.Role == "leader" {
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

func printStatus(w io.Writer, s *statusDoc) {
	state := "serving"
	if s.Draining {
		state = "shutting down"
	}
	fmt.Fprintf(w, "server:      %s (%s, %s)\n", s.Addr, s.Role, state)
	if s.Mode != "" && s.Mode != "single" {
		fmt.Fprintf(w, "cluster:     %s, epoch %d, active %s\n", s.Mode, s.Epoch, orNone(s.Active))
		if s.Role == "standby" {
			fmt.Fprintf(w, "sync:        in sync %v, lag %s\n", s.InSync, seconds(s.LagSeconds))
		}
		if r := s.Raft; r != nil {
			fmt.Fprintf(w, "raft:        term %d, commit %d, applied %d, %.1f changes/entry, commit p50 %s p99 %s\n",
				r.Term, r.CommitIndex, r.AppliedIndex, r.RecordsPerEntry, seconds(r.CommitP50), seconds(r.CommitP99))
		}
	}
	fmt.Fprintf(w, "version:     %s\nuptime:      %s\nheld keys:   %d of %d\nwaiters:     %d of %d\nconnections: %d of %d\ntoken mark:  %s\n",
		s.Version, (time.Duration(s.UptimeSeconds) * time.Second).String(),
		s.Keys, s.Limits.MaxKeys, s.Waiters, s.Limits.MaxWaiters, s.Connections, s.Limits.MaxConns, s.TokenLast)
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

// keyPath escapes key for /keys/{key...}: url.PathEscape leaves dots, and
// a key "." or ".." (or with such a segment) would be cleaned out of the
// path by the server's router.
func keyPath(key string) string {
	return strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}
