package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/ratelog"
	"github.com/lockd-dev/lockd/tlsconf"
)

// tlsFlags maps tlsconf's fields onto the daemon's flags.
var tlsFlags = map[string]string{
	tlsconf.FieldCert:     "--tls-cert",
	tlsconf.FieldKey:      "--tls-key",
	tlsconf.FieldClientCA: "--tls-client-ca",
	tlsconf.FieldPeerCA:   "--tls-peer-ca",
}

// loadTLS checks the TLS flags and reads their files (PROTOCOL.md §8.1):
// nil without any; a usageError naming the flag and its file when one is
// missing, unreadable or does not parse.
func loadTLS(f tlsconf.Files) (*tlsconf.Store, error) {
	if f == (tlsconf.Files{}) {
		return nil, nil
	}
	st, err := tlsconf.Load(f)
	if err != nil {
		return nil, usageError{tlsFlagError(err)}
	}
	return st, nil
}

// tlsFlagError words a tlsconf error with the flag's name (each part of a
// joined Reload error on its own).
func tlsFlagError(err error) string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var parts []string
		for _, e := range j.Unwrap() {
			parts = append(parts, tlsFlagError(e))
		}
		return strings.Join(parts, "; ")
	}
	var fe *tlsconf.FieldError
	if !errors.As(err, &fe) {
		return err.Error()
	}
	name := tlsFlags[fe.Field]
	switch {
	case errors.Is(fe.Err, tlsconf.ErrPair):
		return fmt.Sprintf("%s missing: --tls-cert and --tls-key go together, give both", name)
	case errors.Is(fe.Err, tlsconf.ErrNeedsCert):
		return fmt.Sprintf("%s %s: needs --tls-cert and --tls-key", name, fe.File)
	}
	return fmt.Sprintf("%s %s: %v", name, fe.File, fe.Err)
}

// adminTLS makes the admin endpoint's listener serve HTTPS with the
// client port's certificate (PROTOCOL.md §8.1, §8.5).
func adminTLS(ln net.Listener, st *tlsconf.Store) net.Listener {
	return tls.NewListener(ln, st.AdminConfig())
}

// limitedLog is the admin server's error log (failed TLS handshakes, bad
// requests): at most one line a second, with the number of lines dropped
// since the last one, so that a flood of bad connections cannot flood the
// log.
func limitedLog(l *slog.Logger) *log.Logger {
	return log.New(&rateWriter{l: l}, "", 0)
}

type rateWriter struct {
	l    *slog.Logger
	logs ratelog.Shared
}

func (w *rateWriter) Write(p []byte) (int, error) {
	if held, ok := w.logs.Allow(time.Now().UnixNano()); ok {
		w.l.Warn("admin endpoint: a connection failed", "err", strings.TrimSpace(string(p)), "dropped_since_last", held)
	}
	return len(p), nil
}
