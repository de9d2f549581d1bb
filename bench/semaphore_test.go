package main

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// semConfig is smallConfig with a semaphore of 2 permits on each of its 2
// hot keys, 4 slots per key, each holding its permit 5 ms: every key is
// full most of the time.
func semConfig() *config {
	cfg := smallConfig()
	cfg.SemLimit, cfg.SemHold = 2, 5*time.Millisecond
	return cfg
}

// checkSemaphore asserts a semaphore run granted permits, reached the limit
// and never went beyond it.
func checkSemaphore(t *testing.T, r *Result, cfg *config, minJain float64) {
	t.Helper()
	checkClean(t, r)
	if r.Limit != cfg.SemLimit || r.OverLimit != 0 || r.MaxHolders != cfg.SemLimit {
		t.Errorf("%s semaphore: limit %d, %d grants beyond it, at most %d holders at once; want limit %d reached and never passed",
			r.Target, r.Limit, r.OverLimit, r.MaxHolders, cfg.SemLimit)
	}
	if r.Jain < minJain || r.Jain > 1.0000001 {
		t.Errorf("%s semaphore: Jain %.3f, want ≥ %.2f", r.Target, r.Jain, minJain)
	}
}

// TestSemaphoreDrivers runs the semaphore workload on every target that
// has one: lockd's S (FIFO), Redisson's expirable-permit scripts on Redis
// (woken by notifications) and the ordered-keys recipe on etcd (FIFO).
func TestSemaphoreDrivers(t *testing.T) {
	cfg := semConfig()
	t.Run("lockd", func(t *testing.T) {
		checkSemaphore(t, run1(t, openTest(t, "lockd"), wlSemaphore, cfg), cfg, 0.9)
	})
	t.Run("echo", func(t *testing.T) {
		if r := run1(t, openTest(t, "echo"), wlSemaphore, cfg); r.Skipped == "" {
			t.Error("echo has no lock state; semaphore must be skipped")
		}
	})
	t.Run("redis", func(t *testing.T) {
		needPeer(t, "redis-server")
		r := run1(t, openTest(t, "redis"), wlSemaphore, cfg)
		checkSemaphore(t, r, cfg, 0.1) // not FIFO: whoever retries first
		if r.Notified == 0 {
			t.Error("redis semaphore: no waiter was woken by a release's notification")
		}
	})
	t.Run("etcd", func(t *testing.T) {
		needPeer(t, "etcd")
		c := *cfg
		c.Dur = 2 * c.Dur // a few hundred grants a second
		checkSemaphore(t, run1(t, openTest(t, "etcd"), wlSemaphore, &c), &c, 0.5)
	})
}

// TestSemaphoreCountsHolders: the workload counts a holder from its grant
// to its release's issue, and a grant that finds the key full is counted
// beyond the limit — what a broken semaphore would show.
func TestSemaphoreCountsHolders(t *testing.T) {
	cfg := semConfig()
	cfg.Hot, cfg.Waiters = 1, 3
	clk := newClock(cfg, 0)
	w := newSemaphore(clk, cfg, 0)
	st := newStats()
	slots := make([]*slot, 3)
	for i := range slots {
		slots[i] = &slot{id: i}
		if a := w.first(slots[i], 0); a.op != opAcquire || a.limit != 2 || string(a.key) != "bench/sem/0" {
			t.Fatalf("first action %+v", a)
		}
	}
	for i, s := range slots[:2] {
		if a := w.next(s, &answer{kind: ansGranted, token: uint64(10 + i)}, clk.now(), st); a.op != opWake || a.delay != cfg.SemHold {
			t.Fatalf("after a grant: %+v, want the hold", a)
		}
	}
	if w.over.Load() != 0 || w.maxHolders() != 2 {
		t.Fatalf("two holders of 2 permits: %d beyond, %d at most", w.over.Load(), w.maxHolders())
	}
	w.next(slots[2], &answer{kind: ansGranted, token: 12}, clk.now(), st)
	if w.over.Load() != 1 || w.maxHolders() != 3 {
		t.Fatalf("a third holder of 2 permits: %d beyond, %d at most; want 1 and 3", w.over.Load(), w.maxHolders())
	}
	a := w.next(slots[0], &answer{kind: ansWake}, clk.now(), st)
	if a.op != opRelease || a.token != 10 || a.limit != 2 || w.held[0].Load() != 2 {
		t.Fatalf("the hold's end: %+v with %d holders, want the release of token 10 and 2 holders", a, w.held[0].Load())
	}
}

// TestRedisSemaphoreScripts drives the two scripts by hand: permits up to
// the limit, a refusal telling the nearest expiry, a release announced on
// the channel with the permits now free, an expired permit given back to
// the next acquire, and the release of an expired permit answered 0.
func TestRedisSemaphoreScripts(t *testing.T) {
	needPeer(t, "redis-server")
	tg := openTest(t, "redis")
	cfg := semConfig()
	cfg.Hot, cfg.Waiters = 1, 1
	w := newSemaphore(&clock{}, cfg, time.Millisecond)
	stop, err := redisSemSetup(tg.addr, nil, w, 1)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	key := string(w.hot[0])
	sub, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sub.Write(appendBulk(appendBulk(appendArray(nil, 2), "SUBSCRIBE"), semChannel(nil, key)))
	br := bufio.NewReader(sub)
	if msg, err := readPush(br); err != nil || string(msg[0]) != "subscribe" {
		t.Fatalf("SUBSCRIBE: %q %v", msg, err)
	}
	now := time.Now().UnixMilli()
	ms := func(v int64) string { return strconv.FormatInt(v, 10) }
	acquire := func(id string, expires int64) string {
		t.Helper()
		got, err := redisCommand(tg.addr, nil, "EVALSHA", redisSemAcquireSHA, "3", key, string(semTimeoutKey(nil, key)),
			string(semChannel(nil, key)), "1", ms(expires), ms(time.Now().UnixMilli()), id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	release := func(id string) string {
		t.Helper()
		got, err := redisCommand(tg.addr, nil, "EVALSHA", redisSemReleaseSHA, "3", key, string(semTimeoutKey(nil, key)),
			string(semChannel(nil, key)), id, ms(time.Now().UnixMilli()))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if a, b := acquire("1", now+10_000), acquire("2", now+20_000); a != "OK" || b != "OK" {
		t.Fatalf("two acquires of 2 permits: %q %q", a, b)
	}
	if c := acquire("3", now+10_000); c != ":"+ms(now+10_000) {
		t.Fatalf("a third acquire: %q, want the nearest expiry :%d", c, now+10_000)
	}
	if r := release("1"); r != "1" {
		t.Fatalf("release: %q", r)
	}
	sub.SetReadDeadline(time.Now().Add(5 * time.Second))
	if msg, err := readPush(br); err != nil || len(msg) != 3 || string(msg[0]) != "message" || string(msg[2]) != "1" {
		t.Fatalf("the release's announcement: %q %v, want a message with 1 permit free", msg, err)
	}
	if r := release("1"); r != "0" {
		t.Fatalf("a second release of one permit: %q, want 0", r)
	}
	// A permit whose expiry has passed: given back (and announced) by the
	// next acquire, which takes it.
	if c := acquire("3", now-1); c != "OK" {
		t.Fatalf("acquire: %q", c)
	}
	if c := acquire("4", now+10_000); c != "OK" {
		t.Fatalf("an acquire after a permit expired: %q, want OK", c)
	}
	if msg, err := readPush(br); err != nil || string(msg[0]) != "message" {
		t.Fatalf("the expiry's announcement: %q %v", msg, err)
	}
	if r := release("3"); r != "0" {
		t.Fatalf("the release of an expired permit: %q, want 0", r)
	}
	if got, err := redisCommand(tg.addr, nil, "GET", key); err != nil || got != "0" {
		t.Fatalf("permits available with 2 of 2 held: %q %v", got, err)
	}
}

// TestEtcdSemaphoreRecipe drives the etcd recipe by hand: two permits
// granted at once, a third waiter blocked until one is released and then
// granted with a larger token, and a waiter whose wait is spent refused
// and out of the queue.
func TestEtcdSemaphoreRecipe(t *testing.T) {
	needPeer(t, "etcd")
	tg := openTest(t, "etcd")
	s := []*slot{{id: 0}, {id: 1}, {id: 2}, {id: 3}}
	er, err := tg.etcd.start([][]*slot{s}, etcdSemaphore)
	if err != nil {
		t.Fatal(err)
	}
	defer er.close()
	acq := action{op: opAcquire, key: []byte("bench/test/sem"), wait: 5, lease: 10, limit: 2}
	rel := action{op: opRelease, key: acq.key, limit: 2}
	g0, g1 := er.do(s[0], &acq), er.do(s[1], &acq)
	if g0.kind != ansGranted || g1.kind != ansGranted || g1.token <= g0.token {
		t.Fatalf("two acquires of 2 permits: %+v %+v (last error %v)", g0, g1, tg.etcd.lastErr.Load())
	}
	got := make(chan answer, 1)
	go func() { got <- er.do(s[2], &acq) }()
	select {
	case g := <-got:
		t.Fatalf("a third acquire answered %+v while both permits are held", g)
	case <-time.After(300 * time.Millisecond):
	}
	if r := er.do(s[1], &rel); r.kind != ansReleased {
		t.Fatalf("release: %+v", r)
	}
	g2 := <-got
	if g2.kind != ansGranted || g2.token <= g1.token {
		t.Fatalf("the waiter after a release: %+v, want granted with a token above %d", g2, g1.token)
	}
	short := acq
	short.wait = 1
	if r := er.do(s[3], &short); r.kind != ansRefused {
		t.Fatalf("an acquire with a 1 s wait on a full semaphore: %+v, want refused", r)
	}
	resp, err := er.slots[0].cli.Get(t.Context(), "bench/test/sem/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 2 {
		t.Fatalf("keys in the queue after the refused wait: %d (%v), want the 2 holders", resp.Count, err)
	}
	for _, i := range []int{0, 2} {
		if r := er.do(s[i], &rel); r.kind != ansReleased {
			t.Fatalf("release: %+v", r)
		}
	}
}

// TestParsePushRejects: the subscriber's reader names what it cannot read.
func TestParsePushRejects(t *testing.T) {
	for _, in := range []string{"+OK\r\n", "*2\r\n+x\r\n", "*1\r\n$x\r\n", "*99\r\n"} {
		if _, err := readPush(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("%q: read without an error", in)
		}
	}
}

// TestSemaphoreSkipsHTTP: the HTTP targets skip the semaphore workload
// with a reason, rather than run it as exclusive locks (their driver sends
// no limit).
func TestSemaphoreSkipsHTTP(t *testing.T) {
	tg := &target{name: "lockd-http", skip: map[string]string{}}
	httpSkips(tg)
	res, err := runWorkload(tg, wlSemaphore, &config{}, 1)
	if err != nil || res.Skipped == "" {
		t.Fatalf("semaphore over HTTP: %+v %v, want skipped with a reason", res, err)
	}
}
