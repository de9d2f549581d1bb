package client

import (
	"crypto/tls"
	"crypto/x509"
	"os"
)

// TLSFiles names the PEM files of a client's TLS settings, for LoadTLS.
type TLSFiles struct {
	// CA is a bundle of CA certificates to verify servers with; empty:
	// the system's roots.
	CA string
	// Cert and Key are the client certificate (chain) and its key, for
	// servers that require mutual TLS (lockd's --tls-client-ca); both or
	// neither.
	Cert, Key string
	// ServerName is the name servers' certificates must carry; empty:
	// each address's host.
	ServerName string
}

// LoadTLS reads the files into a *tls.Config for Config.TLS (TLS 1.2 or
// later, Go's defaults otherwise). A file that cannot be read or holds no
// usable PEM is a *FieldError naming the field and the file.
func LoadTLS(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, &FieldError{Field: "TLSFiles.CA", Value: f.CA, Want: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &FieldError{Field: "TLSFiles.CA", Value: f.CA, Want: "no PEM certificate in it"}
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert != "" && f.Key != "":
		crt, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, &FieldError{Field: "TLSFiles.Cert", Value: f.Cert, Want: "with TLSFiles.Key " + f.Key + ": " + err.Error()}
		}
		cfg.Certificates = []tls.Certificate{crt}
	case f.Cert != "":
		return nil, &FieldError{Field: "TLSFiles.Key", Want: "required with TLSFiles.Cert"}
	case f.Key != "":
		return nil, &FieldError{Field: "TLSFiles.Cert", Want: "required with TLSFiles.Key"}
	}
	return cfg, nil
}
