package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/tlsconf"
)

// memberSecurity applies PROTOCOL.md §8.4 to a cluster member's options:
// with --tls-cert the member link is mutual TLS (which needs --tls-peer-ca
// or --tls-client-ca), and --cluster-secret FILE gives the secret. A
// single node takes neither (a --cluster-secret without --cluster is a
// bad flag; its TLS flags concern the client port alone).
func memberSecurity(opt *options, files tlsconf.Files, secretFile string) error {
	if opt.cluster == "" {
		if secretFile != "" {
			return usageError{"--cluster-secret needs --cluster priority or --cluster raft"}
		}
		return nil
	}
	if opt.tls != nil {
		if files.PeerCA == "" && files.ClientCA == "" {
			return usageError{"--tls-cert on a cluster member needs --tls-peer-ca (or --tls-client-ca): the member link is mutual TLS, and members' certificates must verify against a CA bundle (PROTOCOL.md §8.4)"}
		}
		opt.member.MemberTLS = opt.tls
	}
	if secretFile != "" {
		s, err := readSecret(secretFile)
		if err != nil {
			return usageError{fmt.Sprintf("--cluster-secret %s: %v", secretFile, err)}
		}
		opt.member.Secret = s
	}
	if err := opt.member.Validate(); err != nil {
		return usageError{flagError(err).Error()}
	}
	return nil
}

// maxSecretFile bounds the secret file: a secret is a few dozen bytes.
const maxSecretFile = 4096

// readSecret reads the cluster secret: the file's bytes without trailing
// blanks and line ends (so `openssl rand -hex 32 > FILE` works), at least
// repl.MinSecret of them. The error never quotes the file's contents.
func readSecret(file string) (repl.Secret, error) {
	f, err := os.Open(file)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("the file is over %d bytes: it should hold one secret", maxSecretFile)
	}
	s := bytes.TrimRight(b, " \t\r\n")
	switch {
	case len(s) == 0:
		return nil, errors.New("the file is empty: put one random secret in it, the same on every member (e.g. openssl rand -hex 32)")
	case len(s) < repl.MinSecret:
		return nil, fmt.Errorf("the secret is %d bytes, want at least %d (e.g. openssl rand -hex 32)", len(s), repl.MinSecret)
	}
	return repl.Secret(bytes.Clone(s)), nil
}
