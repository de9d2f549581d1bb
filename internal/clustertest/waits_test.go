package clustertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// TestAgreed: one member serves and every other names it, by its address
// or by its entry in that member's --peers; anything else says why not.
func TestAgreed(t *testing.T) {
	c := &Cluster{plan: &plan{mode: ModePriority, client: []int{1, 2, 3}, link: [][]int{{0, 12, 13}, {21, 0, 23}, {31, 32, 0}}}}
	for i := range 3 {
		c.members = append(c.members, &Member{c: c, index: i, addr: hostPort(i + 1)})
	}
	st := func(i int, role, active string) Status {
		return Status{Index: i, Status: api.Status{Role: role, Active: active}}
	}
	a0, a2 := hostPort(1), hostPort(3)
	for _, tc := range []struct {
		name string
		sts  []Status
		want int
		why  string
	}{
		{"active named by address", []Status{st(0, api.RoleActive, a0), st(1, api.RoleStandby, a0), st(2, api.RoleStandby, a0)}, 0, ""},
		{"named through the proxies", []Status{st(0, api.RoleActive, a0), st(1, api.RoleStandby, hostPort(21)), st(2, api.RoleStandby, hostPort(31))}, 0, ""},
		{"a proxy of another member", []Status{st(0, api.RoleActive, a0), st(1, api.RoleStandby, hostPort(23))}, -1, `member 1 (standby) names "127.0.0.1:23", not member 0`},
		{"a standby that knows no active", []Status{st(0, api.RoleActive, a0), st(1, api.RoleStandby, "")}, -1, `member 1 (standby) names ""`},
		{"two serve", []Status{st(0, api.RoleActive, a0), st(1, api.RoleStandby, a0), st(2, api.RoleActive, a2)}, -1, "members 0 and 2 both serve"},
		{"none serves", []Status{st(0, api.RoleActiveChecking, a0), st(1, api.RoleStandby, a0)}, -1, "no member serves"},
		{"a raft leader", []Status{st(0, api.RoleFollower, a2), st(1, api.RoleFollower, hostPort(23)), st(2, api.RoleLeader, a2)}, 2, ""},
		{"the members asked only", []Status{st(1, api.RoleFollower, a2), st(2, api.RoleLeader, a2)}, 2, ""},
		{"no status", nil, -1, "no member serves"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Agreed(tc.sts)
			if got != tc.want || (tc.why == "") != (err == nil) {
				t.Fatalf("Agreed = %d, %v; want %d (%q)", got, err, tc.want, tc.why)
			}
			if err != nil && (!errors.Is(err, ErrNoLeader) || !strings.Contains(err.Error(), tc.why)) {
				t.Fatalf("error %q, want ErrNoLeader saying %q", err, tc.why)
			}
		})
	}
}

// statusDoc reads member m's /status into an api.Status with
// DisallowUnknownFields (a field lockd serves that api lacks fails) and
// checks that the type loses nothing either: encoded again, it is the
// document lockd served, field for field.
func statusDoc(t *testing.T, m *Member) api.Status {
	t.Helper()
	resp, err := m.c.http.Get(m.AdminURL() + api.PathStatus)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	strict := json.NewDecoder(bytes.NewReader(body))
	strict.DisallowUnknownFields()
	var doc api.Status
	if err := strict.Decode(&doc); err != nil {
		t.Fatalf("member %d's /status is not an api.Status: %v\n%s", m.index, err, body)
	}
	asMap := func(b []byte) (v map[string]any) {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	again, _ := json.Marshal(doc)
	if served, typed := asMap(body), asMap(again); !reflect.DeepEqual(served, typed) {
		t.Fatalf("member %d: the api type does not carry the document:\nserved %v\ntyped  %v", m.index, served, typed)
	}
	return doc
}

// TestWaitsPriority: on a proxied priority cluster (each member names the
// active through a proxy of its own) WaitLeader finds the first member,
// Every fails once a member is dead and Running leaves it out, a frozen
// member is skipped by name, and a wait that is never satisfied times out
// with why. Every member's /status is an api.Status, whole.
func TestWaitsPriority(t *testing.T) {
	c := Start(t, Options{Mode: ModePriority, Members: 3, Proxied: true})
	if lead, err := c.WaitLeader(15*time.Second, Every); err != nil || lead != 0 {
		t.Fatalf("WaitLeader: %d, %v", lead, err)
	}
	sts, err := c.WaitStatuses(15*time.Second, Every, func(sts []Status) error {
		for _, st := range sts[1:] {
			if !st.InSync {
				return errors.New("a standby is not in sync")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range sts {
		doc := statusDoc(t, c.Member(i))
		if st.Index != i || doc.Mode != api.ModePriority || len(doc.Members) != 2 || st.Addr != c.Member(i).Addr() {
			t.Fatalf("member %d: %+v", i, doc)
		}
		// The priority part, and "epoch" as it was before it.
		if p := doc.Priority; p == nil || p.Epoch == 0 || p.Epoch != doc.Epoch || doc.Raft != nil || i == 0 && p.SnapshotsSent < 2 {
			t.Fatalf("member %d: epoch %d, priority %+v, raft %+v", i, doc.Epoch, doc.Priority, doc.Raft)
		}
		if i > 0 && (st.Role != api.RoleStandby || st.Active != c.Peers(i)[0]) {
			t.Fatalf("standby %d names %q, want its proxy %s", i, st.Active, c.Peers(i)[0])
		}
	}
	if err := c.Member(0).Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leader(Every); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Leader(Every) with member 0 dead: %v", err)
	}
	if lead, err := c.WaitLeader(10*time.Second, Running()); err != nil || lead != 1 {
		t.Fatalf("WaitLeader(Running) after the kill: %d, %v", lead, err)
	}
	sts, err = c.Statuses(Running())
	if err != nil || len(sts) != 2 || sts[0].Index != 1 || sts[1].Index != 2 {
		t.Fatalf("Statuses(Running): %v %v", sts, err)
	}
	if err := c.Member(2).Stop(); err != nil {
		t.Fatal(err)
	}
	if lead, err := c.Leader(Running(2)); err != nil || lead != 1 {
		t.Fatalf("Leader(Running(2)) with member 2 frozen: %d, %v", lead, err)
	}
	if err := c.Member(2).Cont(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = c.WaitStatuses(100*time.Millisecond, Running(), func([]Status) error { return errors.New("never good enough") })
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "never good enough") || !strings.Contains(err.Error(), "member 1 ") {
		t.Fatalf("a wait never satisfied: %v", err)
	}
	if took := time.Since(began); took < 100*time.Millisecond || took > 5*time.Second {
		t.Fatalf("the 100 ms wait took %v", took)
	}
}

// TestWaitsRaft: a raft cluster agrees on its leader, whose /status (and
// every follower's) is an api.Status with its raft section; once the
// leader is killed the others agree on another.
func TestWaitsRaft(t *testing.T) {
	c := Start(t, Options{Mode: ModeRaft, Members: 3})
	lead, err := c.WaitLeader(15*time.Second, Every)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members() {
		doc := statusDoc(t, m)
		if doc.Mode != api.ModeRaft || doc.Raft == nil || doc.Raft.Term == 0 || doc.Raft.Term != doc.Epoch || doc.Priority != nil {
			t.Fatalf("member %d: %+v raft %+v", m.Index(), doc, doc.Raft)
		}
		if m.Index() == lead && doc.Role != api.RoleLeader {
			t.Fatalf("the agreed leader %d says %q", lead, doc.Role)
		}
	}
	if err := c.Member(lead).Kill(); err != nil {
		t.Fatal(err)
	}
	next, err := c.WaitLeader(15*time.Second, Running())
	if err != nil || next == lead {
		t.Fatalf("after killing leader %d: %d, %v", lead, next, err)
	}
	sts, err := c.Statuses(Running())
	if err != nil || len(sts) != 2 || slices.ContainsFunc(sts, func(st Status) bool { return st.Index == lead }) {
		t.Fatalf("Statuses(Running): %v %v", sts, err)
	}
}
