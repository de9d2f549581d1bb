package api_test

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockd-dev/lockd/api"
)

// encode is admin's encoding: indented, one document and a newline.
func encode(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestWireNames: every field, filled, encodes to the bytes of testdata/,
// which were written by the admin endpoint's own types before they moved
// here; each golden file decodes into its type with no unknown field and
// encodes back to itself. A renamed, dropped or reordered field fails.
func TestWireNames(t *testing.T) {
	full := api.Status{Version: "v1.2.3", Role: api.RoleStandby, Addr: "127.0.0.1:7070", UptimeSeconds: 12.5, Draining: true,
		Keys: 3, Waiters: 4, Connections: 5, SharedHolders: 16, Watches: 17,
		TokenLast: "18446744073709551615", TokenReserved: "18446744073709551614",
		Limits: api.Limits{MaxKey: 1024, MaxKeys: 16777216, MaxWaitersPerKey: 4096, MaxWaiters: 1048576, MaxConns: 100000,
			MaxOutbound: 4194304, Loops: 2, MaxHolders: 1048576, MaxWatchesPerConn: 1024},
		Mode: api.ModePriority, Active: "127.0.0.1:7080", Leader: "127.0.0.1:7080", Epoch: 7, InSync: true, LagSeconds: 0.001,
		Members: []api.Member{{Addr: "127.0.0.1:7080", Role: api.RoleActive, Live: true, Unobserved: true, InSync: true, LagSeconds: 0.002,
			LagRecords: 6, LagBytes: 7}},
		Priority: &api.PriorityStatus{Epoch: 7, Failovers: 19, Handovers: 20, Demotions: 21, SnapshotsSent: 22, SnapshotsReceived: 23},
		Raft: &api.RaftStatus{Term: 8, CommitIndex: 9, AppliedIndex: 10, Entries: 11, RecordsPerEntry: 1.5,
			CommitP50Seconds: 0.0003, CommitP99Seconds: 0.004, Snapshots: 12, LastSnapshotBytes: 13, Elections: 14, Rebuilds: 15}}
	live := true
	members := api.Members{Leader: "127.0.0.1:7070", Index: 14, Members: []api.RaftMember{
		{ID: "0", Addr: "127.0.0.1:7070", MemberAddr: "127.0.0.1:17070", Voter: true, Leader: true, Self: true, Live: &live},
		{ID: "2", Addr: "127.0.0.1:7090", MemberAddr: "127.0.0.1:17090", Voter: true},
		{ID: "127.0.0.1:7100", Addr: "127.0.0.1:7100", MemberAddr: "127.0.0.1:17100"},
	}}
	cases := []struct {
		file string
		v    any
		into func() any
	}{
		{"status.json", full, func() any { return new(api.Status) }},
		{"status-single.json", api.Status{Version: "v", Role: api.RoleActive, Mode: api.ModeSingle, TokenLast: "1", TokenReserved: "2"},
			func() any { return new(api.Status) }},
		{"key-held.json", api.Key{Key: "a/b", Held: true, Token: "99", LeaseLeftMs: 1234, Waiters: 2}, func() any { return new(api.Key) }},
		{"key-free.json", api.Key{Key: "free"}, func() any { return new(api.Key) }},
		{"key-identity.json", api.Key{Key: "orders/1", Held: true, Token: "99", LeaseLeftMs: 1234, Identity: "orders"},
			func() any { return new(api.Key) }},
		{"release.json", api.Release{Key: "orders/1", Released: true, Token: "99", Identity: "orders"},
			func() any { return new(api.Release) }},
		{"key-shared.json", api.Key{Key: "sem", Held: true, Token: "101", LeaseLeftMs: 900, Waiters: 2, Identity: "ops", Limit: 3, Shared: true,
			Holders: []api.KeyHolder{{Token: "100", Identity: "orders", LeaseLeftMs: 800}, {Token: "101", Identity: "ops", LeaseLeftMs: 900}},
			Queue: []api.KeyWaiter{{Owner: "7", Identity: "orders", WaitLeftMs: 5000, LeaseSeconds: 30},
				{Owner: "18446744073709551615", WaitLeftMs: 0, Shared: true, Limit: 3, LeaseSeconds: 10}}},
			func() any { return new(api.Key) }},
		{"release-shared.json", api.Release{Key: "sem", Released: true, Token: "101", Identity: "ops",
			Holders: []api.ReleasedGrant{{Token: "100", Identity: "orders"}, {Token: "101", Identity: "ops"}}},
			func() any { return new(api.Release) }},
		{"error.json", api.Error{Error: "missing key: GET /keys/{key}"}, func() any { return new(api.Error) }},
		{"status-raft-configuration.json", api.Status{Version: "v", Role: api.RoleLeader, Mode: api.ModeRaft, TokenLast: "1", TokenReserved: "2",
			Raft: &api.RaftStatus{Term: 3, Configuration: members.Members}}, func() any { return new(api.Status) }},
		{"members.json", members, func() any { return new(api.Members) }},
		{"add-member.json", api.AddMember{Addr: "127.0.0.1:7100"}, func() any { return new(api.AddMember) }},
		{"member-change.json", api.MemberChange{Member: members.Members[2], Members: members}, func() any { return new(api.MemberChange) }},
		{"not-leader.json", api.NotLeader{Error: "not the leader", Leader: "127.0.0.1:7070"}, func() any { return new(api.NotLeader) }},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			golden, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if got := encode(t, tc.v); !bytes.Equal(got, golden) {
				t.Fatalf("encodes as\n%s\nwant\n%s", got, golden)
			}
			into := tc.into()
			d := json.NewDecoder(bytes.NewReader(golden))
			d.DisallowUnknownFields()
			if err := d.Decode(into); err != nil {
				t.Fatal(err)
			}
			if got := encode(t, into); !bytes.Equal(got, golden) {
				t.Fatalf("round trip:\n%s\nwant\n%s", got, golden)
			}
		})
	}
}

// TestNames pins the role and mode names: they are on the wire.
func TestNames(t *testing.T) {
	for got, want := range map[string]string{
		api.ModeSingle: "single", api.ModePriority: "priority", api.ModeRaft: "raft",
		api.RoleActive: "active", api.RoleActiveChecking: "active-checking", api.RoleHandingOver: "handing-over",
		api.RoleLeaving: "leaving", api.RoleStandby: "standby",
		api.RoleLeader: "leader", api.RoleFollower: "follower", api.RoleCandidate: "candidate",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
	for role, serving := range map[string]bool{
		api.RoleActive: true, api.RoleLeader: true,
		api.RoleActiveChecking: false, api.RoleHandingOver: false, api.RoleLeaving: false, api.RoleStandby: false,
		api.RoleFollower: false, api.RoleCandidate: false, "": false,
	} {
		if api.Serving(role) != serving {
			t.Errorf("Serving(%q) = %v", role, !serving)
		}
		if st := (api.Status{Role: role}); st.Serving() != serving {
			t.Errorf("Status{Role: %q}.Serving() = %v", role, !serving)
		}
	}
}

// TestRoles: every role of a mode is listed once, and each role belongs
// to one mode (single and priority share active).
func TestRoles(t *testing.T) {
	all := map[string]bool{}
	for _, mode := range []string{api.ModeSingle, api.ModePriority, api.ModeRaft} {
		roles := api.Roles(mode)
		seen := map[string]bool{}
		for _, r := range roles {
			if seen[r] {
				t.Errorf("%s lists %s twice", mode, r)
			}
			seen[r], all[r] = true, true
		}
		if len(roles) == 0 {
			t.Errorf("no roles for %s", mode)
		}
	}
	for _, r := range []string{api.RoleActive, api.RoleActiveChecking, api.RoleHandingOver, api.RoleLeaving, api.RoleStandby,
		api.RoleLeader, api.RoleFollower, api.RoleCandidate} {
		if !all[r] {
			t.Errorf("role %s in no mode's list", r)
		}
	}
	if api.Roles("nonsense") != nil {
		t.Error("roles for an unknown mode")
	}
}

// TestKeyPath: every key comes back whole through a path the router
// cleans (".", ".." and their segments would be removed unescaped).
func TestKeyPath(t *testing.T) {
	for _, key := range []string{"a", "dir/a b", ".", "..", "a/../b", "./x", "100%", "k?q=1#f", "ü/ß"} {
		p := api.PathKeys + api.KeyPath(key)
		u, err := url.Parse("http://h" + p)
		if err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		// What a cleaning router sees: no "." or ".." segment.
		for _, seg := range bytes.Split([]byte(u.EscapedPath()), []byte("/")) {
			if s := string(seg); s == "." || s == ".." {
				t.Fatalf("%q: path %s has a %q segment", key, p, s)
			}
		}
		if got, _ := url.PathUnescape(api.KeyPath(key)); got != key {
			t.Fatalf("%q: unescapes to %q", key, got)
		}
	}
}
