package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/proto"
)

// PROTOCOL.md §9 against the built binary, in raw frames, as a black-box
// suite speaks it: S, V, W, I and their answers, the pushed L, E 7 and
// E 8, the shutdown's E 4 and L 4, and a restart that keeps every shared
// holder with its token, limit and identity (SIGTERM, same data dir).

// shared sends an S.
func (c *conn) shared(key string, wait, lease uint8, owner uint64, limit uint16) {
	c.t.Helper()
	c.send(proto.AppendShared(nil, wait, lease, owner, limit, key))
}

// expectE reads an E for (op, id) with code.
func (c *conn) expectE(op proto.Op, id uint64, code uint8) {
	c.t.Helper()
	if r := c.expect(proto.OpError, id); r.ReqOp != op || r.Code != code {
		c.t.Fatalf("E for %c %d: op %c code %d, want %c code %d", op, id, r.ReqOp, r.Code, op, code)
	}
}

// ping is a round trip: what c sent before has been executed.
func (c *conn) ping() {
	c.t.Helper()
	c.send(proto.AppendPing(nil, 0xabc))
	c.expect(proto.OpPing, 0xabc)
}

func TestSharedOfTheBinary(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "acl"), t.TempDir()
	writeACL(t, path, aclFile)
	args := []string{"--acl", path, "--max-watches-per-conn", "2", "--drain", "1s", "--admin", "127.0.0.1:0"}
	d := startDaemon(t, dir, args...)
	a, b, ops := dial(t, d.addr), dial(t, d.addr), dial(t, d.addr)
	a.login("orders")
	b.login("orders-b")
	ops.login("ops")

	// Two holders of a semaphore of 2, each its identity's.
	a.shared("orders/sem", 0, 60, 1, 2)
	ta := a.expect(proto.OpAcquire, 1).Token
	b.shared("orders/sem", 0, 60, 2, 2)
	tb := b.expect(proto.OpAcquire, 2).Token
	if tb <= ta {
		t.Fatalf("tokens %d then %d", ta, tb)
	}
	// Full: wait 0 is T, wait > 0 queues; another limit is E 7, and so is 0.
	b.shared("orders/sem", 0, 60, 3, 2)
	b.expect(proto.OpTimeout, 3)
	b.shared("orders/sem", 0, 60, 4, 3)
	b.expectE(proto.OpShared, 4, proto.CodeLimitMismatch)
	b.shared("orders/sem", 0, 60, 5, 0)
	b.expectE(proto.OpShared, 5, proto.CodeLimitMismatch)
	// I: 2 holders of limit 2, the newest's token.
	ops.send(proto.AppendInspect(nil, 6, "orders/sem"))
	if r := ops.expect(proto.OpInspect, 6); r.Holders != 2 || r.Limit != 2 || r.Waiters != 0 || r.Token != tb || r.Remaining < 55000 {
		t.Fatalf("I: %+v", r)
	}
	// V: valid for a holder, N for anything else.
	ops.send(proto.AppendValidate(nil, ta, "orders/sem"))
	if r := ops.expect(proto.OpValidate, ta); r.Remaining < 55000 || r.Remaining > 60000 {
		t.Fatalf("V: %+v", r)
	}
	ops.send(proto.AppendValidate(nil, ta+tb, "orders/sem"))
	if r := ops.expect(proto.OpNotHeld, ta+tb); r.ReqOp != proto.OpValidate {
		t.Fatalf("V of a stale token: %+v", r)
	}
	// W: two watches, the third is E 8; the release pushes an L 1.
	ops.send(proto.AppendWatch(nil, ta, "orders/sem"))
	ops.expect(proto.OpWatch, ta)
	ops.send(proto.AppendWatch(nil, tb, "orders/sem"))
	ops.expect(proto.OpWatch, tb)
	ops.send(proto.AppendWatch(nil, tb, "orders/sem"))
	ops.expectE(proto.OpWatch, tb, proto.CodeLimitReached)
	b.shared("orders/sem", 30, 60, 7, 2) // queued behind the full key
	b.ping()
	a.send(proto.AppendRelease(nil, ta, "orders/sem"))
	a.expect(proto.OpRelease, ta)
	if r := ops.read(); r.Op != proto.OpLost || r.ID != ta || r.Reason != 1 || string(r.Tail) != "orders/sem" {
		t.Fatalf("L of the release: %+v", r)
	}
	t7 := b.expect(proto.OpAcquire, 7).Token // the release served the queue
	// A writer queues behind the readers; a later reader queues behind it.
	a.send(proto.AppendAcquire(nil, 30, 60, 8, "orders/sem"))
	a.ping()
	a.shared("orders/sem", 30, 60, 9, 2)
	a.ping()

	// The admin endpoint lists every holder and waiter in queue order.
	var k api.Key
	adminGet(t, d, "/keys/"+api.KeyPath("orders/sem"), &k)
	if !k.Shared || k.Limit != 2 || len(k.Holders) != 2 || len(k.Queue) != 2 ||
		k.Holders[0].Token != strconv.FormatUint(tb, 10) || k.Holders[0].Identity != "orders-b" ||
		k.Holders[1].Token != strconv.FormatUint(t7, 10) || k.Queue[0].Shared || !k.Queue[1].Shared || k.Queue[1].Limit != 2 {
		t.Fatalf("/keys/orders/sem: %+v", k)
	}

	// SIGTERM: the queued acquires get E 4 (op A, op S), the watch L 4.
	_ = d.Signal(syscall.SIGTERM)
	got := map[uint64]proto.Response{}
	for range 2 {
		r := a.read()
		got[r.ID] = r
	}
	if r := got[8]; r.Op != proto.OpError || r.ReqOp != proto.OpAcquire || r.Code != proto.CodeShutdown {
		t.Fatalf("the queued A at shutdown: %+v", r)
	}
	if r := got[9]; r.Op != proto.OpError || r.ReqOp != proto.OpShared || r.Code != proto.CodeShutdown {
		t.Fatalf("the queued S at shutdown: %+v", r)
	}
	if r := ops.read(); r.Op != proto.OpLost || r.ID != tb || r.Reason != 4 {
		t.Fatalf("the watch at shutdown: %+v", r)
	}
	ops.send(proto.AppendInspect(nil, 10, "orders/sem"))
	ops.expectE(proto.OpInspect, 10, proto.CodeShutdown)
	if code := d.wait(); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.logs)
	}

	// The restart holds both holders with their tokens, the limit and
	// their identities.
	d = startDaemon(t, dir, args...)
	a, b = dial(t, d.addr), dial(t, d.addr)
	a.login("orders")
	b.login("orders-b")
	a.send(proto.AppendInspect(nil, 11, "orders/sem"))
	if r := a.expect(proto.OpInspect, 11); r.Holders != 2 || r.Limit != 2 || r.Token != t7 {
		t.Fatalf("I after the restart: %+v", r)
	}
	a.shared("orders/sem", 0, 60, 12, 3)
	a.expectE(proto.OpShared, 12, proto.CodeLimitMismatch)
	for _, tok := range []uint64{tb, t7} {
		a.send(proto.AppendValidate(nil, tok, "orders/sem"))
		a.expect(proto.OpValidate, tok)
		a.send(proto.AppendRelease(nil, tok, "orders/sem")) // orders-b's: N for orders
		a.expect(proto.OpNotHeld, tok)
		b.send(proto.AppendRelease(nil, tok, "orders/sem"))
		b.expect(proto.OpRelease, tok)
	}
	a.shared("orders/sem", 0, 60, 13, 5) // free again: any limit
	if r := a.expect(proto.OpAcquire, 13); r.Token <= t7 {
		t.Fatalf("token %d after the restart, not above %d", r.Token, t7)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// adminGet decodes the admin endpoint's JSON at path, as the admin
// identity.
func adminGet(t *testing.T, d *daemon, path string, v any) {
	t.Helper()
	req, err := http.NewRequest("GET", d.adminURL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("ops", aclSecrets["ops"])
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
