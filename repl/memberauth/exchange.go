package memberauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The exchange's four messages (docs/MEMBER-LINK.md, "Authentication"),
// every one fixed-size, integers big-endian, each starting with
//
//	magic "LKMA" (4) | version u8 (= 1) | kind u8
//
// claim     dialer → acceptor  49 bytes: … | flags u8 | mode u8 | members u8 | from u8 | to u8 | offset u16 | failover_ms u32 | nonce [32]
// challenge acceptor → dialer  72 bytes: … | flags u8 | self u8 | nonce [32] | mac [32]
// response  dialer → acceptor  38 bytes: … | mac [32]
// welcome   acceptor → dialer   6 bytes: (the header alone)
//
// The MACs are HMAC-SHA256 keyed with the cluster secret over
//
//	label | 0x00 | claim (49) | challenge without its mac (40) | binding (32)
//
// with label "lockd member-link acceptor v1" for the challenge's and
// "lockd member-link dialer v1" for the response's, and binding the TLS
// exporter (ExportKeyingMaterial with exporterLabel, no context, 32
// bytes) or 32 zero bytes without TLS. Without a secret the nonces are
// still random, the MACs are zero and not checked.

// Sizes and constants of the exchange.
const (
	version = 1

	kindClaim     = 1
	kindChallenge = 2
	kindResponse  = 3
	kindWelcome   = 4

	headLen      = 6
	nonceLen     = 32
	macLen       = sha256.Size
	bindingLen   = 32
	claimLen     = headLen + 5 + 2 + 4 + nonceLen  // 49
	challengeLen = headLen + 2 + nonceLen + macLen // 72
	responseLen  = headLen + macLen                // 38
	welcomeLen   = headLen                         // 6

	// flagSecret: the sender uses a cluster secret.
	flagSecret = 1

	// exporterLabel is the TLS exporter label of the channel binding
	// (RFC 8446 §7.5; RFC 5705).
	exporterLabel = "EXPORTER-lockd-member-link"

	labelAcceptor = "lockd member-link acceptor v1"
	labelDialer   = "lockd member-link dialer v1"
)

// magic opens every message.
var magic = [4]byte{'L', 'K', 'M', 'A'}

// Errors of the messages' decoding, all of reason handshake.
var (
	// errMagic: the bytes are not a message of this exchange (another
	// protocol: a TLS client on a plaintext port, an old lockd, a scanner).
	errMagic = errors.New("memberauth: not a member-link authentication message")
	// errVersion: the peer speaks another version of the exchange.
	errVersion = errors.New("memberauth: another version of the member-link authentication")
	// errKind: the message is not the one expected at this step.
	errKind = errors.New("memberauth: unexpected message at this step")
	// errFlags: flag bits this version does not define are set.
	errFlags = errors.New("memberauth: unknown flags")
)

// Params are the cluster's parameters that both ends must share: the
// claim carries the dialer's, the acceptor refuses a claim whose differ
// from its own, and the MACs cover them (they are in the claim).
type Params struct {
	Mode       uint8  // 1 priority, 2 raft (ModePriority, ModeRaft)
	Members    uint8  // entries of --peers
	PeerOffset uint16 // --peer-offset
	FailoverMS uint32 // --failover-timeout in milliseconds
}

// Cluster modes as Params.Mode carries them.
const (
	ModePriority = 1
	ModeRaft     = 2
)

// claim is the dialer's first message: who it is, whom it dialled, its
// cluster's parameters and its nonce.
type claim struct {
	Secret   bool // flagSecret
	Params   Params
	From, To uint8
	Nonce    [nonceLen]byte
}

// challenge is the acceptor's answer: who it is, its nonce and its MAC.
type challenge struct {
	Secret bool
	Self   uint8
	Nonce  [nonceLen]byte
	MAC    [macLen]byte
}

// appendHead appends a message header of kind k.
func appendHead(dst []byte, k byte) []byte {
	return append(append(dst, magic[:]...), version, k)
}

// checkHead checks that p starts with the header of kind k. The magic is
// checked before the version and the version before the kind, so a peer
// of another protocol or version is told apart from a confused one.
func checkHead(p []byte, k byte) error {
	switch {
	case len(p) < headLen:
		return errKind
	case [4]byte(p[:4]) != magic:
		return errMagic
	case p[4] != version:
		return fmt.Errorf("%w: version %d, here %d", errVersion, p[4], version)
	case p[5] != k:
		return fmt.Errorf("%w: kind %d, want %d", errKind, p[5], k)
	}
	return nil
}

func flagsOf(secret bool) byte {
	if secret {
		return flagSecret
	}
	return 0
}

// appendClaim appends c's 49 bytes to dst.
func appendClaim(dst []byte, c *claim) []byte {
	dst = appendHead(dst, kindClaim)
	dst = append(dst, flagsOf(c.Secret), c.Params.Mode, c.Params.Members, c.From, c.To)
	dst = binary.BigEndian.AppendUint16(dst, c.Params.PeerOffset)
	dst = binary.BigEndian.AppendUint32(dst, c.Params.FailoverMS)
	return append(dst, c.Nonce[:]...)
}

// decodeClaim decodes a claim from exactly claimLen bytes.
func decodeClaim(p []byte, c *claim) error {
	if err := checkHead(p, kindClaim); err != nil {
		return err
	}
	if len(p) != claimLen {
		return errKind
	}
	if p[6]&^flagSecret != 0 {
		return errFlags
	}
	*c = claim{
		Secret: p[6]&flagSecret != 0,
		Params: Params{Mode: p[7], Members: p[8], PeerOffset: binary.BigEndian.Uint16(p[11:]), FailoverMS: binary.BigEndian.Uint32(p[13:])},
		From:   p[9],
		To:     p[10],
	}
	copy(c.Nonce[:], p[17:])
	return nil
}

// appendChallenge appends ch's 72 bytes to dst.
func appendChallenge(dst []byte, ch *challenge) []byte {
	dst = appendHead(dst, kindChallenge)
	dst = append(dst, flagsOf(ch.Secret), ch.Self)
	dst = append(dst, ch.Nonce[:]...)
	return append(dst, ch.MAC[:]...)
}

// decodeChallenge decodes a challenge from exactly challengeLen bytes.
func decodeChallenge(p []byte, ch *challenge) error {
	if err := checkHead(p, kindChallenge); err != nil {
		return err
	}
	if len(p) != challengeLen {
		return errKind
	}
	if p[6]&^flagSecret != 0 {
		return errFlags
	}
	*ch = challenge{Secret: p[6]&flagSecret != 0, Self: p[7]}
	copy(ch.Nonce[:], p[8:])
	copy(ch.MAC[:], p[8+nonceLen:])
	return nil
}

// appendResponse appends a response carrying mac to dst.
func appendResponse(dst []byte, mac *[macLen]byte) []byte {
	return append(appendHead(dst, kindResponse), mac[:]...)
}

// decodeResponse decodes a response from exactly responseLen bytes.
func decodeResponse(p []byte, mac *[macLen]byte) error {
	if err := checkHead(p, kindResponse); err != nil {
		return err
	}
	if len(p) != responseLen {
		return errKind
	}
	copy(mac[:], p[headLen:])
	return nil
}

// appendWelcome appends the welcome to dst.
func appendWelcome(dst []byte) []byte { return appendHead(dst, kindWelcome) }

// decodeWelcome checks a welcome of exactly welcomeLen bytes.
func decodeWelcome(p []byte) error {
	if err := checkHead(p, kindWelcome); err != nil {
		return err
	}
	if len(p) != welcomeLen {
		return errKind
	}
	return nil
}

// transcript is what both MACs cover: the claim, the challenge up to its
// MAC, and the channel binding.
type transcript struct {
	claim     [claimLen]byte
	challenge [challengeLen - macLen]byte
	binding   [bindingLen]byte
}

// mac computes the MAC of label over t with secret.
func (t *transcript) mac(secret []byte, label string) [macLen]byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(t.claim[:])
	h.Write(t.challenge[:])
	h.Write(t.binding[:])
	var out [macLen]byte
	h.Sum(out[:0])
	return out
}
