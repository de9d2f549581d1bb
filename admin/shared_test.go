package admin_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
)

// TestKeysShared: /keys/{key} lists every holder of a shared key (token,
// identity, lease left, oldest first) and every waiter in queue order
// (identity, wait left, exclusive or shared with its limit), PROTOCOL.md
// §9.5; DELETE without a token releases every holder (each watch gets
// L 3) and lists them; the metrics count shared holders, watches and L
// by reason.
func TestKeysShared(t *testing.T) {
	f := setupACL(t) // the fixture's connection is orders'
	ops, b, watcher := f.other("ops"), f.other("orders-b"), f.other("prom")
	h1 := f.do(proto.AppendShared(nil, 0, 30, 1, 3, "orders/s"))
	h2 := ops.doOn(proto.AppendShared(nil, 0, 20, 2, 3, "orders/s"))
	if h1.Op != proto.OpAcquire || h2.Op != proto.OpAcquire {
		t.Fatalf("grants: %c %c", h1.Op, h2.Op)
	}
	if _, err := b.conn.Write(proto.AppendAcquire(nil, 10, 30, 3, "orders/s")); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the writer to queue", func() bool { return f.srv.Table().Lookup([]byte("orders/s")).Waiters == 1 })
	if _, err := f.conn.Write(proto.AppendShared(nil, 5, 15, 4, 3, "orders/s")); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the reader to queue", func() bool { return f.srv.Table().Lookup([]byte("orders/s")).Waiters == 2 })
	// A monitor of no keys may not watch these; an admin may (watcher
	// logs in as ops on a connection of its own).
	if r := watcher.doOn(proto.AppendWatch(nil, h1.Token, "orders/s")); r.Op != proto.OpError || r.Code != proto.CodePermissionDenied {
		t.Fatalf("a monitor of no keys watched: %c %d", r.Op, r.Code)
	}
	watcher = f.other("ops")
	for _, h := range []proto.Response{h1, h2} {
		if r := watcher.doOn(proto.AppendWatch(nil, h.Token, "orders/s")); r.Op != proto.OpWatch {
			t.Fatalf("watch: %c", r.Op)
		}
	}

	var k api.Key
	if code := f.getAs("/keys/orders/s", "prom", &k); code != 200 {
		t.Fatalf("GET: %d", code)
	}
	tok := func(r proto.Response) string { return strconv.FormatUint(r.Token, 10) }
	if !k.Held || !k.Shared || k.Limit != 3 || k.Waiters != 2 || k.Token != tok(h2) || k.Identity != "ops" || len(k.Holders) != 2 || len(k.Queue) != 2 {
		t.Fatalf("key view: %+v", k)
	}
	if x := k.Holders[0]; x.Token != tok(h1) || x.Identity != "orders" || x.LeaseLeftMs <= 25_000 || x.LeaseLeftMs > 30_000 {
		t.Fatalf("first holder: %+v", x)
	}
	if x := k.Holders[1]; x.Token != tok(h2) || x.Identity != "ops" || x.LeaseLeftMs <= 15_000 || x.LeaseLeftMs > 20_000 {
		t.Fatalf("second holder: %+v", x)
	}
	if w := k.Queue[0]; w.Owner != "3" || w.Identity != "orders-b" || w.Shared || w.Limit != 0 || w.LeaseSeconds != 30 ||
		w.WaitLeftMs <= 5_000 || w.WaitLeftMs > 10_000 {
		t.Fatalf("head of the queue: %+v", w)
	}
	if w := k.Queue[1]; w.Owner != "4" || w.Identity != "orders" || !w.Shared || w.Limit != 3 || w.LeaseSeconds != 15 ||
		w.WaitLeftMs <= 0 || w.WaitLeftMs > 5_000 {
		t.Fatalf("second waiter: %+v", w)
	}
	fams := f.scrapeAs("prom")
	if v := value(t, fams, "lockd_shared_holders"); v != 1 {
		t.Fatalf("lockd_shared_holders %v, want 1", v)
	}
	if v := value(t, fams, "lockd_watches"); v != 2 {
		t.Fatalf("lockd_watches %v, want 2", v)
	}

	code, _, body := f.req("DELETE", "/keys/orders/s", "ops", secrets["ops"])
	var rel api.Release
	if err := json.Unmarshal(body, &rel); err != nil || code != 200 || rel.Token != tok(h2) || len(rel.Holders) != 2 ||
		rel.Holders[0] != (api.ReleasedGrant{Token: tok(h1), Identity: "orders"}) || rel.Holders[1] != (api.ReleasedGrant{Token: tok(h2), Identity: "ops"}) {
		t.Fatalf("release of every holder: %d %s", code, body)
	}
	for _, h := range []proto.Response{h1, h2} {
		if r := watcher.read(); r.Op != proto.OpLost || r.ID != h.Token || r.Reason != 3 {
			t.Fatalf("watch of %d: %c id=%d reason %d, want L 3", h.Token, r.Op, r.ID, r.Reason)
		}
	}
	if r := b.read(); r.Op != proto.OpAcquire || r.ID != 3 {
		t.Fatalf("the writer: %c", r.Op)
	}
	fams = f.scrapeAs("prom")
	for reason, want := range map[string]float64{"released": 0, "expired": 0, "forced": 2, "cannot_tell": 0} {
		if v := value(t, fams, "lockd_lost_total", "reason", reason); v != want {
			t.Fatalf("lockd_lost_total{reason=%q} %v, want %v", reason, v, want)
		}
	}
	if v := value(t, fams, "lockd_requests_total", "op", "acquire-shared", "result", "granted"); v != 2 {
		t.Fatalf("acquire-shared granted %v, want 2", v)
	}
	if v := value(t, fams, "lockd_requests_total", "op", "watch", "result", "watching"); v != 2 {
		t.Fatalf("watch watching %v, want 2", v)
	}
	if v := value(t, fams, "lockd_admin_releases_total"); v != 2 {
		t.Fatalf("admin releases %v, want 2 (one per holder)", v)
	}
	var st api.Status
	if code := f.getAs("/status", "prom", &st); code != 200 || st.Limits.MaxHolders != 1<<20 || st.Limits.MaxWatchesPerConn != 1024 || st.Watches != 0 {
		t.Fatalf("status: %d %+v", code, st)
	}
}
