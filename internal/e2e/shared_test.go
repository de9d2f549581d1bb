package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// Shared holders and watches (PROTOCOL.md §9) across a takeover, on real
// processes with raw frames: the holders replicated (priority) or
// committed (raft) are held on the member that takes over with their
// tokens, a watch on the old member ends with L reason 4 when it hands
// over (a killed one just closes), and a watch made again on the new one
// works.

// sharedHolder is one holder the test made.
type sharedHolder struct {
	key   string
	limit uint16 // 0: exclusive
	token uint64
}

// acquireShared sends S (wait 0) and returns the granted token.
func acquireShared(t *testing.T, conn *clustertest.Conn, key string, limit uint16, lease uint8, owner uint64) uint64 {
	t.Helper()
	r := do(t, conn, proto.AppendShared(nil, 0, lease, owner, limit, key))
	if r.Op != proto.OpAcquire || r.ID != owner {
		t.Fatalf("acquire shared %q limit %d: %c id=%d code=%d tail=%q", key, limit, r.Op, r.ID, r.Code, r.Tail)
	}
	return r.Token
}

// watchAll registers a watch of every holder on conn.
func watchAll(t *testing.T, conn *clustertest.Conn, hs []sharedHolder, who string) {
	t.Helper()
	for _, h := range hs {
		if r := do(t, conn, proto.AppendWatch(nil, h.token, h.key)); r.Op != proto.OpWatch || r.ID != h.token {
			t.Fatalf("watch of %s holder %d on %s: %c id=%d code=%d", h.key, h.token, who, r.Op, r.ID, r.Code)
		}
	}
}

// validAll checks that every holder validates on conn's member.
func validAll(t *testing.T, conn *clustertest.Conn, hs []sharedHolder, who string) {
	t.Helper()
	for _, h := range hs {
		if r := do(t, conn, proto.AppendValidate(nil, h.token, h.key)); r.Op != proto.OpValidate || r.ID != h.token || r.Remaining == 0 {
			t.Fatalf("validate %s holder %d on %s: %c id=%d remaining %d ms", h.key, h.token, who, r.Op, r.ID, r.Remaining)
		}
	}
}

// sharedAcrossTakeover runs the test on a cluster whose serving member is
// a: it makes the holders, watches them, runs resync (if any), takes
// member a down as how says ("kill" or "term"), and checks the member
// that takes over; serving waits for it (skipping a).
func sharedAcrossTakeover(t *testing.T, c *clustertest.Cluster, a int, how string, resync func(), serving func(skip int) int) {
	hc, wc := dial(t, c, a), dial(t, c, a)
	var hs []sharedHolder
	owner := uint64(0)
	for _, k := range []struct {
		key   string
		limit uint16
		n     int
	}{{"sem", 3, 3}, {"rw", 65535, 2}, {"sem1", 1, 1}} {
		for range k.n {
			owner++
			hs = append(hs, sharedHolder{k.key, k.limit, acquireShared(t, hc, k.key, k.limit, 60, owner)})
		}
	}
	owner++
	hs = append(hs, sharedHolder{"ex", 0, grant(t, hc, "ex", 60, owner)})
	last := uint64(0)
	for _, h := range hs {
		last = max(last, h.token)
	}
	if r := do(t, hc, proto.AppendShared(nil, 0, 60, 90, 3, "sem")); r.Op != proto.OpTimeout {
		t.Fatalf("a fourth holder of sem (limit 3): %c, want T", r.Op)
	}
	watchAll(t, wc, hs, "the old member")
	validAll(t, hc, hs, "the old member")
	if r := do(t, hc, proto.AppendInspect(nil, 5, "sem")); r.Op != proto.OpInspect || r.Holders != 3 || r.Limit != 3 {
		t.Fatalf("inspect sem: %c holders %d limit %d", r.Op, r.Holders, r.Limit)
	}
	time.Sleep(150 * time.Millisecond) // priority: replicated (§6.3: 100 ms); raft: committed already
	if resync != nil {
		resync()
	}

	m := c.Member(a)
	var err error
	if how == "kill" {
		err = m.Kill()
	} else {
		err = m.Signal(syscall.SIGTERM)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The old member's watches: L reason 4 for each once it hands over
	// (it can no longer tell), then the close; a killed member only closes.
	lost := map[uint64]int{}
	for {
		r, err := wc.Read()
		if err != nil {
			break
		}
		if r.Op != proto.OpLost {
			t.Fatalf("on the old member's watch connection: %c id=%d", r.Op, r.ID)
		}
		if r.Reason != 4 {
			t.Fatalf("L for %d with reason %d on the old member, want 4 (it can no longer tell)", r.ID, r.Reason)
		}
		lost[r.ID]++
	}
	if how == "term" {
		for _, h := range hs {
			if lost[h.token] != 1 {
				t.Fatalf("%s holder %d: %d L on the old member's watch connection, want 1 (reason 4)", h.key, h.token, lost[h.token])
			}
		}
	} else if len(lost) != 0 {
		t.Fatalf("L from a killed member: %v", lost)
	}

	n := serving(a)
	nc, rw := dial(t, c, n), dial(t, c, n)
	validAll(t, nc, hs, "the new member")
	if r := do(t, nc, proto.AppendInspect(nil, 6, "sem")); r.Op != proto.OpInspect || r.Holders != 3 || r.Limit != 3 || r.Token != hs[2].token {
		t.Fatalf("inspect sem on the new member: %c holders %d limit %d newest %d, want 3, 3, %d", r.Op, r.Holders, r.Limit, r.Token, hs[2].token)
	}
	if r := do(t, nc, proto.AppendShared(nil, 0, 60, 91, 3, "sem")); r.Op != proto.OpTimeout {
		t.Fatalf("a fourth holder of sem on the new member: %c, want T", r.Op)
	}
	if r := do(t, nc, proto.AppendShared(nil, 0, 60, 92, 2, "sem")); r.Op != proto.OpError || r.Code != proto.CodeLimitMismatch {
		t.Fatalf("another limit on sem on the new member: %c code %d, want E 7", r.Op, r.Code)
	}
	watchAll(t, rw, hs, "the new member") // watch again there
	sem := hs[1]
	if r := do(t, nc, proto.AppendRelease(nil, sem.token, sem.key)); r.Op != proto.OpRelease || r.ID != sem.token {
		t.Fatalf("release of sem holder %d on the new member: %c", sem.token, r.Op)
	}
	if r, err := rw.Read(); err != nil || r.Op != proto.OpLost || r.ID != sem.token || r.Reason != 1 {
		t.Fatalf("the new member's watch of the released holder: %c id=%d reason %d, %v; want L %d reason 1", r.Op, r.ID, r.Reason, err, sem.token)
	}
	if tok := acquireShared(t, nc, "sem", 3, 60, 93); tok <= last {
		t.Fatalf("a holder of sem on the new member has token %d, not above %d", tok, last)
	}
	for _, h := range []sharedHolder{hs[0], hs[2]} {
		if r := do(t, nc, proto.AppendValidate(nil, h.token, h.key)); r.Op != proto.OpValidate {
			t.Fatalf("sem holder %d after another holder's release: %c", h.token, r.Op)
		}
	}
}

// TestPrioritySharedHoldersAcrossTakeover: kill -9 and SIGTERM of the
// active under shared holders and watches. The standby that takes over
// (the next in priority) was killed and restarted after the holders were
// made, so it holds them from the active's snapshot.
func TestPrioritySharedHoldersAcrossTakeover(t *testing.T) {
	for _, how := range []string{"kill", "term"} {
		t.Run(how, func(t *testing.T) {
			c, a := startPriority(t, 3, false)
			resync := func() {
				s := c.Member((a + 1) % 3)
				if err := s.Kill(); err != nil {
					t.Fatal(err)
				}
				mark := s.LogMark()
				if err := s.Restart(); err != nil {
					t.Fatal(err)
				}
				if _, err := s.WaitLogSince(mark, inSyncRE, 10*time.Second); err != nil {
					t.Fatalf("the restarted standby did not sync: %v", err)
				}
			}
			sharedAcrossTakeover(t, c, a, how, resync, func(skip int) int {
				n, took := waitActive(t, c, 3*time.Second)
				if n != (skip+1)%3 {
					t.Fatalf("member %d took over, want %d (the next in priority, synced by snapshot)", n, (skip+1)%3)
				}
				t.Logf("member %d active %v after the %s", n, took, how)
				return n
			})
		})
	}
}

// TestRaftSharedHoldersAcrossTakeover: kill -9 and SIGTERM of the leader
// under shared holders and watches.
func TestRaftSharedHoldersAcrossTakeover(t *testing.T) {
	for _, how := range []string{"kill", "term"} {
		t.Run(how, func(t *testing.T) {
			c, l := startRaft(t, false)
			sharedAcrossTakeover(t, c, l, how, nil, func(skip int) int {
				n, took := waitServing(t, c, 3*time.Second, skip)
				t.Logf("member %d leads %v after the %s", n, took, how)
				return n
			})
		})
	}
}

// sharedRestartAll makes holders on member a, stops every member with
// SIGTERM (the serving one last: a priority member that is the last one
// live shuts down as a single node, with its shutdown snapshot), restarts
// them all, and checks that the member that serves then holds every
// holder with its token and limit.
func sharedRestartAll(t *testing.T, c *clustertest.Cluster, a int, serving func() int) {
	hc := dial(t, c, a)
	var hs []sharedHolder
	for i := range 3 {
		hs = append(hs, sharedHolder{"sem", 3, acquireShared(t, hc, "sem", 3, 120, uint64(i+1))})
	}
	hs = append(hs, sharedHolder{"rw", 65535, acquireShared(t, hc, "rw", 65535, 120, 4)})
	time.Sleep(150 * time.Millisecond)
	for _, m := range c.Members() {
		if m.Index() == a {
			continue
		}
		if code, err := m.Term(); err != nil || code != 0 {
			t.Fatalf("SIGTERM of member %d: exit %d, %v", m.Index(), code, err)
		}
	}
	if code, err := c.Member(a).Term(); err != nil || code != 0 {
		t.Fatalf("SIGTERM of member %d, the last: exit %d, %v", a, code, err)
	}
	for _, m := range c.Members() {
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	n := serving()
	nc := dial(t, c, n)
	validAll(t, nc, hs, "the member serving after the restart")
	if r := do(t, nc, proto.AppendInspect(nil, 7, "sem")); r.Op != proto.OpInspect || r.Holders != 3 || r.Limit != 3 {
		t.Fatalf("inspect sem after the restart: %c holders %d limit %d, want 3 and 3", r.Op, r.Holders, r.Limit)
	}
	if r := do(t, nc, proto.AppendShared(nil, 0, 60, 9, 2, "sem")); r.Op != proto.OpError || r.Code != proto.CodeLimitMismatch {
		t.Fatalf("another limit on sem after the restart: %c code %d, want E 7", r.Op, r.Code)
	}
}

// TestPrioritySharedHoldersRestartAll: every member stopped, the active
// last (its shutdown snapshot), then all restarted: the holders are back.
func TestPrioritySharedHoldersRestartAll(t *testing.T) {
	c, a := startPriority(t, 3, false)
	sharedRestartAll(t, c, a, func() int {
		n, _ := waitActive(t, c, 15*time.Second)
		return n
	})
}

// TestRaftSharedHoldersRestartAll: every member stopped, the leader last,
// then all restarted: the holders are back from the log.
func TestRaftSharedHoldersRestartAll(t *testing.T) {
	c, l := startRaft(t, false)
	sharedRestartAll(t, c, l, func() int {
		n, _ := waitServing(t, c, 15*time.Second)
		return n
	})
}
