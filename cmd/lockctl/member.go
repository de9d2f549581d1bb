package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/client"
)

// The member commands: a raft cluster's membership through the admin
// endpoint (docs/ADMIN.md, "Members"; docs/CLUSTER.md, "Changing a raft
// cluster's members"). A change goes to the leader: lockctl asks the
// admin endpoints it knows for the one whose member leads, and follows a
// 421's leader (its client address's port + 1, lockd's default admin
// port) when --admin did not name one endpoint.

const memberLong = `member lists, adds and removes the members of a raft cluster (lockd
--cluster raft) through the admin endpoint; with lockd's --acl a change needs
an admin identity (--identity, --secret-file), a list a monitor.

A new member starts first, on an empty --data-dir, with --join and its own
--self; then "member add" with that --self. It catches up from the leader's
snapshot and log as a non-voter and becomes a voter once it has. "member
remove" takes a member's ID or client address; removing the leader hands the
leadership over first (nothing is lost) and lockctl asks the successor.

A priority cluster's members are its --peers: change them with a rolling
restart (docs/CLUSTER.md).`

func (a *app) memberCmd() *cobra.Command {
	m := a.group("member", "list, add and remove the members of a raft cluster", memberLong)
	m.Example = `  lockctl member list
  lockd --cluster raft --join --listen 10.0.0.4:7070 --peers 10.0.0.1:7070,10.0.0.2:7070,10.0.0.4:7070 --data-dir /var/lib/lockd &
  lockctl member add 10.0.0.4:7070
  lockctl member remove 10.0.0.3:7070`
	m.AddCommand(a.memberListCmd(), a.memberAddCmd(), a.memberRemoveCmd())
	return m
}

func (a *app) memberListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "show the raft configuration: every member's ID, addresses, vote, leader, liveness",
		Long: `list prints the raft configuration as the leader knows it (else as the first
member that answers knows it): each member's raft ID (its --peers index for the
members that bootstrapped the cluster, its client address for one added later),
client address, member port, whether it votes, leads and is live.

After a change, this is what every member's --peers should say (a raft member
reads --peers only at its first start: docs/CLUSTER.md).`,
		Example: `  lockctl member list
  lockctl --addr 10.0.0.1:7070 --addr 10.0.0.2:7070 member list -o json | jq -r '.members[].addr' | paste -sd,`,
		Args: args(0, "member list takes no arguments"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	ad := adminFlag(cmd, c)
	cmd.RunE = a.wrap(func(*cobra.Command, []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if err := c.finish(); err != nil {
			return err
		}
		ad.finish()
		base, err := ad.active(ad.addrs())
		if err != nil {
			return err
		}
		var ms api.Members
		if err := ad.getJSON(base+api.PathMembers, &ms); err != nil {
			return err
		}
		return o.result(a.stdout, membersText(&ms), &ms)
	})
	return cmd
}

func (a *app) memberAddCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "add ADDR",
		Short: "add a raft member started with --join: ADDR is its --self",
		Long: `add adds the member whose client address is ADDR — exactly its --self, which
becomes its raft ID. Start it first on an empty --data-dir with --join. The
leader adds it as a non-voter, waits up to --wait until it has caught up from
the snapshot and the log, then makes it a voter; the configuration after the
change is printed.

If it has not caught up in time it stays a non-voter (it counts in no majority):
add it again to wait more, or remove it. The leader refuses an add that would
make 8 voters, or a member already there.`,
		Example: `  lockctl member add 10.0.0.4:7070
  lockctl member add 10.0.0.4:7070 --wait 5m    # a large table`,
		Args: args(1, "member add takes the new member's ADDR (its --self)"),
	}
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "how long the leader waits for the new member to catch up, up to 10m")
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	ad := adminFlag(cmd, c)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if wait <= 0 || wait > 10*time.Minute {
			return usageErr("--wait %v: must be in (0, 10m]", wait)
		}
		if host, port, err := net.SplitHostPort(pos[0]); err != nil || host == "" || port == "" {
			return usageErr("ADDR %q: want host:port, the new member's --self", pos[0])
		}
		if err := c.finish(); err != nil {
			return err
		}
		ad.finish()
		ad.hc.Timeout = c.timeout + wait
		// The leader waits for the new member to catch up: say so, and
		// whether the member answers at all, rather than wait in silence.
		if err := a.probeMember(c, pos[0]); err != nil {
			a.warn("%s does not answer on its client port (%v): the leader will wait for it all the same; start it first, on an empty --data-dir, with --cluster raft --join --self %s", pos[0], err, pos[0])
		}
		a.out.message(a.stderr, "info", fmt.Sprintf("adding %s: the leader waits up to %v (--wait) for it to catch up from its snapshot and log, then makes it a voter", pos[0], wait), 0)
		body, _ := json.Marshal(api.AddMember{Addr: pos[0]})
		var ch api.MemberChange
		if err := ad.change(http.MethodPost, api.PathMembers+"?wait="+url.QueryEscape(wait.String()), body, &ch); err != nil {
			return err
		}
		return o.result(a.stdout, "added "+memberName(&ch.Member)+"\n\n"+membersText(&ch.Members), &ch)
	})
	return cmd
}

func (a *app) memberRemoveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "remove ID|ADDR",
		Short: "remove a raft member by its ID or client address",
		Long: `remove removes a member from the raft configuration, by its raft ID or its client
address (member list shows both). Removing the leader hands the leadership over
first, as a SIGTERM does, and the successor removes it. Stop the removed member
afterwards if it still runs: it serves nothing.

The leader refuses a removal after which the live voters would not be a
majority (the change could never commit and the cluster would stop): remove
the members that are down first.`,
		Example: `  lockctl member remove 2
  lockctl member remove 10.0.0.3:7070`,
		Args: args(1, "member remove takes a member's ID or ADDR"),
	}
	o := a.outputFlag(cmd)
	c := connFlags(cmd)
	ad := adminFlag(cmd, c)
	cmd.RunE = a.wrap(func(_ *cobra.Command, pos []string) error {
		if err := a.checkOutput(o); err != nil {
			return err
		}
		if pos[0] == "" || strings.ContainsAny(pos[0], "/?#") {
			return usageErr("%q: want a member's ID or host:port", pos[0])
		}
		if err := c.finish(); err != nil {
			return err
		}
		ad.finish()
		var ch api.MemberChange
		if err := ad.change(http.MethodDelete, api.PathMembers+"/"+url.PathEscape(pos[0]), nil, &ch); err != nil {
			return err
		}
		return o.result(a.stdout, "removed "+memberName(&ch.Member)+"\n\n"+membersText(&ch.Members), &ch)
	})
	return cmd
}

// probeMember pings addr, a new member's client address, with the
// command's connection settings: a member started with --join answers
// pings before it is added.
func (a *app) probeMember(c *conn, addr string) error {
	pc := *c
	pc.addrs = []string{addr}
	cfg := pc.config()
	cfg.ConnsPerAddr = 1
	cl, err := client.New(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), min(c.timeout, 3*time.Second))
	defer cancel()
	_, err = cl.Ping(ctx)
	if cause := errors.Unwrap(err); cause != nil && errors.Is(err, client.ErrNoConnection) {
		err = cause
	}
	return err
}

// memberName is "ID (addr)", or the address when it is the ID.
func memberName(m *api.RaftMember) string {
	if m.ID == m.Addr {
		return m.Addr
	}
	return m.ID + " (" + m.Addr + ")"
}

func membersText(ms *api.Members) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tMEMBER PORT\tVOTER\tLEADER\tLIVE")
	yes := func(v bool) string {
		if v {
			return "yes"
		}
		return "no"
	}
	for _, m := range ms.Members {
		live := "?"
		if m.Live != nil {
			live = yes(*m.Live)
		}
		id := m.ID
		if m.Self {
			id += " *"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, m.Addr, m.MemberAddr, yes(m.Voter), yes(m.Leader), live)
	}
	tw.Flush()
	fmt.Fprintf(&b, "(* the member that answered; configuration index %d)\n", ms.Index)
	return b.String()
}

// notLeaderErr is a 421: the member asked does not lead.
type notLeaderErr struct {
	admin  string
	leader string
}

func (e *notLeaderErr) Error() string {
	if e.leader == "" {
		return "admin endpoint " + e.admin + ": its member does not lead and knows no leader yet (an election): try again shortly"
	}
	return "admin endpoint " + e.admin + ": its member does not lead; the leader is " + e.leader
}

// change sends a membership change to the leader: first to the admin
// endpoint whose member says it serves, then, on a 421, to the one of the
// leader it names (its client port + 1) — unless --admin named one
// endpoint — a few times, since removing the leader names its successor.
func (ad *admin) change(method, path string, body []byte, v any) error {
	base := ad.base(ad.addr)
	if ad.addr == "" {
		var err error
		if base, err = ad.active(ad.addrs()); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		err := ad.send(method, base+path, body, v)
		var nl *notLeaderErr
		if !errors.As(err, &nl) || attempt >= 4 {
			return err
		}
		if nl.leader == "" {
			time.Sleep(500 * time.Millisecond) // an election
			if ad.addr == "" {
				if base, err = ad.active(ad.addrs()); err != nil {
					return err
				}
			}
			continue
		}
		if ad.addr != "" {
			return fmt.Errorf("%w: give --admin its admin endpoint", err)
		}
		next, ok := adminOf(nl.leader)
		if !ok {
			return err
		}
		base = ad.base(next)
	}
}

// adminOf is lockd's default admin address for a client address: its
// port + 1.
func adminOf(addr string) (string, bool) {
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || p < 1 || p >= 65535 {
		return "", false
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), true
}

// send makes one change request and decodes its answer into v.
func (ad *admin) send(method, u string, body []byte, v any) error {
	resp, err := ad.do(method, u, body, "an admin identity")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("admin endpoint: bad answer: %v", err)
		}
		return nil
	case http.StatusMisdirectedRequest:
		var nl api.NotLeader
		_ = json.Unmarshal(b, &nl)
		return &notLeaderErr{admin: u, leader: nl.Leader}
	}
	msg := errorBody(b)
	if resp.StatusCode == http.StatusBadRequest {
		return usageError(msg)
	}
	return fmt.Errorf("%s: %s", resp.Status, msg)
}
