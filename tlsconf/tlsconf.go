package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// Files names the PEM files of PROTOCOL.md §8.1. The zero value is TLS off.
type Files struct {
	// Cert is the certificate chain the server presents (leaf first), and
	// Key its private key (PKCS #1, PKCS #8 or SEC 1). Both or neither.
	Cert, Key string
	// ClientCA is a bundle of CA certificates: when set, a client must
	// present a certificate that verifies against it (mutual TLS). Needs
	// Cert.
	ClientCA string
	// PeerCA is the bundle member certificates must verify against on the
	// member link (§8.4); "" means ClientCA. Needs Cert.
	PeerCA string
}

// On reports whether TLS is configured (Cert set; Validate checks the rest).
func (f Files) On() bool { return f.Cert != "" }

// Names of Files' fields, as FieldError.Field gives them.
const (
	FieldCert     = "Cert"
	FieldKey      = "Key"
	FieldClientCA = "ClientCA"
	FieldPeerCA   = "PeerCA"
)

// FieldError is a file of Files that is missing, unreadable or does not
// parse. Field is one of FieldCert, FieldKey, FieldClientCA, FieldPeerCA:
// the daemon maps it onto its flag.
type FieldError struct {
	Field string
	File  string // "" when the file is missing
	Err   error
}

func (e *FieldError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("tlsconf: %s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("tlsconf: %s file %q: %v", e.Field, e.File, e.Err)
}

func (e *FieldError) Unwrap() error { return e.Err }

// Errors of Validate, wrapped in a FieldError.
var (
	ErrPair      = errors.New("missing: the certificate and its key go together, give both")
	ErrNeedsCert = errors.New("needs the server's certificate and key")
)

// Validate checks which files are given (not their contents: Load reads
// them): Cert and Key together, ClientCA and PeerCA only with Cert.
func (f Files) Validate() error {
	switch {
	case f.Cert != "" && f.Key == "":
		return &FieldError{Field: FieldKey, Err: ErrPair}
	case f.Cert == "" && f.Key != "":
		return &FieldError{Field: FieldCert, Err: ErrPair}
	case f.Cert == "" && f.ClientCA != "":
		return &FieldError{Field: FieldClientCA, File: f.ClientCA, Err: ErrNeedsCert}
	case f.Cert == "" && f.PeerCA != "":
		return &FieldError{Field: FieldPeerCA, File: f.PeerCA, Err: ErrNeedsCert}
	}
	return nil
}

// material is what one read of the files gave, with the configurations
// built from it. Never changed once published.
type material struct {
	cert     *tls.Certificate
	clientCA *x509.CertPool // nil: no client certificates asked for
	peerCA   *x509.CertPool // PeerCA, else clientCA; nil if neither
	server   *tls.Config    // the client port
	admin    *tls.Config    // the admin endpoint
}

// Store holds the files' current contents. Load makes one; Reload re-reads.
type Store struct {
	files  Files
	cur    atomic.Pointer[material]
	reload sync.Mutex // one Reload at a time

	// The configurations handed out: each reads cur per handshake.
	server, admin *tls.Config
}

// Load checks f, reads and parses every file and returns a Store serving
// them. An error is a *FieldError naming the first file that is missing,
// unreadable or does not parse.
func Load(f Files) (*Store, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if !f.On() {
		return nil, &FieldError{Field: FieldCert, Err: errors.New("no certificate given")}
	}
	m := &material{}
	var err error
	if m.cert, err = readKeyPair(f.Cert, f.Key); err != nil {
		return nil, err
	}
	if f.ClientCA != "" {
		if m.clientCA, err = readPool(FieldClientCA, f.ClientCA); err != nil {
			return nil, err
		}
	}
	if f.PeerCA != "" {
		if m.peerCA, err = readPool(FieldPeerCA, f.PeerCA); err != nil {
			return nil, err
		}
	}
	s := &Store{files: f}
	s.publish(m)
	s.server = &tls.Config{
		MinVersion:                  tls.VersionTLS12,
		DynamicRecordSizingDisabled: true,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load().server, nil
		},
	}
	s.admin = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load().admin, nil
		},
	}
	return s, nil
}

// publish builds m's configurations and makes m current.
func (s *Store) publish(m *material) {
	if m.peerCA == nil {
		m.peerCA = m.clientCA
	}
	m.server = &tls.Config{
		MinVersion:                  tls.VersionTLS12,
		Certificates:                []tls.Certificate{*m.cert},
		DynamicRecordSizingDisabled: true,
	}
	m.admin = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{*m.cert},
	}
	if m.clientCA != nil {
		m.server.ClientAuth, m.server.ClientCAs = tls.RequireAndVerifyClientCert, m.clientCA
		m.admin.ClientAuth, m.admin.ClientCAs = tls.VerifyClientCertIfGiven, m.clientCA
	}
	s.cur.Store(m)
}

// Reload re-reads every file. A part that cannot be read or parsed — the
// key pair (certificate and key together), the client CA bundle, the peer
// CA bundle — keeps its previous contents; the others take their new
// ones. The error joins a *FieldError per part kept. Handshakes that begin
// after Reload returns use what it published.
func (s *Store) Reload() error {
	s.reload.Lock()
	defer s.reload.Unlock()
	old := s.cur.Load()
	m := &material{cert: old.cert, clientCA: old.clientCA}
	if s.files.PeerCA != "" {
		m.peerCA = old.peerCA
	}
	var errs []error
	if cert, err := readKeyPair(s.files.Cert, s.files.Key); err != nil {
		errs = append(errs, err)
	} else {
		m.cert = cert
	}
	if s.files.ClientCA != "" {
		if pool, err := readPool(FieldClientCA, s.files.ClientCA); err != nil {
			errs = append(errs, err)
		} else {
			m.clientCA = pool
		}
	}
	if s.files.PeerCA != "" {
		if pool, err := readPool(FieldPeerCA, s.files.PeerCA); err != nil {
			errs = append(errs, err)
		} else {
			m.peerCA = pool
		}
	}
	s.publish(m)
	return errors.Join(errs...)
}

// Files returns the files the store reads.
func (s *Store) Files() Files { return s.files }

// ServerConfig is the client port's configuration: the current
// certificate and, with ClientCA, a client certificate required and
// verified against it. Dynamic record sizing is off: every Write of at
// most 16 KiB then makes exactly one TLS record, which lets the engine
// tell which frames reached the socket (docs/DESIGN.md "TLS").
func (s *Store) ServerConfig() *tls.Config { return s.server }

// AdminConfig is the admin endpoint's configuration: the current
// certificate and, with ClientCA, a client certificate asked for and
// verified if given but not required (PROTOCOL.md §8.5: basic
// authentication is what admits a request).
func (s *Store) AdminConfig() *tls.Config { return s.admin }

// Certificate returns the current certificate (for the member link's
// GetCertificate and GetClientCertificate).
func (s *Store) Certificate() *tls.Certificate { return s.cur.Load().cert }

// ClientCAs returns the current client CA pool, nil without ClientCA.
func (s *Store) ClientCAs() *x509.CertPool { return s.cur.Load().clientCA }

// PeerCAs returns the pool member certificates must verify against on
// the member link: PeerCA's, else ClientCA's; nil if neither is given.
func (s *Store) PeerCAs() *x509.CertPool { return s.cur.Load().peerCA }

// readKeyPair reads a certificate chain and its key. A file that cannot be
// read, a certificate file without a certificate that parses, and a key
// that does not parse or does not match are FieldErrors of their file.
func readKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, &FieldError{Field: FieldCert, File: certFile, Err: unwrapPath(err)}
	}
	certs, err := parseCerts(certPEM)
	if err != nil {
		return nil, &FieldError{Field: FieldCert, File: certFile, Err: err}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, &FieldError{Field: FieldKey, File: keyFile, Err: unwrapPath(err)}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, &FieldError{Field: FieldKey, File: keyFile, Err: err}
	}
	pair.Leaf = certs[0]
	return &pair, nil
}

// readPool reads a CA bundle: at least one certificate, every CERTIFICATE
// block parsing.
func readPool(field, file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, &FieldError{Field: field, File: file, Err: unwrapPath(err)}
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil, &FieldError{Field: field, File: file, Err: err}
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts parses every CERTIFICATE block of a PEM file; none, or one
// that does not parse, is an error. Other blocks (a key in the same file)
// are skipped.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

// unwrapPath drops the *fs.PathError around a read error: FieldError
// names the file already.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
