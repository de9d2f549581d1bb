package engine_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/acl"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/repl"
)

// The identities of the ACL tests: two clients sharing the orders/ keys
// (so one can try the other's grants), a client of billing/ keys, a
// monitor, an admin of every key, a certificate-only identity, and one
// whose secret is 256 bytes with spaces.
var (
	secrets = map[string]string{
		"orders":   "orders-secret",
		"orders-b": "orders-b-secret",
		"billing":  "billing-secret",
		"prom":     "prom-secret",
		"ops":      "ops-secret",
		"long":     " " + strings.Repeat("s p", 85),
		"guard":    "guard-secret", // a monitor of orders/ (TestSharedACL)
	}
	aclText = line("orders", "orders/,jobs/", "client") + line("orders-b", "orders/", "client") +
		line("billing", "billing/", "client") + line("prom", "-", "monitor") + line("ops", "*", "admin") +
		"certonly cert * client\n" + line("long", "*", "client")
)

func line(name, keys, role string) string {
	return name + " " + acl.Digest([]byte(secrets[name])) + " " + keys + " " + role + "\n"
}

func parseACL(t testing.TB, text string) *acl.ACL {
	t.Helper()
	a, err := acl.Parse("test-acl", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startACL starts a server with the test ACL (and mod's changes).
func startACL(t testing.TB, mod func(*engine.Config)) *testServer {
	t.Helper()
	return startServer(t, func(c *engine.Config) {
		c.ACL = parseACL(t, aclText)
		if mod != nil {
			mod(c)
		}
	})
}

// hello sends a hello and returns its answer.
func (w *wire) hello(nonce uint64, tail string) frame {
	w.t.Helper()
	w.send(append(binary.BigEndian.AppendUint64([]byte{'H'}, nonce), tail+"\n"...))
	f, err := w.next(5 * time.Second)
	if err != nil {
		w.t.Fatalf("hello %d: %v", nonce, err)
	}
	return f
}

// login authenticates w as name.
func (w *wire) login(name string) {
	w.t.Helper()
	if f := w.hello(77, name+" "+secrets[name]); f.Op != proto.OpHello || f.ID != 77 || f.Tail != name {
		w.t.Fatalf("hello as %s: %+v", name, f)
	}
}

// expectE reads an E frame for (op, id) with code.
func (w *wire) expectE(op proto.Op, id uint64, code uint8) {
	w.t.Helper()
	f := w.expect(proto.OpError, id)
	if f.ReqOp != op || f.Code != code {
		w.t.Fatalf("E for %c id=%d: %+v, want op %c code %d", op, id, f, op, code)
	}
}

func TestACLHello(t *testing.T) {
	ts := startACL(t, nil)
	for _, c := range []struct {
		name, tail string
		ok         bool
	}{
		{"known", "orders orders-secret", true},
		{"secret with spaces, 256 bytes", "long " + secrets["long"], true},
		{"admin", "ops ops-secret", true},
		{"monitor", "prom prom-secret", true},
		{"wrong secret", "orders orders-secreT", false},
		{"secret of another identity", "orders billing-secret", false},
		{"unknown identity", "nobody orders-secret", false},
		{"cert-only identity", "certonly anything", false},
		{"no 0x20", "orders", false},
		{"empty identity", " orders-secret", false},
		{"empty secret", "orders ", false},
		{"empty tail", "", false},
		{"secret of 257 bytes", "long " + secrets["long"] + "x", false},
		{"identity with a trailing space", "orders  orders-secret", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := dial(t, ts.Addr())
			f := w.hello(5, c.tail)
			if c.ok {
				if want, _, _ := strings.Cut(c.tail, " "); f.Op != proto.OpHello || f.ID != 5 || f.Tail != want {
					t.Fatalf("welcome %+v, want H 5 %q", f, want)
				}
				w.send(proto.AppendPing(nil, 6)) // the connection goes on
				w.expect(proto.OpPing, 6)
				return
			}
			if f.Op != proto.OpError || f.ReqOp != proto.OpHello || f.ID != 5 || f.Code != proto.CodeUnauthenticated {
				t.Fatalf("failed hello answered %+v, want E 5 for H 5", f)
			}
			if f.Tail != "unauthenticated" {
				t.Fatalf("E 5 says %q: it must not say which part failed", f.Tail)
			}
			w.closed(5 * time.Second)
		})
	}
	t.Run("tail over 1024 bytes is a bad frame", func(t *testing.T) {
		w := dial(t, ts.Addr())
		w.send(append(binary.BigEndian.AppendUint64([]byte{'H'}, 9), "orders "+strings.Repeat("x", proto.MaxKey)+"\n"...))
		w.expectE(proto.OpHello, 9, proto.CodeBadFrame)
		w.closed(5 * time.Second)
	})
	m := ts.Metrics()
	if m.Auth.Hello != 10 || m.Errors[proto.CodeUnauthenticated] != 10 {
		t.Fatalf("failed hellos counted %d (E 5 sent %d), want 10", m.Auth.Hello, m.Errors[proto.CodeUnauthenticated])
	}
}

// TestACLUnauthenticated: A, R, K on a connection without an identity are
// E 5 (op and id as §3) and the connection closes; what was pipelined after
// is not executed. P is answered without an identity.
func TestACLUnauthenticated(t *testing.T) {
	ts := startACL(t, nil)
	for _, c := range []struct {
		name string
		req  []byte
		op   proto.Op
		id   uint64
	}{
		{"acquire", proto.AppendAcquire(nil, 0, 30, 11, "orders/1"), proto.OpAcquire, 11},
		{"release", proto.AppendRelease(nil, 12, "orders/1"), proto.OpRelease, 12},
		{"renew", proto.AppendRenew(nil, 30, 13, "orders/1"), proto.OpRenew, 13},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := dial(t, ts.Addr())
			w.send(proto.AppendPing(nil, 1))
			w.expect(proto.OpPing, 1)
			// The acquire behind the refused request is never executed.
			w.send(append(c.req, proto.AppendAcquire(nil, 0, 30, 99, "orders/behind")...))
			w.expectE(c.op, c.id, proto.CodeUnauthenticated)
			w.closed(5 * time.Second)
			if ts.Key([]byte("orders/behind")).Held {
				t.Fatal("a request after E 5 was executed")
			}
		})
	}
	if m := ts.Metrics(); m.Auth.Unauthenticated != 3 {
		t.Fatalf("unauthenticated requests counted %d, want 3", m.Auth.Unauthenticated)
	}
}

// TestACLPermission: outside the identity's prefixes, or from a monitor,
// A, R and K are E 6 and the connection stays open.
func TestACLPermission(t *testing.T) {
	ts := startACL(t, nil)
	w := dial(t, ts.Addr())
	w.login("orders")
	w.acquire("billing/1", 0, 30, 1)
	w.expectE(proto.OpAcquire, 1, proto.CodePermissionDenied)
	w.release("billing/1", 2)
	w.expectE(proto.OpRelease, 2, proto.CodePermissionDenied)
	w.renew("billing/1", 30, 3)
	w.expectE(proto.OpRenew, 3, proto.CodePermissionDenied)
	w.acquire("order", 0, 30, 4) // a prefix of a prefix is not inside it
	w.expectE(proto.OpAcquire, 4, proto.CodePermissionDenied)
	tok := w.grant("orders/1", 30, 5) // still open, and its own keys work
	w.grant("jobs/1", 30, 6)
	w.release("orders/1", tok)
	w.expect(proto.OpRelease, tok)

	m := dial(t, ts.Addr())
	m.login("prom")
	m.acquire("orders/2", 0, 30, 7)
	m.expectE(proto.OpAcquire, 7, proto.CodePermissionDenied)
	m.send(proto.AppendPing(nil, 8))
	m.expect(proto.OpPing, 8)
	if got := ts.Metrics().Auth.Denied; got != 5 {
		t.Fatalf("denied requests counted %d, want 5", got)
	}
}

// TestACLValidationOrder checks each adjacent pair of §8.3's order: E 1,
// E 5, E 2, E 3, E 6, E 4, M, then the table's answers.
func TestACLValidationOrder(t *testing.T) {
	ts := startACL(t, nil)
	t.Run("E1 before E5", func(t *testing.T) {
		w := dial(t, ts.Addr())
		w.send(append(binary.BigEndian.AppendUint64([]byte{'A', 0, 30}, 1), strings.Repeat("k", proto.MaxKey+1)...))
		w.expectE(proto.OpAcquire, 1, proto.CodeBadFrame)
		w.closed(5 * time.Second)
	})
	t.Run("E5 before E2", func(t *testing.T) {
		w := dial(t, ts.Addr())
		w.acquire("bad\xffkey", 0, 30, 2)
		w.expectE(proto.OpAcquire, 2, proto.CodeUnauthenticated)
		w.closed(5 * time.Second)
	})
	w := dial(t, ts.Addr())
	w.login("orders")
	t.Run("E2 before E3", func(t *testing.T) {
		w.renew("", 0, 3)
		w.expectE(proto.OpRenew, 3, proto.CodeBadKey)
	})
	t.Run("E3 before E6", func(t *testing.T) {
		w.acquire("billing/1", 0, 0, 4)
		w.expectE(proto.OpAcquire, 4, proto.CodeBadLease)
	})
	t.Run("E2 before E6", func(t *testing.T) {
		w.release("billing/\xff", 5)
		w.expectE(proto.OpRelease, 5, proto.CodeBadKey)
	})
	t.Run("E6 before the table", func(t *testing.T) {
		w.release("billing/1", 6) // a stale token would be N
		w.expectE(proto.OpRelease, 6, proto.CodePermissionDenied)
	})
}

// TestACLOrderWhileDraining: during the shutdown drain, E 6 still comes
// before E 4, and E 5 before both.
func TestACLOrderWhileDraining(t *testing.T) {
	ts := startACL(t, nil)
	a, b, anon := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	a.login("orders")
	b.login("orders-b")
	a.grant("orders/k", 30, 1)
	b.acquire("orders/k", 30, 10, 2)
	b.silent(50 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	b.expectE(proto.OpAcquire, 2, proto.CodeShutdown) // the drain has begun
	a.acquire("billing/1", 0, 30, 3)
	a.expectE(proto.OpAcquire, 3, proto.CodePermissionDenied)
	a.acquire("orders/2", 0, 30, 4)
	a.expectE(proto.OpAcquire, 4, proto.CodeShutdown)
	a.send(proto.AppendHello(nil, 5, "ops", secrets["ops"])) // hello works while draining
	a.expect(proto.OpHello, 5)
	anon.acquire("orders/3", 0, 30, 6)
	anon.expectE(proto.OpAcquire, 6, proto.CodeUnauthenticated)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestACLOrderOnAMemberThatRedirects: a member that answers M answers an
// unauthenticated acquire E 5 and one outside the identity's keys E 6
// (both before M), a hello itself, and the rest M.
func TestACLOrderOnAMemberThatRedirects(t *testing.T) {
	ts, node := startCommitting(t, func(c *engine.Config) { c.ACL = parseACL(t, aclText) })
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	ts.GateChanged()
	anon := dial(t, ts.Addr())
	anon.acquire("orders/1", 0, 30, 1)
	anon.expectE(proto.OpAcquire, 1, proto.CodeUnauthenticated)
	anon.closed(5 * time.Second)

	w := dial(t, ts.Addr())
	w.send(proto.AppendPing(nil, 2)) // P without an identity: M here, as every request
	w.expect(proto.OpMoved, 2)
	w.login("orders")
	w.acquire("billing/1", 0, 30, 3)
	w.expectE(proto.OpAcquire, 3, proto.CodePermissionDenied)
	w.acquire("orders/1", 0, 30, 4)
	if f := w.expect(proto.OpMoved, 4); f.Tail != "127.0.0.1:1" {
		t.Fatalf("M names %q", f.Tail)
	}
	w.release("orders/1", 5) // M before the table's N
	w.expect(proto.OpMoved, 5)
}

// TestACLIdentityBoundRelease: a grant is released or renewed only by the
// identity it was made to (from any of its connections); another identity
// with the current token gets N, exactly as for a stale token; an admin
// releases or renews it (forced), and both are counted.
func TestACLIdentityBoundRelease(t *testing.T) {
	ts := startACL(t, nil)
	owner, owner2, other, admin := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	owner.login("orders")
	owner2.login("orders")
	other.login("orders-b")
	admin.login("ops")

	tok := owner.grant("orders/k", 30, 1)
	if st := ts.Key([]byte("orders/k")); st.Ident != "orders" {
		t.Fatalf("key state %+v: the grant's identity is not orders", st)
	}
	other.renew("orders/k", 30, tok)
	if f := other.expect(proto.OpNotHeld, tok); f.ReqOp != proto.OpRenew || f.Tail != "orders/k" {
		t.Fatalf("renew by another identity: %+v", f)
	}
	other.release("orders/k", tok)
	if f := other.expect(proto.OpNotHeld, tok); f.ReqOp != proto.OpRelease {
		t.Fatalf("release by another identity: %+v", f)
	}
	other.release("orders/k", tok+1000) // a stale token: the same answer
	if f := other.expect(proto.OpNotHeld, tok+1000); f.ReqOp != proto.OpRelease || f.Tail != "orders/k" {
		t.Fatalf("stale release: %+v", f)
	}
	if !ts.Key([]byte("orders/k")).Held {
		t.Fatal("another identity released the grant")
	}
	owner2.renew("orders/k", 30, tok) // the same identity on another connection
	owner2.expect(proto.OpRenew, tok)
	admin.renew("orders/k", 60, tok)
	admin.expect(proto.OpRenew, tok)
	if st := ts.Key([]byte("orders/k")); st.Ident != "orders" || st.LeaseLeft < 59*time.Second {
		t.Fatalf("after the forced renew: %+v", st)
	}
	// A waiter of another identity gets the key after the forced release,
	// and the grant is its own.
	other.acquire("orders/k", 10, 30, 7)
	other.silent(50 * time.Millisecond)
	admin.release("orders/k", tok)
	admin.expect(proto.OpRelease, tok)
	next := other.expect(proto.OpAcquire, 7).Token
	if st := ts.Key([]byte("orders/k")); st.Ident != "orders-b" || st.Token != next {
		t.Fatalf("after the handoff: %+v", st)
	}
	owner.release("orders/k", next)
	owner.expect(proto.OpNotHeld, next)

	tab := ts.Metrics().Table
	if tab.ForcedRenews != 1 || tab.ForcedReleases != 1 || tab.RefusedRenews != 1 || tab.RefusedReleases != 2 {
		t.Fatalf("forced renews %d releases %d, refused renews %d releases %d; want 1 1 1 2",
			tab.ForcedRenews, tab.ForcedReleases, tab.RefusedRenews, tab.RefusedReleases)
	}
}

// TestACLPipelining: requests after a hello on the same connection are
// judged by its outcome, in order: in one write, a hello then requests of
// its identity, a second hello that switches identity and requests judged
// by the new one; a failed hello ends the stream.
func TestACLPipelining(t *testing.T) {
	ts := startACL(t, nil)
	w := dial(t, ts.Addr())
	var b []byte
	b = proto.AppendHello(b, 1, "orders", secrets["orders"])
	b = proto.AppendAcquire(b, 0, 30, 2, "orders/p")
	b = proto.AppendAcquire(b, 0, 30, 3, "billing/p") // E 6 for orders
	b = proto.AppendHello(b, 4, "billing", secrets["billing"])
	b = proto.AppendAcquire(b, 0, 30, 5, "billing/p")
	b = proto.AppendAcquire(b, 0, 30, 6, "orders/q") // E 6 for billing
	b = proto.AppendHello(b, 7, "billing", "wrong")
	b = proto.AppendAcquire(b, 0, 30, 8, "billing/never")
	w.send(b)
	if f := w.expect(proto.OpHello, 1); f.Tail != "orders" {
		t.Fatalf("welcome %+v", f)
	}
	w.expect(proto.OpAcquire, 2)
	w.expectE(proto.OpAcquire, 3, proto.CodePermissionDenied)
	if f := w.expect(proto.OpHello, 4); f.Tail != "billing" {
		t.Fatalf("welcome %+v", f)
	}
	w.expect(proto.OpAcquire, 5)
	w.expectE(proto.OpAcquire, 6, proto.CodePermissionDenied)
	w.expectE(proto.OpHello, 7, proto.CodeUnauthenticated)
	w.closed(5 * time.Second)
	if ts.Key([]byte("billing/never")).Held {
		t.Fatal("an acquire after a failed hello was executed")
	}
	if ts.Key([]byte("orders/p")).Ident != "orders" || ts.Key([]byte("billing/p")).Ident != "billing" {
		t.Fatal("grants made to the wrong identity")
	}
}

// TestACLSwitchIdentity: a later hello switches the connection's identity;
// grants made before stay the first identity's.
func TestACLSwitchIdentity(t *testing.T) {
	ts := startACL(t, nil)
	w := dial(t, ts.Addr())
	w.login("orders")
	tok := w.grant("orders/s", 30, 1)
	w.login("orders-b")
	w.release("orders/s", tok)
	w.expect(proto.OpNotHeld, tok)
	w.login("orders")
	w.release("orders/s", tok)
	w.expect(proto.OpRelease, tok)
}

// TestACLReload: SetACL puts a new file in force. A removed identity's
// connections close within a second and its grants are an admin's to
// release; changed prefixes and roles apply to the next request; a changed
// secret only to the next hello; a file that does not load keeps the old.
func TestACLReload(t *testing.T) {
	ts := startACL(t, nil)
	gone, stay, changed, admin := dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr()), dial(t, ts.Addr())
	gone.login("orders")
	stay.login("orders-b")
	changed.login("billing")
	admin.login("ops")
	tok := gone.grant("orders/r", 30, 1)
	changed.grant("billing/1", 30, 2)

	// orders removed; billing gets orders/ keys and a new secret;
	// orders-b, ops and prom unchanged.
	next := line("orders-b", "orders/", "client") + line("ops", "*", "admin") +
		"billing " + acl.Digest([]byte("new-billing-secret")) + " orders/ client\n" + line("prom", "-", "monitor")
	begin := time.Now()
	if err := ts.SetACL(parseACL(t, next)); err != nil {
		t.Fatal(err)
	}
	gone.closed(time.Second)
	if d := time.Since(begin); d > time.Second {
		t.Fatalf("removed identity's connection closed after %v", d)
	}
	// The grant of the removed identity stays held; orders-b cannot touch it.
	if st := ts.Key([]byte("orders/r")); !st.Held || st.Ident != "orders" {
		t.Fatalf("removed identity's grant: %+v", st)
	}
	stay.release("orders/r", tok)
	stay.expect(proto.OpNotHeld, tok)
	// billing's next request is judged by its new keys; its connection
	// stays although its secret changed.
	changed.acquire("billing/2", 0, 30, 3)
	changed.expectE(proto.OpAcquire, 3, proto.CodePermissionDenied)
	changed.grant("orders/b", 30, 4)
	// The old secret no longer authenticates; the new one does.
	w := dial(t, ts.Addr())
	if f := w.hello(5, "billing billing-secret"); f.Op != proto.OpError || f.Code != proto.CodeUnauthenticated {
		t.Fatalf("old secret after the reload: %+v", f)
	}
	w2 := dial(t, ts.Addr())
	if f := w2.hello(6, "billing new-billing-secret"); f.Op != proto.OpHello {
		t.Fatalf("new secret after the reload: %+v", f)
	}
	// An admin releases the removed identity's grant.
	admin.release("orders/r", tok)
	admin.expect(proto.OpRelease, tok)

	// A file that does not load: the one in force stays.
	err := ts.ReloadACL(func() (*acl.ACL, error) { return acl.Parse("bad", []byte("x y z\n")) })
	var le *acl.LineError
	if !errors.As(err, &le) {
		t.Fatalf("ReloadACL of a bad file: %v", err)
	}
	stay.grant("orders/still", 30, 7)
	if f := dial(t, ts.Addr()).hello(8, "billing new-billing-secret"); f.Op != proto.OpHello {
		t.Fatalf("after a failed reload: %+v", f)
	}
	m := ts.Metrics()
	if m.Auth.Removed != 1 || m.ACLReloads != 1 || m.ACLReloadErrs != 1 {
		t.Fatalf("removed %d, reloads %d, failed reloads %d; want 1 1 1", m.Auth.Removed, m.ACLReloads, m.ACLReloadErrs)
	}
}

// TestACLReloadRole: a role change applies to the next request.
func TestACLReloadRole(t *testing.T) {
	ts := startACL(t, nil)
	w := dial(t, ts.Addr())
	w.login("orders")
	w.grant("orders/1", 30, 1)
	if err := ts.SetACL(parseACL(t, strings.Replace(aclText, "orders/,jobs/ client", "orders/,jobs/ monitor", 1))); err != nil {
		t.Fatal(err)
	}
	w.acquire("orders/2", 0, 30, 2)
	w.expectE(proto.OpAcquire, 2, proto.CodePermissionDenied)
}

// TestACLRestartKeepsIdentity: a graceful restart reloads every grant with
// its identity; a restart without the ACL judges them by the token alone.
func TestACLRestartKeepsIdentity(t *testing.T) {
	ts := startACL(t, nil)
	w := dial(t, ts.Addr())
	w.login("orders")
	tok := w.grant("orders/kept", 60, 1)
	tok2 := w.grant("orders/kept2", 60, 2)
	w.c.Close()
	ts.shutdown()

	ts2 := startWith(t, ts.cfg) // the same data dir and ACL
	if st := ts2.Key([]byte("orders/kept")); !st.Held || st.Token != tok || st.Ident != "orders" {
		t.Fatalf("after the restart: %+v", st)
	}
	other := dial(t, ts2.Addr())
	other.login("orders-b")
	other.release("orders/kept", tok)
	other.expect(proto.OpNotHeld, tok)
	own := dial(t, ts2.Addr())
	own.login("orders")
	own.release("orders/kept", tok)
	own.expect(proto.OpRelease, tok)
	other.c.Close()
	own.c.Close()
	ts2.shutdown()

	cfg := ts.cfg
	cfg.ACL = nil
	ts3 := startWith(t, cfg)
	if st := ts3.Key([]byte("orders/kept2")); st.Ident != "orders" {
		t.Fatalf("restart without the ACL forgot the identity: %+v", st)
	}
	anon := dial(t, ts3.Addr())
	anon.release("orders/kept2", tok2) // §4: the token alone
	anon.expect(proto.OpRelease, tok2)
}

// TestSetACLWithoutACL: authentication cannot be turned on by a reload.
func TestSetACLWithoutACL(t *testing.T) {
	ts := startServer(t, nil)
	if err := ts.SetACL(parseACL(t, aclText)); !errors.Is(err, engine.ErrNoACL) {
		t.Fatalf("SetACL on a server without an ACL: %v", err)
	}
	if ts.ACL() != nil {
		t.Fatal("ACL() on a server without one")
	}
}

// TestAdminRelease: the admin endpoint's release frees a grant of any
// identity (by its token, or whatever holds the key), hands the key to its
// waiter, and is counted; a token that is not current, or a free key, is
// ErrNotHeld; a member that does not serve refuses it.
func TestAdminRelease(t *testing.T) {
	ts := startACL(t, nil)
	w, waiter := dial(t, ts.Addr()), dial(t, ts.Addr())
	w.login("orders")
	waiter.login("orders-b")
	tok := w.grant("orders/a", 30, 1)
	ctx := context.Background()
	if _, err := ts.AdminRelease(ctx, []byte("orders/a"), tok+1, "ops"); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("release of another token: %v", err)
	}
	waiter.acquire("orders/a", 10, 30, 2)
	waiter.silent(50 * time.Millisecond)
	rel, err := ts.AdminRelease(ctx, []byte("orders/a"), tok, "ops")
	if err != nil || rel.Token != tok || rel.Ident != "orders" {
		t.Fatalf("AdminRelease: %+v %v", rel, err)
	}
	next := waiter.expect(proto.OpAcquire, 2).Token
	rel, err = ts.AdminRelease(ctx, []byte("orders/a"), 0, "ops") // whatever holds it
	if err != nil || rel.Token != next || rel.Ident != "orders-b" {
		t.Fatalf("AdminRelease without a token: %+v %v", rel, err)
	}
	if _, err := ts.AdminRelease(ctx, []byte("orders/a"), 0, "ops"); !errors.Is(err, engine.ErrNotHeld) {
		t.Fatalf("release of a free key: %v", err)
	}
	if _, err := ts.AdminRelease(ctx, []byte("bad\n"), 0, "ops"); !errors.Is(err, engine.ErrBadKey) {
		t.Fatalf("release of a bad key: %v", err)
	}
	m := ts.Metrics()
	if m.AdminReleases != 2 || m.Table.ForcedReleases != 2 {
		t.Fatalf("admin releases %d, forced %d; want 2 2", m.AdminReleases, m.Table.ForcedReleases)
	}

	cts, node := startCommitting(t, nil)
	node.gate.Store(&repl.Gate{State: repl.Redirect, Addr: "127.0.0.1:1"})
	cts.GateChanged()
	var ns *engine.NotServingError
	if _, err := cts.AdminRelease(ctx, []byte("k"), 0, ""); !errors.As(err, &ns) || ns.Active != "127.0.0.1:1" {
		t.Fatalf("AdminRelease on a member that redirects: %v", err)
	}
}

// TestAdminReleaseWaitsForCommit: on a node that commits before answering,
// AdminRelease returns once its release is committed.
func TestAdminReleaseWaitsForCommit(t *testing.T) {
	ts, node := startCommitting(t, nil)
	w := dial(t, ts.Addr())
	w.acquire("k", 0, 30, 1)
	for deadline := time.Now().Add(5 * time.Second); node.Barrier() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the acquire made no record")
		}
		time.Sleep(time.Millisecond)
	}
	ts.Committed(node.Barrier())
	tok := w.expect(proto.OpAcquire, 1).Token
	done := make(chan error, 1)
	go func() {
		_, err := ts.AdminRelease(context.Background(), []byte("k"), tok, "")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("returned before the commit: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	ts.Committed(node.Barrier())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAdminReleaseAbandoned: an admin release whose record the node
// abandons (leadership lost before it committed) is ErrOutcomeUnknown,
// never a success, even though the committed number then passes it.
func TestAdminReleaseAbandoned(t *testing.T) {
	ts, node := startCommitting(t, nil)
	w := dial(t, ts.Addr())
	w.acquire("k", 0, 30, 1)
	for deadline := time.Now().Add(5 * time.Second); node.Barrier() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the acquire made no record")
		}
		time.Sleep(time.Millisecond)
	}
	committed := node.Barrier()
	ts.Committed(committed)
	tok := w.expect(proto.OpAcquire, 1).Token
	done := make(chan error, 1)
	go func() {
		_, err := ts.AdminRelease(context.Background(), []byte("k"), tok, "")
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); node.Barrier() == committed; {
		if time.Now().After(deadline) {
			t.Fatal("the release made no record")
		}
		time.Sleep(time.Millisecond)
	}
	ts.Abandon(committed)
	if err := <-done; !errors.Is(err, engine.ErrOutcomeUnknown) {
		t.Fatalf("an abandoned admin release returned %v, want ErrOutcomeUnknown", err)
	}
}

// TestACLRefusalsLoggedOncePerSecond: a flood of refusals makes a log
// line a second at most, and each line counts the refusals held back
// since the one before (not_logged_since_last), so that every refusal is
// in the log once a line follows the flood.
func TestACLRefusalsLoggedOncePerSecond(t *testing.T) {
	var logs logBuffer
	ts := startACL(t, func(c *engine.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	w := dial(t, ts.Addr())
	w.login("orders")
	const flood = 200
	var b []byte
	for i := range flood {
		b = proto.AppendAcquire(b, 0, 30, uint64(i), "billing/1")
	}
	began := time.Now()
	w.send(b)
	for i := range flood {
		w.expectE(proto.OpAcquire, uint64(i), proto.CodePermissionDenied)
	}
	// One more refusal at a time until a line is logged for the last one:
	// then the lines count every refusal sent.
	counted := func() int {
		n := 0
		for _, rec := range logs.lines(t, "permission denied") {
			held, _ := rec["not_logged_since_last"].(float64)
			n += 1 + int(held)
		}
		return n
	}
	sent := flood
	for deadline := time.Now().Add(10 * time.Second); counted() != sent; sent++ {
		if n := counted(); n > sent || time.Now().After(deadline) {
			t.Fatalf("%d refusals counted in the log after %d sent", n, sent)
		}
		time.Sleep(50 * time.Millisecond) // a refusal every 50 ms: the next line within a second
		w.acquire("billing/1", 0, 30, uint64(sent))
		w.expectE(proto.OpAcquire, uint64(sent), proto.CodePermissionDenied)
	}
	took := time.Since(began)
	lines := len(logs.lines(t, "permission denied"))
	if maxLines := 2 + int(took/time.Second); lines > maxLines || lines < 2 {
		t.Fatalf("%d log lines for %d refusals in %v, want 2..%d (one a second)", lines, sent, took, maxLines)
	}
	if m := ts.Metrics(); m.Auth.Denied != uint64(sent) {
		t.Fatalf("%d refusals counted in the metrics, want %d", m.Auth.Denied, sent)
	}
	t.Logf("%d refusals in %v: %d log lines", sent, took.Round(time.Millisecond), lines)
}
