package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(clustertest.Main(m),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"), // idle keep-alive conns of the harness's HTTP client
	)
}

// short skips the slow cluster tests under -short.
func short(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster test: not under -short")
	}
}

// waitActive waits until one member is the active, as every running
// member but those in skip (frozen ones, whose admin endpoint cannot
// answer) agrees, and returns it and how long it took.
func waitActive(t *testing.T, c *clustertest.Cluster, within time.Duration, skip ...int) (int, time.Duration) {
	t.Helper()
	began := time.Now()
	a, err := c.WaitLeader(within, clustertest.Running(skip...))
	if err != nil {
		t.Fatalf("no single active within %v: %v", within, err)
	}
	return a, time.Since(began)
}

// waitActiveIs waits until every running member (but those in skip)
// agrees that member want is the active; what says what failed if they do
// not within 10 s.
func waitActiveIs(t *testing.T, c *clustertest.Cluster, want int, what string, skip ...int) {
	t.Helper()
	_, err := c.WaitStatuses(10*time.Second, clustertest.Running(skip...), func(sts []clustertest.Status) error {
		a, err := c.Agreed(sts)
		if err == nil && a != want {
			err = fmt.Errorf("member %d is the active", a)
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// dial connects a raw protocol client to member i.
func dial(t *testing.T, c *clustertest.Cluster, i int) *clustertest.Conn {
	t.Helper()
	conn, err := c.Dial(c.Member(i).Addr())
	if err != nil {
		t.Fatal(err)
	}
	conn.SetTimeout(10 * time.Second)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// do sends one frame and returns the answer, failing the test on error.
func do(t *testing.T, conn *clustertest.Conn, frame []byte) proto.Response {
	t.Helper()
	r, err := conn.Do(frame)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// grant acquires key (wait 0) and returns its token.
func grant(t *testing.T, conn *clustertest.Conn, key string, lease uint8, owner uint64) uint64 {
	t.Helper()
	r := do(t, conn, proto.AppendAcquire(nil, 0, lease, owner, key))
	if r.Op != proto.OpAcquire || r.ID != owner {
		t.Fatalf("acquire %q: %c id=%d tail=%q", key, r.Op, r.ID, r.Tail)
	}
	return r.Token
}

// keyState reads /keys/{key} of member i: held and its token.
func keyState(t *testing.T, c *clustertest.Cluster, i int, key string) (bool, uint64) {
	t.Helper()
	hc := c.HTTPClient(5 * time.Second)
	resp, err := hc.Get(c.Member(i).AdminURL() + api.PathKeys + api.KeyPath(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var k api.Key
	if err := json.NewDecoder(resp.Body).Decode(&k); err != nil {
		t.Fatal(err)
	}
	tok, _ := strconv.ParseUint(k.Token, 10, 64)
	return k.Held, tok
}

// waitHeld waits until member i holds key with token tok (a standby's
// copy included).
func waitHeld(t *testing.T, c *clustertest.Cluster, i int, key string, tok uint64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("member %d to hold %s with token %d", i, key, tok), func() bool {
		held, got := keyState(t, c, i, key)
		return held && got == tok
	})
}

// mustHold fails unless member i holds every key of want with its token.
func mustHold(t *testing.T, c *clustertest.Cluster, i int, when string, want map[string]uint64) {
	t.Helper()
	for key, tok := range want {
		if held, got := keyState(t, c, i, key); !held || got != tok {
			t.Fatalf("%s %s: held=%v token %d, want %d", key, when, held, got, tok)
		}
	}
}

// env returns an integer from the environment, or def.
func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var inSyncRE = regexp.MustCompile(`in sync: snapshot applied`)

// dumpKeys reads member i's /debug/locks: every held key and its token.
func dumpKeys(t *testing.T, c *clustertest.Cluster, i int) map[string]uint64 {
	t.Helper()
	hc := c.HTTPClient(30 * time.Second)
	resp, err := hc.Get(c.Member(i).AdminURL() + "/debug/locks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	keys := map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 3)
		if len(f) != 3 {
			t.Fatalf("bad /debug/locks line %q", sc.Text())
		}
		tok, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		key, err := strconv.Unquote(f[2])
		if err != nil {
			t.Fatal(err)
		}
		keys[key] = tok
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// noRaces fails the test if any member's log shows the race detector's
// report (the harness builds lockd with -race where it can).
func noRaces(t *testing.T, c *clustertest.Cluster) {
	t.Cleanup(func() {
		for _, m := range c.Members() {
			if strings.Contains(m.Logs(), "WARNING: DATA RACE") {
				t.Errorf("member %d's log has a data race report", m.Index())
			}
		}
	})
}

// redirects checks that a member that is not the active/leader answers
// every op, ping included, with M naming want and executes nothing, and
// that validation ranks before M (a bad lease is E 3). tok is a token held
// on the active, for the release and renew.
func redirects(t *testing.T, conn *clustertest.Conn, tok uint64, want, who string) {
	t.Helper()
	for _, tc := range []struct {
		name  string
		frame []byte
		op    proto.Op
		id    uint64
	}{
		{"acquire", proto.AppendAcquire(nil, 5, 10, 7, "free"), proto.OpAcquire, 7},
		{"acquire held", proto.AppendAcquire(nil, 0, 10, 8, "held"), proto.OpAcquire, 8},
		{"release", proto.AppendRelease(nil, tok, "held"), proto.OpRelease, tok},
		{"renew", proto.AppendRenew(nil, 10, tok, "held"), proto.OpRenew, tok},
		{"ping", proto.AppendPing(nil, 99), proto.OpPing, 99},
	} {
		r := do(t, conn, tc.frame)
		if r.Op != proto.OpMoved || r.ReqOp != tc.op || r.ID != tc.id || string(r.Tail) != want {
			t.Fatalf("%s on %s: %c op=%c id=%d tail=%q, want M %c %d %q", tc.name, who, r.Op, r.ReqOp, r.ID, r.Tail, tc.op, tc.id, want)
		}
	}
	if r := do(t, conn, proto.AppendAcquire(nil, 0, 0, 9, "k")); r.Op != proto.OpError || r.Code != proto.CodeBadLease {
		t.Fatalf("bad lease on %s: %c code %d", who, r.Op, r.Code)
	}
}
