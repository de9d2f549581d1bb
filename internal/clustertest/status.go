package clustertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Status is a member's /status document: the fields the harness knows by
// name, and all of it in Raw. Numbers in Raw are json.Number (tokens and
// epochs may not fit a float64).
type Status struct {
	Role      string // "active" on a single node; the cluster modes add theirs
	Active    string // the active's (or leader's) address, when /status has "active" (or "leader")
	Epoch     uint64 // "epoch", a number or a decimal string, when present
	Addr      string
	Keys      int
	TokenLast uint64
	Raw       map[string]any
}

// Status reads the member's /status.
func (m *Member) Status() (Status, error) {
	url := m.AdminURL()
	if url == "" {
		return Status{}, fmt.Errorf("%w: member %d has no admin endpoint logged", ErrNotRunning, m.index)
	}
	resp, err := m.c.http.Get(url + "/status")
	if err != nil {
		return Status{}, fmt.Errorf("member %d: %w", m.index, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Status{}, fmt.Errorf("member %d: /status: %w", m.index, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Status{}, fmt.Errorf("member %d: /status: %s: %s", m.index, resp.Status, body)
	}
	return parseStatus(body)
}

func parseStatus(body []byte) (Status, error) {
	var raw map[string]any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&raw); err != nil {
		return Status{}, fmt.Errorf("clustertest: /status: %w", err)
	}
	s := Status{Raw: raw}
	str := func(k string) string { v, _ := raw[k].(string); return v }
	num := func(k string) uint64 {
		switch v := raw[k].(type) {
		case json.Number:
			n, _ := strconv.ParseUint(v.String(), 10, 64)
			return n
		case string:
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
		return 0
	}
	s.Role, s.Addr = str("role"), str("addr")
	if s.Active = str("active"); s.Active == "" {
		s.Active = str("leader")
	}
	s.Epoch, s.TokenLast = num("epoch"), num("token_last")
	s.Keys = int(num("keys"))
	return s, nil
}

// WaitStatus polls the member's /status every 20 ms until ok accepts it,
// for up to timeout (errors while the member starts or stalls count as not
// yet). It returns the accepted status, or the last one read and
// ErrTimeout.
func (m *Member) WaitStatus(timeout time.Duration, ok func(Status) bool) (Status, error) {
	deadline := time.Now().Add(timeout)
	var last Status
	var lastErr error
	for {
		s, err := m.Status()
		if err == nil {
			if ok(s) {
				return s, nil
			}
			last = s
		}
		lastErr = err
		if time.Now().After(deadline) {
			return last, fmt.Errorf("%w: member %d: no accepted /status in %v (last %+v, error %v)",
				ErrTimeout, m.index, timeout, last.Raw, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
