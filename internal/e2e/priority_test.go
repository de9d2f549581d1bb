package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

func startPriority(t *testing.T, n int, proxied bool) (*clustertest.Cluster, int) {
	t.Helper()
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModePriority, Members: n, Proxied: proxied})
	noRaces(t, c)
	a, _ := waitActive(t, c, 10*time.Second)
	return c, a
}

// TestPriorityStandbyRedirects: a standby answers every request, ping
// included, with M naming the active (its --peers entry) and executes
// nothing; malformed requests still get their E first.
func TestPriorityStandbyRedirects(t *testing.T) {
	c, a := startPriority(t, 3, false)
	if a != 0 {
		t.Fatalf("active %d at start, want the first member", a)
	}
	act := dial(t, c, 0)
	tok := grant(t, act, "held", 60, 1)
	redirects(t, dial(t, c, 1), tok, c.Member(0).Addr(), "a standby")
	// Nothing executed: the key is still held by the same token, free
	// stays free.
	if held, got := keyState(t, c, 0, "held"); !held || got != tok {
		t.Fatalf("held after the standby's M: %v %d", held, got)
	}
	if held, _ := keyState(t, c, 0, "free"); held {
		t.Fatal("a standby executed an acquire")
	}
}

// TestPriorityKill9Failover: kill -9 of the active under held locks; a
// standby serves within 3 s, the replicated locks are held with their
// tokens (release gives R) and every new token is above every old one.
func TestPriorityKill9Failover(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	conn := dial(t, c, 0)
	tokens := map[string]uint64{}
	var last uint64
	for i := range 200 {
		key := fmt.Sprintf("k%d", i)
		tokens[key] = grant(t, conn, key, 60, uint64(i+1))
		last = tokens[key]
	}
	// A change answered more than 100 ms before the crash has reached the
	// standbys (§6.3).
	time.Sleep(150 * time.Millisecond)
	if err := c.Member(0).Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	a, _ := waitActive(t, c, 3*time.Second)
	took := time.Since(killed)
	t.Logf("member %d active %v after kill -9", a, took)
	if took > 3*time.Second {
		t.Fatalf("failover took %v", took)
	}
	nc := dial(t, c, a)
	first := grant(t, nc, "new", 10, 1000)
	if first <= last {
		t.Fatalf("first token after failover %d not above the last before %d", first, last)
	}
	for key, tok := range tokens {
		r := do(t, nc, proto.AppendRelease(nil, tok, key))
		if r.Op != proto.OpRelease || r.ID != tok {
			t.Fatalf("release %s %d on the successor: %c", key, tok, r.Op)
		}
	}
}

// TestPriorityRestartTakesOver: the first member restarts after a
// failover, syncs as a standby and takes over by a planned handover with
// every lock kept.
func TestPriorityRestartTakesOver(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	conn := dial(t, c, 0)
	a0 := grant(t, conn, "before", 60, 1)
	time.Sleep(150 * time.Millisecond) // replicated (§6.3: 100 ms)
	if err := c.Member(0).Kill(); err != nil {
		t.Fatal(err)
	}
	a, _ := waitActive(t, c, 3*time.Second)
	conn = dial(t, c, a)
	a1 := grant(t, conn, "during", 60, 2)
	if err := c.Member(0).Restart(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "the restarted first member did not take over")
	for key, tok := range map[string]uint64{"before": a0, "during": a1} {
		if held, got := keyState(t, c, 0, key); !held || got != tok {
			t.Fatalf("%s after the handover: held=%v token %d, want %d", key, held, got, tok)
		}
	}
	conn = dial(t, c, 0)
	if tok := grant(t, conn, "after", 10, 3); tok <= a1 {
		t.Fatalf("token %d after the handover not above %d", tok, a1)
	}
}

// TestPriorityFrozenActive: SIGSTOP of the active past the failover
// timeout, SIGCONT: one active within 2 × the timeout, and what queued up
// on the frozen member is not answered with a grant from its stale state.
func TestPriorityFrozenActive(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	old := dial(t, c, 0)
	grant(t, old, "warm", 10, 1)
	if err := c.Member(0).Stop(); err != nil {
		t.Fatal(err)
	}
	a, _ := waitActive(t, c, 3*time.Second, 0)
	// Take the key on the new active, so a stale grant would be a
	// double grant.
	nc := dial(t, c, a)
	tok := grant(t, nc, "contested", 30, 2)
	// Requests queue up in the frozen member's socket buffer.
	if err := old.Send(proto.AppendAcquire(nil, 0, 10, 3, "contested"), proto.AppendAcquire(nil, 0, 10, 4, "fresh")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := c.Member(0).Cont(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	for _, id := range []uint64{3, 4} {
		r, err := old.Read()
		if err != nil {
			t.Fatalf("answer %d from the resumed member: %v", id, err)
		}
		if r.Op == proto.OpAcquire {
			t.Fatalf("the resumed member granted %q (owner %d, token %d) from its stale state", r.Tail, r.ID, r.Token)
		}
		if r.Op != proto.OpMoved {
			t.Fatalf("answer %d: %c, want M", id, r.Op)
		}
	}
	waitActive(t, c, 2*time.Second) // 2 × the failover timeout
	t.Logf("one active %v after SIGCONT", time.Since(resumed))
	// Priority order is then restored by a planned handoff to member 0
	// (PROTOCOL.md §6.3). Read the key once that is over: the active found
	// above may be handing over, and a member that hands over re-syncs its
	// table from its successor (CI once read it mid-sync: "false 0").
	waitActiveIs(t, c, 0, "member 0 active again by a planned handoff")
	if held, got := keyState(t, c, 0, "contested"); !held || got != tok {
		t.Fatalf("contested after the freeze: %v %d, want %d", held, got, tok)
	}
}

// TestPriorityFrozenActiveAfterHandover: the active (member 0) and member
// 1 freeze together; member 2, alone, promotes and grants; member 1 comes
// back, syncs from it and takes the role by a planned handover (it has the
// higher priority); then member 0 comes back. Member 0 holds nothing that
// member 2 had not applied, while member 1's table holds member 2's grant:
// the handover's successor counts its predecessor's changes as its own
// (PROTOCOL.md §6.3, docs/PROTOCOL.md decision 71), so member 0 steps
// down and the grant survives. (Counting only its own, none, member 1
// stepped down and the grant was lost: CI once saw that as "false 0".)
func TestPriorityFrozenActiveAfterHandover(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	warm := grant(t, dial(t, c, 0), "warm", 60, 1)
	waitHeld(t, c, 2, "warm", warm)
	for _, i := range []int{0, 1} {
		if err := c.Member(i).Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if a, _ := waitActive(t, c, 5*time.Second, 0, 1); a != 2 {
		t.Fatalf("member %d active with members 0 and 1 frozen, want 2", a)
	}
	tok := grant(t, dial(t, c, 2), "contested", 60, 2)
	if err := c.Member(1).Cont(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 1, "member 1 to take over from member 2", 0)
	if err := c.Member(0).Cont(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "member 0 active again by a planned handoff")
	mustHold(t, c, 0, "after member 0 came back", map[string]uint64{"warm": warm, "contested": tok})
}

// TestPriorityFrozenActiveAfterTwoFailovers: the active (member 0)
// freezes; member 1 promotes with its whole table and grants; member 2
// replicates that, and promotes when member 1 is killed; then member 0
// comes back. Member 2's table holds member 0's whole table through member
// 1's (its lineage, PROTOCOL.md §6.3, docs/PROTOCOL.md decision 71):
// member 0 holds nothing member 2 lacks, a tie, and member 0 steps down;
// member 1's grant survives. (Judged by its own base only, member 2 counted
// all of member 0's table and stepped down, and the grant was lost.)
func TestPriorityFrozenActiveAfterTwoFailovers(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	warm := grant(t, dial(t, c, 0), "warm", 60, 1)
	waitHeld(t, c, 1, "warm", warm)
	waitHeld(t, c, 2, "warm", warm)
	if err := c.Member(0).Stop(); err != nil {
		t.Fatal(err)
	}
	if a, _ := waitActive(t, c, 5*time.Second, 0); a != 1 {
		t.Fatalf("member %d active with member 0 frozen, want 1", a)
	}
	tok := grant(t, dial(t, c, 1), "contested", 60, 2)
	waitHeld(t, c, 2, "contested", tok)
	if err := c.Member(1).Kill(); err != nil {
		t.Fatal(err)
	}
	if a, _ := waitActive(t, c, 5*time.Second, 0, 1); a != 2 {
		t.Fatalf("member %d active with member 0 frozen and member 1 dead, want 2", a)
	}
	if err := c.Member(0).Cont(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "member 0 active again by a planned handoff")
	mustHold(t, c, 0, "after member 0 came back", map[string]uint64{"warm": warm, "contested": tok})
}

// TestPriorityEmptyPromotionYields: a member that promoted with an empty
// table meets one that promoted with the replicated table, and yields,
// however few changes the other made since its promotion. Member 2 is
// killed and restarted cut off from the others, so it promotes alone with
// nothing (at epoch 2: its data dir holds epoch 1) and grants three locks;
// member 0 freezes, and member 1 promotes with member 0's whole table, also
// at epoch 2, and grants one. After the heal each counts what it holds that
// the other lacks (PROTOCOL.md §6.3, docs/PROTOCOL.md decision 71): member
// 1 holds the replicated table, so member 2 steps down and its three locks
// are lost; member 0 yields too, and every replicated lock and member 1's
// grant survive. (Counting only member 1's changes since its promotion, 1
// against 3, member 1 stepped down and the replicated table was lost: a
// chaos run lost a table that way.)
func TestPriorityEmptyPromotionYields(t *testing.T) {
	c, a := startPriority(t, 3, true)
	if a != 0 {
		t.Fatalf("active %d at start, want the first member", a)
	}
	conn := dial(t, c, 0)
	warm := map[string]uint64{}
	for i := range 5 {
		key := fmt.Sprintf("warm-%d", i)
		warm[key] = grant(t, conn, key, 60, uint64(i+1))
	}
	for key, tok := range warm {
		waitHeld(t, c, 1, key, tok)
		waitHeld(t, c, 2, key, tok)
	}
	if err := c.Member(2).Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Partition([]int{2}, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.Member(2).Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Member(2).WaitStatus(10*time.Second, func(st clustertest.Status) bool { return st.Serving() }); err != nil {
		t.Fatalf("member 2, alone, did not promote: %v", err)
	}
	m2 := dial(t, c, 2)
	for i := range 3 {
		grant(t, m2, fmt.Sprintf("alone-%d", i), 60, uint64(10+i))
	}
	if err := c.Member(0).Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Member(1).WaitStatus(10*time.Second, func(st clustertest.Status) bool { return st.Serving() }); err != nil {
		t.Fatalf("member 1 did not promote with member 0 frozen: %v", err)
	}
	tok := grant(t, dial(t, c, 1), "contested", 60, 20)
	c.Heal()
	if err := c.Member(0).Cont(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "member 0 active again by a planned handoff")
	warm["contested"] = tok
	mustHold(t, c, 0, "after the heal", warm)
	if held, _ := keyState(t, c, 0, "alone-0"); held {
		t.Fatal("a lock of the member that promoted with an empty table survived: it should have stepped down")
	}
}

// TestPrioritySIGTERMHandsOver: SIGTERM of the active hands over: nothing
// is answered E 4, a queued acquire gets M naming the successor, held
// locks stay with their tokens, and the successor serves within 500 ms.
func TestPrioritySIGTERMHandsOver(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	conn := dial(t, c, 0)
	tok := grant(t, conn, "held", 60, 1)
	if err := conn.Send(proto.AppendAcquire(nil, 30, 10, 2, "held")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	r, err := conn.Read()
	if err != nil {
		t.Fatal(err)
	}
	if r.Op != proto.OpMoved || r.ID != 2 || string(r.Tail) != c.Member(1).Addr() {
		t.Fatalf("queued acquire at the handover: %c id=%d tail=%q, want M naming %s", r.Op, r.ID, r.Tail, c.Member(1).Addr())
	}
	nc := dial(t, c, 1)
	for {
		r := do(t, nc, proto.AppendPing(nil, 5))
		if r.Op == proto.OpPing {
			break
		}
		if time.Since(signalled) > 2*time.Second {
			t.Fatalf("successor not serving 2 s after the signal: %c", r.Op)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(signalled)
	t.Logf("successor served %v after SIGTERM", took)
	if took > 500*time.Millisecond {
		t.Errorf("successor served %v after the signal, want ≤ 500 ms", took)
	}
	// Anything that still reaches the old member is M, never E 4.
	if r := do(t, conn, proto.AppendRelease(nil, tok, "held")); r.Op != proto.OpMoved {
		t.Fatalf("release on the old member after the handover: %c", r.Op)
	}
	if r := do(t, nc, proto.AppendRelease(nil, tok, "held")); r.Op != proto.OpRelease {
		t.Fatalf("release on the successor: %c", r.Op)
	}
	if code, err := c.Member(0).Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("old active exit %d, %v", code, err)
	}
}

// TestPriorityPartitionHeals: a partition of the member links between the
// active and the others makes two actives; after the heal whoever would
// lose more by stepping down stays (PROTOCOL.md §6.3): the side that made
// fewer changes during the split steps down within 2 × the failover timeout,
// loses what it granted since the split, and tokens keep increasing — both
// ways round, so that neither "the earlier steps down" nor "the later steps
// down" passes it.
func TestPriorityPartitionHeals(t *testing.T) {
	for _, tc := range []struct {
		name         string
		oldN, newN   int  // grants on the isolated old active's side and on the new side
		oldSideStays bool // the old active made more changes
	}{
		{name: "the new side made more changes", oldN: 20, newN: 300},
		{name: "the old side made more changes", oldN: 600, newN: 20, oldSideStays: true},
	} {
		t.Run(tc.name, func(t *testing.T) { partitionHeals(t, tc.oldN, tc.newN, tc.oldSideStays) })
	}
}

func partitionHeals(t *testing.T, oldN, newN int, oldSideStays bool) {
	c, a := startPriority(t, 3, true)
	conn := dial(t, c, a)
	before := grant(t, conn, "pre", 60, 1)
	if err := c.Partition([]int{a}, others(c, a)); err != nil {
		t.Fatal(err)
	}
	// The majority side promotes after the failover timeout.
	b := -1
	_, err := c.WaitStatuses(5*time.Second, clustertest.Running(a), func(sts []clustertest.Status) error {
		for _, st := range sts {
			if st.Serving() {
				b = st.Index
				return nil
			}
		}
		return errors.New("no member serves")
	})
	if err != nil {
		t.Fatalf("no active on the other side of the partition: %v", err)
	}
	bc := dial(t, c, b)
	mid := grant(t, bc, "split", 60, 2)
	if mid <= before {
		t.Fatalf("token %d on the new side not above %d", mid, before)
	}
	// The isolated old active grants (it cannot know) oldN locks; every
	// token either side issued must be below every token issued after the
	// heal.
	splitMax := max(before, mid)
	var oldFirst uint64
	for i := range oldN {
		key, owner := fmt.Sprintf("old-side/%d", i), uint64(100+i)
		r := do(t, conn, proto.AppendAcquire(nil, 0, 60, owner, key))
		if r.Op != proto.OpAcquire || r.ID != owner {
			t.Fatalf("acquire %q on the isolated old active: %c id=%d tail=%q", key, r.Op, r.ID, r.Tail)
		}
		if i == 0 {
			oldFirst = r.Token
		}
		splitMax = max(splitMax, r.Token)
	}
	// And the new side newN. Its active may hand over to a member of
	// higher priority on its side meanwhile (the standby it promoted beside
	// is in sync from its Ack(snapshot)): the client follows the M, as §7
	// asks of it.
	moves := 0
	for i := range newN {
		key, owner := fmt.Sprintf("new-side/%d", i), uint64(1000+i)
		r := do(t, bc, proto.AppendAcquire(nil, 0, 60, owner, key))
		for r.Op == proto.OpMoved && moves < 3 {
			moves++
			nc, err := c.Dial(string(r.Tail))
			if err != nil {
				t.Fatalf("following M to %q: %v", r.Tail, err)
			}
			nc.SetTimeout(10 * time.Second)
			t.Cleanup(func() { nc.Close() })
			bc = nc
			r = do(t, bc, proto.AppendAcquire(nil, 0, 60, owner, key))
		}
		if r.Op != proto.OpAcquire || r.ID != owner {
			t.Fatalf("acquire %q on the new side: %c id=%d tail=%q", key, r.Op, r.ID, r.Tail)
		}
		splitMax = max(splitMax, r.Token)
	}
	marks := make([]int, len(c.Members()))
	for i := range marks {
		marks[i] = c.Member(i).LogMark()
	}
	c.Heal()
	healed := time.Now()
	// The side with fewer changes steps down within 2 × the failover
	// timeout: the old active a, or the new side's active (whichever
	// member that is after its handovers).
	stepped := -1
	deadline := time.Now().Add(2 * time.Second)
	for stepped < 0 && time.Now().Before(deadline) {
		for i := range marks {
			if _, err := c.Member(i).WaitLogSince(marks[i], steppingDownRE, time.Millisecond); err == nil {
				stepped = i
				break
			}
		}
	}
	switch {
	case stepped < 0:
		t.Fatalf("no active stepped down within 2 s of the heal")
	case oldSideStays && stepped == a:
		t.Fatalf("the old active (member %d, %d changes) stepped down; the new side made only %d", a, oldN, newN)
	case !oldSideStays && stepped != a:
		t.Fatalf("member %d of the new side (%d changes) stepped down; the old active made only %d", stepped, newN, oldN)
	}
	t.Logf("member %d stepped down %v after the heal", stepped, time.Since(healed))
	// Priority order is then restored by a planned handover.
	waitActiveIs(t, c, 0, "priority order not restored after the heal")
	wc := dial(t, c, 0)
	if after := grant(t, wc, "post", 10, 3); after <= splitMax {
		t.Fatalf("token %d after the heal not above %d, the largest either side issued during the split", after, splitMax)
	}
	// The side that stayed kept its locks with their tokens; the other's
	// grants since the split are lost (§6.3).
	splitHeld, splitTok := keyState(t, c, 0, "split")
	oldHeld, oldTok := keyState(t, c, 0, "old-side/0")
	if oldSideStays {
		if !oldHeld || oldTok != oldFirst {
			t.Fatalf("a lock the staying old active granted: held=%v token %d, want %d", oldHeld, oldTok, oldFirst)
		}
		if splitHeld {
			t.Fatalf("the lock the stepped-down side granted is still held (token %d)", splitTok)
		}
		return
	}
	if !splitHeld || splitTok != mid {
		t.Fatalf("the lock granted by the surviving side: held=%v token %d, want %d", splitHeld, splitTok, mid)
	}
	if oldHeld {
		t.Fatalf("the lock the stepped-down old active granted is still held (token %d)", oldTok)
	}
}

var steppingDownRE = regexp.MustCompile(`stepping down`)

func others(c *clustertest.Cluster, a int) []int {
	var o []int
	for i := range c.Members() {
		if i != a {
			o = append(o, i)
		}
	}
	return o
}

// TestPrioritySnapshotOf100k: a standby that starts next to an active
// holding 100,000 locks syncs by snapshot, then follows the stream with
// nothing missing: the two tables agree key by key.
func TestPrioritySnapshotOf100k(t *testing.T) {
	short(t)
	n := env("LOCKD_E2E_LOCKS", 100_000)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModePriority, Members: 2, Deferred: []int{1}})
	noRaces(t, c)
	waitActive(t, c, 10*time.Second)
	conn := dial(t, c, 0)
	const pipe = 512
	for i := 0; i < n; i += pipe {
		var frames [][]byte
		for j := i; j < min(i+pipe, n); j++ {
			frames = append(frames, proto.AppendAcquire(nil, 0, 120, uint64(j+1), fmt.Sprintf("bulk/%07d", j)))
		}
		if err := conn.Send(frames...); err != nil {
			t.Fatal(err)
		}
		for range frames {
			if r, err := conn.Read(); err != nil || r.Op != proto.OpAcquire {
				t.Fatalf("bulk acquire: %c %v", r.Op, err)
			}
		}
	}
	began := time.Now()
	if err := c.Member(1).Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Member(1).WaitLog(inSyncRE, 20*time.Second); err != nil {
		t.Fatalf("standby not in sync: %v", err)
	}
	t.Logf("standby in sync with %d locks %v after it started", n, time.Since(began))
	// Changes after the snapshot: releases, new grants.
	for j := 0; j < 1000; j++ {
		key := fmt.Sprintf("bulk/%07d", j)
		held, tok := keyState(t, c, 0, key)
		if !held {
			t.Fatalf("%s not held on the active", key)
		}
		if r := do(t, conn, proto.AppendRelease(nil, tok, key)); r.Op != proto.OpRelease {
			t.Fatalf("release %s: %c", key, r.Op)
		}
	}
	for j := 0; j < 1000; j++ {
		grant(t, conn, fmt.Sprintf("late/%d", j), 120, uint64(n+j+1))
	}
	time.Sleep(300 * time.Millisecond)
	a, s := dumpKeys(t, c, 0), dumpKeys(t, c, 1)
	if len(a) != n || len(s) != len(a) {
		t.Fatalf("active holds %d keys, standby %d, want %d", len(a), len(s), n)
	}
	for k, tok := range a {
		if s[k] != tok {
			t.Fatalf("key %s: active token %d, standby %d", k, tok, s[k])
		}
	}
}

// TestPrioritySIGTERMUnderLoad: SIGTERM of the active while clients of the
// library (given every member) and raw pipelined connections load it:
// nothing is answered E 4 (the raw connections see A, R, T or M only), no
// library call ends Indeterminate, and every lock held across the signal
// is still held on the successor with its token.
func TestPrioritySIGTERMUnderLoad(t *testing.T) {
	c, _ := startPriority(t, 3, false)
	cl, err := client.New(client.Config{Addrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	held := map[string]uint64{}
	for i := range 50 {
		key := fmt.Sprintf("held/%d", i)
		l, err := cl.Acquire(ctx, key, client.AcquireOptions{Wait: 2 * time.Second, Lease: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		held[key] = l.Token
	}
	time.Sleep(150 * time.Millisecond) // replicated

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var pairs, indeterminate, otherErrs atomic.Int64
	var firstErr atomic.Value
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("load/%d/%d", w, i%16)
				l, err := cl.Acquire(ctx, key, client.AcquireOptions{Wait: 3 * time.Second, Lease: 10 * time.Second})
				if err == nil {
					err = cl.Release(ctx, l)
				}
				switch {
				case err == nil:
					pairs.Add(1)
				case errors.Is(err, client.ErrIndeterminate):
					indeterminate.Add(1)
					firstErr.CompareAndSwap(nil, err)
				default:
					otherErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	// Raw pipelined connections to the active: the wire shows any E 4.
	var e4, rawAnswers atomic.Int64
	for r := range 2 {
		conn := dial(t, c, 0)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("raw/%d/%d", r, i%32)
				// do sends one frame, counting the answers and any E 4.
				do := func(frame []byte) (proto.Response, bool) {
					resp, err := conn.Do(frame)
					if err != nil {
						return resp, false // the old active closed the connection
					}
					rawAnswers.Add(1)
					if resp.Op == proto.OpError && resp.Code == proto.CodeShutdown {
						e4.Add(1)
					}
					return resp, true
				}
				resp, ok := do(proto.AppendAcquire(nil, 0, 10, uint64(i), key))
				if !ok {
					return
				}
				if resp.Op == proto.OpAcquire {
					if _, ok := do(proto.AppendRelease(nil, resp.Token, key)); !ok {
						return
					}
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	before := pairs.Load()
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := c.Member(0).Wait(15 * time.Second); err != nil || code != 0 {
		t.Errorf("old active exit %d, %v", code, err)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d pairs before the signal, %d in all; %d raw answers", before, pairs.Load(), rawAnswers.Load())
	if n := e4.Load(); n != 0 {
		t.Errorf("%d answers were E 4 during a planned handover", n)
	}
	if n := indeterminate.Load(); n != 0 {
		t.Errorf("%d calls ended Indeterminate: %v", n, firstErr.Load())
	}
	if n := otherErrs.Load(); n != 0 {
		t.Errorf("%d calls failed: %v", n, firstErr.Load())
		logBusyMetrics(t, c)
	}
	if pairs.Load() <= before {
		t.Error("no pair completed after the handover")
	}
	a, _ := waitActive(t, c, 3*time.Second)
	conn := dial(t, c, a)
	for key, tok := range held {
		if r := do(t, conn, proto.AppendRelease(nil, tok, key)); r.Op != proto.OpRelease {
			t.Fatalf("lock %s (token %d) after the handover: %c", key, tok, r.Op)
		}
	}
}

// logBusyMetrics logs, for each running member, the metrics that say why
// it answered B: for want of a reserved token, or capacity.
func logBusyMetrics(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	hc := http.Client{Timeout: 2 * time.Second}
	for i, m := range c.Members() {
		resp, err := hc.Get(m.AdminURL() + "/metrics")
		if err != nil {
			t.Logf("member %d: /metrics: %v", i, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "lockd_busy_no_token_total") || strings.HasPrefix(line, "lockd_token_reserve") ||
				strings.HasPrefix(line, "lockd_requests_total") && strings.Contains(line, `result="busy"`) {
				t.Logf("member %d: %s", i, line)
			}
		}
	}
}
