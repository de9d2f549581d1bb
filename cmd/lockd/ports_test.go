package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckPorts: the port rule's collisions are found, between members
// on one host and within one member, and worded with the flags and the
// ports; layouts that leave room pass.
func TestCheckPorts(t *testing.T) {
	cases := []struct {
		name       string
		peers      string
		self       int
		listen     string
		offset     int
		admin      string
		adminGiven bool
		want       []string // "" when the layout is fine
	}{
		{"the docs' layout", "127.0.0.1:7070,127.0.0.1:7080,127.0.0.1:7090", 0, "127.0.0.1:7070", 10000, "", false, nil},
		{"three hosts", "10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070", 1, "10.0.0.2:7070", 10000, "", false, nil},
		{"two apart", "127.0.0.1:7070,127.0.0.1:7072", 0, "127.0.0.1:7070", 10000, "", false, nil},
		{"one apart, hosts differ", "10.0.0.1:7070,10.0.0.2:7071", 0, "10.0.0.1:7070", 10000, "", false, nil},
		{"one apart, admin off", "127.0.0.1:7070,127.0.0.1:7071", 0, "127.0.0.1:7070", 10000, "", true, nil},
		{"one apart, this member's admin elsewhere", "127.0.0.1:7070,127.0.0.1:7071", 0, "127.0.0.1:7070", 10000, "127.0.0.1:9000", true, nil},
		{"wildcard listen", "127.0.0.1:7070,127.0.0.1:7080", 0, ":7070", 10000, "", false, nil},

		{"one apart", "127.0.0.1:7070,127.0.0.1:7071", 1, "127.0.0.1:7071", 10000, "", false,
			[]string{"--peers", "127.0.0.1:7070's admin port 7071", "--admin", "127.0.0.1:7071's client port 7071", "at least 2 apart"}},
		{"localhost is 127.0.0.1", "localhost:7070,127.0.0.1:7071", 0, "localhost:7070", 10000, "", false,
			[]string{"admin port 7071", "client port 7071"}},
		{"offset onto a client port", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070", 10, "", false,
			[]string{"member port 7080", "--peer-offset 10", "127.0.0.1:7080's client port 7080"}},
		{"offset onto an admin port", "127.0.0.1:7070,127.0.0.1:7090", 0, "127.0.0.1:7070", 21, "", false,
			[]string{"127.0.0.1:7070's member port 7091", "--peer-offset 21", "127.0.0.1:7090's admin port 7091"}},
		{"offset 1: a member's own admin port", "127.0.0.1:7070,127.0.0.1:7080", 1, "127.0.0.1:7080", 1, "", false,
			[]string{"member port 7071", "admin port 7071", "--peer-offset other than 1"}},
		{"a client port on a member port", "127.0.0.1:7070,127.0.0.1:17070", 0, "127.0.0.1:7070", 10000, "", false,
			[]string{"member port 17070", "client port 17070"}},
		{"explicit admin on another's client port", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070", 10000, "127.0.0.1:7080", true,
			[]string{"admin port 7080 (--admin)", "client port 7080", "give --admin a port"}},
		{"explicit wildcard admin", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070", 10000, ":17080", true,
			[]string{"admin port 17080 (--admin)", "127.0.0.1:7080's member port 17080"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPorts(strings.Split(tc.peers, ","), tc.self, tc.listen, tc.offset, tc.admin, tc.adminGiven, 0)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("got %v, want a usage error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(ue.msg, w) {
					t.Fatalf("%q does not say %q", ue.msg, w)
				}
			}
			t.Log(ue.msg)
		})
	}
}

// TestPortCollisionOfTheBinary: members one port apart, and a
// --peer-offset that lands on another member, are bad flags at start
// (exit 2) whose message names the flags and the ports.
func TestPortCollisionOfTheBinary(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--peers", "127.0.0.1:7070,127.0.0.1:7071", "--listen", "127.0.0.1:7070"},
			[]string{"--peers 127.0.0.1:7070,127.0.0.1:7071", "admin port 7071", "--admin", "client port 7071"}},
		{[]string{"--peers", "127.0.0.1:7070,127.0.0.1:7071", "--listen", "127.0.0.1:7071"},
			[]string{"admin port 7071", "client port 7071"}},
		{[]string{"--peers", "127.0.0.1:7070,127.0.0.1:7080,127.0.0.1:7090", "--listen", "127.0.0.1:7090", "--peer-offset", "10"},
			[]string{"--peer-offset 10", "member port 7080", "client port 7080"}},
	}
	for _, mode := range []string{"priority", "raft"} {
		for _, tc := range cases {
			t.Run(mode+" "+strings.Join(tc.args, " "), func(t *testing.T) {
				var stderr bytes.Buffer
				cmd := exec.Command(binary, append([]string{"--cluster", mode, "--data-dir", t.TempDir()}, tc.args...)...)
				cmd.Stderr = &stderr
				err := cmd.Run()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 2 {
					t.Fatalf("exit: %v, want 2; stderr: %s", err, stderr.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(stderr.String(), w) {
						t.Fatalf("stderr does not say %q: %s", w, stderr.String())
					}
				}
			})
		}
	}
}

// TestMemberPortWarning: a member port (client port + --peer-offset) in
// the kernel's ephemeral range is warned about with the range and what to
// do; outside it, with port 0, or without a readable range, nothing.
func TestMemberPortWarning(t *testing.T) {
	dir := t.TempDir()
	rangeFile := filepath.Join(dir, "ip_local_port_range")
	if err := os.WriteFile(rangeFile, []byte("20000\t30000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		listen string
		offset int
		file   string
		want   string // "" for none
	}{
		{"127.0.0.1:12000", 10000, rangeFile, "the member port 22000 (client port + --peer-offset) is in the kernel's ephemeral port range 20000-30000"},
		{"127.0.0.1:7070", 10000, rangeFile, ""},  // 17070: below
		{"127.0.0.1:21000", 10000, rangeFile, ""}, // 31000: above
		{"127.0.0.1:10000", 10000, rangeFile, "member port 20000"},
		{"127.0.0.1:20000", 10000, rangeFile, "member port 30000"},
		{"127.0.0.1:0", 10000, rangeFile, ""},
		{"127.0.0.1:12000", 10000, filepath.Join(dir, "none"), ""},
	} {
		got := memberPortWarning(c.listen, c.offset, c.file)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("--listen %s --peer-offset %d: %q, want %q", c.listen, c.offset, got, c.want)
		}
		if got != "" && !strings.Contains(got, "ip_local_reserved_ports") {
			t.Errorf("the warning does not say what to do: %q", got)
		}
	}
	if lo, hi, ok := ephemeralRange(ephemeralFile); ok && (lo < 1 || hi < lo) {
		t.Fatalf("this machine's range read as %d-%d", lo, hi)
	}
}

// TestCheckPortsHTTP: with --http, every member's HTTP port (its client
// port + --http's offset from --listen) must be away from every other port
// of the cluster.
func TestCheckPortsHTTP(t *testing.T) {
	cases := []struct {
		name   string
		peers  string
		self   int
		listen string
		want   []string // nil when the layout is fine
		http   int      // --http's offset from --listen
	}{
		{"http ports beside", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070", nil, 1000},
		{"http on another member's client port", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070",
			[]string{"127.0.0.1:7070's HTTP port 7080 (client port + 10, --http's offset", "127.0.0.1:7080's client port 7080", "give --http a port"}, 10},
		{"http on a member's own admin port", "127.0.0.1:7070,127.0.0.1:7080", 1, "127.0.0.1:7080",
			[]string{"HTTP port 7071", "admin port 7071"}, 1},
		{"http on a member port", "127.0.0.1:7070,127.0.0.1:7080", 0, "127.0.0.1:7070",
			[]string{"HTTP port 17070", "member port 17070"}, 10000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPorts(strings.Split(tc.peers, ","), tc.self, tc.listen, 10000, "", false, tc.http)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%v\ndoes not say %q", err, w)
				}
			}
		})
	}
}
