package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// waitServing waits until a member that every running member (but those
// in skip) names as the leader grants on a fresh key, and returns it and
// how long it took.
func waitServing(t *testing.T, c *clustertest.Cluster, within time.Duration, skip ...int) (int, time.Duration) {
	t.Helper()
	began := time.Now()
	l, n := -1, 0
	_, err := c.WaitStatuses(within, clustertest.Running(skip...), func(sts []clustertest.Status) error {
		var err error
		if l, err = c.Agreed(sts); err != nil {
			return err
		}
		n++
		conn, err := c.Dial(c.Member(l).Addr())
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetTimeout(time.Second)
		r, err := conn.Do(proto.AppendAcquire(nil, 0, 1, 1, fmt.Sprintf("probe/%d", n)))
		if err == nil && r.Op != proto.OpAcquire {
			err = fmt.Errorf("leader %d answered %c", l, r.Op)
		}
		return err
	})
	if err != nil {
		t.Fatalf("no leader serving within %v: %v", within, err)
	}
	return l, time.Since(began)
}

func startRaft(t *testing.T, proxied bool) (*clustertest.Cluster, int) {
	t.Helper()
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModeRaft, Members: 3, Proxied: proxied})
	l, _ := waitServing(t, c, 15*time.Second)
	return c, l
}

// settleKeys waits until every live member's /debug/locks equals want
// (the followers apply what the leader committed).
func settleKeys(t *testing.T, c *clustertest.Cluster, want map[string]uint64) {
	t.Helper()
	for _, m := range c.Members() {
		if !m.Alive() {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := dumpKeys(t, c, m.Index())
			same := len(got) == len(want)
			for k, v := range want {
				same = same && got[k] == v
			}
			if same {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %d holds %d keys, want %d (or other tokens)", m.Index(), len(got), len(want))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestRaftFollowersRedirect: a follower answers every request, ping
// included, with M naming the leader and executes nothing; validation
// ranks before M.
func TestRaftFollowersRedirect(t *testing.T) {
	c, l := startRaft(t, false)
	lc := dial(t, c, l)
	tok := grant(t, lc, "held", 60, 1)
	want := c.Member(l).Addr()
	for _, f := range c.Members() {
		if f.Index() == l {
			continue
		}
		redirects(t, dial(t, c, f.Index()), tok, want, fmt.Sprintf("follower %d", f.Index()))
	}
	settleKeys(t, c, map[string]uint64{"held": tok})
	// The leader's /status and /metrics show the log.
	st, err := c.Member(l).Status()
	if err != nil {
		t.Fatal(err)
	}
	r, _ := st.Raw["raft"].(map[string]any)
	if st.Role != "leader" || r == nil || r["commit_index"] == nil || r["entries"] == nil {
		t.Fatalf("leader's /status: role %q raft %v", st.Role, r)
	}
	if n, _ := r["entries"].(json.Number).Int64(); n < 1 {
		t.Fatalf("leader's /status counts %d committed entries after a grant", n)
	}
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(c.Member(l).AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"lockd_raft_term ", "lockd_raft_commit_index ", "lockd_raft_entry_records_total ", `lockd_raft_commit_latency_seconds_bucket{le="+Inf"} `, "lockd_raft_commit_latency_seconds_count "} {
		if !strings.Contains(string(body), m) {
			t.Fatalf("leader's /metrics lacks %s", m)
		}
	}
}

// loadGrants runs conns connections against addr, each keeping depth
// acquires of fresh keys in flight, until stop closes or the connection
// fails; it returns every acknowledged grant (key → token).
func loadGrants(addr string, conns, depth int, stop <-chan struct{}) (map[string]uint64, int) {
	var mu sync.Mutex
	granted := map[string]uint64{}
	other := 0
	var wg sync.WaitGroup
	for g := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := clustertest.Dial(addr)
			if err != nil {
				return
			}
			defer conn.Close()
			conn.SetTimeout(5 * time.Second)
			owner := uint64(g) << 32
			key := func(o uint64) string { return fmt.Sprintf("load/%d/%d", o>>32, o&(1<<32-1)) }
			var frames []byte
			for range depth {
				owner++
				frames = proto.AppendAcquire(frames, 0, 60, owner, key(owner))
			}
			if conn.Send(frames) != nil {
				return
			}
			for {
				r, err := conn.Read()
				if err != nil {
					return
				}
				mu.Lock()
				if r.Op == proto.OpAcquire {
					granted[key(r.ID)] = r.Token
				} else {
					other++
				}
				mu.Unlock()
				select {
				case <-stop:
					continue // drain what is in flight
				default:
				}
				owner++
				if conn.Send(proto.AppendAcquire(nil, 0, 60, owner, key(owner))) != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return granted, other
}

// TestRaftKill9UnderLoad: kill -9 of the leader while clients pipeline
// acquires into it: a new leader serves within 3 s, and every grant that
// was acknowledged (A) before the crash is held there with its token (it
// was committed before its answer left); new tokens are above them all.
func TestRaftKill9UnderLoad(t *testing.T) {
	c, l := startRaft(t, false)
	stop := make(chan struct{})
	var granted map[string]uint64
	var others int
	done := make(chan struct{})
	go func() {
		granted, others = loadGrants(c.Member(l).Addr(), 8, 16, stop)
		close(done)
	}()
	time.Sleep(time.Second)
	if err := c.Member(l).Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	close(stop)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the load did not end after the kill")
	}
	nl, _ := waitServing(t, c, 10*time.Second, l)
	took := time.Since(killed)
	t.Logf("%d grants acknowledged, %d other answers; member %d serves %v after kill -9", len(granted), others, nl, took)
	if len(granted) == 0 {
		t.Fatal("no grant acknowledged before the kill")
	}
	if took > 3*time.Second {
		t.Fatalf("a new leader served %v after the kill, want within 3 s", took)
	}
	held := dumpKeys(t, c, nl)
	var last uint64
	for key, tok := range granted {
		if held[key] != tok {
			t.Fatalf("%s acknowledged with token %d, on the new leader: %d", key, tok, held[key])
		}
		last = max(last, tok)
	}
	if tok := grant(t, dial(t, c, nl), "after", 10, 1); tok <= last {
		t.Fatalf("first token after the failover %d, not above %d", tok, last)
	}
}

// TestRaftRestartAll: kill -9 of all three members, restart: every lock
// whose lease has not ended is held with the same token; the ones whose
// lease ended are gone once the new leader's lease rule has run out; new
// tokens are larger.
func TestRaftRestartAll(t *testing.T) {
	c, l := startRaft(t, false)
	conn := dial(t, c, l)
	long := map[string]uint64{}
	var last uint64
	for i := range 100 {
		key := fmt.Sprintf("long/%d", i)
		long[key] = grant(t, conn, key, 120, uint64(i+1))
		last = max(last, long[key])
	}
	short := map[string]uint64{}
	for i := range 20 {
		key := fmt.Sprintf("short/%d", i)
		short[key] = grant(t, conn, key, 1, uint64(1000+i))
		last = max(last, short[key])
	}
	for _, m := range c.Members() {
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the short leases end while every member is down
	for _, m := range c.Members() {
		if err := m.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	nl, took := waitServing(t, c, 15*time.Second)
	t.Logf("member %d serves %v after the restart", nl, took)
	held := dumpKeys(t, c, nl)
	for key, tok := range long {
		if held[key] != tok {
			t.Fatalf("%s after the restart: token %d, want %d", key, held[key], tok)
		}
	}
	if tok := grant(t, dial(t, c, nl), "after", 10, 1); tok <= last {
		t.Fatalf("first token after the restart %d, not above %d", tok, last)
	}
	// The ended leases: the new leader extends them to its election + T
	// (1 s) at most, then expires them.
	deadline := time.Now().Add(5 * time.Second)
	for key := range short {
		for {
			if h, _ := keyState(t, c, nl, key); !h {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s, whose lease ended during the outage, is still held", key)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestRaftPartitionedMinorityLeader: the leader is cut off from the
// others; from then on its clients get M or nothing (a closed connection,
// no answer), never A; the majority elects a leader that serves; healed,
// the old leader follows it and holds what it holds.
func TestRaftPartitionedMinorityLeader(t *testing.T) {
	c, l := startRaft(t, true)
	conn := dial(t, c, l)
	before := grant(t, conn, "before", 60, 1)
	if err := c.Partition([]int{l}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	answers := map[proto.Op]int{}
	closed := 0
	owner := uint64(100)
	for time.Since(cut) < 3*time.Second {
		cc, err := clustertest.Dial(c.Member(l).Addr())
		if err != nil {
			t.Fatal(err)
		}
		cc.SetTimeout(500 * time.Millisecond)
		for time.Since(cut) < 3*time.Second {
			owner++
			r, err := cc.Do(proto.AppendAcquire(nil, 0, 30, owner, fmt.Sprintf("minority/%d", owner)))
			if err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					closed++
				}
				break // a timed-out request may still be answered: use a new connection
			}
			if r.Op == proto.OpAcquire {
				t.Fatalf("the partitioned leader granted minority/%d (token %d) %v after the cut", owner, r.Token, time.Since(cut))
			}
			answers[r.Op]++
			time.Sleep(5 * time.Millisecond)
		}
		cc.Close()
	}
	t.Logf("partitioned leader's answers: %v, connections closed: %d", answers, closed)
	if answers[proto.OpMoved] == 0 {
		t.Fatal("the partitioned leader never answered M")
	}
	nl, took := waitServing(t, c, 5*time.Second, l)
	t.Logf("member %d serves on the majority side (%v after the wait began)", nl, took)
	nc := dial(t, c, nl)
	during := grant(t, nc, "during", 60, 2)
	if during <= before {
		t.Fatalf("token %d on the majority side, not above %d", during, before)
	}
	c.Heal()
	settleKeys(t, c, map[string]uint64{"before": before, "during": during})
}

// TestRaftLeaseAcrossLeaderChange: a 3 s lease granted by a leader that is
// then killed ends once, on the new leader, never earlier than granted:
// a waiter queued on the new leader gets the key no sooner than 3 s after
// the grant was asked for, and within the new leader's lease rule and a
// tick or two after that.
func TestRaftLeaseAcrossLeaderChange(t *testing.T) {
	c, l := startRaft(t, false)
	conn := dial(t, c, l)
	asked := time.Now()
	tok := grant(t, conn, "lease", 3, 1)
	acked := time.Now()
	time.Sleep(300 * time.Millisecond) // committed and applied by the followers
	if err := c.Member(l).Kill(); err != nil {
		t.Fatal(err)
	}
	nl, _ := waitServing(t, c, 10*time.Second, l)
	elected := time.Now()
	wc := dial(t, c, nl)
	wc.SetTimeout(15 * time.Second)
	r := do(t, wc, proto.AppendAcquire(nil, 10, 10, 2, "lease"))
	got := time.Now()
	if r.Op != proto.OpAcquire || r.Token <= tok {
		t.Fatalf("the waiter on the new leader: %c token %d (old %d)", r.Op, r.Token, tok)
	}
	ended := got.Sub(asked)
	latest := acked.Add(3 * time.Second)
	if e := elected.Add(time.Second); e.After(latest) {
		latest = e
	}
	latest = latest.Add(time.Second)
	t.Logf("the lease ended %v after the grant was asked for (new leader serving %v after)", ended, elected.Sub(asked))
	if ended < 3*time.Second {
		t.Fatalf("the 3 s lease ended after %v", ended)
	}
	if got.After(latest) {
		t.Fatalf("the lease ended %v after the grant, later than the lease rule allows (%v)", ended, latest.Sub(asked))
	}
	// Ended once: the key is now the waiter's, on every member.
	settleKeys(t, c, map[string]uint64{"lease": r.Token})
}

// TestRaftPhantomRelease: a queued acquire whose connection closes as the
// key is handed to it: the grant it can no longer receive is released by
// a command (not only on the leader's table), and the key goes to the
// next waiter, on every member — at once, not when the grant's lease
// ends.
//
// The release is sent just before the close, so that lockd mostly hands
// the key over before it sees the close. A test goroutine paused between
// the two (a loaded machine) lets the grant commit and reach b's socket
// before the close: lockd then counts it delivered (the kernel took it),
// and it ends with its lease, as PROTOCOL.md §4 says of any delivered
// grant. Such a trial is told apart by the time the two sends took and
// waits for b's short lease; the others must see the key handed on well
// before that lease could end.
func TestRaftPhantomRelease(t *testing.T) {
	c, l := startRaft(t, false)
	holder := dial(t, c, l)
	want := map[string]uint64{}
	handedOver, late := 0, 0
	const bLease = 3 // seconds: b's grant, if it was delivered, ends by then
	for i := range 20 {
		key := fmt.Sprintf("phantom/%d", i)
		a := grant(t, holder, key, 60, uint64(i+1))
		b, err := clustertest.Dial(c.Member(l).Addr())
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Send(proto.AppendAcquire(nil, 30, bLease, 100, key)); err != nil {
			t.Fatal(err)
		}
		next := dial(t, c, l)
		// Let b's acquire queue first, then next's.
		time.Sleep(20 * time.Millisecond)
		if err := next.Send(proto.AppendAcquire(nil, 30, 60, 200, key)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		// Release and close b at once: the handoff grant to b is made and
		// cannot be delivered.
		if tc, ok := b.NetConn().(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		sent := time.Now()
		if err := holder.Send(proto.AppendRelease(nil, a, key)); err != nil {
			t.Fatal(err)
		}
		b.Close()
		// A raft commit (a follower's fsync and two hops between
		// processes) takes far longer than this: the grant cannot have
		// reached b's socket within it.
		paused := time.Since(sent) > 200*time.Microsecond
		if r, err := holder.Read(); err != nil || r.Op != proto.OpRelease {
			t.Fatalf("release of %s: %c %v", key, r.Op, err)
		}
		r, err := next.Read()
		if err != nil || r.Op != proto.OpAcquire || r.ID != 200 {
			t.Fatalf("the next waiter of %s: %c id=%d %v", key, r.Op, r.ID, err)
		}
		if took := time.Since(sent); took > bLease*time.Second/2 {
			if !paused {
				t.Fatalf("the next waiter of %s was granted %v after the release: b's undeliverable grant was not released, it ran out", key, took)
			}
			late++
		}
		if r.Token > a+1 {
			handedOver++ // b was granted a token in between, and released it
		}
		want[key] = r.Token
	}
	t.Logf("%d of 20 keys were handed to the closed connection first; %d trials paused between the release and the close and waited for b's lease", handedOver, late)
	if late > 10 {
		t.Fatalf("%d of 20 trials paused between two sends: too few were a test of the release", late)
	}
	settleKeys(t, c, want)
}

// TestRaftFrozenLeaderAnswersNothingStale (PROTOCOL.md
// §6.2): the leader is frozen (SIGSTOP) with client connections open, a
// new leader is elected and changes the state, requests are sent to the
// frozen leader meanwhile, and it resumes (SIGCONT). Its answers to them
// must not come from its stale state: a renew of the key's current token
// must not get N, a wait=0 acquire of a key now free must not get T, a
// ping must not get a pong from a member that no longer leads. Only M, or
// an answer the new state allows (K for the renew), passes. The race is
// between the resumed member's event loops and raft noticing the newer
// term, so the trial repeats (LOCKD_FROZEN_TRIALS, default 10, within
// 150 s) on one cluster, freezing whichever member leads.
func TestRaftFrozenLeaderAnswersNothingStale(t *testing.T) {
	c, l := startRaft(t, false)
	noRaces(t, c)
	trials := env("LOCKD_FROZEN_TRIALS", 10)
	deadline := time.Now().Add(150 * time.Second)
	done := 0
	for trial := 0; trial < trials && time.Now().Before(deadline); trial++ {
		l = frozenLeaderTrial(t, c, l, trial)
		done++
	}
	if done < 3 {
		t.Fatalf("only %d trials within the time bound", done)
	}
	t.Logf("%d trials: the resumed leader answered nothing from its stale state", done)
}

// frozenLeaderTrial runs one freeze of leader l and returns the member
// that leads afterwards.
func frozenLeaderTrial(t *testing.T, c *clustertest.Cluster, l, trial int) int {
	t.Helper()
	renewKey, freeKey := fmt.Sprintf("frozen/%d/renew", trial), fmt.Sprintf("frozen/%d/free", trial)
	lc := dial(t, c, l)
	oldRenew := grant(t, lc, renewKey, 60, 1)
	oldFree := grant(t, lc, freeKey, 60, 2)
	// Connections to the leader, open and served before the freeze.
	const conns = 4
	olds := make([]*clustertest.Conn, conns)
	for i := range olds {
		olds[i] = dial(t, c, l)
		if r := do(t, olds[i], proto.AppendPing(nil, 1)); r.Op != proto.OpPing {
			t.Fatalf("trial %d: ping on the leader: %c", trial, r.Op)
		}
	}
	if err := c.Member(l).Stop(); err != nil {
		t.Fatal(err)
	}
	frozen := true
	defer func() {
		if frozen {
			_ = c.Member(l).Cont()
		}
	}()
	nl, _ := waitServing(t, c, 10*time.Second, l)
	// The new leader changes both keys: renewKey gets a new token,
	// freeKey becomes free.
	nc := dial(t, c, nl)
	if r := do(t, nc, proto.AppendRelease(nil, oldRenew, renewKey)); r.Op != proto.OpRelease {
		t.Fatalf("trial %d: release on the new leader: %c", trial, r.Op)
	}
	cur := grant(t, nc, renewKey, 60, 3)
	if r := do(t, nc, proto.AppendRelease(nil, oldFree, freeKey)); r.Op != proto.OpRelease {
		t.Fatalf("trial %d: release on the new leader: %c", trial, r.Op)
	}
	// Requests queue up on the frozen leader.
	for i, o := range olds {
		if err := o.Send(proto.AppendRenew(nil, 60, cur, renewKey),
			proto.AppendAcquire(nil, 0, 60, uint64(100+i), freeKey),
			proto.AppendPing(nil, uint64(200+i))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if err := c.Member(l).Cont(); err != nil {
		t.Fatal(err)
	}
	frozen = false
	resumed := time.Now()
	var stale []string
	var first time.Duration
	answers := map[proto.Op]int{}
	for i, o := range olds {
		for range 3 {
			r, err := o.Read()
			if err != nil {
				t.Fatalf("trial %d: connection %d to the resumed member: %v", trial, i, err)
			}
			if first == 0 {
				first = time.Since(resumed)
			}
			answers[r.Op]++
			bad := ""
			switch r.Op {
			case proto.OpMoved:
			case proto.OpRenew:
				if r.ID != cur {
					bad = "K for another token"
				}
			case proto.OpNotHeld:
				bad = "N to a renew of the key's current token"
			case proto.OpTimeout:
				bad = "T to a wait=0 acquire of a free key"
			case proto.OpPing:
				bad = "a pong from a member that no longer leads"
			case proto.OpAcquire:
				if r.Token <= cur {
					bad = "a grant below the new leader's tokens"
				}
			default:
				bad = "an unexpected answer"
			}
			if bad != "" {
				stale = append(stale, fmt.Sprintf("%s (%c id=%d, %v after SIGCONT)", bad, r.Op, r.ID, time.Since(resumed)))
			}
		}
		o.Close()
	}
	if len(stale) > 0 {
		t.Fatalf("trial %d: member %d resumed and answered from its stale state: %s", trial, l, strings.Join(stale, "; "))
	}
	t.Logf("trial %d: member %d frozen, member %d led meanwhile; answers after SIGCONT: %v, the first %v after it", trial, l, nl, answers, first)
	nl, _ = waitServing(t, c, 10*time.Second)
	return nl
}

// TestRaftShortFreezeServesAgain: a leader frozen for longer than its
// lease but shorter than the followers' election timeout (failover timeout
// 4 s: lease 1.5 s, elections after 2 s of silence) holds what queued up
// meanwhile, and once a majority has answered it after resuming it is
// still the leader and serves it: a grant, without a new request to wake
// the connection.
func TestRaftShortFreezeServesAgain(t *testing.T) {
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModeRaft, Members: 3, FailoverTimeout: 4 * time.Second})
	noRaces(t, c)
	l, _ := waitServing(t, c, 30*time.Second)
	for attempt := range 3 {
		conn := dial(t, c, l)
		grant(t, conn, fmt.Sprintf("short/%d/warm", attempt), 10, 1)
		term := func() uint64 {
			st, err := c.Member(l).Status()
			if err != nil {
				t.Fatal(err)
			}
			return st.Epoch
		}
		before := term()
		if err := c.Member(l).Stop(); err != nil {
			t.Fatal(err)
		}
		if err := conn.Send(proto.AppendAcquire(nil, 0, 10, 2, fmt.Sprintf("short/%d/queued", attempt))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1750 * time.Millisecond)
		if err := c.Member(l).Cont(); err != nil {
			t.Fatal(err)
		}
		resumed := time.Now()
		r, err := conn.Read()
		if err != nil {
			t.Fatalf("the request queued during the freeze: %v", err)
		}
		took := time.Since(resumed)
		if after := term(); after != before {
			t.Logf("attempt %d: an election happened anyway (term %d to %d, answer %c): the machine is slow; again", attempt, before, after, r.Op)
			l, _ = waitServing(t, c, 30*time.Second)
			continue
		}
		if r.Op != proto.OpAcquire || r.ID != 2 {
			t.Fatalf("the leader, still leading after a short freeze, answered %c (id %d)", r.Op, r.ID)
		}
		t.Logf("attempt %d: frozen 1.75 s (lease 1.5 s), still the leader: granted %v after SIGCONT", attempt, took)
		return
	}
	t.Fatal("no attempt without an election")
}
