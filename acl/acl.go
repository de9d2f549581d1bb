package acl

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"unicode/utf8"
)

// Role is what an identity may do (PROTOCOL.md §8.2).
type Role uint8

// Roles.
const (
	// RoleClient makes lock requests on its keys.
	RoleClient Role = iota + 1
	// RoleMonitor reads the admin endpoint and makes no lock request.
	RoleMonitor
	// RoleAdmin makes lock requests on its keys, uses the whole admin
	// endpoint, and may release or renew any identity's grant on its keys
	// (a forced release).
	RoleAdmin
)

// String returns the role's name as the file spells it.
func (r Role) String() string {
	switch r {
	case RoleClient:
		return "client"
	case RoleMonitor:
		return "monitor"
	case RoleAdmin:
		return "admin"
	}
	return "Role(" + strconv.Itoa(int(r)) + ")"
}

// Limits of the file's fields.
const (
	// MaxName is the longest identity, in bytes.
	MaxName = 64
	// MaxPrefix is the longest key prefix, in bytes: the protocol's
	// longest key (a longer prefix would match nothing).
	MaxPrefix = 1024
	// MaxLine is the longest line the parser reads, in bytes.
	MaxLine = 1 << 20
)

// Identity is one line of the file: a name, how it authenticates, the keys
// it reaches and its role. It never holds a secret, only the secret's
// SHA-256.
type Identity struct {
	// Name is the identity, 1..MaxName bytes of A–Z a–z 0–9 . _ @ -.
	Name string
	// Role is what the identity may do.
	Role Role

	index    int      // position among the file's identities
	certOnly bool     // "cert": authenticates only by client certificate
	digest   [32]byte // SHA-256 of the secret (certOnly: unused)
	all      bool     // "*": every key
	prefixes []prefix // the key prefixes ("-": none)
}

// prefix is a key prefix with its first 8 bytes (or fewer) as a word, so
// that Allows compares most prefixes with one AND and one comparison
// instead of a call to the runtime's memequal per prefix.
type prefix struct {
	b    []byte
	head uint64 // b[:min(8, len(b))], little-endian
	mask uint64 // covers the bytes of head
}

func newPrefix(b []byte) prefix {
	p := prefix{b: b}
	for i := 0; i < len(b) && i < 8; i++ {
		p.head |= uint64(b[i]) << (8 * i)
		p.mask |= 0xff << (8 * i)
	}
	return p
}

// Index is the identity's position among the file's identities (0, 1, …),
// for callers that keep a table beside the ACL.
func (id *Identity) Index() int { return id.index }

// CertOnly reports whether the identity authenticates only with a client
// certificate whose Common Name is its name (secret "cert").
func (id *Identity) CertOnly() bool { return id.certOnly }

// MayLock reports whether the identity may make lock requests (A, R, K,
// and S, PROTOCOL.md §9.1): every role but monitor. Validate, watch and
// inspect (V, W, I) need no more than an identity of any role whose
// prefixes allow the key (Allows): a resource server that only checks
// tokens gets a monitor identity.
func (id *Identity) MayLock() bool { return id.Role == RoleClient || id.Role == RoleAdmin }

// Allows reports whether key starts with one of the identity's prefixes
// (byte comparison; "*" allows every key, "-" none). It never allocates.
// Its cost is linear in the number of prefixes.
func (id *Identity) Allows(key []byte) bool {
	if id.all {
		return true
	}
	var w uint64 // the key's first 8 bytes, little-endian
	if len(key) >= 8 {
		w = binary.LittleEndian.Uint64(key)
	} else {
		for i, c := range key {
			w |= uint64(c) << (8 * i)
		}
	}
	for i := range id.prefixes {
		p := &id.prefixes[i]
		if len(key) >= len(p.b) && w&p.mask == p.head && (len(p.b) <= 8 || string(key[8:len(p.b)]) == string(p.b[8:])) {
			return true
		}
	}
	return false
}

// Prefixes returns the identity's key prefixes as the file writes them:
// "*" for every key, "-" for none, else the comma-separated list.
func (id *Identity) Prefixes() string {
	switch {
	case id.all:
		return "*"
	case len(id.prefixes) == 0:
		return "-"
	}
	list := make([][]byte, len(id.prefixes))
	for i, p := range id.prefixes {
		list[i] = p.b
	}
	return string(bytes.Join(list, []byte(",")))
}

// String describes the identity without its digest.
func (id *Identity) String() string {
	auth := "sha256"
	if id.certOnly {
		auth = "cert"
	}
	return id.Name + " (" + id.Role.String() + ", " + auth + ", keys " + id.Prefixes() + ")"
}

// ACL is a parsed identity file. It is immutable: every method is safe for
// concurrent use.
type ACL struct {
	file  string
	ids   map[string]*Identity
	list  []*Identity
	decoy [32]byte // what an unknown or certificate-only identity's secret is compared with
}

// File returns the name the ACL was parsed under (its path, for Load).
func (a *ACL) File() string { return a.file }

// Len returns the number of identities.
func (a *ACL) Len() int { return len(a.list) }

// Identities returns the identities in file order. The slice is the ACL's:
// do not modify it.
func (a *ACL) Identities() []*Identity { return a.list }

// Lookup returns the identity called name, or nil. It never allocates.
func (a *ACL) Lookup(name []byte) *Identity { return a.ids[string(name)] }

// Authenticate returns the identity called name if secret is its secret
// (SHA-256(secret) equals the stored digest), else nil. An unknown
// identity, or one whose secret is "cert", costs the same work — the hash
// and a constant-time comparison with a decoy digest — and fails, so the
// time taken does not tell which identities exist. It never allocates.
func (a *ACL) Authenticate(name, secret []byte) *Identity {
	id := a.ids[string(name)]
	sum := sha256.Sum256(secret)
	want, known := &a.decoy, 0
	if id != nil && !id.certOnly {
		want, known = &id.digest, 1
	}
	if subtle.ConstantTimeCompare(sum[:], want[:])&known == 1 {
		return id
	}
	return nil
}

// ByCertificate returns the identity a verified client certificate whose
// Subject Common Name is cn authenticates (PROTOCOL.md §8.2: any identity
// of the file, "cert" or not), or nil.
func (a *ACL) ByCertificate(cn string) *Identity {
	if cn == "" {
		return nil
	}
	return a.ids[cn]
}

// LineError is a bad line of the file.
type LineError struct {
	File string // the name given to Parse (a path, for Load)
	Line int    // 1-based
	Msg  string // what is wrong (never a secret: the file holds none)
}

func (e *LineError) Error() string { return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Msg }

// ErrTooLong is the cause of a LineError for a line over MaxLine bytes.
var ErrTooLong = errors.New("acl: line too long")

// Load reads and parses the file at path.
func Load(path string) (*ACL, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses an identity file (PROTOCOL.md §8.2); file names it in
// errors. The text is UTF-8, one identity per line:
//
//	identity  secret  keys  role
//
// separated by runs of spaces or tabs, leading and trailing ones ignored; a
// line whose first non-blank character is '#' is a comment; blank lines are
// ignored; a line may end in CR LF. The first bad line is returned as a
// *LineError.
func Parse(file string, data []byte) (*ACL, error) {
	a := &ACL{file: file, ids: make(map[string]*Identity)}
	lines := make(map[string]int)
	if _, err := rand.Read(a.decoy[:]); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxLine)
	line := 0
	for sc.Scan() {
		line++
		id, err := parseLine(sc.Bytes())
		if err != "" {
			return nil, &LineError{File: file, Line: line, Msg: err}
		}
		if id == nil {
			continue
		}
		if first, dup := lines[id.Name]; dup {
			return nil, &LineError{File: file, Line: line,
				Msg: fmt.Sprintf("identity %q appears again (first at line %d)", id.Name, first)}
		}
		lines[id.Name] = line
		id.index = len(a.list)
		a.ids[id.Name] = id
		a.list = append(a.list, id)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{File: file, Line: line + 1, Msg: fmt.Sprintf("line longer than %d bytes", MaxLine)}
		}
		return nil, err
	}
	return a, nil
}

// blank reports whether c separates fields.
func blank(c byte) bool { return c == ' ' || c == '\t' }

// fields splits a line at runs of blanks.
func fields(line []byte, dst [][]byte) [][]byte {
	for {
		for len(line) > 0 && blank(line[0]) {
			line = line[1:]
		}
		if len(line) == 0 {
			return dst
		}
		i := 0
		for i < len(line) && !blank(line[i]) {
			i++
		}
		dst = append(dst, line[:i])
		line = line[i:]
	}
}

// parseLine parses one line: an identity, or nil for a comment or blank
// line, or the reason it is bad.
func parseLine(line []byte) (*Identity, string) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if !utf8.Valid(line) {
		return nil, "not UTF-8"
	}
	var buf [5][]byte
	f := fields(line, buf[:0])
	if len(f) == 0 || f[0][0] == '#' {
		return nil, ""
	}
	if len(f) != 4 {
		return nil, fmt.Sprintf("%d fields, want 4: identity, secret (sha256:<hex> or cert), keys, role", len(f))
	}
	id := &Identity{Name: string(f[0])}
	if msg := checkName(f[0]); msg != "" {
		return nil, msg
	}
	if msg := id.parseSecret(f[1]); msg != "" {
		return nil, msg
	}
	if msg := id.parseKeys(f[2]); msg != "" {
		return nil, msg
	}
	switch string(f[3]) {
	case "client":
		id.Role = RoleClient
	case "monitor":
		id.Role = RoleMonitor
	case "admin":
		id.Role = RoleAdmin
	default:
		return nil, fmt.Sprintf("role %q: want client, monitor or admin", f[3])
	}
	return id, ""
}

// checkName checks an identity's length and characters.
func checkName(name []byte) string {
	if len(name) > MaxName {
		return fmt.Sprintf("identity of %d bytes: at most %d", len(name), MaxName)
	}
	for _, c := range name {
		if !nameByte(c) {
			return fmt.Sprintf("identity %q: only A-Z a-z 0-9 . _ @ - are allowed", name)
		}
	}
	return ""
}

// nameByte reports whether c may appear in an identity.
func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '@' || c == '-'
}

// ValidName reports whether name is a well-formed identity (1..MaxName
// bytes of A–Z a–z 0–9 . _ @ -).
func ValidName(name string) bool {
	return len(name) > 0 && checkName([]byte(name)) == ""
}

const sha256Prefix = "sha256:"

// parseSecret reads "sha256:<64 lowercase hex>" or "cert". The error never
// quotes the field: it may be a secret pasted by mistake.
func (id *Identity) parseSecret(f []byte) string {
	if string(f) == "cert" {
		id.certOnly = true
		return ""
	}
	hexd, ok := bytes.CutPrefix(f, []byte(sha256Prefix))
	if !ok {
		return "secret: want sha256:<64 lowercase hex digits> or cert (the file holds the SHA-256 of a secret, never the secret)"
	}
	if len(hexd) != 64 {
		return fmt.Sprintf("secret: sha256: is followed by %d characters, want 64 lowercase hex digits", len(hexd))
	}
	for _, c := range hexd {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "secret: sha256: must be followed by lowercase hex digits (0-9 a-f)"
		}
	}
	_, _ = hex.Decode(id.digest[:], hexd)
	return ""
}

// parseKeys reads "*", "-" or comma-separated prefixes.
func (id *Identity) parseKeys(f []byte) string {
	switch string(f) {
	case "*":
		id.all = true
		return ""
	case "-":
		return ""
	}
	for p := range bytes.SplitSeq(f, []byte(",")) {
		switch {
		case len(p) == 0:
			return fmt.Sprintf("keys %q: empty prefix (two commas, or a comma at an end)", f)
		case string(p) == "*" || string(p) == "-":
			return fmt.Sprintf("keys %q: %s stands alone (every key, or none), not in a list", f, p)
		case p[len(p)-1] == '*':
			return fmt.Sprintf("keys %q: prefix %q ends in *: a prefix is matched byte by byte, write it without the *", f, p)
		case len(p) > MaxPrefix:
			return fmt.Sprintf("keys: a prefix of %d bytes, at most %d", len(p), MaxPrefix)
		}
		id.prefixes = append(id.prefixes, newPrefix(bytes.Clone(p)))
	}
	return ""
}

// Digest returns the file's form of a secret: "sha256:" and the lowercase
// hex SHA-256 of secret's bytes (what `lockctl acl hash` prints).
func Digest(secret []byte) string {
	sum := sha256.Sum256(secret)
	return sha256Prefix + hex.EncodeToString(sum[:])
}
