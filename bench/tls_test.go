package main

import (
	"net"
	"testing"
	"time"
)

// checkTLSOnly: the target's address refuses a plaintext client.
func checkTLSOnly(t *testing.T, tg *target) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", tg.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tg.ping(nc); err == nil {
		t.Fatalf("%s answered a plaintext ping", tg.name)
	}
}

// checkHandshakes: the handshakes workload measured full TLS handshakes.
func checkHandshakes(t *testing.T, r *Result) {
	t.Helper()
	checkClean(t, r)
	if r.Unit != "handshakes/s" {
		t.Errorf("%s handshakes: unit %q", r.Target, r.Unit)
	}
}

func TestLockdTLSDriver(t *testing.T) {
	tg := openTest(t, "lockd-tls")
	checkTLSOnly(t, tg)
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	checkContended(t, run1(t, tg, wlContended, cfg), 0.9)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
	checkHandshakes(t, run1(t, tg, wlHandshakes, cfg))
}

func TestRedisTLSDriver(t *testing.T) {
	needPeer(t, "redis-server")
	tg := openTest(t, "redis-tls")
	checkTLSOnly(t, tg)
	cfg := smallConfig()
	checkClean(t, run1(t, tg, wlUncontended, cfg))
	checkContended(t, run1(t, tg, wlContended, cfg), 0.1)
	checkFanin(t, run1(t, tg, wlFanin, cfg), cfg)
	checkHandshakes(t, run1(t, tg, wlHandshakes, cfg))
}

// TestHandshakesSkippedInPlaintext: a plaintext target has no handshake
// to measure.
func TestHandshakesSkippedInPlaintext(t *testing.T) {
	tg := openTest(t, "lockd")
	if r := run1(t, tg, wlHandshakes, smallConfig()); r.Skipped == "" {
		t.Fatal("handshakes ran on a plaintext target")
	}
}

// TestTLSGoals: issue 19's goals are judged per round from lockd-tls,
// lockd and redis-tls results.
func TestTLSGoals(t *testing.T) {
	rs := []*Result{
		fake("lockd", wlUncontended, 1, 100, 0, time.Millisecond), fake("lockd-tls", wlUncontended, 1, 80, 0, time.Millisecond),
		fake("redis-tls", wlUncontended, 1, 20, 0, time.Millisecond),
		fake("lockd", wlUncontended, 2, 100, 0, time.Millisecond), fake("lockd-tls", wlUncontended, 2, 60, 0, time.Millisecond),
		fake("redis-tls", wlUncontended, 2, 30, 0, time.Millisecond),
	}
	var got []goal
	for _, g := range goals(rs) {
		if g.Target == "lockd-tls" {
			got = append(got, g)
		}
	}
	if len(got) != 2 {
		t.Fatalf("lockd-tls goals %+v, want 2", got)
	}
	if g := got[0]; g.Limit != 0.7 || g.Met != 1 || !near(g.Rounds[0], 0.8) || !near(g.Rounds[1], 0.6) {
		t.Errorf("÷ lockd goal %+v", g)
	}
	if g := got[1]; g.Limit != 2.5 || !g.Times || g.Met != 1 || !near(g.Rounds[0], 4) || !near(g.Rounds[1], 2) {
		t.Errorf("÷ redis-tls goal %+v", g)
	}
}
