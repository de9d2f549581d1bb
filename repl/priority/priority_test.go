package priority

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/priority/machine"
	"github.com/lockd-dev/lockd/shard"
)

// fakeHost is the engine as a node sees it, for in-process tests: it
// counts gate changes.
type fakeHost struct{ changes atomic.Int64 }

func (h *fakeHost) GateChanged() { h.changes.Add(1) }

func (h *fakeHost) Committed(uint64) {}

func (h *fakeHost) Abandon(uint64) {}

// member is one in-process priority node with its own table and clock.
type member struct {
	p      *node
	table  *shard.Table
	host   *fakeHost
	clock  func() int64
	stalls atomic.Int64 // "frozen or stalled" log lines: a loaded test machine's ticker stalls
}

func startMembers(t *testing.T, n int, mod ...func(*node)) []*member {
	t.Helper()
	ms := openMembers(t, n, mod...)
	for _, m := range ms {
		m.start(t)
	}
	return ms
}

// openMembers opens n members of one cluster without starting them (a
// member not started is down for the others); the test starts each with
// start.
func openMembers(t *testing.T, n int, mod ...func(*node)) []*member {
	t.Helper()
	const offset = 1000
	peers := repltest.FreeAddrs(t, n, offset)
	var ms []*member
	keys := &keysOnce{}
	t.Cleanup(func() { // after the members' Close (cleanups run last first)
		if bad := keys.repeats(); len(bad) > 0 {
			t.Errorf("log lines repeat a key (one key, one meaning): %q", bad)
		}
	})
	for i := range n {
		p, err := newNode(repl.ClusterConfig{Peers: peers, Self: i, Listen: peers[i], PeerOffset: offset,
			FailoverTimeout: 300 * time.Millisecond, DataDir: t.TempDir(), TokenBlock: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range mod {
			f(p)
		}
		m := &member{p: p, host: &fakeHost{}, clock: repltest.Clock()}
		log := slog.New(countingHandler{Handler: keysOnceHandler{Handler: testLogger().Handler(), seen: keys}, match: "frozen or stalled", n: &m.stalls})
		m.table, err = p.Open(shard.Config{Shards: 8}, m.clock, log)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			if m != nil {
				m.p.Close(context.Background(), repl.Discard)
			}
		}
	})
	return ms
}

// start starts an opened member.
func (m *member) start(t *testing.T) {
	t.Helper()
	if err := m.p.Start(m.p.self, m.host); err != nil {
		t.Fatal(err)
	}
}

func (m *member) serving() bool { return m.p.Gate().Effective(m.clock()) == repl.Serve }

func waitServing(t *testing.T, ms []*member, want int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("member %d serving and the others following it in sync", want), func() bool {
		if !ms[want].serving() {
			return false
		}
		for _, mb := range ms[want].p.Status().Members {
			if !mb.Live || !mb.InSync {
				return false // the active's own view, from heartbeats
			}
		}
		for i, m := range ms {
			if i == want || m == nil {
				continue
			}
			st := m.p.Status()
			if st.Role != "standby" || !st.InSync || st.Active != ms[want].p.self {
				return false
			}
		}
		return true
	})
}

// TestPriorityInProcess runs three members in this process (so -race and
// goleak see the node's own goroutines): one becomes active, the others
// follow it; grants, renews and releases made on the active's table reach
// the standbys' tables; a planned handover on Stop moves the active with
// every lock and its token; Close ends every goroutine.
func TestPriorityInProcess(t *testing.T) {
	ms := startMembers(t, 3)
	waitServing(t, ms, 0)
	a := ms[0]
	var out shard.Out
	tokens := map[string]uint64{}
	for i := range 300 {
		key := fmt.Sprintf("k%d", i)
		st, tok := a.table.Acquire(a.clock(), []byte(key), 0, 30, 0, nil, &out)
		if st != shard.Granted {
			t.Fatalf("acquire %s on the active: %v", key, st)
		}
		tokens[key] = tok
	}
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("k%d", i)
		if !a.table.Release(a.clock(), []byte(key), tokens[key], &out) {
			t.Fatalf("release %s", key)
		}
		delete(tokens, key)
	}
	a.table.Renew(a.clock(), []byte("k200"), 60, tokens["k200"], &out)
	same := func(m *member) bool {
		for key, tok := range tokens {
			if info := m.table.Lookup([]byte(key)); !info.Held || info.Token != tok {
				return false
			}
		}
		return m.table.Stats().Keys == len(tokens)
	}
	for i := 1; i < 3; i++ {
		wait.For(t, fmt.Sprintf("standby %d to hold the active's locks", i), func() bool { return same(ms[i]) })
	}
	wait.For(t, "every batch acknowledged", func() bool {
		for _, mb := range a.p.Status().Members {
			if mb.LagRecords != 0 || mb.LagBytes != 0 {
				return false
			}
		}
		return true
	})
	if st := a.p.Status(); st.Priority.Batches == 0 || st.Priority.Records < 400 || st.Priority.WireBytes == 0 || st.Priority.RawBytes < st.Priority.Records*10 {
		t.Fatalf("the active's stream counters: %+v", st)
	}
	if info := ms[1].table.Lookup([]byte("k200")); time.Duration(info.Deadline-ms[1].clock()) < 50*time.Second {
		t.Fatalf("the renew did not reach the standby: %v left", time.Duration(info.Deadline-ms[1].clock()))
	}
	// A planned handover to the best in-sync standby.
	if succ := a.p.Stop(context.Background()); succ != ms[1].p.self {
		t.Fatalf("Stop handed over to %q, want %q", succ, ms[1].p.self)
	}
	if g := a.p.Gate(); g.State != repl.Redirect || g.Addr != ms[1].p.self {
		t.Fatalf("old active's gate after the handover: %+v", g)
	}
	wait.For(t, "the successor to serve", ms[1].serving)
	if !same(ms[1]) {
		t.Fatal("the successor does not hold every lock with its token")
	}
	last := uint64(0)
	for _, tok := range tokens {
		last = max(last, tok)
	}
	st, tok := ms[1].table.Acquire(ms[1].clock(), []byte("new"), 0, 30, 0, nil, &out)
	if st != shard.Granted || tok <= last {
		t.Fatalf("first grant on the successor: %v %d, want above %d", st, tok, last)
	}
}

// TestPriorityFailoverInProcess: the active's links die (Close without a
// handover, as kill -9 would) right after a burst of grants, some of which
// the stream loses; the best standby promotes after the failover timeout
// and its first token is above every token the old active issued. The
// wall-clock floor is off and the active's tokens are far above every
// member's start, so only the replicated reservations can keep the
// promoted member above the grants it never received.
func TestPriorityFailoverInProcess(t *testing.T) {
	ms := startMembers(t, 3, func(p *node) { p.noWallFloor = true })
	waitServing(t, ms, 0)
	a := ms[0]
	a.table.Tokens().Observe(a.table.Tokens().Last() + 1e12)
	var out shard.Out
	var last uint64
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 20000; {
		st, tok := a.table.Acquire(a.clock(), []byte(fmt.Sprint("b", i)), 0, 30, 0, nil, &out)
		switch {
		case st == shard.Granted:
			last = max(last, tok)
			i++
		case time.Now().After(deadline):
			t.Fatalf("acquire %d: %v", i, st)
		}
	}
	a.p.Close(context.Background(), repl.Discard) // no goodbye: silence
	ms[0] = nil
	wait.For(t, "a standby to take over", func() bool { return ms[1].serving() || ms[2].serving() })
	s := ms[1]
	if !s.serving() {
		s = ms[2]
	}
	st, tok := s.table.Acquire(s.clock(), []byte("after"), 0, 30, 0, nil, &out)
	if st != shard.Granted || tok <= last {
		t.Fatalf("first grant after the failover: %v %d, want above %d", st, tok, last)
	}
	lost := 0
	for i := range 20000 {
		if !s.table.Lookup([]byte(fmt.Sprint("b", i))).Held {
			lost++
		}
	}
	t.Logf("%d of the last burst's grants were lost with the active; first token after: +%d", lost, tok-last)
}

// speakAsMember2 starts three members with member 0 serving, stops member
// 2 and dials member 0's member link as member 2 would: it returns member
// 0, its epoch, the connection and the hello to write before anything
// else on it.
func speakAsMember2(t *testing.T) (a *member, epoch uint64, c net.Conn, hello []byte) {
	t.Helper()
	ms := startMembers(t, 3)
	waitServing(t, ms, 0)
	a = ms[0]
	ms[2].p.Close(context.Background(), repl.Discard)
	ms[2] = nil // the members' cleanup skips it
	c, err := net.Dial("tcp", a.p.cfg.MemberAddr(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := a.p.hello()
	h.Self = 2
	return a, a.p.Status().Priority.Epoch, c, h.Append(nil)
}

// TestSplitActiveBackAsStandby: a member that comes back as a standby
// with a stored epoch above the active's — it promoted on the other side
// of a partition, granted above the active's counter and died before the
// heal, so the two never saw each other as actives — makes the active's
// tokens go on above its mark (DESIGN.md, "Tokens across a failover",
// 6). Member 2 of three is that member: it is stopped, and its first
// heartbeat after a restart is played on a raw connection.
func TestSplitActiveBackAsStandby(t *testing.T) {
	a, epoch, c, hello := speakAsMember2(t)
	mark := a.table.Tokens().Last() + 1e12 // what it reserved on its side
	hb := heartbeat{Epoch: 0, Role: machine.RoleStandby, Active: noActive, Probe: 1, TokenLast: mark, StoredEpoch: epoch + 1}
	if _, err := c.Write(hb.Append(hello)); err != nil {
		t.Fatal(err)
	}
	// The gate holds requests from the heartbeat until the jump is
	// reserved: once it serves again, the counter is past the mark and the
	// first acquire is granted above it (not B).
	wait.For(t, "the active to serve again above the returning member's mark", func() bool {
		return a.table.Tokens().Last() >= mark && a.serving()
	})
	var out shard.Out
	if st, tok := a.table.Acquire(a.clock(), []byte("after"), 0, 30, 0, nil, &out); st != shard.Granted || tok <= mark {
		t.Fatalf("first acquire after the member came back: %v, token %d, want granted above %d", st, tok, mark)
	}
	if st := a.p.Status(); st.Role != "active" || st.Priority.Demotions != 0 {
		t.Fatalf("the active changed: %+v", st)
	}
	// A counter near 2^64 is no real member's: the reservation above it
	// would wrap. It is ignored.
	hb.Probe, hb.StoredEpoch, hb.TokenLast = 2, epoch+2, math.MaxUint64-5
	if _, err := c.Write(hb.Append(nil)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * a.p.cfg.FailoverTimeout / 10)
	if last := a.table.Tokens().Last(); last >= 1<<63 || !a.serving() {
		t.Fatalf("after a heartbeat claiming token %d: counter %d, serving %v", hb.TokenLast, last, a.serving())
	}
}

// TestActiveMeetingActiveHoldsNotBusy: an active that hears another
// active whose tokens are above its reservation (a healed partition; here
// a raw heartbeat of member 2 claiming to be active at the same epoch,
// which member 0 beats) never serves without a token to give: it holds
// requests until its reservation covers the jump (PROTOCOL.md decision
// 70), then grants above the other's reservation. On the old code its
// gate kept serving while the counter was past the reservation, and an
// acquire got B.
func TestActiveMeetingActiveHoldsNotBusy(t *testing.T) {
	a, epoch, c, hello := speakAsMember2(t)
	other := a.table.Tokens().Limit() + 1e12 // what the other side reserved
	hb := heartbeat{Epoch: epoch, Role: machine.RoleActive, Active: 2, Probe: 1, TokenLast: other - 5, Reserved: other, StoredEpoch: epoch, Serving: true}
	var out shard.Out
	if st, _ := a.table.Acquire(a.clock(), []byte("before"), 0, 30, 0, nil, &out); st != shard.Granted {
		t.Fatalf("acquire before the heartbeat: %v", st)
	}
	if _, err := c.Write(hb.Append(hello)); err != nil {
		t.Fatal(err)
	}
	// Acquire as the engine would: only while the gate serves. A B seen
	// while the gate still serves, after the acquire, is one a client got.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("not serving above the other active's reservation %d within 10 s: counter %d, serving %v",
				other, a.table.Tokens().Last(), a.serving())
		}
		if !a.serving() {
			continue
		}
		st, tok := a.table.Acquire(a.clock(), []byte(fmt.Sprint("k", i)), 0, 30, 0, nil, &out)
		if st == shard.Busy && a.serving() {
			t.Fatalf("acquire %d answered B while the gate served (counter %d, limit %d)", i, a.table.Tokens().Last(), a.table.Tokens().Limit())
		}
		if st == shard.Granted && tok > other {
			break
		}
	}
}

// TestHandoverUnderLoadServesWithTokens: a planned handover while the
// active grants millions of tokens a second (its reservations always in
// flight) leaves the successor serving with tokens to give: no acquire is
// answered B while a gate serves. Before, a reservation the old active
// had in flight at the Handoff, or began after it, reached the standbys as
// their mark above the successor's reservation, and the successor jumped
// above it and answered B (8 of 25 runs beside two CPU hogs; the
// successor's counter one or two blocks past its limit).
func TestHandoverUnderLoadServesWithTokens(t *testing.T) {
	ms := startMembers(t, 3)
	waitServing(t, ms, 0)
	var busy, granted, after atomic.Int64
	var firstBusy atomic.Value
	var handedOver atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var out shard.Out
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for j, m := range ms {
					if !m.serving() {
						continue
					}
					// As the engine: only while the gate serves; a B seen
					// while it still serves is one a client got.
					key := []byte(fmt.Sprintf("w%d/%d", w, i%16))
					st, tok := m.table.Acquire(m.clock(), key, 0, 10, 0, nil, &out)
					switch {
					case st == shard.Busy && m.serving():
						busy.Add(1)
						firstBusy.CompareAndSwap(nil, fmt.Sprintf("member %d, counter %d, limit %d", j, m.table.Tokens().Last(), m.table.Tokens().Limit()))
					case st == shard.Granted:
						granted.Add(1)
						if handedOver.Load() && j != 0 {
							after.Add(1)
						}
						m.table.Release(m.clock(), key, tok, &out)
					}
					break
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	to := ms[0].p.Stop(ctx)
	cancel()
	if to == "" {
		t.Fatal("no member took the handover")
	}
	handedOver.Store(true)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := busy.Load(); n > 0 {
		t.Fatalf("%d acquires answered B while a gate served (of %d granted): first: %v", n, granted.Load(), firstBusy.Load())
	}
	if after.Load() == 0 {
		t.Fatalf("no grant on the successor %s after the handover", to)
	}
	t.Logf("%d grants, %d of them on the successor after the handover", granted.Load(), after.Load())
}

// countingHandler counts the records whose message contains match.
type countingHandler struct {
	slog.Handler
	match string
	n     *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.match, h.n}
}

func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(g), h.match, h.n}
}

func testLogger() *slog.Logger {
	if os.Getenv("LOCKD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return repltest.Quiet()
}

// TestPriorityTakeoverKeepsIdentities: every grant's identity
// (PROTOCOL.md §8.3) reaches the standbys — one in the stream from the
// start (records), one that joins later (a snapshot, then the stream) —
// and the member that takes over after the others die holds every grant
// with its identity, so a release from another identity is still refused
// there and the owner's works.
func TestPriorityTakeoverKeepsIdentities(t *testing.T) {
	ms := openMembers(t, 3)
	ms[0].start(t)
	ms[1].start(t)
	wait.For(t, "member 0 serving with member 1 in sync", func() bool {
		st := ms[1].p.Status()
		return ms[0].serving() && st.Role == "standby" && st.InSync
	})
	a := ms[0]
	var out shard.Out
	names := []string{"orders", "", "billing@example.com"}
	type grant struct {
		token uint64
		ident string
	}
	want := map[string]grant{}
	acquire := func(i int) {
		key := fmt.Sprint("id/", i)
		name := names[i%len(names)]
		st, tok := a.table.AcquireAs(a.clock(), []byte(key), 0, 60, 0, a.table.Ident([]byte(name)), nil, &out)
		if st != shard.Granted {
			t.Fatalf("acquire %s: %v", key, st)
		}
		want[key] = grant{tok, name}
	}
	for i := range 150 { // before member 2 joins: it gets them in its snapshot
		acquire(i)
	}
	ms[2].start(t)
	waitServing(t, ms, 0)
	for i := 150; i < 300; i++ { // in the stream, to both standbys
		acquire(i)
	}
	has := func(m *member) bool {
		for key, g := range want {
			if info := m.table.Lookup([]byte(key)); !info.Held || info.Token != g.token || info.Ident != g.ident {
				return false
			}
		}
		return true
	}
	for i := 1; i < 3; i++ {
		wait.For(t, fmt.Sprintf("standby %d to hold every grant with its identity", i), func() bool { return has(ms[i]) })
	}
	// Members 0 and 1 die; member 2 (the one that joined by snapshot)
	// takes over.
	for i := 0; i < 2; i++ {
		ms[i].p.Close(context.Background(), repl.Discard)
		ms[i] = nil
	}
	s := ms[2]
	wait.For(t, "member 2 to take over", s.serving)
	if !has(s) {
		t.Fatal("the member that took over lost grants or their identities")
	}
	g := want["id/0"] // orders'
	other := shard.Who{Ident: s.table.Ident([]byte("billing@example.com"))}
	if r, holder := s.table.ReleaseAs(s.clock(), []byte("id/0"), g.token, other, &out); r != shard.ResultRefused ||
		string(s.table.IdentName(holder)) != "orders" {
		t.Fatalf("another identity's release after the takeover: %v (holder %q)", r, s.table.IdentName(holder))
	}
	if r, _ := s.table.ReleaseAs(s.clock(), []byte("id/0"), g.token, shard.Who{Ident: s.table.Ident([]byte("orders"))}, &out); r != shard.ResultOK {
		t.Fatalf("the owner's release after the takeover: %v", r)
	}
}

// TestStaleGateNotInstalled: a gate is installed only if no gate the
// machine numbered later is: one published out of order cannot reopen a
// gate closed by a handover's hold or a demotion.
func TestStaleGateNotInstalled(t *testing.T) {
	p, err := newNode(repl.ClusterConfig{Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}, Self: 0, Listen: "127.0.0.1:1",
		PeerOffset: 1000, FailoverTimeout: time.Second, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	host := &fakeHost{}
	now := int64(1e9)
	p.host, p.clock = host, func() int64 { return now }
	for _, tc := range []struct {
		name  string
		later machine.Gate
		want  repl.GateState
	}{
		{"handover", machine.Gate{State: machine.Hold, To: machine.None}, repl.Hold},
		{"demotion", machine.Gate{State: machine.Redirect, To: 1}, repl.Redirect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := p.gate.Load().seq
			stale := machine.Gate{State: machine.Serve, To: machine.None, Until: now + 1e9, Seq: base + 1}
			tc.later.Seq = base + 2
			p.publish(tc.later)
			p.publish(stale) // published late
			if g := p.Gate(); g.State != tc.want {
				t.Fatalf("gate %v after a stale %v was published late, want %v", g.State, stale.State, tc.want)
			}
		})
	}
}

// TestBusyReaderKeepsSenderLive: while this member processes a frame of a
// member's (held up by its own work: a table reset under the apply lock,
// an fsync, the engine's barrier), the tick counts that member as heard
// (machine.Local.Busy), for at most ten failover timeouts.
func TestBusyReaderKeepsSenderLive(t *testing.T) {
	m := openMembers(t, 2)[1]
	p := m.p
	at := m.clock()
	p.busySince[0].Store(at)
	if l := p.measure(); l.Busy != 1 {
		t.Fatalf("busy %b with a frame of member 0 in hand, want 1", l.Busy)
	}
	p.busySince[0].Store(at - 11*p.timeout())
	if l := p.measure(); l.Busy != 0 {
		t.Fatalf("busy %b with a frame in hand for 11 failover timeouts, want 0", l.Busy)
	}
	p.busySince[0].Store(0)
	if l := p.measure(); l.Busy != 0 {
		t.Fatalf("busy %b with no frame in hand", l.Busy)
	}
}

// TestOpenNumbersProbesFromTheClock: Open starts the heartbeat probes at
// probeBase, so a restarted member's probes are above every probe of its
// earlier lives that the others may still echo
// (machine.TestRolesFreezeCheckAfterRestart).
func TestOpenNumbersProbesFromTheClock(t *testing.T) {
	before := probeBase()
	m := openMembers(t, 2)[0]
	for _, a := range m.p.m.Tick(m.clock(), m.p.measure()) {
		if a.Kind == machine.ActHeartbeat && a.HB.Probe <= before {
			t.Fatalf("probes start at %d, below the clock's %d before Open", a.HB.Probe, before)
		}
	}
}

// keysOnce collects the log lines of the members of a test that name a
// key twice: every JSON line must give each key one meaning (the member's
// own index is member; another member is peer, active, successor, …).
type keysOnce struct {
	mu  sync.Mutex
	bad []string
}

func (k *keysOnce) add(line string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.bad) < 10 {
		k.bad = append(k.bad, line)
	}
}

func (k *keysOnce) repeats() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bad
}

// keysOnceHandler reports to seen every record that repeats a key,
// counting the attributes the logger was made With.
type keysOnceHandler struct {
	slog.Handler
	with []string
	seen *keysOnce
}

func (h keysOnceHandler) Handle(ctx context.Context, r slog.Record) error {
	keys := map[string]bool{}
	for _, k := range h.with {
		keys[k] = true
	}
	r.Attrs(func(a slog.Attr) bool {
		if keys[a.Key] {
			h.seen.add(r.Message + ": " + a.Key)
		}
		keys[a.Key] = true
		return true
	})
	return h.Handler.Handle(ctx, r)
}

func (h keysOnceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	with := slices.Clone(h.with)
	for _, a := range as {
		with = append(with, a.Key)
	}
	return keysOnceHandler{Handler: h.Handler.WithAttrs(as), with: with, seen: h.seen}
}

func (h keysOnceHandler) WithGroup(g string) slog.Handler {
	return keysOnceHandler{Handler: h.Handler.WithGroup(g), seen: h.seen}
}

// TestHeardOncePerInterval: every frame shows its sender is live, but the
// readers tell the machine so at most once every twentieth of the
// failover timeout per member: a stream of batches and acknowledgements
// (a thousand a second) must not fill run's inbox, which would hold up
// the readers and the standbys' acknowledgements behind it (a bench run
// saw a standby's lag reach 415 ms).
func TestHeardOncePerInterval(t *testing.T) {
	m := openMembers(t, 2)[0] // not started: nothing drains the inbox
	p := m.p
	pm := &peerMap{from: 1, xlate: []int{0, 1}}
	in := p.standby.from(1)
	ack := (&snapAck{ID: 1, Frames: 1}).Append(nil)[frameHead : len((&snapAck{}).Append(nil))-frameTail]
	for range 100 {
		if err := p.receive(in, 1, pm, msgSnapAck, ack); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(p.inbox); n != 1 {
		t.Fatalf("%d messages in run's inbox after 100 frames within a twentieth of the failover timeout, want 1", n)
	}
}

// TestOtherVersionRefused: a member that speaks another version of the
// member link (a cluster that mixes lockd versions) is refused at its
// Hello, with an error that names both versions; a member that then hears
// no one is not ready, and says why (docs/PROTOCOL.md decisions 37, 38).
func TestOtherVersionRefused(t *testing.T) {
	var refusals atomic.Int64
	ms := openMembers(t, 2)
	m := ms[0]
	m.p.log = slog.New(countingHandler{Handler: m.p.log.Handler(), match: "another version of the member link", n: &refusals})
	m.p.link.log = m.p.log
	m.start(t)
	c, err := net.Dial("tcp", m.p.cfg.MemberAddr(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := m.p.hello()
	h.Self = 1
	old := h.Append(nil)
	binary.BigEndian.PutUint16(old[frameHead:], protocolVersion-1) // a version-5 member
	binary.BigEndian.PutUint32(old[len(old)-frameTail:], crc32.Checksum(old[4:len(old)-frameTail], castagnoli))
	if _, err := c.Write(old); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the refusal logged", func() bool { return refusals.Load() > 0 })
	wait.For(t, "member 0 unready, naming the refused link", func() bool {
		err := m.p.Health()
		return err != nil && strings.Contains(err.Error(), "refused") && strings.Contains(err.Error(), m.p.cfg.Peers[1])
	})
}
