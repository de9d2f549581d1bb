package clustertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/wait"
)

// pollEvery is how often the waits read /status.
const pollEvery = 20 * time.Millisecond

// Status is a member's /status: the document in lockd's api types, whose
// fields it promotes (st.Role, st.Active, st.InSync, st.Raft, …), what the
// harness adds, and all of it in Raw.
type Status struct {
	api.Status
	// Index is the member's position in --peers.
	Index int
	// TokenLast is api.Status.TokenLast (a decimal string, which it
	// shadows) as a number.
	TokenLast uint64
	// Raw is the document as parsed, numbers as json.Number: for checks
	// of the JSON itself, and for a binary other than lockd (the tests'
	// fakelockd) whose fields api does not know.
	Raw map[string]any
}

// Status reads the member's /status. A member whose process has ended is
// ErrNotRunning at once.
func (m *Member) Status() (Status, error) {
	url := m.AdminURL()
	switch {
	case url == "":
		return Status{}, fmt.Errorf("%w: member %d has no admin endpoint logged", ErrNotRunning, m.index)
	case !m.Alive():
		return Status{}, fmt.Errorf("%w: member %d has ended", ErrNotRunning, m.index)
	}
	resp, err := m.c.http.Get(url + api.PathStatus)
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
	s, err := parseStatus(body)
	if err != nil {
		return Status{}, fmt.Errorf("member %d: %w", m.index, err)
	}
	s.Index = m.index
	return s, nil
}

// parseStatus decodes a /status body. A field of another type than api's
// is left zero and the rest decoded (encoding/json's documented behaviour
// for an UnmarshalTypeError); for another binary's document, an "epoch"
// given as a decimal string and a "leader" in place of "active" are read
// too.
func parseStatus(body []byte) (Status, error) {
	var s Status
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&s.Raw); err != nil {
		return Status{}, fmt.Errorf("clustertest: /status: %w", err)
	}
	var typeErr *json.UnmarshalTypeError
	if err := json.Unmarshal(body, &s.Status); err != nil && !errors.As(err, &typeErr) {
		return Status{}, fmt.Errorf("clustertest: /status: %w", err)
	}
	s.TokenLast, _ = strconv.ParseUint(s.Status.TokenLast, 10, 64)
	if s.Active == "" {
		s.Active, _ = s.Raw["leader"].(string)
	}
	if e, ok := s.Raw["epoch"].(string); ok {
		s.Epoch, _ = strconv.ParseUint(e, 10, 64)
	}
	return s, nil
}

// summary is the gist of s for an error message.
func (s *Status) summary() string {
	out := fmt.Sprintf("member %d %s %s", s.Index, s.Addr, s.Role)
	if s.Mode != "" && s.Mode != api.ModeSingle {
		out += fmt.Sprintf(" (epoch %d, active %q", s.Epoch, s.Active)
		if s.InSync {
			out += ", in sync"
		}
		if r := s.Raft; r != nil {
			out += fmt.Sprintf(", commit %d, applied %d", r.CommitIndex, r.AppliedIndex)
		}
		out += ")"
	}
	return out
}

// errNotYet is a poll's "read, but not accepted".
var errNotYet = errors.New("clustertest: not accepted yet")

// poll calls try every pollEvery until it returns nil or timeout has
// passed, and returns try's last answer.
func poll(timeout time.Duration, try func() error) error { return wait.Until(timeout, pollEvery, try) }

// WaitStatus polls the member's /status every 20 ms until ok accepts it,
// for up to timeout (errors while the member starts or stalls count as not
// yet). It returns the accepted status, or the last one read and
// ErrTimeout.
func (m *Member) WaitStatus(timeout time.Duration, ok func(Status) bool) (Status, error) {
	var last Status
	var lastErr error
	err := poll(timeout, func() error {
		s, err := m.Status()
		if lastErr = err; err != nil {
			return err
		}
		last = s
		if ok(s) {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		return last, fmt.Errorf("%w: member %d: no accepted /status in %v (last %+v, error %v)",
			ErrTimeout, m.index, timeout, last.Raw, lastErr)
	}
	return last, nil
}
