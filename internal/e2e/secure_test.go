package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// Real clusters with PROTOCOL.md §8 on (clustertest's Secure: TLS on the
// client port and the admin endpoint, mutual TLS on the member link, a
// cluster secret): the basic scenarios — failover after kill -9, a
// planned handover, a member that rejoins — work as without it, and a
// stranger on a member port is refused and counted.

// memberFrame is a frame of the priority member link (MEMBER-LINK.md):
// length u32 | type u8 | payload | crc32c.
func memberFrame(typ byte, payload []byte) []byte {
	body := append([]byte{typ}, payload...)
	out := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
	out = append(out, body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

// forgeMember connects to addr (a member port) and sends first; it
// reports whether the member closed the connection within 5 s.
func forgeMember(t *testing.T, addr string, first []byte) bool {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = nc.Write(first)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(nc)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// refused reads member i's lockd_member_link_refused_total{reason}.
func refused(t *testing.T, c *clustertest.Cluster, i int, reason string) int {
	t.Helper()
	resp, err := c.HTTPClient(5 * time.Second).Get(c.Member(i).AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`lockd_member_link_refused_total\{reason="` + reason + `"\} (\d+)`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("member %d's /metrics has no refusals for %q", i, reason)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestSecurePriority: a priority cluster with §8 on elects member 0; a
// forged Hello and "active, epoch 2^40" heartbeat on its member port is
// refused and counted, and changes nothing; kill -9 of the active fails
// over within 3 s with every lock; the restarted member syncs and takes
// over by a planned handover with every lock; SIGTERM hands over again.
func TestSecurePriority(t *testing.T) {
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModePriority, Members: 3, Secure: true})
	noRaces(t, c)
	if a, _ := waitActive(t, c, 10*time.Second); a != 0 {
		t.Fatalf("active %d at start", a)
	}
	st0, err := c.Member(0).Status()
	if err != nil {
		t.Fatal(err)
	}
	// A stranger: Hello (version 2, priority, 3 members, claims member 2,
	// offset 10000, 8 shards, 1 s) and an "active at epoch 2^40" heartbeat.
	hello := []byte{0, 2, 1, 3, 2, 0, 0, 0x27, 0x10, 0, 0, 0, 8, 0, 0, 0x03, 0xe8}
	hb := binary.BigEndian.AppendUint64(nil, 1<<40)
	hb = append(hb, 2, 2, 1)
	hb = append(hb, make([]byte, 48)...)
	if !forgeMember(t, c.Member(0).MemberAddr(), append(memberFrame(1, hello), memberFrame(2, hb)...)) {
		t.Fatal("the member kept the forged connection open")
	}
	if n := refused(t, c, 0, "tls"); n < 1 {
		t.Fatalf("the forged connection was not counted (tls: %d)", n)
	}
	time.Sleep(2 * time.Second)
	if st, err := c.Member(0).Status(); err != nil || st.Role != "active" || st.Epoch != st0.Epoch {
		t.Fatalf("after the forgery: %+v, %v (epoch before %d)", st.Status, err, st0.Epoch)
	}

	conn := dial(t, c, 0)
	tokens := map[string]uint64{}
	var last uint64
	for i := range 100 {
		key := fmt.Sprintf("k%d", i)
		tokens[key] = grant(t, conn, key, 60, uint64(i+1))
		last = tokens[key]
	}
	time.Sleep(150 * time.Millisecond) // replicated (§6.3)
	if err := c.Member(0).Kill(); err != nil {
		t.Fatal(err)
	}
	a, took := waitActive(t, c, 3*time.Second)
	t.Logf("member %d active %v after kill -9", a, took)
	check := func(i int, what string) {
		t.Helper()
		for key, tok := range tokens {
			if held, got := keyState(t, c, i, key); !held || got != tok {
				t.Fatalf("%s: %s held=%v token %d, want %d", what, key, held, got, tok)
			}
		}
	}
	check(a, "after the failover")
	if tok := grant(t, dial(t, c, a), "new", 10, 1000); tok <= last {
		t.Fatalf("token %d after the failover not above %d", tok, last)
	}
	if err := c.Member(0).Restart(); err != nil {
		t.Fatal(err)
	}
	waitActiveIs(t, c, 0, "the restarted first member did not take over")
	check(0, "after the handover to the restarted member")
	if err := c.Member(0).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := c.Member(0).Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("SIGTERM: exit %d, %v", code, err)
	}
	a, _ = waitActive(t, c, 3*time.Second, 0)
	check(a, "after the SIGTERM handover")
	// The client library over TLS, given every member.
	cl, err := client.New(client.Config{Addrs: c.Addrs(), TLS: c.ClientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cl.Acquire(ctx, "by-client", client.AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		t.Fatalf("client over TLS: %v", err)
	}
	if err := cl.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestSecureRaft: a raft cluster with §8 on elects a leader; bytes that
// open hashicorp's AppendEntries on its member port are refused and
// counted, the term unchanged; kill -9 of the leader, then SIGTERM of the
// next: each time a member serves within a few seconds with every lock.
func TestSecureRaft(t *testing.T) {
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModeRaft, Members: 3, Secure: true})
	noRaces(t, c)
	l, _ := waitServing(t, c, 15*time.Second)
	st0, err := c.Member(l).Status()
	if err != nil {
		t.Fatal(err)
	}
	// rpcAppendEntries (0) and the start of a msgpack map.
	if !forgeMember(t, c.Member(l).MemberAddr(), []byte{0x00, 0x87, 0xa4, 'T', 'e', 'r', 'm', 0xcf, 0, 0, 1, 0, 0, 0, 0, 0}) {
		t.Fatal("the leader kept the forged connection open")
	}
	if n := refused(t, c, l, "tls"); n < 1 {
		t.Fatalf("the forged connection was not counted (tls: %d)", n)
	}
	time.Sleep(time.Second)
	if st, err := c.Member(l).Status(); err != nil || st.Role != "leader" || st.Epoch != st0.Epoch {
		t.Fatalf("after the forgery: %+v, %v (term before %d)", st.Status, err, st0.Epoch)
	}
	conn := dial(t, c, l)
	tokens := map[string]uint64{}
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		tokens[key] = grant(t, conn, key, 60, uint64(i+1))
	}
	check := func(i int, what string) {
		t.Helper()
		conn := dial(t, c, i)
		for key, tok := range tokens {
			r := do(t, conn, proto.AppendRenew(nil, 60, tok, key))
			if r.Op != proto.OpRenew || r.ID != tok {
				t.Fatalf("%s: renew %s %d on member %d: %c", what, key, tok, i, r.Op)
			}
		}
	}
	if err := c.Member(l).Kill(); err != nil {
		t.Fatal(err)
	}
	l2, took := waitServing(t, c, 5*time.Second, l)
	t.Logf("member %d serving %v after kill -9 of %d", l2, took, l)
	check(l2, "after kill -9")
	if err := c.Member(l).Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(15*time.Second, clustertest.Every); err != nil {
		t.Fatal(err)
	}
	if err := c.Member(l2).Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := c.Member(l2).Wait(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("SIGTERM: exit %d, %v", code, err)
	}
	l3, took := waitServing(t, c, 5*time.Second, l2)
	t.Logf("member %d serving %v after SIGTERM of %d", l3, took, l2)
	check(l3, "after the SIGTERM handover")
}

// TestPriorityMismatchedSecretNotReady: a member started with another
// --cluster-secret than the others is refused by every one of them (and
// refuses them): it hears nobody, promotes itself after the failover
// timeout, and serves beside the real active — a second active that
// cannot learn the others' tokens. It must not say it is ready: /readyz
// and /healthz answer 503 naming the refused link, while the real active
// and its standby stay ready, and the refusals are counted in
// lockd_member_link_refused_total (the alert's metric).
func TestPriorityMismatchedSecretNotReady(t *testing.T) {
	short(t)
	dir := t.TempDir()
	secret := func(name, value string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	right, wrong := secret("right", "4c6f636b64207465737420736563726574206f6e65"), secret("wrong", "616e6f74686572206f6e65")
	c := clustertest.Start(t, clustertest.Options{Mode: clustertest.ModePriority, Members: 3, Deferred: []int{2},
		ExtraArgs: []string{"--cluster-secret", right}})
	noRaces(t, c)
	if err := c.Member(2).RestartWith("--cluster-secret", wrong); err != nil {
		t.Fatal(err)
	}
	waitActiveAmong := func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st0, err0 := c.Member(0).Status()
			st2, err2 := c.Member(2).Status()
			if err0 == nil && err2 == nil && st0.Serving() && st2.Role == "active" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("member 0 %+v (%v), member 2 %+v (%v): want both active", st0.Status, err0, st2.Status, err2)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitActiveAmong()
	hc := c.HTTPClient(5 * time.Second)
	probe := func(i int, path string) (int, string) {
		resp, err := hc.Get(c.Member(i).AdminURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, path := range []string{"/readyz", "/healthz"} {
		code, body := probe(2, path)
		if code == 200 || !strings.Contains(body, "refused") {
			t.Errorf("%s on member 2, whose --cluster-secret differs: %d %q, want 503 naming the refused link", path, code, body)
		}
	}
	for _, i := range []int{0, 1} {
		if code, body := probe(i, "/readyz"); code != 200 {
			t.Errorf("/readyz on member %d (the others' secret): %d %q, want 200", i, code, body)
		}
	}
	if n := refused(t, c, 2, "secret") + refused(t, c, 2, "peer"); n < 1 {
		t.Errorf("member 2 counted no refusal (secret or peer): %d", n)
	}
}
