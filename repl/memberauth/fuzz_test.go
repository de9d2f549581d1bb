package memberauth

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/repl/internal/repltest"
)

// seedClaim is a valid claim from member 1 to member 0 of a priority
// cluster of three (fixed nonce, so the corpus is stable).
func seedClaim(secret bool) []byte {
	c := claim{Secret: secret, Params: Params{Mode: ModePriority, Members: 3, PeerOffset: 10000, FailoverMS: 1000}, From: 1, To: 0}
	for i := range c.Nonce {
		c.Nonce[i] = byte(i)
	}
	return appendClaim(nil, &c)
}

func authSeeds() repltest.Seeds {
	var seeds repltest.Seeds
	add := seeds.Add
	claimSecret := seedClaim(true)
	ch := challenge{Secret: true, Self: 0}
	var mac [macLen]byte
	for i := range mac {
		mac[i] = 0xa5
	}
	add("FuzzMessages", "claim", claimSecret)
	add("FuzzMessages", "claim-no-secret", seedClaim(false))
	add("FuzzMessages", "challenge", appendChallenge(nil, &ch))
	add("FuzzMessages", "response", appendResponse(nil, &mac))
	add("FuzzMessages", "welcome", appendWelcome(nil))
	add("FuzzMessages", "bad-flags", append(append([]byte{}, claimSecret[:6]...), 0x82))
	add("FuzzMessages", "other-version", []byte("LKMA\x02\x01"))
	// What the acceptor may be sent: a claim and a response (a guess at the
	// MAC), a claim alone, the start of a TLS ClientHello, a priority
	// Hello frame, a claim for another mode, junk, nothing.
	add("FuzzAccept", "claim-response", append(append([]byte{}, claimSecret...), appendResponse(nil, &mac)...))
	add("FuzzAccept", "claim-only", claimSecret)
	add("FuzzAccept", "tls-client-hello", stalledHello[:64])
	add("FuzzAccept", "priority-hello", []byte{0, 0, 0, 0x16, 1, 0, 1, 1, 3, 1, 0, 0, 0x27, 0x10, 0, 0, 0, 8, 0, 0, 3, 0xe8, 0xde, 0xad, 0xbe, 0xef})
	raft := seedClaim(true)
	raft[7] = ModeRaft
	add("FuzzAccept", "claim-other-mode", raft)
	add("FuzzAccept", "junk", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	add("FuzzAccept", "empty", []byte{})
	return seeds
}

// TestFuzzCorpus: the seed corpus under testdata/fuzz holds every seed
// above as it is built now (go test -run TestFuzzCorpus -write-corpus
// rewrites it).
func TestFuzzCorpus(t *testing.T) { repltest.CheckCorpus(t, authSeeds()) }

// FuzzMessages: every decoder either rejects its input or decodes a
// message that re-encodes to exactly the bytes it was read from; none
// panics.
func FuzzMessages(f *testing.F) {
	for _, s := range authSeeds() {
		if s.Target == "FuzzMessages" {
			f.Add(s.Args[0].([]byte))
		}
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var c claim
		if decodeClaim(p, &c) == nil && !bytes.Equal(appendClaim(nil, &c), p) {
			t.Fatalf("claim %x re-encodes differently", p)
		}
		var ch challenge
		if decodeChallenge(p, &ch) == nil && !bytes.Equal(appendChallenge(nil, &ch), p) {
			t.Fatalf("challenge %x re-encodes differently", p)
		}
		var mac [macLen]byte
		if decodeResponse(p, &mac) == nil && !bytes.Equal(appendResponse(nil, &mac), p) {
			t.Fatalf("response %x re-encodes differently", p)
		}
		if decodeWelcome(p) == nil && !bytes.Equal(appendWelcome(nil), p) {
			t.Fatalf("welcome %x re-encodes differently", p)
		}
	})
}

// fakeConn reads from in and discards what is written; deadlines are
// ignored (in ends).
type fakeConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *fakeConn) Read(p []byte) (int, error)       { return c.in.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *fakeConn) Close() error                     { return nil }
func (c *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// consumed is how many bytes the acceptor read.
func (c *fakeConn) consumed() int { return int(c.in.Size()) - c.in.Len() }

// FuzzAccept: whatever a peer sends, the acceptor (a secret, no TLS)
// never panics, never reads past the claim before it has answered it,
// never more than a claim and a response in all, and never accepts: the
// MAC it would need covers a nonce the acceptor draws afresh.
func FuzzAccept(f *testing.F) {
	for _, s := range authSeeds() {
		if s.Target == "FuzzAccept" {
			f.Add(s.Args[0].([]byte))
		}
	}
	a := side{secret: repltest.Secret(1)}.auth(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		c := &fakeConn{in: bytes.NewReader(p)}
		_, _, err := a.acceptExchange(c)
		if err == nil {
			t.Fatalf("accepted %x", p)
		}
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("error %v is not a refusal", err)
		}
		if c.consumed() > claimLen+responseLen {
			t.Fatalf("read %d bytes", c.consumed())
		}
		if c.out.Len() > 0 && c.consumed() < claimLen {
			t.Fatalf("answered before a whole claim was read")
		}
	})
}
