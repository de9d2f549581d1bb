package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMemberSecurityFlags: --cluster-secret and the member link's TLS
// (PROTOCOL.md §8.4) are checked at start: a bad one is a usage error
// (exit 2) naming the flag and the file, and never quoting the secret.
func TestMemberSecurityFlags(t *testing.T) {
	p := newPEMFiles(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("secret", "3f1c0b9e8d7a6f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d\n")
	empty := write("empty", "\n \n")
	short := write("short", "hunter2\n")
	huge := write("huge", strings.Repeat("x", 5000))
	cluster := []string{"--cluster", "priority", "--peers", "127.0.0.1:7070,127.0.0.1:7080", "--listen", "127.0.0.1:7070", "--admin", ""}
	tlsFlags := []string{"--tls-cert", p.cert, "--tls-key", p.key}
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the message; empty: no error
	}{
		{"secret without a cluster", []string{"--cluster-secret", good}, []string{"--cluster-secret", "needs --cluster"}},
		{"secret file missing", append(cluster, "--cluster-secret", p.missing), []string{"--cluster-secret", p.missing, "no such file"}},
		{"secret file empty", append(cluster, "--cluster-secret", empty), []string{"--cluster-secret", empty, "empty"}},
		{"secret too short", append(cluster, "--cluster-secret", short), []string{"--cluster-secret", short, "at least 16"}},
		{"secret file too large", append(cluster, "--cluster-secret", huge), []string{"--cluster-secret", huge, "over 4096"}},
		{"secret file a directory", append(cluster, "--cluster-secret", dir), []string{"--cluster-secret", dir}},
		{"TLS on a cluster without a CA", append(cluster, tlsFlags...), []string{"--tls-peer-ca", "--tls-client-ca"}},
		{"TLS with a peer CA", append(append(cluster, tlsFlags...), "--tls-peer-ca", p.caFile), nil},
		{"TLS with a client CA", append(append(cluster, tlsFlags...), "--tls-client-ca", p.caFile), nil},
		{"TLS on a single node without a CA", append([]string{"--listen", "127.0.0.1:0", "--admin", ""}, tlsFlags...), nil},
		{"secret", append(cluster, "--cluster-secret", good), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, opt, err := parseFlags(append(tc.args, "--data-dir", t.TempDir()), &bytes.Buffer{})
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(tc.name, "secret") && string(opt.member.Secret) != "3f1c0b9e8d7a6f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d" {
					t.Fatalf("secret read as %q", []byte(opt.member.Secret))
				}
				if strings.Contains(tc.name, "CA") && !strings.Contains(tc.name, "single") && opt.member.MemberTLS == nil {
					t.Fatal("the member link got no TLS")
				}
				return
			}
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("error %v, want a usage error (exit 2)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(ue.msg, w) {
					t.Fatalf("%q does not name %q", ue.msg, w)
				}
			}
			if strings.Contains(ue.msg, "hunter2") {
				t.Fatalf("the message quotes the secret: %q", ue.msg)
			}
		})
	}
}
