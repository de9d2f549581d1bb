package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

const testSecret = "s3cr3t with spaces"

// credConfig is fastConfig with credentials.
func credConfig(addrs ...string) Config {
	cfg := fastConfig(addrs...)
	cfg.Identity = "orders"
	cfg.Secret = testSecret
	return cfg
}

// TestSecretNeverPrinted: the secret appears in no formatting of a Config,
// in no JSON or log line, and in no error of Validate.
func TestSecretNeverPrinted(t *testing.T) {
	cfg := credConfig("127.0.0.1:7070")
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("cfg", "config", cfg, "secret", cfg.Secret)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("cfg", "config", cfg, "secret", cfg.Secret)
	js, err := json.Marshal(struct {
		Identity string
		Secret   Secret
	}{cfg.Identity, cfg.Secret})
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]string{"log": logs.String(), "json": string(js)}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s", "%T %v"} {
		outs[verb+" Config"] = fmt.Sprintf(verb, cfg)
		outs[verb+" &Config"] = fmt.Sprintf(verb, &cfg)
		outs[verb+" Secret"] = fmt.Sprintf(verb, cfg.Secret)
	}
	outs["Sprint"] = fmt.Sprint(cfg.Secret, cfg)
	outs["String"] = cfg.Secret.String()
	outs["GoString"] = cfg.Secret.GoString()
	for _, bad := range []Config{
		{Addrs: []string{"a:1"}, Identity: "orders", Secret: "two\nlines " + testSecret},
		{Addrs: []string{"a:1"}, Identity: "bad identity", Secret: testSecret},
		{Addrs: []string{"a:1"}, Secret: testSecret},
		{Addrs: []string{"a:1"}, Identity: "orders", Secret: Secret(strings.Repeat("x", 257)) + testSecret},
	} {
		err := bad.Validate()
		if err == nil {
			t.Fatalf("Validate accepted %v", bad)
		}
		outs["Validate "+err.Error()] = err.Error()
	}
	for what, s := range outs {
		if strings.Contains(s, testSecret) || strings.Contains(s, "s3cr3t") || strings.Contains(s, fmt.Sprintf("%x", testSecret)) {
			t.Errorf("%s shows the secret: %s", what, s)
		}
	}
	if s := fmt.Sprintf("%v", cfg.Secret); s != "[redacted]" {
		t.Errorf("%%v of a Secret = %q", s)
	}
	if s := fmt.Sprintf("%+v", Config{}); !strings.Contains(s, "Secret:}") || strings.Contains(s, "redacted") {
		t.Errorf("an empty Secret should print empty: %s", s)
	}
	if string(cfg.Secret) != testSecret {
		t.Fatal("string(Secret) is not the secret")
	}
}

func TestValidateCredentials(t *testing.T) {
	cases := []struct {
		name   string
		id     string
		secret Secret
		field  string // "" = valid
	}{
		{"none", "", "", ""},
		{"both", "orders", "x", ""},
		{"every identity byte", "aZ09._@-", "x", ""},
		{"64-byte identity", strings.Repeat("a", 64), "x", ""},
		{"256-byte secret", "orders", Secret(strings.Repeat("s", 256)), ""},
		{"65-byte identity", strings.Repeat("a", 65), "x", "Identity"},
		{"space in identity", "a b", "x", "Identity"},
		{"slash in identity", "a/b", "x", "Identity"},
		{"secret without identity", "", "x", "Identity"},
		{"identity without secret", "orders", "", "Secret"},
		{"newline in secret", "orders", "a\nb", "Secret"},
		{"257-byte secret", "orders", Secret(strings.Repeat("s", 257)), "Secret"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Addrs: []string{"127.0.0.1:1"}, Identity: tc.id, Secret: tc.secret}
			err := cfg.Validate()
			var fe *FieldError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
				t.Fatalf("err = %v, want a FieldError on %s", err, tc.field)
			}
		})
	}
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		content string
		want    string // "" = rejected
	}{
		{"abc", "abc"},
		{"abc\n", "abc"},
		{"abc\r\n", "abc"},
		{" abc  \n", " abc  "},
		{"abc\n\n", ""},
		{"a\nb", ""},
		{"\n", ""},
		{"", ""},
		{strings.Repeat("s", 256) + "\n", strings.Repeat("s", 256)},
		{strings.Repeat("s", 257), ""},
	}
	for i, tc := range cases {
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := LoadSecret(p)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%q: accepted as %q", tc.content, string(s))
		case tc.want != "" && (err != nil || string(s) != tc.want):
			t.Errorf("%q: got %q, %v; want %q", tc.content, string(s), err, tc.want)
		case err != nil && strings.TrimSpace(tc.content) != "" && strings.Contains(err.Error(), strings.TrimSpace(tc.content)):
			t.Errorf("%q: the error shows the content: %v", tc.content, err)
		}
	}
	if _, err := LoadSecret(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestHelloRealServer: a server without --acl answers the hello, and
// everything works with credentials configured, on every connection.
func TestHelloRealServer(t *testing.T) {
	srv := sharedServer(t)
	cl := newClient(t, credConfig(srv.Addr()))
	ctx := ctxT(t, 10*time.Second)
	for i := 0; i < 10; i++ { // both connections
		l, err := cl.Acquire(ctx, "TestHelloRealServer", AcquireOptions{Wait: time.Second, Lease: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := liveConns(cl); n != 2 {
		t.Fatalf("%d connections live, want 2", n)
	}
}

// helloFake is a fake server that checks that every connection starts with
// the hello and answers it with answer (nil: a welcome), holding the
// answer back until the connection's second frame arrives: a client that
// waited for the welcome before sending would stall.
type helloFake struct {
	*fake
	mu     sync.Mutex
	first  map[*fconn]freq // each connection's first frame
	frames map[*fconn]int
	ops    []proto.Op // every frame after the hellos
}

func newHelloFake(t *testing.T, answer func(fc *fconn, hello freq) []byte, then func(fc *fconn, r freq)) *helloFake {
	hf := &helloFake{first: map[*fconn]freq{}, frames: map[*fconn]int{}}
	var held sync.Map // *fconn → []byte: the hello's answer, not yet sent
	hf.fake = newFake(t, func(fc *fconn, r freq) {
		hf.mu.Lock()
		n := hf.frames[fc]
		hf.frames[fc] = n + 1
		if n == 0 {
			hf.first[fc] = r
		} else {
			hf.ops = append(hf.ops, r.Op)
		}
		hf.mu.Unlock()
		if n == 0 {
			if r.Op != proto.OpHello {
				t.Errorf("first frame of a connection is %c, want H", r.Op)
				return
			}
			ans := proto.AppendWelcome(nil, r.ID, "orders")
			if answer != nil {
				ans = answer(fc, r)
			}
			held.Store(fc, ans)
			return
		}
		if ans, ok := held.LoadAndDelete(fc); ok {
			fc.send(ans.([]byte))
			if answer != nil && bytes.HasPrefix(ans.([]byte), []byte{'E'}) && ans.([]byte)[10] == proto.CodeUnauthenticated {
				_ = fc.nc.Close() // as the server does after E 5
				return
			}
		}
		if r.Op == proto.OpHello {
			t.Errorf("a second hello on one connection")
		}
		if then != nil {
			then(fc, r)
		} else {
			fc.auto(r)
		}
	})
	return hf
}

func (hf *helloFake) hellos() []freq {
	hf.mu.Lock()
	defer hf.mu.Unlock()
	var out []freq
	for _, r := range hf.first {
		out = append(out, r)
	}
	return out
}

func (hf *helloFake) count(op proto.Op) int {
	hf.mu.Lock()
	defer hf.mu.Unlock()
	n := 0
	for _, o := range hf.ops {
		if o == op {
			n++
		}
	}
	return n
}

// TestHelloFirstAndPipelined: the hello is the first frame of every
// connection, with the identity and the secret verbatim, and requests
// follow it without waiting for the welcome.
func TestHelloFirstAndPipelined(t *testing.T) {
	hf := newHelloFake(t, nil, nil)
	cl := newClient(t, credConfig(hf.addr()))
	ctx := ctxT(t, 20*time.Second)
	rounds := func() {
		t.Helper()
		for i := 0; i < 6; i++ {
			l, err := cl.Acquire(ctx, "k", AcquireOptions{Wait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := cl.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitHellos := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); len(hf.hellos()) < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections said hello, want %d", len(hf.hellos()), n)
			}
		}
	}
	waitUp(t, cl, 2)
	rounds()
	waitHellos(2)
	// Every connection it opens: cut both, and the redialled ones say
	// hello first too.
	hf.mu.Lock()
	for fc := range hf.first {
		_ = fc.nc.Close()
	}
	hf.mu.Unlock()
	waitHellos(4)
	waitUp(t, cl, 2)
	rounds()
	hs := hf.hellos()
	if len(hs) != 4 {
		t.Fatalf("%d connections said hello, want 4", len(hs))
	}
	for _, h := range hs {
		if h.Op != proto.OpHello || h.Key != "orders "+testSecret {
			t.Fatalf("first frame %c %q, want H with identity and secret", h.Op, h.Key)
		}
	}
}

// A client without an identity sends no hello.
func TestNoIdentityNoHello(t *testing.T) {
	f := newFake(t, nil)
	cl := newClient(t, fastConfig(f.addr()))
	ctx := ctxT(t, 5*time.Second)
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.next(time.Second); r.Op != proto.OpPing {
		t.Fatalf("first frame %c, want the ping", r.Op)
	}
}

// refuse answers a hello E 5, as a server with --acl does for a wrong
// secret.
func refuse(fc *fconn, h freq) []byte {
	return proto.AppendError(nil, proto.OpHello, h.ID, proto.CodeUnauthenticated, "unauthenticated")
}

// TestHelloRefused: an E 5 to the hello fails every request pipelined
// behind it with ErrUnauthenticated — definitive, not Indeterminate, not
// sent again on another connection — and, until a hello succeeds, calls
// fail with it at once.
func TestHelloRefused(t *testing.T) {
	hf := newHelloFake(t, refuse, nil)
	cfg := credConfig(hf.addr())
	cfg.ReconnectInterval = time.Hour // no redial: each request had one chance
	cl := newClient(t, cfg)
	waitUp(t, cl, 2) // hellos sent, their answers held: the requests go behind them
	ctx := ctxT(t, 10*time.Second)
	const n = 20
	tickets := make([]*Ticket, n)
	rels := make([]Releasing, n)
	for i := range tickets {
		tickets[i] = cl.AcquireAsync(ctx, fmt.Sprint("k", i), AcquireOptions{Wait: 5 * time.Second})
		rels[i] = cl.ReleaseAsync(ctx, Lock{Key: fmt.Sprint("r", i), Token: uint64(100 + i)})
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrIndeterminate) || errors.Is(err, ErrNoConnection) {
			t.Fatalf("%s: %v, want ErrUnauthenticated alone", what, err)
		}
		if msg := err.Error(); !strings.Contains(msg, `"orders"`) || !strings.Contains(msg, hf.addr()) || strings.Contains(msg, "s3cr3t") {
			t.Fatalf("%s: message %q should name the identity and server, not the secret", what, msg)
		}
	}
	start := time.Now()
	for i := range tickets {
		_, err := tickets[i].Wait()
		check("acquire", err)
		check("release", rels[i].Wait())
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("took %v", el)
	}
	if a, r := hf.count(proto.OpAcquire), hf.count(proto.OpRelease); a > n || r > n {
		t.Fatalf("the server saw %d acquires and %d releases for %d each: some were sent again", a, r, n)
	}
	// Both connections are gone, refused: a new call fails at once.
	deadline := time.Now().Add(5 * time.Second)
	for liveConns(cl) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	start = time.Now()
	_, err := cl.Acquire(ctx, "late", AcquireOptions{Wait: 5 * time.Second})
	check("acquire after", err)
	_, err = cl.Ping(ctx)
	check("ping after", err)
	if el := time.Since(start); el > time.Second {
		t.Fatalf("calls after a refused hello took %v, want at once", el)
	}
}

// TestUnauthenticatedWithoutIdentity: a server that wants an identity
// answers E 5 to the first request of a client that has none, and closes;
// nothing on that connection was executed.
func TestUnauthenticatedWithoutIdentity(t *testing.T) {
	f := newFake(t, func(fc *fconn, r freq) {
		if r.Op == proto.OpPing {
			fc.auto(r)
			return
		}
		fc.send(proto.AppendError(nil, r.Op, r.ID, proto.CodeUnauthenticated, "unauthenticated"))
		_ = fc.nc.Close()
	})
	cfg := fastConfig(f.addr())
	cfg.ConnsPerAddr = 1
	cfg.ReconnectInterval = time.Hour
	cl := newClient(t, cfg)
	waitUp(t, cl, 1)
	ctx := ctxT(t, 10*time.Second)
	var tickets []*Ticket
	for i := 0; i < 10; i++ {
		tickets = append(tickets, cl.AcquireAsync(ctx, fmt.Sprint("k", i), AcquireOptions{Wait: 5 * time.Second}))
	}
	for _, tk := range tickets {
		_, err := tk.Wait()
		if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrIndeterminate) {
			t.Fatalf("acquire: %v, want ErrUnauthenticated", err)
		}
		if !strings.Contains(err.Error(), "requires an identity") {
			t.Fatalf("message %q does not say what is missing", err)
		}
	}
}

// TestPermissionDenied: E 6 is a definitive ErrPermissionDenied for that
// key, not retried; the connection stays open for the keys allowed, and a
// keep-alive whose renewal is refused reports the lock lost at once.
func TestPermissionDenied(t *testing.T) {
	denied := func(key string) bool { return strings.HasPrefix(key, "billing/") }
	var mu sync.Mutex
	deniedRenew := false
	hf := newHelloFake(t, nil, func(fc *fconn, r freq) {
		mu.Lock()
		dr := deniedRenew && r.Op == proto.OpRenew
		mu.Unlock()
		if r.Op != proto.OpPing && (denied(r.Key) || dr) {
			fc.send(proto.AppendError(nil, r.Op, r.ID, proto.CodePermissionDenied, "permission denied"))
			return
		}
		fc.auto(r)
	})
	cfg := credConfig(hf.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrIndeterminate) {
			t.Fatalf("%s: %v, want ErrPermissionDenied", what, err)
		}
		if !strings.Contains(err.Error(), `"billing/1"`) || !strings.Contains(err.Error(), `"orders"`) {
			t.Fatalf("%s: message %q should name the key and the identity", what, err)
		}
	}
	_, err := cl.Acquire(ctx, "billing/1", AcquireOptions{Wait: 2 * time.Second})
	check("acquire", err)
	check("release", cl.Release(ctx, Lock{Key: "billing/1", Token: 5}))
	_, err = cl.Renew(ctx, Lock{Key: "billing/1", Token: 5}, time.Second)
	check("renew", err)
	if a, r, k := hf.count(proto.OpAcquire), hf.count(proto.OpRelease), hf.count(proto.OpRenew); a != 1 || r != 1 || k != 1 {
		t.Fatalf("server saw %d acquires, %d releases, %d renews: want each once (no retry)", a, r, k)
	}
	l, err := cl.Acquire(ctx, "orders/1", AcquireOptions{Wait: 2 * time.Second, Lease: 30 * time.Second})
	if err != nil {
		t.Fatalf("an allowed key after E 6: %v", err)
	}
	if n := hf.numConns(); n != 1 {
		t.Fatalf("%d connections: E 6 should keep the connection", n)
	}
	mu.Lock()
	deniedRenew = true
	mu.Unlock()
	ka, err := cl.KeepAlive(context.Background(), l, KeepAliveOptions{Lease: 30 * time.Second, Every: 20 * time.Millisecond})
	if err == nil {
		defer ka.Stop()
		select {
		case <-ka.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("keep-alive went on after a refused renewal")
		}
		err = ka.Err()
	}
	if !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("keep-alive: %v, want ErrPermissionDenied", err)
	}
	if ka != nil && !errors.Is(err, ErrLockLost) {
		t.Fatalf("keep-alive: %v, want ErrLockLost too", err)
	}
}

// TestUnauthenticatedAfterWelcome: an E 5 to a request on a connection
// whose hello was welcomed (a reload removed the identity) fails that
// request with ErrUnauthenticated, and says so.
func TestUnauthenticatedAfterWelcome(t *testing.T) {
	hf := newHelloFake(t, nil, func(fc *fconn, r freq) {
		if r.Op == proto.OpAcquire && r.Key == "removed" {
			fc.send(proto.AppendError(nil, r.Op, r.ID, proto.CodeUnauthenticated, "unauthenticated"))
			_ = fc.nc.Close()
			return
		}
		fc.auto(r)
	})
	cfg := credConfig(hf.addr())
	cfg.ConnsPerAddr = 1
	cl := newClient(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	if _, err := cl.Ping(ctx); err != nil { // the hello is welcomed with it
		t.Fatal(err)
	}
	_, err := cl.Acquire(ctx, "removed", AcquireOptions{Wait: 2 * time.Second})
	if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), "no longer accepts") {
		t.Fatalf("acquire: %v, want ErrUnauthenticated", err)
	}
}
