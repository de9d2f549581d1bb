package clustertest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// The cluster-level reads and waits, in the manner of hashicorp/raft's
// testing.go (Leader, "every member agrees"): the tests, the benchmark's
// cluster targets and chaos read the members' /status through these
// rather than a polling loop each.

// ErrNoLeader is a reading of the members' /status on which they do not
// agree on one member that serves.
var ErrNoLeader = errors.New("clustertest: no agreed leader")

// Among chooses the members a cluster-level read asks. A wait evaluates it
// afresh at every reading.
type Among func(*Member) bool

// Every asks every member: one that does not run, or does not answer,
// fails the reading ("every member agrees").
func Every(*Member) bool { return true }

// Running asks the members whose process runs, except those in skip
// (frozen members, whose admin endpoint cannot answer).
func Running(skip ...int) Among {
	return func(m *Member) bool { return m.Alive() && !slices.Contains(skip, m.index) }
}

// Statuses reads the /status of the members among asks, in --peers order
// (Status.Index says whose). The error names the first member that did not
// answer.
func (c *Cluster) Statuses(among Among) ([]Status, error) {
	var sts []Status
	for _, m := range c.Members() {
		if !among(m) {
			continue
		}
		st, err := m.Status()
		if err != nil {
			return nil, err
		}
		sts = append(sts, st)
	}
	return sts, nil
}

// Agreed returns the member that every status of sts agrees serves:
// exactly one says it serves (api.Serving: the active, or raft's leader),
// and every other names it as its active — by the member's address or by
// its entry in that member's --peers (a proxy). Otherwise it returns -1
// and an ErrNoLeader error that says why.
func (c *Cluster) Agreed(sts []Status) (int, error) {
	lead := -1
	for _, st := range sts {
		if !api.Serving(st.Role) {
			continue
		}
		if lead >= 0 {
			return -1, fmt.Errorf("%w: members %d and %d both serve", ErrNoLeader, lead, st.Index)
		}
		lead = st.Index
	}
	if lead < 0 {
		return -1, fmt.Errorf("%w: no member serves", ErrNoLeader)
	}
	addr := c.Member(lead).addr
	for _, st := range sts {
		if st.Index == lead || st.Active == addr {
			continue
		}
		if peers := c.Peers(st.Index); lead >= len(peers) || st.Active != peers[lead] {
			return -1, fmt.Errorf("%w: member %d (%s) names %q, not member %d", ErrNoLeader, st.Index, st.Role, st.Active, lead)
		}
	}
	return lead, nil
}

// Leader reads the statuses of the members among asks and returns the
// member they agree serves (Agreed).
func (c *Cluster) Leader(among Among) (int, error) {
	sts, err := c.Statuses(among)
	if err != nil {
		return -1, err
	}
	return c.Agreed(sts)
}

// WaitStatuses reads the statuses of the members among asks every 20 ms
// until ok accepts a reading (returns nil), for up to timeout, and returns
// that reading. A member that does not answer counts as not yet. On
// timeout the error wraps ErrTimeout and ok's last complaint (or the last
// read error) and sums up the last reading.
func (c *Cluster) WaitStatuses(timeout time.Duration, among Among, ok func([]Status) error) ([]Status, error) {
	var last, accepted []Status
	err := poll(timeout, func() error {
		sts, err := c.Statuses(among)
		if err != nil {
			return err
		}
		last = sts
		if err := ok(sts); err != nil {
			return err
		}
		accepted = sts
		return nil
	})
	if err != nil {
		var seen []string
		for i := range last {
			seen = append(seen, last[i].summary())
		}
		return nil, fmt.Errorf("%w: no accepted reading of /status in %v: %w; last reading: %s",
			ErrTimeout, timeout, err, strings.Join(seen, "; "))
	}
	return accepted, nil
}

// WaitLeader waits, as WaitStatuses, until the members among asks agree
// on the member that serves (Agreed), and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration, among Among) (int, error) {
	lead := -1
	_, err := c.WaitStatuses(timeout, among, func(sts []Status) error {
		var err error
		lead, err = c.Agreed(sts)
		return err
	})
	if err != nil {
		return -1, err
	}
	return lead, nil
}
