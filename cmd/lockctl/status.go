package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	base := "http://" + c.admin
	if len(pos) == 1 {
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
	var s statusDoc
	if err := getJSON(hc, base+"/status", &s); err != nil {
		return err
	}
	state := "serving"
	if s.Draining {
		state = "shutting down"
	}
	fmt.Fprintf(stdout, "server:      %s (%s, %s)\nversion:     %s\nuptime:      %s\nheld keys:   %d of %d\nwaiters:     %d of %d\nconnections: %d of %d\ntoken mark:  %s\n",
		s.Addr, s.Role, state, s.Version, (time.Duration(s.UptimeSeconds) * time.Second).String(),
		s.Keys, s.Limits.MaxKeys, s.Waiters, s.Limits.MaxWaiters, s.Connections, s.Limits.MaxConns, s.TokenLast)
	return nil
}

func getJSON(hc *http.Client, u string, v any) error {
	resp, err := hc.Get(u)
	if err != nil {
		return fmt.Errorf("admin endpoint: %v (is lockd running with --admin? set --admin or LOCKD_ADMIN)", err)
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
