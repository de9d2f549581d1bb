package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/lockd-dev/lockd/proto"
)

// Secret is an identity's secret (PROTOCOL.md §8.2). It prints as
// "[redacted]" with every fmt verb (%v, %+v, %#v, %s, %q, %x, %d …), as
// a field of a printed Config too, and marshals to JSON as "[redacted]":
// the secret reaches the server's hello and nothing else. string(s) is
// the secret itself.
type Secret string

const redacted = "[redacted]"

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return strconv.Quote(redacted) }

// Format implements fmt.Formatter: every verb prints "[redacted]"; an
// empty Secret prints as "" so a printed Config shows whether one is set.
func (s Secret) Format(f fmt.State, verb rune) {
	if s == "" {
		if verb == 'q' || verb == 'v' && f.Flag('#') {
			_, _ = f.Write([]byte(`""`))
		}
		return
	}
	_, _ = f.Write([]byte(redacted))
}

// MarshalJSON implements json.Marshaler: "[redacted]", or "" when empty.
func (s Secret) MarshalJSON() ([]byte, error) {
	if s == "" {
		return []byte(`""`), nil
	}
	return json.Marshal(redacted)
}

// MaxIdentity is the longest identity, in bytes (PROTOCOL.md §8.2).
const MaxIdentity = 64

// validIdentity reports whether id is 1..64 bytes of A–Z a–z 0–9 . _ @ -
// (PROTOCOL.md §8.2).
func validIdentity(id string) bool {
	if len(id) == 0 || len(id) > MaxIdentity {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// validSecret reports whether s fits a hello: 1..256 bytes, no 0x0A.
func validSecret(s Secret) bool {
	return len(s) > 0 && len(s) <= proto.MaxSecret && !bytes.ContainsRune([]byte(s), '\n')
}

// TrimSecret removes one trailing newline ("\n" or "\r\n") from b, and
// nothing else: what a secret file written by `echo` or an editor ends
// with. Spaces are part of a secret (PROTOCOL.md §8.3). LoadSecret and
// lockctl (`--secret-file`, `acl hash`) use it, so a secret hashed into
// the ACL file and one sent by the client agree.
func TrimSecret(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// LoadSecret reads a secret from the file at path: its whole content
// less one trailing newline (TrimSecret). It must be 1..256 bytes without
// another newline. The error names the file, never its content.
func LoadSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := Secret(TrimSecret(b))
	if !validSecret(s) {
		return "", &FieldError{Field: "Secret", Value: path, Want: "a secret of 1..256 bytes on one line (one trailing newline is removed)"}
	}
	return s, nil
}

// FieldError is a bad setting: Field names it (a Config or TLSFiles
// field), Value is what was given (a file name, never a secret), Want
// says what is accepted.
type FieldError struct {
	Field string
	Value string
	Want  string
}

// Error implements error.
func (e *FieldError) Error() string {
	if e.Value == "" {
		return "client: " + e.Field + ": " + e.Want
	}
	return "client: " + e.Field + " " + strconv.Quote(e.Value) + ": " + e.Want
}

// authError is an E 5 (unauthenticated) or E 6 (permission denied):
// definitive, not executed, not retried. It matches ErrUnauthenticated or
// ErrPermissionDenied.
type authError struct {
	code     uint8    // proto.CodeUnauthenticated or proto.CodePermissionDenied
	op       proto.Op // the op the server refused: OpHello for a failed hello
	key      string   // the request's key (E 6)
	identity string   // Config.Identity, "" when none
	certCN   string   // the client certificate's Common Name, "" when none
	addr     string   // the server that answered
	msg      string   // the server's message
}

func (e *authError) Error() string {
	srv := "lockd at " + e.addr
	if e.addr == "" {
		srv = "lockd"
	}
	said := " (E " + strconv.Itoa(int(e.code)) + " to " + e.op.String()
	if e.msg != "" {
		said += ": " + e.msg
	}
	said += "); not executed"
	// Without a hello, the identity in force is the client certificate's
	// Common Name, the one the server logs.
	who := "identity " + strconv.Quote(e.identity)
	if e.identity == "" && e.certCN != "" {
		who = "identity " + strconv.Quote(e.certCN) + " (its client certificate's name)"
	}
	switch {
	case e.code == proto.CodePermissionDenied:
		return "client: permission denied: " + srv + " does not let " + who + " lock key " + strconv.Quote(e.key) + said
	case e.op == proto.OpHello:
		return "client: unauthenticated: " + srv + " refused the hello of identity " + strconv.Quote(e.identity) + ": unknown identity or wrong secret" + said
	case e.identity == "" && e.certCN != "":
		return "client: unauthenticated: " + srv + " requires an identity, and its client certificate's name " + strconv.Quote(e.certCN) + " is none of its identities (give an identity and its secret)" + said
	case e.identity == "":
		return "client: unauthenticated: " + srv + " requires an identity, and none was given (an identity and its secret, or a client certificate whose name is one)" + said
	}
	return "client: unauthenticated: " + srv + " no longer accepts " + who + said
}

func (e *authError) Is(target error) bool {
	if e.code == proto.CodePermissionDenied {
		return target == ErrPermissionDenied
	}
	return target == ErrUnauthenticated
}

// authErr is the error of t's request answered E 5 or E 6.
func (t *Ticket) authErr() error {
	return &authError{code: t.rcode, op: t.op, key: t.key, identity: t.cl.cfg.Identity, certCN: t.cl.certCN, addr: t.from, msg: t.rtail}
}

// isAuthCode reports whether an E code is 5 or 6.
func isAuthCode(code uint8) bool {
	return code == proto.CodeUnauthenticated || code == proto.CodePermissionDenied
}

// refusedError: the server refused the connection before answering
// anything, and said so: a TLS alert after the client's side of the
// handshake had completed (err: TLS 1.3 rejects a client certificate that
// way), or an E 1 as its first frame (msg: what a TLS port answers a
// plaintext client). Nothing sent on that connection was executed.
type refusedError struct {
	addr  string
	err   error  // the TLS alert
	msg   string // the E 1's message
	plain bool   // the client does not speak TLS
}

func (e *refusedError) Error() string {
	if e.err == nil {
		return "lockd at " + e.addr + " refused the connection before answering anything: " + strconv.Quote(e.msg) + " (E 1)"
	}
	return "lockd at " + e.addr + " refused the TLS connection: " + e.err.Error() + " (a client certificate it does not accept, or none where it requires one)"
}

func (e *refusedError) Unwrap() error { return e.err }

// Is matches ErrTLS for a TLS alert, and for an E 1 that a server sent a
// client without TLS naming TLS (lockd's TLS port).
func (e *refusedError) Is(target error) bool {
	return target == ErrTLS && (e.err != nil || e.plain && strings.Contains(e.msg, "TLS"))
}

// handshakeError is a TLS handshake that failed at the dial.
type handshakeError struct {
	addr string
	err  error
}

func (e *handshakeError) Error() string {
	return "TLS handshake with " + e.addr + " failed: " + e.err.Error()
}

func (e *handshakeError) Unwrap() error { return e.err }

// Is matches ErrTLS.
func (e *handshakeError) Is(target error) bool { return target == ErrTLS }

// errHelloAnswer: the server answered the hello with an E other than 5.
var errHelloAnswer = errors.New("client: server answered the hello with an unexpected error")
