package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/repl"
)

// memberNode is a single node that also answers the membership calls as a
// test scripts them (admin sees only repl.Membership).
type memberNode struct {
	*repl.Local
	mu     sync.Mutex
	calls  []string
	err    error // what AddMember and RemoveMember return
	config api.Members
}

func (m *memberNode) Members() (api.Members, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "list")
	return m.config, nil
}

func (m *memberNode) AddMember(_ context.Context, addr string, wait time.Duration) (api.MemberChange, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, fmt.Sprintf("add %s %v", addr, wait))
	if m.err != nil {
		return api.MemberChange{}, m.err
	}
	r := api.RaftMember{ID: addr, Addr: addr, Voter: true}
	m.config.Members = append(m.config.Members, r)
	return api.MemberChange{Member: r, Members: m.config}, nil
}

func (m *memberNode) RemoveMember(_ context.Context, who string) (api.MemberChange, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "remove "+who)
	if m.err != nil {
		return api.MemberChange{}, m.err
	}
	return api.MemberChange{Member: api.RaftMember{ID: who}, Members: m.config}, nil
}

func (m *memberNode) lastCall() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.calls) == 0 {
		return ""
	}
	return m.calls[len(m.calls)-1]
}

// call makes a request with an optional JSON body and basic
// authentication, returning the status and body.
func (f *fixture) call(method, path, body, user, pass string) (int, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, f.http.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if user != "" {
		r.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestMembersEndpoint: GET, POST and DELETE /members reach the node's
// Membership with what the request says, and its errors come back as the
// documented statuses (docs/ADMIN.md, "Members"); a single node answers
// 404 (nothing changes).
func TestMembersEndpoint(t *testing.T) {
	node := &memberNode{Local: repl.NewLocal(repl.LocalConfig{DataDir: t.TempDir()}),
		config: api.Members{Leader: "127.0.0.1:7070", Index: 9, Members: []api.RaftMember{{ID: "0", Addr: "127.0.0.1:7070", Voter: true, Leader: true, Self: true}}}}
	f := setupWith(t, func(c *engine.Config) { c.Node = node })
	var ms api.Members
	if code := f.get(api.PathMembers, &ms); code != 200 || ms.Index != 9 || len(ms.Members) != 1 || ms.Members[0].ID != "0" {
		t.Fatalf("GET /members: %d %+v", code, ms)
	}
	tests := []struct {
		name, method, path, body string
		err                      error
		code                     int
		call                     string
	}{
		{"add", "POST", "/members", `{"addr": "127.0.0.1:7100"}`, nil, 200, "add 127.0.0.1:7100 1m0s"},
		{"add with wait", "POST", "/members?wait=5s", `{"addr": "127.0.0.1:7100"}`, nil, 200, "add 127.0.0.1:7100 5s"},
		{"add, bad wait", "POST", "/members?wait=20m", `{"addr": "127.0.0.1:7100"}`, nil, 400, ""},
		{"add, no body", "POST", "/members", ``, nil, 400, ""},
		{"add, unknown field", "POST", "/members", `{"address": "x"}`, nil, 400, ""},
		{"add on a follower", "POST", "/members", `{"addr": "127.0.0.1:7100"}`, &repl.NotLeaderError{Leader: "127.0.0.1:7080"}, 421, "add 127.0.0.1:7100 1m0s"},
		{"add, bad address", "POST", "/members", `{"addr": "x"}`, fmt.Errorf("%w: x", repl.ErrBadMember), 400, "add x 1m0s"},
		{"add, exists", "POST", "/members", `{"addr": "127.0.0.1:7070"}`, repl.ErrMemberExists, 409, "add 127.0.0.1:7070 1m0s"},
		{"add, full", "POST", "/members", `{"addr": "127.0.0.1:7100"}`, repl.ErrMembersFull, 409, "add 127.0.0.1:7100 1m0s"},
		{"add, not caught up", "POST", "/members", `{"addr": "127.0.0.1:7100"}`, repl.ErrNotCaughtUp, 504, "add 127.0.0.1:7100 1m0s"},
		{"remove", "DELETE", "/members/1", "", nil, 200, "remove 1"},
		{"remove by address", "DELETE", "/members/127.0.0.1:7080", "", nil, 200, "remove 127.0.0.1:7080"},
		{"remove, none", "DELETE", "/members/9", "", repl.ErrNoMember, 404, "remove 9"},
		{"remove, quorum at risk", "DELETE", "/members/1", "", repl.ErrQuorumAtRisk, 409, "remove 1"},
		{"remove the leader: successor named", "DELETE", "/members/0", "", &repl.NotLeaderError{Leader: "127.0.0.1:7080"}, 421, "remove 0"},
		{"remove, raft failed", "DELETE", "/members/1", "", fmt.Errorf("raft: timed out"), 503, "remove 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node.mu.Lock()
			node.err, node.calls = tc.err, nil
			node.mu.Unlock()
			code, body := f.call(tc.method, tc.path, tc.body, "", "")
			if code != tc.code {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.code)
			}
			if got := node.lastCall(); got != tc.call {
				t.Fatalf("the node was asked %q, want %q", got, tc.call)
			}
			d := json.NewDecoder(bytes.NewReader(body))
			d.DisallowUnknownFields()
			switch code {
			case 200:
				var ch api.MemberChange
				if err := d.Decode(&ch); err != nil {
					t.Fatalf("answer %s: %v", body, err)
				}
			case 421:
				var nl api.NotLeader
				if err := d.Decode(&nl); err != nil || nl.Leader != "127.0.0.1:7080" {
					t.Fatalf("421 answer %s: %v", body, err)
				}
			default:
				var e api.Error
				if err := d.Decode(&e); err != nil || e.Error == "" {
					t.Fatalf("%d answer %s: %v", code, body, err)
				}
			}
		})
	}
	// The configuration is in /status's raft block for a raft node; here
	// the lockd_raft_members metric is absent (a single node).
	if _, ok := f.scrape()["lockd_raft_members"]; ok {
		t.Fatal("a single node exports lockd_raft_members")
	}
}

// TestMembersEndpointSingleNode: without a Membership node every /members
// path is 404, and nothing changes.
func TestMembersEndpointSingleNode(t *testing.T) {
	f := setup(t)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/members", ""}, {"POST", "/members", `{"addr": "127.0.0.1:7100"}`}, {"DELETE", "/members/1", ""},
	} {
		if code, body := f.call(c.method, c.path, c.body, "", ""); code != 404 || !strings.Contains(string(body), "--cluster raft") {
			t.Fatalf("%s %s on a single node: %d %s", c.method, c.path, code, body)
		}
	}
}

// TestMembersEndpointAuth: with --acl a change needs an admin identity, a
// read a monitor (PROTOCOL.md §8.5).
func TestMembersEndpointAuth(t *testing.T) {
	node := &memberNode{Local: repl.NewLocal(repl.LocalConfig{DataDir: t.TempDir()})}
	f := setupWith(t, func(c *engine.Config) { c.Node = node; c.ACL = parseACL(t, aclText) })
	for _, c := range []struct {
		method, path, body, user, pass string
		code                           int
	}{
		{"GET", "/members", "", "", "", 401},
		{"GET", "/members", "", "orders", "orders-secret", 403},
		{"GET", "/members", "", "prom", "prom-secret", 200},
		{"POST", "/members", `{"addr": "127.0.0.1:7100"}`, "", "", 401},
		{"POST", "/members", `{"addr": "127.0.0.1:7100"}`, "prom", "prom-secret", 403},
		{"POST", "/members", `{"addr": "127.0.0.1:7100"}`, "ops", "ops-secret", 200},
		{"DELETE", "/members/1", "", "prom", "prom-secret", 403},
		{"DELETE", "/members/1", "", "ops", "ops-secret", 200},
	} {
		node.mu.Lock()
		node.calls = nil
		node.mu.Unlock()
		code, body := f.call(c.method, c.path, c.body, c.user, c.pass)
		if code != c.code {
			t.Fatalf("%s %s as %q: %d %s, want %d", c.method, c.path, c.user, code, body, c.code)
		}
		if c.code != 200 && c.method != "GET" && node.lastCall() != "" {
			t.Fatalf("%s %s as %q refused, but the node was asked %q", c.method, c.path, c.user, node.lastCall())
		}
	}
}
