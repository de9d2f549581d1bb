package memberauth

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hosts are the members' hosts: three loopback addresses, so that a
// certificate names one member and not the others.
var hosts = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}

// side is one member's configuration in a test.
type side struct {
	secret []byte
	tls    repl.MemberTLS
	mode   uint8
	self   int
	opt    Options
	peers  []string // default: hosts at port 7070
}

func (s side) auth(t testing.TB) *Auth {
	t.Helper()
	peers := s.peers
	if peers == nil {
		for _, h := range hosts {
			peers = append(peers, net.JoinHostPort(h, "7070"))
		}
	}
	cfg := repl.ClusterConfig{Peers: peers, Self: s.self, Listen: peers[s.self], PeerOffset: 10000,
		FailoverTimeout: time.Second, MemberTLS: s.tls, Secret: s.secret}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.mode == 0 {
		s.mode = ModePriority
	}
	s.opt.Mode = s.mode
	return New(cfg, s.opt, repltest.Quiet())
}

// serve listens on 127.0.0.1:0 with a and returns the listener and a
// channel of what Accept returns.
func serve(t *testing.T, a *Auth) (*Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := a.Listen(ln)
	got := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		close(got)
		for c := range got {
			c.Close()
		}
	})
	return l, got
}

// echo checks that bytes pass both ways on an accepted pair.
func echo(t *testing.T, dialled, accepted net.Conn) {
	t.Helper()
	_ = dialled.SetDeadline(time.Now().Add(5 * time.Second))
	_ = accepted.SetDeadline(time.Now().Add(5 * time.Second))
	go func() { _, _ = dialled.Write([]byte("ping")) }()
	var b [4]byte
	if _, err := io.ReadFull(accepted, b[:]); err != nil || string(b[:]) != "ping" {
		t.Fatalf("acceptor read %q, %v", b, err)
	}
	go func() { _, _ = accepted.Write([]byte("pong")) }()
	if _, err := io.ReadFull(dialled, b[:]); err != nil || string(b[:]) != "pong" {
		t.Fatalf("dialer read %q, %v", b, err)
	}
}

// TestExchange: with a secret, TLS, or both, member 1 dials member 0 and
// the connection arrives authenticated as member 1, carrying bytes both
// ways; with neither it passes as plain TCP (member unknown).
func TestExchange(t *testing.T) {
	_, mats := repltest.MemberTLS(t, hosts)
	sec := repltest.Secret(1)
	for _, tc := range []struct {
		name   string
		secret []byte
		tls    bool
	}{
		{"secret", sec, false},
		{"tls", nil, true},
		{"tls+secret", sec, true},
		{"off", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc, dia := side{self: 0, secret: tc.secret}, side{self: 1, secret: tc.secret}
			if tc.tls {
				acc.tls, dia.tls = mats[0], mats[1]
			}
			a, d := acc.auth(t), dia.auth(t)
			l, got := serve(t, a)
			c, err := d.Dial(context.Background(), 0, l.Addr().String(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var in net.Conn
			select {
			case in = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("nothing accepted")
			}
			m, ok := MemberOf(in)
			if want := tc.secret != nil || tc.tls; ok != want || (ok && m != 1) {
				t.Fatalf("MemberOf = %d, %v; want 1, %v", m, ok, want)
			}
			echo(t, c, in)
			for _, x := range []*Auth{a, d} {
				for _, r := range x.Refusals() {
					if r.N != 0 {
						t.Errorf("refusal counted: %+v", r)
					}
				}
			}
		})
	}
}

// refusedCase is a pair of configurations that must not connect, with
// the reason each side counts.
type refusedCase struct {
	name           string
	acc, dia       side
	to             int // the member the dialer dials (default 0)
	accWhy, diaWhy Reason
}

// TestRefused: every way a member connection can fail the checks of
// §8.4 is refused by both ends, counted under its reason, and Accept
// never returns it.
func TestRefused(t *testing.T) {
	ca, mats := repltest.MemberTLS(t, hosts)
	_, otherMats := repltest.MemberTLS(t, hosts) // another CA
	// Member 1's certificate, issued by the right CA, naming no member.
	stray, err := ca.Issue("stray", "10.9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	strayMat := repltest.NewTLSMaterial(stray.TLS, ca.Pool())
	sec, sec2 := repltest.Secret(1), repltest.Secret(2)
	for _, tc := range []refusedCase{
		{name: "wrong secret", acc: side{secret: sec}, dia: side{self: 1, secret: sec2}, accWhy: ReasonPeer, diaWhy: ReasonSecret},
		{name: "dialer has no secret", acc: side{tls: mats[0], secret: sec}, dia: side{self: 1, tls: mats[1]}, accWhy: ReasonConfig, diaWhy: ReasonPeer},
		{name: "acceptor has no secret", acc: side{tls: mats[0]}, dia: side{self: 1, tls: mats[1], secret: sec}, accWhy: ReasonConfig, diaWhy: ReasonPeer},
		{name: "secret, other mode", acc: side{secret: sec}, dia: side{self: 1, secret: sec, mode: ModeRaft}, accWhy: ReasonConfig, diaWhy: ReasonPeer},
		{name: "dialled the wrong member", acc: side{secret: sec}, dia: side{self: 1, secret: sec}, to: 2, accWhy: ReasonConfig, diaWhy: ReasonPeer},
		{name: "certificate from another CA", acc: side{tls: mats[0]}, dia: side{self: 1, tls: repltest.NewTLSMaterial(*otherMats[1].Certificate(), ca.Pool())}, accWhy: ReasonTLS, diaWhy: ReasonPeer},
		{name: "acceptor's certificate from another CA", acc: side{tls: repltest.NewTLSMaterial(*otherMats[0].Certificate(), ca.Pool())}, dia: side{self: 1, tls: mats[1]}, accWhy: ReasonTLS, diaWhy: ReasonTLS},
		{name: "right CA, certificate names another host", acc: side{tls: mats[0], secret: sec}, dia: side{self: 1, tls: strayMat, secret: sec}, accWhy: ReasonName, diaWhy: ReasonPeer},
		{name: "right CA, claims to be another member", acc: side{tls: mats[0], secret: sec}, dia: side{self: 2, tls: mats[1], secret: sec}, accWhy: ReasonName, diaWhy: ReasonPeer},
		{name: "acceptor's certificate names another host", acc: side{tls: strayMat}, dia: side{self: 1, tls: mats[1]}, accWhy: ReasonTLS, diaWhy: ReasonName},
		{name: "plaintext peer on a TLS port", acc: side{tls: mats[0], secret: sec}, dia: side{self: 1, secret: sec}, accWhy: ReasonTLS, diaWhy: ReasonPeer},
		{name: "TLS peer on a plaintext port", acc: side{secret: sec}, dia: side{self: 1, tls: mats[1], secret: sec}, accWhy: ReasonHandshake, diaWhy: ReasonPeer},
	} {
		t.Run(tc.name, func(t *testing.T) { checkRefused(t, tc) })
	}
}

func checkRefused(t *testing.T, tc refusedCase) {
	t.Helper()
	a, d := tc.acc.auth(t), tc.dia.auth(t)
	l, got := serve(t, a)
	c, err := d.Dial(context.Background(), tc.to, l.Addr().String(), time.Second)
	if err == nil {
		c.Close()
		t.Fatal("the dial succeeded")
	}
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("dial error %v does not match ErrRefused", err)
	}
	wait.For(t, "the acceptor's refusal", func() bool { return total(a) == 1 })
	select {
	case c := <-got:
		c.Close()
		t.Fatal("Accept returned the refused connection")
	case <-time.After(50 * time.Millisecond):
	}
	if n := a.Refused(tc.accWhy); n != 1 {
		t.Errorf("acceptor: %v, want one %q", a.Refusals(), tc.accWhy)
	}
	t.Logf("dialer: %v", err)
	if n := d.Refused(tc.diaWhy); n != 1 || total(d) != 1 {
		t.Errorf("dialer (err %v): %v, want one %q", err, d.Refusals(), tc.diaWhy)
	}
}

func total(a *Auth) uint64 {
	var n uint64
	for _, r := range a.Refusals() {
		n += r.N
	}
	return n
}
