package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/freeport"
)

// freePort is a port that is free now, with port + 10000 free too (the
// member port).
func freePort(t *testing.T) string {
	t.Helper()
	return freeport.Addrs(t, 1, 10000)[0]
}

// TestMembershipFlags: --join and --force-new-cluster are raft flags, not
// both at once (exit 2, naming the flag), and --force-new-cluster on a data
// dir without raft state fails at start naming the flag (exit 1).
func TestMembershipFlags(t *testing.T) {
	addr := freePort(t)
	raft := []string{"--cluster", "raft", "--peers", addr, "--listen", addr, "--admin", "", "--data-dir", t.TempDir()}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"join without a cluster", []string{"--join"}, 2, "--join needs --cluster"},
		{"force without a cluster", []string{"--force-new-cluster"}, 2, "--force-new-cluster needs --cluster"},
		{"join in priority mode", []string{"--cluster", "priority", "--peers", addr, "--listen", addr, "--join"}, 2, "--join needs --cluster raft"},
		{"force in priority mode", []string{"--cluster", "priority", "--peers", addr, "--listen", addr, "--force-new-cluster"}, 2, "--force-new-cluster needs --cluster raft"},
		{"both", append(append([]string{}, raft...), "--join", "--force-new-cluster"), 2, "--force-new-cluster"},
		{"force on an empty data dir", append(append([]string{}, raft...), "--force-new-cluster"), 1, "--force-new-cluster true: the data directory holds no raft state"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(binary, tc.args...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit: %v, want code %d; stderr: %s", err, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q: %s", tc.want, stderr.String())
			}
		})
	}
}
