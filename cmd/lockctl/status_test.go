package main

import (
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/api"
)

// TestPrintStatus: lockctl status shows what /status carries, for each
// kind of node: the limits and the reservation mark everywhere, a
// standby's sync, a raft member's log, the other members.
func TestPrintStatus(t *testing.T) {
	limits := api.Limits{MaxKey: 512, MaxKeys: 1000, MaxWaitersPerKey: 7, MaxWaiters: 2000, MaxConns: 30, MaxOutbound: 65536, Loops: 3}
	cases := []struct {
		name string
		st   api.Status
		want []string
	}{
		{"single", api.Status{Version: "v9", Role: api.RoleActive, Addr: "127.0.0.1:7070", Mode: api.ModeSingle, Keys: 4,
			TokenLast: "41", TokenReserved: "64", Limits: limits},
			[]string{"server:      127.0.0.1:7070 (active, serving)", "version:     v9", "held keys:   4 of 1000",
				"waiters:     0 of 2000 (7 per key)", "connections: 0 of 30", "token mark:  41 (reserved to 64)",
				"keys of up to 512 B", "65536 B of answers buffered per connection", "3 event loops"}},
		{"standby", api.Status{Role: api.RoleStandby, Mode: api.ModePriority, Epoch: 5, Active: "a:1", InSync: true, Draining: true,
			LagSeconds: 0.002, Limits: limits, Members: []api.Member{{Addr: "a:1", Role: api.RoleActive, Live: true}}},
			[]string{"(standby, shutting down)", "cluster:     priority, epoch 5, active a:1", "sync:        in sync true, lag 2ms",
				"members:", "a:1", "live"}},
		{"standby, the epoch from its part", api.Status{Role: api.RoleStandby, Mode: api.ModePriority, Epoch: 5, Limits: limits,
			Priority: &api.PriorityStatus{Epoch: 6}}, []string{"cluster:     priority, epoch 6, active (none)"}},
		{"raft follower, the term from its part", api.Status{Role: api.RoleFollower, Mode: api.ModeRaft, Limits: limits,
			Raft: &api.RaftStatus{Term: 9}}, []string{"cluster:     raft, term 9, leader (none)"}},
		{"active", api.Status{Role: api.RoleActive, Mode: api.ModePriority, Limits: limits, Members: []api.Member{
			{Addr: "b:2", Role: api.RoleStandby, Live: true, InSync: true, LagSeconds: 0.001, LagRecords: 3, LagBytes: 99},
			{Addr: "c:3"}}},
			[]string{"active (none)", "b:2", "standby      live, in sync, lag 1ms (3 records, 99 B)", "c:3", "(none)       down"}},
		{"raft follower", api.Status{Role: api.RoleFollower, Mode: api.ModeRaft, Epoch: 8, Active: "a:1", InSync: true, Limits: limits,
			Members: []api.Member{{Addr: "a:1", Role: api.RoleLeader, Live: true}, {Addr: "c:3", Role: api.RoleFollower, Unobserved: true}}},
			[]string{"(follower, not serving: answers M)", "cluster:     raft, term 8, leader a:1", "a:1                   leader       live",
				"c:3                   follower     not observed from here"}},
		{"raft leader", api.Status{Role: api.RoleLeader, Mode: api.ModeRaft, Epoch: 8, Limits: limits,
			Raft: &api.RaftStatus{Term: 8, CommitIndex: 100, AppliedIndex: 99, Entries: 40, RecordsPerEntry: 2.5, CommitP50Seconds: 0.001,
				CommitP99Seconds: 0.003, Snapshots: 2, LastSnapshotBytes: 4096, Elections: 1, Rebuilds: 0}},
			[]string{"raft:        term 8, commit 100, applied 99, 2.5 changes/entry, commit p50 1ms p99 3ms",
				"raft log:    40 entries committed as leader, 1 elections won, 2 snapshots (last 4096 B), 0 rebuilds"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, &tc.st)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("no %q in\n%s", w, b.String())
				}
			}
			if tc.st.Mode == api.ModeRaft && (strings.Contains(b.String(), "active") || strings.Contains(b.String(), "epoch")) {
				t.Errorf("a raft member's status speaks of an active or an epoch:\n%s", b.String())
			}
			if tc.st.Mode == api.ModeSingle && strings.Contains(b.String(), "cluster:") {
				t.Errorf("a single node shows a cluster line:\n%s", b.String())
			}
		})
	}
}
