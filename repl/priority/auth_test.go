package priority

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/memberauth"
	"github.com/lockd-dev/lockd/repl/priority/machine"
	"github.com/lockd-dev/lockd/shard"
)

// forgeHeartbeats plays member 2 on c: a Hello that matches the cluster's
// and, every 20 ms for d, a heartbeat that says "active at epoch 2^40,
// tokens up to 2^62, serving, and you, the active at epoch verdict, step
// down". It returns whether the member closed c.
func forgeHeartbeats(c net.Conn, h hello, d time.Duration, verdict uint64) (closed bool) {
	defer c.Close()
	h.Self = 2
	hb := heartbeat{Epoch: 1 << 40, Role: machine.RoleActive, Active: 2, InSync: true, Serving: true, TokenLast: 1 << 62, Reserved: 1 << 62,
		Verdict: verdict}
	out := h.Append(nil)
	for end := time.Now().Add(d); time.Now().Before(end); {
		hb.Probe++
		out = hb.Append(out)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(out); err != nil {
			return true
		}
		out = out[:0]
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// clusterState is what a forged connection must not change.
type clusterState struct {
	epochs    []uint64
	roles     []string
	changes   []uint64 // failovers + demotions + handovers
	tokenLast uint64
	locks     map[string]uint64 // on the active
}

func stateOf(ms []*member, keys map[string]uint64) clusterState {
	var s clusterState
	for _, m := range ms {
		st := m.p.Status()
		s.epochs = append(s.epochs, st.Priority.Epoch)
		role := st.Role
		if role == api.RoleActiveChecking {
			// A freeze check after a stall of the loaded test machine is
			// not a role change.
			role = api.RoleActive
		}
		s.roles = append(s.roles, role)
		s.changes = append(s.changes, st.Priority.Failovers+st.Priority.Demotions+st.Priority.Handovers)
	}
	s.tokenLast = ms[0].table.Tokens().Last()
	s.locks = map[string]uint64{}
	for k := range keys {
		if info := ms[0].table.Lookup([]byte(k)); info.Held {
			s.locks[k] = info.Token
		}
	}
	return s
}

func (s clusterState) String() string {
	return fmt.Sprintf("epochs %v, roles %v, role changes %v, token counter %d, %d locks held", s.epochs, s.roles, s.changes, s.tokenLast, len(s.locks))
}

func (s clusterState) equal(o clusterState) bool {
	if fmt.Sprint(s.epochs, s.roles, s.changes, s.tokenLast) != fmt.Sprint(o.epochs, o.roles, o.changes, o.tokenLast) || len(s.locks) != len(o.locks) {
		return false
	}
	for k, v := range s.locks {
		if o.locks[k] != v {
			return false
		}
	}
	return true
}

// TestForgedMember: a stranger on the member port (a raw TCP client with
// a valid Hello and "active, epoch 2^40" heartbeats claiming to be member
// 2; or one that runs the exchange with a certificate of another CA, or
// of the right CA naming another host) takes a cluster without §8.4 over
// — the real active steps down, the forged epoch spreads — and changes
// nothing with §8.4 on: the same active, the same epochs, no role change,
// every lock held with its token, the token counter unmoved, the
// refusals counted.
func TestForgedMember(t *testing.T) {
	mats, cases := repltest.ForgeryCases(t, 7)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			ms := startMembers(t, 3, func(p *node) {
				p.cfg.Secret = tc.Secret
				if tc.TLS {
					p.cfg.MemberTLS = mats[p.cfg.Self]
				}
			})
			waitServing(t, ms, 0)
			a := ms[0]
			var out shard.Out
			keys := map[string]uint64{}
			for i := range 50 {
				key := fmt.Sprintf("held/%d", i)
				// B while a reservation catches up (two members promoted at
				// once at the start: the survivor's tokens jump) is retried.
				wait.For(t, "acquire "+key, func() bool {
					st, tok := a.table.Acquire(a.clock(), []byte(key), 0, 60, 0, nil, &out)
					if st != shard.Granted && st != shard.Busy {
						t.Fatalf("acquire %s: %v", key, st)
					}
					keys[key] = tok
					return st == shard.Granted
				})
			}
			wait.For(t, "the standbys to have every lock", func() bool {
				for _, m := range ms[1:] {
					if m.table.Lookup([]byte("held/49")).Token != keys["held/49"] {
						return false
					}
				}
				return true
			})
			before := stateOf(ms, keys)
			h := a.p.hello()
			forge := func(to int) net.Conn {
				addr := a.p.cfg.MemberAddr(to)
				if tc.Impostor != nil {
					cfg := a.p.cfg
					cfg.Self, cfg.MemberTLS = 2, tc.Impostor
					c, err := memberauth.New(cfg, memberauth.Options{Mode: memberauth.ModePriority}, repltest.Quiet()).
						Dial(context.Background(), to, addr, time.Second)
					if err == nil {
						t.Errorf("the impostor's exchange with member %d succeeded", to)
						return c
					}
				}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			// Member 0 (the active) and member 1 (a standby) hear the
			// forged active for three failover timeouts.
			d := 3 * a.p.cfg.FailoverTimeout
			done := make(chan bool, 2)
			epoch := a.p.Status().Priority.Epoch
			for _, to := range []int{0, 1} {
				c := forge(to)
				go func() { done <- forgeHeartbeats(c, h, d, epoch) }()
			}
			first, second := <-done, <-done
			closed := first && second
			if tc.Name != "off" {
				time.Sleep(d) // what a forged heartbeat did would show by now
			}
			after := stateOf(ms, keys)
			if tc.Name == "off" {
				// The takeover: the real active stepped down (discarding its
				// table for a snapshot), and the forged epoch is the cluster's.
				wait.For(t, "the real active to step down", func() bool { return ms[0].p.Status().Priority.Demotions > 0 })
				if e := ms[0].p.Status().Priority.Epoch; e < 1<<40 {
					t.Errorf("without §8.4 the forged epoch did not spread: epoch %d", e)
				}
				after = stateOf(ms, keys)
				t.Logf("without §8.4: %v (before: %v)", after, before)
				return
			}
			if !closed {
				t.Error("a member kept the forged connection open")
			}
			if stalled := ms[0].stalls.Load(); stalled > 0 && after.tokenLast != before.tokenLast && after.tokenLast < 1<<62 {
				// The active's ticker stalled (the loaded test machine): its
				// freeze check ends with a jump to the wall clock, no forgery's.
				t.Logf("member 0 stalled %d times: its token counter moved %d to the wall clock", stalled, after.tokenLast-before.tokenLast)
				after.tokenLast = before.tokenLast
			}
			if !after.equal(before) {
				t.Fatalf("the forged member changed the cluster:\nbefore %v\nafter  %v", before, after)
			}
			for _, m := range ms[1:] {
				for k, tok := range keys {
					if m.table.Lookup([]byte(k)).Token != tok {
						t.Fatalf("standby lost %s", k)
					}
				}
			}
			// Serving (a freeze check after a stall of the loaded machine
			// may hold the gate a moment; a demotion would show above).
			wait.For(t, "the active serving", ms[0].serving)
			if st, _ := a.table.Acquire(a.clock(), []byte("after"), 0, 60, 0, nil, &out); st != shard.Granted {
				t.Fatalf("acquire after the forgery: %v", st)
			}
			for i, m := range ms[:2] {
				var n uint64
				for _, r := range m.p.Status().MemberRefused {
					n += r.N
				}
				if n == 0 {
					t.Errorf("member %d counted no refusal: %v", i, m.p.Status().MemberRefused)
				}
			}
		})
	}
}

// TestFloodedMemberPort: a flood of connections that never authenticate,
// on the active's member port, holds at most the exchange's limit of
// them; meanwhile a standby whose link broke gets back in through it, the
// active serves and its grants reach that standby.
func TestFloodedMemberPort(t *testing.T) {
	ms := startMembers(t, 3, func(p *node) { p.cfg.Secret = repltest.Secret(3) })
	waitServing(t, ms, 0)
	a := ms[0]
	g0 := runtime.NumGoroutine()
	stop := repltest.Flood(a.p.cfg.MemberAddr(0), 200)
	defer stop()
	wait.For(t, "the flood to fill the exchange", func() bool { return refusedFor(a, "limit") > 50 })
	// Member 1's link to the active breaks: it dials again into the flood.
	pe := ms[1].p.link.peers[0]
	pe.mu.Lock()
	c := pe.conn
	pe.mu.Unlock()
	c.Close()
	wait.For(t, "member 1's link to the active up again, through the flood", func() bool {
		pe.mu.Lock()
		defer pe.mu.Unlock()
		return pe.conn != nil && pe.conn != c
	})
	var out shard.Out
	key := []byte("during-the-flood")
	var tok uint64
	wait.For(t, "a grant on the active", func() bool {
		var st shard.Status
		st, tok = a.table.Acquire(a.clock(), key, 0, 60, 0, nil, &out)
		return st == shard.Granted
	})
	wait.For(t, "member 1 in sync with the grant, live for the active", func() bool {
		for _, mb := range a.p.Status().Members {
			if mb.Addr == ms[1].p.self && !mb.Live {
				return false
			}
		}
		return ms[1].table.Lookup(key).Token == tok && ms[1].p.Status().InSync
	})
	if g := runtime.NumGoroutine() - g0; g > memberauth.DefaultMaxPending+16 {
		t.Errorf("%d more goroutines during the flood, want about the exchange's limit (%d)", g, memberauth.DefaultMaxPending)
	}
	n := stop()
	t.Logf("%d connections flooded; refused %v; member 1 reconnected and in sync", n, a.p.Status().MemberRefused)
	if st := a.p.Status(); st.Role != "active" || st.Priority.Demotions != 0 {
		t.Fatalf("the active changed: %+v", st)
	}
}

func refusedFor(m *member, reason string) uint64 {
	for _, r := range m.p.Status().MemberRefused {
		if r.Reason == reason {
			return r.N
		}
	}
	return 0
}
