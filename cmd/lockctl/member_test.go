package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// raftPort is a port p with p (clients), p + 1 (lockd's default admin
// endpoint) and p + 10000 (members) free now, none handed out before.
func raftPort(t *testing.T, taken map[int]bool) string {
	t.Helper()
	free := func(p int) bool {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		ln.Close()
		return true
	}
	for p := 20000 + int(time.Now().UnixNano()%20000); p < 55000; p += 7 {
		if !taken[p] && !taken[p+1] && !taken[p+10000] && free(p) && free(p+1) && free(p+10000) {
			// No other member's client, admin or member port may be one of
			// these (lockd refuses such --peers at start).
			for _, q := range []int{p - 1, p, p + 1, p + 9999, p + 10000, p + 10001, p - 9999, p - 10000, p - 10001} {
				taken[q] = true
			}
			return "127.0.0.1:" + strconv.Itoa(p)
		}
	}
	t.Fatal("no free ports")
	return ""
}

// startMember starts a raft member listening on addr (admin on its port +
// 1, lockd's default) with --peers peers.
func startMember(t *testing.T, addr string, peers []string, extra ...string) *server {
	t.Helper()
	args := []string{"--listen", addr, "--data-dir", t.TempDir(), "--loops", "1", "--drain", "1ms",
		"--cluster", "raft", "--peers", strings.Join(peers, ",")}
	s := startLockdArgs(t, append(args, extra...))
	return s
}

// TestMemberCommands: member list, add and remove against a real raft
// cluster, as docs/CLUSTER.md's procedures run them: a fresh member started
// with --join is added, the leader is removed (lockctl follows the 421 to
// the successor), the configuration shows it; bad arguments are exit 2, a
// member that does not exist exit 1, and a single node says it has no
// membership.
func TestMemberCommands(t *testing.T) {
	taken := map[int]bool{}
	var peers []string
	for range 3 {
		peers = append(peers, raftPort(t, taken))
	}
	for _, a := range peers {
		startMember(t, a, peers)
	}
	env := []string{"LOCKD_ADDRS=" + strings.Join(peers, ",")}
	var ms api.Members
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, code := ctl(t, env, "member", "list", "-o", "json")
		if code == 0 && json.Unmarshal([]byte(out), &ms) == nil && ms.Leader != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader in member list: %d %s", code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(ms.Members) != 3 {
		t.Fatalf("member list: %+v", ms)
	}
	out, errs, code := ctl(t, env, "member", "list")
	if code != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, peers[0]) || !strings.Contains(out, "MEMBER PORT") {
		t.Fatalf("member list: %d %s %s", code, out, errs)
	}
	leader := ms.Leader
	// A new member joins.
	nw := raftPort(t, taken)
	startMember(t, nw, append(slices.Clone(peers), nw), "--join")
	out, errs, code = ctl(t, env, "member", "add", nw, "--wait", "20s")
	if code != 0 || !strings.Contains(out, "added "+nw) {
		t.Fatalf("member add: %d %s %s", code, out, errs)
	}
	if _, errs, code := ctl(t, env, "member", "add", nw); code != exitError || !strings.Contains(errs, "already") {
		t.Fatalf("member add again: %d %s", code, errs)
	}
	// The leader goes: it hands over and lockctl asks the successor.
	out, errs, code = ctl(t, append(env, "LOCKD_ADDRS="+strings.Join(append(slices.Clone(peers), nw), ",")), "member", "remove", leader, "-o", "json")
	var ch api.MemberChange
	if code != 0 || json.Unmarshal([]byte(out), &ch) != nil || ch.Member.Addr != leader || len(ch.Members.Members) != 3 {
		t.Fatalf("member remove the leader: %d %s %s", code, out, errs)
	}
	for _, m := range ch.Members.Members {
		if m.Addr == leader || !m.Voter {
			t.Fatalf("after removing %s: %+v", leader, ch.Members)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"member", "add", "nonsense"}, exitUsage, "host:port"},
		{[]string{"member", "add", nw, "--wait", "11m"}, exitUsage, "--wait"},
		{[]string{"member", "remove", "a/b"}, exitUsage, "ID or host:port"},
		{[]string{"member", "remove"}, exitUsage, "ID or ADDR"},
		{[]string{"member", "remove", "127.0.0.1:1"}, exitError, "no such member"},
		{[]string{"member", "bogus"}, exitUsage, "unknown member command"},
	} {
		_, errs, code := ctl(t, append(env, "LOCKD_ADDRS="+strings.Join(append(slices.Clone(peers), nw), ",")), tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Fatalf("%v: exit %d %s, want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	// A member that is not running: lockctl says so and what the leader
	// waits for, instead of waiting in silence; then it is removed again.
	ghost := raftPort(t, taken)
	env = append(env, "LOCKD_ADDRS="+strings.Join(append(slices.Clone(peers), nw), ","))
	start := time.Now()
	_, errs, code = ctl(t, env, "member", "add", ghost, "--wait", "2s", "--timeout", "2s")
	if code != exitError || !strings.Contains(errs, ghost+" does not answer on its client port") || !strings.Contains(errs, "waits up to 2s") ||
		!strings.Contains(errs, "not caught up") {
		t.Fatalf("member add of a member not running: exit %d after %v: %s", code, time.Since(start), errs)
	}
	if _, errs, code := ctl(t, env, "member", "remove", ghost); code != 0 {
		t.Fatalf("member remove of the member not running: %d %s", code, errs)
	}
	single := startLockd(t)
	if _, errs, code := ctl(t, []string{"LOCKD_ADDRS=" + single.addr, "LOCKD_ADMIN=" + single.admin}, "member", "list"); code != exitError || !strings.Contains(errs, "--cluster raft") || strings.Contains(errs, `"error"`) {
		t.Fatalf("member list on a single node: %d %s", code, errs)
	}
}

// TestMemberListPriority: member list on a priority cluster says, in a
// sentence, that its members are its --peers (not the admin endpoint's
// JSON body).
func TestMemberListPriority(t *testing.T) {
	taken := map[int]bool{}
	peers := []string{raftPort(t, taken), raftPort(t, taken)}
	for _, a := range peers {
		startLockdArgs(t, []string{"--listen", a, "--data-dir", t.TempDir(), "--loops", "1", "--drain", "1ms",
			"--cluster", "priority", "--peers", strings.Join(peers, ",")})
	}
	_, errs, code := ctl(t, []string{"LOCKD_ADDRS=" + strings.Join(peers, ",")}, "member", "list")
	if code != exitError || !strings.Contains(errs, "priority cluster's members are its --peers") || strings.Contains(errs, `"error"`) {
		t.Fatalf("member list on a priority cluster: exit %d, %s", code, errs)
	}
}

// TestMemberAuth: a change needs an admin identity: without credentials
// exit 15, a monitor exit 16; the secret is never printed.
func TestMemberAuth(t *testing.T) {
	roles := map[string]string{"prometheus": "monitor-secret", "ops": "admin-secret"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		switch {
		case !ok || roles[user] != pass:
			w.Header().Set("WWW-Authenticate", `Basic realm="lockd"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case r.URL.Path == api.PathStatus:
			_ = json.NewEncoder(w).Encode(api.Status{Role: api.RoleLeader, Mode: api.ModeRaft})
		case r.Method != http.MethodGet && user != "ops":
			http.Error(w, "forbidden", http.StatusForbidden)
		case r.Method == http.MethodPost:
			_ = json.NewEncoder(w).Encode(api.MemberChange{Member: api.RaftMember{ID: "127.0.0.1:7100", Addr: "127.0.0.1:7100", Voter: true}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	admin := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	secret := func(s string) string {
		f := filepath.Join(dir, s)
		_ = os.WriteFile(f, []byte(s+"\n"), 0o600)
		return f
	}
	base := []string{"member", "add", "127.0.0.1:7100", "--admin", admin}
	for _, tc := range []struct {
		name  string
		creds []string
		code  int
		want  string
	}{
		{"admin", []string{"--identity", "ops", "--secret-file", secret("admin-secret")}, 0, "added 127.0.0.1:7100"},
		{"no credentials", nil, exitUnauthenticated, "needs an admin identity"},
		{"monitor", []string{"--identity", "prometheus", "--secret-file", secret("monitor-secret")}, exitPermissionDenied, "is not an admin identity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := ctl(t, nil, append(base, tc.creds...)...)
			if code != tc.code || !strings.Contains(out+errs, tc.want) {
				t.Fatalf("exit %d, out %q, err %q; want %d and %q", code, out, errs, tc.code, tc.want)
			}
			if strings.Contains(out+errs, "-secret") && !strings.Contains(out+errs, "--secret-file") {
				t.Fatalf("a secret was printed: %s %s", out, errs)
			}
		})
	}
}
