package clustertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/freeport"
)

// Membership changes: members started after the cluster, command
// lines that change between starts (a rolling change of --peers), one-off
// flags (a forced recovery), and the admin endpoint's JSON requests.

// AddMember starts one more lockd process on a fresh port pair and data
// dir (m<N>, N its index), in the cluster's mode and with the harness's
// flags: --peers as peers gives it (self is the new member's address),
// then Options.ExtraArgs, then extra (--join, say). It is not proxied. It
// returns the member once it logged that it is ready; on failure nothing
// of it is left running.
func (c *Cluster) AddMember(peers func(self string) []string, extra ...string) (*Member, error) {
	m, err := c.NewMember(peers, extra...)
	if err != nil {
		return nil, err
	}
	if err := m.Start(); err != nil {
		_ = m.Kill()
		return nil, err
	}
	return m, nil
}

// NewMember is AddMember without the start: the member has its address,
// data dir and command line, and starts with Member.Start (a test that
// needs the new member's address before it runs: to give it to a client,
// or to the others' --peers).
func (c *Cluster) NewMember(peers func(self string) []string, extra ...string) (*Member, error) {
	if c.plan.mode == ModeSingle {
		return nil, fmt.Errorf("%w: AddMember needs a cluster mode", ErrBadOptions)
	}
	ports, err := freeport.Pick(1, c.plan.offset, c.plan.http)
	if err != nil {
		return nil, err
	}
	self := hostPort(ports[0])
	c.mu.Lock()
	i := len(c.members)
	d := filepath.Join(c.dir, fmt.Sprintf("m%d", i))
	m := &Member{c: c, index: i, dir: d, logs: newLogBuf(), addr: self, memberAddr: hostPort(ports[0] + c.plan.offset),
		args: c.plan.argsOf(self, peers(self), d, c.opts.LogFormat, append(slices.Clone(c.opts.ExtraArgs), extra...))}
	c.members = append(c.members, m)
	c.mu.Unlock()
	if err := os.RemoveAll(d); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	return m, nil
}

// Peers is the member's --peers as its next start will have it.
func (m *Member) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.args, "--peers"); i >= 0 && i+1 < len(m.args) {
		return strings.Split(m.args[i+1], ",")
	}
	return nil
}

// SetPeers changes the member's --peers for its next start (a rolling
// change of the membership: Term, SetPeers, Restart).
func (m *Member) SetPeers(peers []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.args, "--peers"); i >= 0 && i+1 < len(m.args) {
		m.args[i+1] = strings.Join(peers, ",")
	}
}

// RestartWith is Restart with extra added to the command line of this
// start only (--force-new-cluster, say).
func (m *Member) RestartWith(extra ...string) error {
	m.mu.Lock()
	m.once = slices.Clone(extra)
	m.mu.Unlock()
	return m.Restart()
}

// ErrAdmin is an admin endpoint's answer other than 200: its status code
// and body are in the message (AdminError has them).
var ErrAdmin = errors.New("clustertest: admin endpoint refused")

// AdminError is an admin endpoint's answer other than 200.
type AdminError struct {
	Code int
	Body string
}

func (e *AdminError) Error() string { return fmt.Sprintf("%v: %d %s", ErrAdmin, e.Code, e.Body) }

// Unwrap makes errors.Is(err, ErrAdmin) hold.
func (e *AdminError) Unwrap() error { return ErrAdmin }

// Admin makes an admin endpoint request of the member: body (if not nil)
// is sent as JSON, a 200's JSON answer decoded into v (if not nil); any
// other status is an *AdminError. It waits at most timeout.
func (m *Member) Admin(method, path string, body, v any, timeout time.Duration) error {
	url := m.AdminURL()
	if url == "" || !m.Alive() {
		return fmt.Errorf("%w: member %d", ErrNotRunning, m.index)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url+path, rd)
	if err != nil {
		return err
	}
	hc := *m.c.http
	hc.Timeout = timeout
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("member %d: %s %s: %w", m.index, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("member %d: %s %s: %w", m.index, method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("member %d: %s %s: %w", m.index, method, path, &AdminError{Code: resp.StatusCode, Body: string(b)})
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("member %d: %s %s: %w in %s", m.index, method, path, err, b)
		}
	}
	return nil
}
