package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// The shared client conformance cases (clients/conformance/README.md): the
// Go and Python clients both run them against real lockd processes, so
// that what a caller sees at a deadline, a cancellation or a refused
// connection cannot drift between them.

// conformanceFile is the case file, relative to this package.
const conformanceFile = "../clients/conformance/deadline.json"

// conformanceSlack widens every case's max_ms: the machine running the
// tests may be loaded (two shared cores, -race). It never narrows min_ms.
const conformanceSlack = 250 * time.Millisecond

type confFile struct {
	About string     `json:"about"`
	Cases []confCase `json:"cases"`
}

type confCase struct {
	Name   string `json:"name"`
	Server string `json:"server"`
	Client struct {
		TLS   *bool `json:"tls"`
		Cert  *bool `json:"cert"`
		Conns int   `json:"conns"`
	} `json:"client"`
	Holder *struct {
		LeaseS         int  `json:"lease_s"`
		ReleaseAfterMs *int `json:"release_after_ms"`
	} `json:"holder"`
	Call struct {
		Op            string `json:"op"`
		Key           string `json:"key"`
		WaitMs        int    `json:"wait_ms"`
		LeaseS        int    `json:"lease_s"`
		CancelAfterMs *int   `json:"cancel_after_ms"`
	} `json:"call"`
	Expect struct {
		Outcome string `json:"outcome"`
		Cause   string `json:"cause"`
		MinMs   int    `json:"min_ms"`
		MaxMs   int    `json:"max_ms"`
	} `json:"expect"`
	After *struct {
		KeyFreeWithinMs int  `json:"key_free_within_ms"`
		ConnsKept       bool `json:"conns_kept"`
	} `json:"after"`
}

// confServer is one lockd process of a kind the cases name, and what a
// client of it needs.
type confServer struct {
	addr      string
	pki       *testPKI // nil without TLS
	clientTLS tls.Certificate
	hold      net.Conn // max_conns_0: the one connection the server takes
}

// confServers starts each kind of server once, on first use, for the
// test that asks first (its cleanup stops it).
type confServers struct {
	t     *testing.T
	mu    sync.Mutex
	kinds map[string]*confServer
}

func (s *confServers) get(t *testing.T, kind string) *confServer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cs, ok := s.kinds[kind]; ok {
		return cs
	}
	cs := &confServer{}
	var args []string
	switch kind {
	case "plain":
	case "max_conns_0":
		args = []string{"--max-conns", "1"}
	case "tls", "mtls":
		pki := newPKI(s.t)
		caFile, cert, key := pki.serverFiles(s.t)
		cs.pki, cs.clientTLS = pki, pki.client
		args = []string{"--tls-cert", cert, "--tls-key", key}
		if kind == "mtls" {
			args = append(args, "--tls-client-ca", caFile)
		}
	default:
		t.Fatalf("unknown server kind %q", kind)
	}
	cs.addr = ownServer(s.t, args...).Addr()
	if kind == "max_conns_0" {
		// Take the server's one connection, and see it served.
		nc, err := net.Dial("tcp", cs.addr)
		if err != nil {
			t.Fatal(err)
		}
		s.t.Cleanup(func() { _ = nc.Close() })
		if _, err := nc.Write(proto.AppendPing(nil, 7)); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Read(make([]byte, 64)); err != nil {
			t.Fatalf("max_conns_0: the first connection is not served: %v", err)
		}
		cs.hold = nc
	}
	s.kinds[kind] = cs
	return cs
}

// config is a client of cs: TLS with the CA (and the client certificate
// for mtls) unless the case says otherwise.
func (cs *confServer) config(tlsOn, cert *bool, conns int) Config {
	cfg := Config{Addrs: []string{cs.addr}, ConnsPerAddr: conns, ReconnectInterval: 3 * time.Second}
	useTLS := cs.pki != nil
	if tlsOn != nil {
		useTLS = *tlsOn
	}
	if useTLS {
		cfg.TLS = &tls.Config{RootCAs: cs.pki.pool, MinVersion: tls.VersionTLS12}
		withCert := true
		if cert != nil {
			withCert = *cert
		}
		if withCert {
			cfg.TLS.Certificates = []tls.Certificate{cs.clientTLS}
		}
	}
	return cfg
}

// outcome names err as the case file does.
func confOutcome(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrBusy):
		return "busy"
	case errors.Is(err, ErrNoConnection):
		return "no_connection"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "other: " + err.Error()
}

// TestConformanceDeadline runs clients/conformance/deadline.json.
func TestConformanceDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	lockdBinary(t) // skips where there is no lockd to run (the case file is the repository's too)
	b, err := os.ReadFile(filepath.FromSlash(conformanceFile))
	if err != nil {
		t.Fatal(err)
	}
	var f confFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", conformanceFile, err)
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s: no cases", conformanceFile)
	}
	servers := &confServers{t: t, kinds: map[string]*confServer{}}
	seen := map[string]bool{}
	for i, c := range f.Cases {
		if seen[c.Name] {
			t.Fatalf("case %q twice", c.Name)
		}
		seen[c.Name] = true
		t.Run(c.Name, func(t *testing.T) { runConfCase(t, servers, i, c) })
	}
}

func runConfCase(t *testing.T, servers *confServers, i int, c confCase) {
	if c.Call.Op != "acquire" {
		t.Fatalf("call.op %q: only acquire is known", c.Call.Op)
	}
	cs := servers.get(t, c.Server)
	key := c.Call.Key
	if key == "" {
		key = fmt.Sprintf("conformance/%d/%d", i, time.Now().UnixNano())
	}
	ctx := ctxT(t, 30*time.Second)

	// The holder, on a client (and connections) of its own.
	var holderCl *Client
	var held Lock
	released := make(chan struct{})
	if c.Holder != nil {
		holderCl = newClient(t, cs.config(nil, nil, 1))
		var err error
		held, err = holderCl.Acquire(ctx, key, AcquireOptions{Wait: 5 * time.Second, Lease: time.Duration(c.Holder.LeaseS) * time.Second})
		if err != nil {
			t.Fatalf("holder: %v", err)
		}
		t.Cleanup(func() { _ = holderCl.Release(context.Background(), held) })
	} else {
		close(released)
	}

	cl := newClient(t, cs.config(c.Client.TLS, c.Client.Cert, c.Client.Conns))
	connsBefore := -1
	if c.Expect.Outcome != "no_connection" {
		// Every connection up, so that the call's time is its own and
		// conns_kept compares like with like.
		waitUp(t, cl, len(*cl.slots.Load()))
		connsBefore = liveConns(cl)
	}

	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	if c.Holder != nil {
		if ms := c.Holder.ReleaseAfterMs; ms != nil {
			time.AfterFunc(time.Duration(*ms)*time.Millisecond, func() {
				defer close(released)
				if err := holderCl.Release(context.Background(), held); err != nil {
					t.Errorf("holder's release: %v", err)
				}
			})
		}
	}
	if ms := c.Call.CancelAfterMs; ms != nil {
		time.AfterFunc(time.Duration(*ms)*time.Millisecond, cancel)
	}
	l, err := cl.Acquire(callCtx, key, AcquireOptions{Wait: time.Duration(c.Call.WaitMs) * time.Millisecond, Lease: time.Duration(c.Call.LeaseS) * time.Second})
	el := time.Since(start)
	connsAfter := liveConns(cl)
	if err == nil {
		t.Cleanup(func() { _ = cl.Release(context.Background(), l) })
	}

	if got := confOutcome(err); got != c.Expect.Outcome {
		t.Errorf("outcome %s (%v) after %v, want %s", got, err, el, c.Expect.Outcome)
	}
	switch c.Expect.Cause {
	case "":
	case "rejected":
		if !errors.Is(err, ErrRejected) {
			t.Errorf("cause: %v does not match ErrRejected", err)
		}
	case "tls":
		if err == nil || !strings.Contains(err.Error(), "TLS") || !errors.Is(err, ErrTLS) {
			t.Errorf("cause: %v does not name TLS (or does not match ErrTLS)", err)
		}
	default:
		t.Fatalf("expect.cause %q unknown", c.Expect.Cause)
	}
	lo, hi := time.Duration(c.Expect.MinMs)*time.Millisecond, time.Duration(c.Expect.MaxMs)*time.Millisecond
	if el < lo || el > hi+conformanceSlack {
		t.Errorf("returned after %v, want %v..%v (+%v slack)", el, lo, hi, conformanceSlack)
	}
	if c.After == nil {
		return
	}
	if c.After.ConnsKept && connsAfter != connsBefore {
		t.Errorf("%d connections live after the call, %d before", connsAfter, connsBefore)
	}
	if w := c.After.KeyFreeWithinMs; w > 0 {
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatal("the holder did not release")
		}
		probe := holderCl
		if probe == nil {
			probe = newClient(t, cs.config(nil, nil, 1))
		}
		t0 := time.Now()
		pl, perr := probe.Acquire(ctx, key, AcquireOptions{Wait: time.Duration(w) * time.Millisecond, Lease: 5 * time.Second})
		if perr != nil {
			t.Errorf("the key is not free within %d ms after the call and the holder's release: %v after %v", w, perr, time.Since(t0))
		} else {
			_ = probe.Release(ctx, pl)
		}
	}
	if c.After.ConnsKept {
		if n := liveConns(cl); n != connsBefore {
			t.Errorf("%d connections live at the end, %d before the call", n, connsBefore)
		}
	}
}
