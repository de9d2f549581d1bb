package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/proto"
)

// The identities of the --acl cluster tests (PROTOCOL.md §8.2): two
// clients sharing the orders/ keys, a monitor for the harness's /status
// polls, an admin.
var aclSecrets = map[string]string{
	"orders":   "orders-secret",
	"orders-b": "orders-b-secret",
	"prom":     "prom-secret",
	"ops":      "ops-secret",
}

// writeACL writes the identity file of the tests and returns its path.
func writeACL(t *testing.T) string {
	t.Helper()
	line := func(name, keys, role string) string {
		sum := sha256.Sum256([]byte(aclSecrets[name]))
		return name + " sha256:" + hex.EncodeToString(sum[:]) + " " + keys + " " + role + "\n"
	}
	p := filepath.Join(t.TempDir(), "acl")
	text := line("orders", "orders/", "client") + line("orders-b", "orders/", "client") +
		line("prom", "-", "monitor") + line("ops", "*", "admin")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startACL starts a cluster of mode whose members run with --acl; the
// harness polls /status as the monitor identity.
func startACL(t *testing.T, mode string, n int) (*clustertest.Cluster, int) {
	t.Helper()
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: mode, Members: n, ExtraArgs: []string{"--acl", writeACL(t)},
		AdminUser: "prom", AdminPassword: aclSecrets["prom"]})
	noRaces(t, c)
	a, _ := waitActive(t, c, 10*time.Second)
	return c, a
}

// login dials member i and authenticates as name.
func login(t *testing.T, c *clustertest.Cluster, i int, name string) *clustertest.Conn {
	t.Helper()
	conn := dial(t, c, i)
	if r := do(t, conn, proto.AppendHello(nil, 1, name, aclSecrets[name])); r.Op != proto.OpHello || string(r.Tail) != name {
		t.Fatalf("hello as %s on member %d: %c code %d", name, i, r.Op, r.Code)
	}
	return conn
}

// identityOf reads /keys/{key} of member i as the monitor: the grant's
// identity ("" when free or none).
func identityOf(t *testing.T, c *clustertest.Cluster, i int, key string) string {
	t.Helper()
	req, err := http.NewRequest("GET", c.Member(i).AdminURL()+api.PathKeys+api.KeyPath(key), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("prom", aclSecrets["prom"])
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var k api.Key
	if err := json.NewDecoder(resp.Body).Decode(&k); err != nil {
		t.Fatal(err)
	}
	return k.Identity
}

// TestACLKill9KeepsIdentities: in each cluster mode with --acl, grants
// made to an identity on the active/leader are, after its kill -9, held on
// the member that takes over with their identity: another identity's
// release with the current token is N there, the owner's is R, and an
// admin's renew is forced; a standby/follower answers an unauthenticated
// acquire E 5 (before M, §8.3).
func TestACLKill9KeepsIdentities(t *testing.T) {
	for _, mode := range []string{clustertest.ModePriority, clustertest.ModeRaft} {
		t.Run(mode, func(t *testing.T) {
			c, a := startACL(t, mode, 3)
			other := (a + 1) % 3
			anon := dial(t, c, other)
			if r := do(t, anon, proto.AppendAcquire(nil, 0, 30, 1, "orders/x")); r.Op != proto.OpError || r.Code != proto.CodeUnauthenticated {
				t.Fatalf("an unauthenticated acquire on a non-active member: %c code %d, want E 5", r.Op, r.Code)
			}
			owner := login(t, c, a, "orders")
			tokens := map[string]uint64{}
			for i := range 50 {
				key := fmt.Sprintf("orders/%d", i)
				tokens[key] = grant(t, owner, key, 60, uint64(i+1))
			}
			// A change answered more than 100 ms before the crash has
			// reached the standbys (§6.3); raft answers once committed.
			time.Sleep(150 * time.Millisecond)
			if err := c.Member(a).Kill(); err != nil {
				t.Fatal(err)
			}
			n, _ := waitActive(t, c, 5*time.Second)
			for key := range tokens {
				if id := identityOf(t, c, n, key); id != "orders" {
					t.Fatalf("%s on the member that took over: identity %q, want orders", key, id)
				}
			}
			thief, own, admin := login(t, c, n, "orders-b"), login(t, c, n, "orders"), login(t, c, n, "ops")
			for key, tok := range tokens {
				if r := do(t, thief, proto.AppendRelease(nil, tok, key)); r.Op != proto.OpNotHeld {
					t.Fatalf("another identity's release of %s after the failover: %c", key, r.Op)
				}
			}
			if r := do(t, admin, proto.AppendRenew(nil, 60, tokens["orders/0"], "orders/0")); r.Op != proto.OpRenew {
				t.Fatalf("an admin's renew after the failover: %c", r.Op)
			}
			for key, tok := range tokens {
				if r := do(t, own, proto.AppendRelease(nil, tok, key)); r.Op != proto.OpRelease {
					t.Fatalf("the owner's release of %s after the failover: %c", key, r.Op)
				}
			}
		})
	}
}
