package memberauth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/repl"
)

// Defaults of Options.
const (
	// DefaultMaxPending bounds the connections on the member port that
	// have not finished the exchange.
	DefaultMaxPending = 32
	// DefaultHandshakeTimeout bounds the exchange (TLS handshake
	// included), on each side.
	DefaultHandshakeTimeout = 2 * time.Second
	// DefaultConnsPerMember is how many authenticated connections each
	// other member may hold at once when Options.MaxConns is 0.
	DefaultConnsPerMember = 16
)

// Options are the member port's bounds and the mode that the exchange
// binds. The zero value of a bound is its default.
type Options struct {
	// Mode is ModePriority or ModeRaft.
	Mode uint8
	// MaxPending: connections that have not finished the exchange, at
	// most; when one more arrives the oldest of them is closed (so a
	// flood cannot keep a real member out by holding every slot).
	MaxPending int
	// MaxConns: authenticated member connections open at once, at most;
	// one more is closed as it authenticates. Default
	// DefaultConnsPerMember per other member.
	MaxConns int
	// HandshakeTimeout bounds the whole exchange on each side.
	HandshakeTimeout time.Duration
}

// Reason is why a member connection was refused.
type Reason uint8

// Reasons, as the metric's label and Refusals name them.
const (
	// ReasonLimit: more connections than the member port allows
	// (Options.MaxPending, Options.MaxConns).
	ReasonLimit Reason = iota
	// ReasonHandshake: the exchange did not complete: bytes that are not
	// the exchange (another protocol, a TLS client on a plaintext port),
	// a truncated message, the deadline passed (a silent peer, a cut
	// link), a dialer that went away before its claim.
	ReasonHandshake
	// ReasonConfig: the peer's cluster parameters differ (mode, member
	// count, offset, failover timeout), it claims an index outside the
	// member list or this member's own, it dialled another member, or a
	// cluster secret is on at one end only.
	ReasonConfig
	// ReasonTLS: the TLS handshake failed (no certificate, one that does
	// not verify against the peer CAs, a plaintext peer on a TLS port).
	ReasonTLS
	// ReasonName: the peer's certificate does not name, as an IP or DNS
	// subject alternative name, the host of the --peers entry it claims
	// (the acceptor) or that was dialled (the dialer).
	ReasonName
	// ReasonSecret: the peer's MAC is wrong: it does not know the cluster
	// secret (or uses another one), or the exchange was relayed.
	ReasonSecret
	// ReasonPeer: the peer closed or reset this member's connection
	// during the exchange, TLS handshake included (it refused this member:
	// its log and metric say why).
	ReasonPeer
	numReasons
)

var reasonNames = [numReasons]string{"limit", "handshake", "config", "tls", "name", "secret", "peer"}

// String is the reason's label.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// refusal is a failed exchange: why, and what happened.
type refusal struct {
	reason Reason
	err    error
}

func (e *refusal) Error() string { return e.err.Error() }
func (e *refusal) Unwrap() error { return e.err }

func refuse(r Reason, err error) error { return &refusal{reason: r, err: err} }

func refusef(r Reason, format string, args ...any) error {
	return &refusal{reason: r, err: fmt.Errorf(format, args...)}
}

// ErrRefused matches every error of Dial that is a refusal of the
// exchange (errors.Is), as opposed to a connection that could not be made.
var ErrRefused = errors.New("memberauth: member connection refused")

func (e *refusal) Is(target error) bool { return target == ErrRefused }

// ReasonOf is the reason of a refusal that Dial returned; ok is false for
// an error that is no refusal (a connection that could not be made).
func ReasonOf(err error) (r Reason, ok bool) {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf.reason, true
	}
	return 0, false
}

// Auth is one member's side of the exchange: it dials members (Dial) and
// serves its member port (Listen), counting and logging every refusal.
// Safe for concurrent use.
type Auth struct {
	cfg    repl.ClusterConfig
	opt    Options
	params Params
	hosts  []string // the host of every --peers entry
	log    *slog.Logger

	refused [numReasons]atomic.Uint64
	logs    [2]ratelog.Shared // accept, dial: a line a second each
}

// New returns the exchange of cluster cfg (validated: cfg.Validate) in
// mode opt.Mode, logging to log.
func New(cfg repl.ClusterConfig, opt Options, log *slog.Logger) *Auth {
	if opt.MaxPending <= 0 {
		opt.MaxPending = DefaultMaxPending
	}
	if opt.MaxConns <= 0 {
		opt.MaxConns = DefaultConnsPerMember * max(len(cfg.Peers)-1, 1)
	}
	if opt.HandshakeTimeout <= 0 {
		opt.HandshakeTimeout = DefaultHandshakeTimeout
	}
	a := &Auth{cfg: cfg, opt: opt, log: log,
		params: Params{Mode: opt.Mode, Members: uint8(len(cfg.Peers)), PeerOffset: uint16(cfg.PeerOffset),
			FailoverMS: uint32(cfg.FailoverTimeout / time.Millisecond)}}
	for _, p := range cfg.Peers {
		host, _, _ := net.SplitHostPort(p)
		a.hosts = append(a.hosts, host)
	}
	return a
}

// On reports whether the exchange runs (TLS, a secret, or both). Off, Dial
// and Listen move bytes as plain TCP does; Listen still bounds the count.
func (a *Auth) On() bool { return a.cfg.AuthOn() }

// Refusals counts the refused connections by reason, every reason listed.
func (a *Auth) Refusals() []repl.Refusal {
	out := make([]repl.Refusal, numReasons)
	for r := range numReasons {
		out[r] = repl.Refusal{Reason: r.String(), N: a.refused[r].Load()}
	}
	return out
}

// Refused is the count of one reason.
func (a *Auth) Refused(r Reason) uint64 { return a.refused[r].Load() }

// Sides of a refusal, for the log.
const (
	sideAccept = 0
	sideDial   = 1
)

// note counts a refusal and logs it, at most once a second per side
// (the line says how many it stands for).
func (a *Auth) note(side int, remote net.Addr, member int, err error) {
	r := ReasonHandshake
	var rf *refusal
	if errors.As(err, &rf) {
		r = rf.reason
	}
	a.refused[r].Add(1)
	held, ok := a.logs[side].Allow(time.Now().UnixNano())
	if !ok {
		return
	}
	n := held + 1 // the refusals this line stands for
	args := []any{"reason", r.String(), "err", err.Error()}
	if remote != nil {
		args = append(args, "remote", remote.String())
	}
	if member >= 0 && member < len(a.cfg.Peers) {
		args = append(args, "peer", a.cfg.Peers[member])
	}
	if n > 1 {
		args = append(args, "refusals_since_last_line", n)
	}
	if side == sideDial {
		a.log.Warn("member link: outbound connection refused", args...)
	} else {
		a.log.Warn("member link: inbound connection refused", args...)
	}
}

// Dial connects to member to at addr (its member port as this member
// dials it): TCP within timeout, then, when On, the exchange within
// Options.HandshakeTimeout. ctx cancels both. A refusal is counted,
// logged and returned (errors.Is(err, ErrRefused)); the connection is
// closed.
func (a *Auth) Dial(ctx context.Context, to int, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || !a.On() {
		return raw, err
	}
	c, err := a.dialExchange(ctx, raw, to)
	if err != nil {
		raw.Close()
		if ctx.Err() == nil {
			a.note(sideDial, raw.RemoteAddr(), to, err)
		}
		return nil, err
	}
	return c, nil
}

// abortOn makes c's blocked I/O fail at once when ctx ends; stop undoes it.
func abortOn(ctx context.Context, c net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
}

// dialExchange is the dialer's side of the exchange on raw.
func (a *Auth) dialExchange(ctx context.Context, raw net.Conn, to int) (net.Conn, error) {
	if to < 0 || to >= len(a.cfg.Peers) || to == a.cfg.Self {
		return nil, refusef(ReasonConfig, "no member %d to dial", to)
	}
	_ = raw.SetDeadline(time.Now().Add(a.opt.HandshakeTimeout))
	defer abortOn(ctx, raw)()
	var c net.Conn = raw
	var t transcript
	if m := a.cfg.MemberTLS; m != nil {
		tc := tls.Client(raw, a.clientTLS(to))
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, tlsRefusal(err, true)
		}
		if err := bind(tc, &t); err != nil {
			return nil, err
		}
		c = tc
	}
	secret := len(a.cfg.Secret) > 0
	cl := claim{Secret: secret, Params: a.params, From: uint8(a.cfg.Self), To: uint8(to)}
	if _, err := rand.Read(cl.Nonce[:]); err != nil {
		return nil, err
	}
	appendClaim(t.claim[:0], &cl)
	if _, err := c.Write(t.claim[:]); err != nil {
		return nil, peerRefusal("sending the claim", err)
	}
	var buf [challengeLen]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		return nil, peerRefusal("waiting for the challenge", err)
	}
	var ch challenge
	if err := decodeChallenge(buf[:], &ch); err != nil {
		return nil, refuse(ReasonHandshake, err)
	}
	switch {
	case int(ch.Self) != to:
		return nil, refusef(ReasonConfig, "the member dialled as %d says it is member %d", to, ch.Self)
	case ch.Secret != secret:
		return nil, secretMismatch(ch.Secret)
	}
	copy(t.challenge[:], buf[:challengeLen-macLen])
	var mine [macLen]byte
	if secret {
		want := t.mac(a.cfg.Secret, labelAcceptor)
		if !hmac.Equal(ch.MAC[:], want[:]) {
			return nil, refusef(ReasonSecret, "the member's proof of the cluster secret is wrong (another secret, or a relayed exchange)")
		}
		mine = t.mac(a.cfg.Secret, labelDialer)
	}
	out := appendResponse(buf[:0], &mine)
	if _, err := c.Write(out); err != nil {
		return nil, peerRefusal("sending the response", err)
	}
	if _, err := io.ReadFull(c, buf[:welcomeLen]); err != nil {
		return nil, peerRefusal("waiting for the welcome", err)
	}
	if err := decodeWelcome(buf[:welcomeLen]); err != nil {
		return nil, refuse(ReasonHandshake, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

// acceptExchange is the acceptor's side of the exchange on raw, whose
// deadline the caller set. It returns the connection to use and the
// member the peer proved to be (-1 when it is not known).
func (a *Auth) acceptExchange(raw net.Conn) (net.Conn, int, error) {
	var c net.Conn = raw
	var t transcript
	var leaf *x509.Certificate
	if a.cfg.MemberTLS != nil {
		tc := tls.Server(raw, a.serverTLS())
		if err := tc.Handshake(); err != nil {
			return nil, -1, tlsRefusal(err, false)
		}
		cs := tc.ConnectionState()
		if len(cs.PeerCertificates) == 0 {
			return nil, -1, refusef(ReasonTLS, "no client certificate")
		}
		leaf = cs.PeerCertificates[0]
		if err := bind(tc, &t); err != nil {
			return nil, -1, err
		}
		c = tc
	}
	// The claim is read first and checked before anything else is read.
	if _, err := io.ReadFull(c, t.claim[:]); err != nil {
		return nil, -1, refuse(ReasonHandshake, fmt.Errorf("reading the claim: %w", err))
	}
	var cl claim
	if err := decodeClaim(t.claim[:], &cl); err != nil {
		if errors.Is(err, errMagic) && t.claim[0] == 0x16 {
			err = fmt.Errorf("%w (a TLS client on a plaintext member port?)", err)
		}
		return nil, -1, refuse(ReasonHandshake, err)
	}
	from := int(cl.From)
	if err := a.checkClaim(&cl); err != nil {
		return nil, -1, err
	}
	if leaf != nil {
		if err := leaf.VerifyHostname(a.hosts[from]); err != nil {
			return nil, from, refusef(ReasonName, "its certificate does not name %s, the host of the member it claims to be: %v", a.hosts[from], err)
		}
	}
	secret := len(a.cfg.Secret) > 0
	ch := challenge{Secret: secret, Self: uint8(a.cfg.Self)}
	if _, err := rand.Read(ch.Nonce[:]); err != nil {
		return nil, from, err
	}
	appendChallenge(t.challenge[:0], &ch)
	if secret {
		ch.MAC = t.mac(a.cfg.Secret, labelAcceptor)
	}
	var buf [challengeLen]byte
	if _, err := c.Write(appendChallenge(buf[:0], &ch)); err != nil {
		return nil, from, refuse(ReasonHandshake, fmt.Errorf("sending the challenge: %w", err))
	}
	if _, err := io.ReadFull(c, buf[:responseLen]); err != nil {
		// A dialer that found the challenge wrong closes without a
		// response: it never proves itself to a peer that did not.
		return nil, from, peerRefusal("before its response", err)
	}
	var mac [macLen]byte
	if err := decodeResponse(buf[:responseLen], &mac); err != nil {
		return nil, from, refuse(ReasonHandshake, err)
	}
	if secret {
		want := t.mac(a.cfg.Secret, labelDialer)
		if !hmac.Equal(mac[:], want[:]) {
			return nil, from, refusef(ReasonSecret, "its proof of the cluster secret is wrong (another secret, or a relayed exchange)")
		}
	}
	if _, err := c.Write(appendWelcome(buf[:0])); err != nil {
		return nil, from, refuse(ReasonHandshake, fmt.Errorf("sending the welcome: %w", err))
	}
	return c, from, nil
}

// checkClaim checks a claim against this member's configuration, naming
// everything that differs.
func (a *Auth) checkClaim(cl *claim) error {
	var b strings.Builder
	diff := func(format string, args ...any) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, format, args...)
	}
	p, mine := cl.Params, a.params
	if p.Mode != mine.Mode {
		diff("mode %s (here %s)", modeName(p.Mode), modeName(mine.Mode))
	}
	if p.Members != mine.Members {
		diff("%d members (here %d)", p.Members, mine.Members)
	}
	if p.PeerOffset != mine.PeerOffset {
		diff("peer offset %d (here %d)", p.PeerOffset, mine.PeerOffset)
	}
	if p.FailoverMS != mine.FailoverMS {
		diff("failover timeout %dms (here %dms)", p.FailoverMS, mine.FailoverMS)
	}
	switch {
	case int(cl.From) >= len(a.cfg.Peers):
		diff("it claims member index %d, outside the %d members", cl.From, len(a.cfg.Peers))
	case int(cl.From) == a.cfg.Self:
		diff("it claims this member's own index %d", cl.From)
	}
	if int(cl.To) != a.cfg.Self {
		diff("it dialled member %d (this is member %d)", cl.To, a.cfg.Self)
	}
	if secret := len(a.cfg.Secret) > 0; cl.Secret != secret {
		diff("%v", secretMismatch(cl.Secret))
	}
	if b.Len() == 0 {
		return nil
	}
	return refusef(ReasonConfig, "the peer's configuration differs: %s", b.String())
}

func modeName(m uint8) string {
	switch m {
	case ModePriority:
		return "priority"
	case ModeRaft:
		return "raft"
	}
	return fmt.Sprintf("mode(%d)", m)
}

// secretMismatch: a cluster secret at one end only.
func secretMismatch(peerHas bool) error {
	if peerHas {
		return refusef(ReasonConfig, "the peer uses a cluster secret, this member none")
	}
	return refusef(ReasonConfig, "the peer uses no cluster secret, this member does")
}

// peerRefusal is an I/O error of the dialer while the acceptor had its
// turn: a closed connection means the acceptor refused this member, a
// deadline that it did not answer in time.
func peerRefusal(what string, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return refuse(ReasonHandshake, fmt.Errorf("%s: %w", what, err))
	}
	return refuse(ReasonPeer, fmt.Errorf("the peer closed the connection %s (it refused this member: see its log): %w", what, err))
}

// tlsRefusal classifies a failed TLS handshake: a deadline that passed
// (a silent peer, a cut link) is ReasonHandshake, a connection the peer
// closed or reset is ReasonPeer for the dialer (the acceptor refused it)
// and ReasonHandshake for the acceptor, a certificate that does not name
// the host ReasonName, the rest (no certificate, another CA, a plaintext
// peer, an alert) ReasonTLS.
func tlsRefusal(err error, dialer bool) error {
	var he x509.HostnameError
	var ne net.Error
	switch {
	case errors.As(err, &he):
		return refuse(ReasonName, fmt.Errorf("TLS: %w", err))
	case errors.As(err, &ne) && ne.Timeout():
		return refuse(ReasonHandshake, fmt.Errorf("TLS: %w", err))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		if dialer {
			return refuse(ReasonPeer, fmt.Errorf("TLS: the peer closed the connection (it refused this member: see its log): %w", err))
		}
		return refuse(ReasonHandshake, fmt.Errorf("TLS: %w", err))
	}
	return refuse(ReasonTLS, fmt.Errorf("TLS: %w", err))
}

// bind puts the TLS session's exporter into t (the channel binding).
func bind(tc *tls.Conn, t *transcript) error {
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(exporterLabel, nil, bindingLen)
	if err != nil {
		return refuse(ReasonTLS, fmt.Errorf("TLS exporter: %w", err))
	}
	copy(t.binding[:], b)
	return nil
}

// clientTLS is the dialer's TLS configuration for member to: the current
// certificate and peer CAs, the dialled host as the name to verify.
func (a *Auth) clientTLS(to int) *tls.Config {
	m := a.cfg.MemberTLS
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: a.hosts[to],
		RootCAs:    m.PeerCAs(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return m.Certificate(), nil
		},
	}
}

// serverTLS is the acceptor's TLS configuration: the current certificate,
// a client certificate required and verified against the current peer
// CAs. No session tickets: every connection verifies a full chain.
func (a *Auth) serverTLS() *tls.Config {
	m := a.cfg.MemberTLS
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return m.Certificate(), nil
		},
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              m.PeerCAs(),
		SessionTicketsDisabled: true,
	}
}
