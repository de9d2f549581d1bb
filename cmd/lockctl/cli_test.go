package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// ctlIn runs lockctl with stdin and returns stdout, stderr and the exit
// code.
func ctlIn(t *testing.T, stdin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(lockctlBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestCompletionBash sources `lockctl completion bash` in bash and
// completes partial command lines with the functions it defines, as bash
// does on TAB (through lockctl's hidden __complete command).
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed to test the bash completion: ", err)
	}
	script, errs, code := ctl(t, nil, "completion", "bash")
	if code != 0 || script == "" {
		t.Fatalf("completion bash: %d %s", code, errs)
	}
	file := filepath.Join(t.TempDir(), "lockctl.bash")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	// The script uses bash-completion's _get_comp_words_by_ref when
	// _init_completion is missing; a machine without the bash-completion
	// package gets a minimal stand-in that reads COMP_WORDS as bash sets it.
	prog := `
[ -r /usr/share/bash-completion/bash_completion ] && . /usr/share/bash-completion/bash_completion
if ! declare -F _get_comp_words_by_ref >/dev/null; then
  _get_comp_words_by_ref() {
    cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}
    words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
  }
fi
. "$1" || exit 3
declare -F __start_lockctl >/dev/null || { echo "no __start_lockctl"; exit 4; }
complete -p lockctl | grep -q __start_lockctl || { echo "not registered for lockctl"; exit 5; }
comp() {
  COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
  COMPREPLY=(); __start_lockctl
  echo "$* => ${COMPREPLY[*]}"
}
comp lockctl acq
comp lockctl st
comp lockctl acquire --wa
comp lockctl status -o ''
comp lockctl acl ''
`
	cmd := exec.Command(bash, "--norc", "--noprofile", "-c", prog, "bash", file)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(lockctlBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	for _, want := range []string{
		"lockctl acq => acquire",
		"lockctl st => status",
		"lockctl acquire --wa => --wait",
		"lockctl status -o  => text json",
		"lockctl acl  => hash",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// The zsh and fish scripts are generated for lockctl.
func TestCompletionOtherShells(t *testing.T) {
	for shell, want := range map[string]string{"zsh": "#compdef lockctl", "fish": "complete -c lockctl"} {
		out, errs, code := ctl(t, nil, "completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: %d %q… %s", shell, code, out[:min(len(out), 80)], errs)
		}
	}
	if _, errs, code := ctl(t, nil, "completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: %d %s", code, errs)
	}
}

// flagsOf returns the long names of the flags a help text lists.
func flagsOf(help string) []string {
	_, sect, ok := strings.Cut(help, "\nFlags:\n")
	if !ok {
		return nil
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([\w-]+)`).FindAllStringSubmatch(sect, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names
}

// TestHelpListsOnlyItsFlags: each command's help lists the flags it takes
// and no other (no --admin where the admin endpoint is not used), with
// examples.
func TestHelpListsOnlyItsFlags(t *testing.T) {
	conn := []string{"addr", "timeout", "tls", "tls-ca", "tls-cert", "tls-key", "tls-server-name", "identity", "secret-file"}
	with := func(extra ...string) []string {
		s := append(append([]string{"help", "output"}, conn...), extra...)
		slices.Sort(s)
		return s
	}
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"acquire"}, with("wait", "lease")},
		{[]string{"release"}, with()},
		{[]string{"renew"}, with("lease")},
		{[]string{"ping"}, with()},
		{[]string{"status"}, with("admin")},
		{[]string{"run"}, with("wait", "lease", "margin", "grace", "renew-every", "shared")},
		{[]string{"validate"}, with()},
		{[]string{"watch"}, with("wait")},
		{[]string{"inspect"}, with("admin")},
		{[]string{"acl", "hash"}, []string{"help", "output"}},
		{[]string{"member", "list"}, with("admin")},
		{[]string{"member", "add"}, with("admin", "wait")},
		{[]string{"member", "remove"}, with("admin")},
		{[]string{"completion", "bash"}, []string{"help", "no-descriptions"}},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errs, code := ctl(t, nil, append(tc.args, "--help")...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			if got := flagsOf(out); !slices.Equal(got, tc.want) {
				t.Fatalf("flags %v, want %v\n%s", got, tc.want, out)
			}
			if tc.args[0] != "completion" && !strings.Contains(out, "Examples:\n  lockctl "+strings.Join(tc.args, " ")) {
				t.Fatalf("no examples:\n%s", out)
			}
		})
	}
}

// TestRunHelpLeaseArithmetic: run's help derives the shortest lease, the
// renewal interval and the outage run rides out from the flags' defaults,
// and run enforces exactly that bound. (TestRunSurvivesRestart checks an
// outage in practice.)
func TestRunHelpLeaseArithmetic(t *testing.T) {
	out, _, _ := ctl(t, nil, "run", "--help")
	short := minRunLease(defaultRunMargin, defaultRunGrace, 0)
	if short != 8*time.Second {
		t.Fatalf("shortest lease with the defaults %v, want 8s (lease > 2s + 5s + 100ms)", short)
	}
	// 30s: (30 - 7.1)/3 = 7.633s; 30 - 7.1 - 7.633 - 2 × 250ms = 14.767s.
	// 15s: (15 - 7.1)/3 = 2.633s; 15 - 7.1 - 2.633 - 2 × 250ms = 4.767s.
	for _, want := range []string{"the shortest --lease is 8s", "--lease 30s (the default): renewals every 7.633s, outages up to 14.767s",
		"--lease 15s:              renewals every 2.633s, outages up to 4.767s", "SIGTERM 7.1s before"} {
		if !strings.Contains(out, want) {
			t.Errorf("run --help lacks %q:\n%s", want, out)
		}
	}
	// The bound is the one run applies: 7s is refused, naming the
	// shortest lease, and 8s runs.
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	if _, errs, code := ctl(t, env, "run", "k", "--lease", "7s", "--", "true"); code != exitUsage || !strings.Contains(errs, "the shortest lease is 8s") {
		t.Fatalf("run --lease 7s: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, env, "run", "k", "--lease", "8s", "--", "true"); code != 0 {
		t.Fatalf("run --lease 8s: %d %s", code, errs)
	}
}

// TestVersion: --version prints the module version and, when the build
// stamped one, the VCS revision. The binary is built with -buildvcs=true
// (this machine's go env turns stamping off); Go stamps only in a clone
// whose .git is a directory, not in a git worktree.
func TestVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "lockctl")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, b)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := ""
	if m := regexp.MustCompile(`vcs\.revision=([0-9a-f]+)`).FindSubmatch(info); m != nil {
		rev = string(m[1])
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(out))
	if !strings.HasPrefix(line, "lockctl ") || !strings.Contains(line, " go1.") {
		t.Fatalf("--version printed %q", line)
	}
	top, gitErr := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	clone := false
	if gitErr == nil {
		st, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git"))
		clone = err == nil && st.IsDir()
	}
	switch {
	case rev != "":
		if !strings.Contains(line, "(rev "+rev[:12]) {
			t.Fatalf("--version %q does not show the revision %s", line, rev)
		}
		head, _ := exec.Command("git", "rev-parse", "HEAD").Output()
		if h := strings.TrimSpace(string(head)); h != "" && h != rev {
			t.Fatalf("stamped revision %s, HEAD %s", rev, h)
		}
	case clone:
		t.Fatalf("built in a git clone with -buildvcs=true, but no revision was stamped:\n%s", info)
	default:
		if strings.Contains(line, "(rev ") {
			t.Fatalf("--version %q shows a revision the build did not stamp", line)
		}
		t.Logf("not a git clone (a worktree or no git): no revision to show; --version printed %q", line)
	}
}

// TestACLHash: acl hash prints sha256: and the hex SHA-256 of stdin less
// one trailing newline.
func TestACLHash(t *testing.T) {
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(h[:])
	}
	const orders = "sha256:363838865d67245f6045a510d660614ae477cd64df9f55f5c068b20a1536949a" // PROTOCOL.md §8.2
	if sum("orders-secret") != orders {
		t.Fatal("the test's own hash disagrees with PROTOCOL.md")
	}
	cases := []struct {
		in   string
		want string // "" = exit 2
	}{
		{"orders-secret", orders},
		{"orders-secret\n", orders},
		{"orders-secret\r\n", orders},
		{" orders-secret \n", sum(" orders-secret ")},
		{"two words\n", sum("two words")},
		{strings.Repeat("s", 256) + "\n", sum(strings.Repeat("s", 256))},
		{"orders-secret\n\n", ""},
		{"a\nb", ""},
		{"\n", ""},
		{"", ""},
		{strings.Repeat("s", 257), ""},
	}
	for _, tc := range cases {
		out, errs, code := ctlIn(t, tc.in, nil, "acl", "hash")
		switch {
		case tc.want == "" && code != exitUsage:
			t.Errorf("%q: exit %d, out %q; want 2", tc.in, code, out)
		case tc.want != "" && (code != 0 || out != tc.want+"\n"):
			t.Errorf("%q: exit %d, out %q, err %q; want %s", tc.in, code, out, errs, tc.want)
		case strings.TrimSpace(tc.in) != "" && strings.Contains(errs, strings.TrimSpace(tc.in)):
			t.Errorf("%q: the error shows the secret: %s", tc.in, errs)
		}
	}
	out, _, code := ctlIn(t, "orders-secret\n", nil, "acl", "hash", "-o", "json")
	var h hashJSON
	if err := json.Unmarshal([]byte(out), &h); code != 0 || err != nil || h.Secret != orders {
		t.Fatalf("acl hash -o json: %d %q %v", code, out, err)
	}
	if _, _, code := ctlIn(t, "x", nil, "acl", "hash", "extra"); code != exitUsage {
		t.Fatalf("acl hash extra: %d", code)
	}
}

// TestJSONOutput: -o json prints one decodable document per command, and
// errors as JSON lines on stderr with the exit code.
func TestJSONOutput(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr, "LOCKD_ADMIN=" + s.admin}
	decode := func(what, out string, v any) {
		t.Helper()
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Fatalf("%s: %v in %q", what, err, out)
		}
	}
	out, errs, code := ctl(t, env, "acquire", "json-key", "--lease", "20s", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	var l lockJSON
	decode("acquire", out, &l)
	if _, err := strconv.ParseUint(l.Token, 10, 64); err != nil || l.Key != "json-key" || l.LeaseSeconds != 20 {
		t.Fatalf("acquire: %+v", l)
	}
	if exp, err := time.Parse(time.RFC3339Nano, l.Expires); err != nil || time.Until(exp) < 15*time.Second || time.Until(exp) > 21*time.Second {
		t.Fatalf("acquire expires %q (%v)", l.Expires, err)
	}
	out, _, code = ctl(t, env, "renew", "json-key", l.Token, "--lease", "40s", "-o", "json")
	var r lockJSON
	decode("renew", out, &r)
	if code != 0 || r.Token != l.Token || r.LeaseSeconds != 40 {
		t.Fatalf("renew: %d %+v", code, r)
	}
	out, _, code = ctl(t, env, "status", "json-key", "-o", "json")
	var k api.Key
	decode("status KEY", out, &k)
	if code != 0 || !k.Held || k.Token != l.Token {
		t.Fatalf("status KEY: %d %+v", code, k)
	}
	out, _, code = ctl(t, env, "status", "-o", "json")
	var st statusJSON
	decode("status", out, &st)
	if code != 0 || len(st.Servers) != 1 || st.Servers[0].Status == nil || st.Servers[0].Status.Keys != 1 || st.Servers[0].Admin != s.admin {
		t.Fatalf("status: %d %+v", code, st)
	}
	out, _, code = ctl(t, env, "ping", "-o", "json")
	var p pongJSON
	decode("ping", out, &p)
	if code != 0 || p.RTTSeconds <= 0 || !slices.Equal(p.Addrs, []string{s.addr}) {
		t.Fatalf("ping: %d %+v", code, p)
	}
	// Errors: a JSON line on stderr, nothing on stdout.
	type msg struct {
		Level    string `json:"level"`
		Msg      string `json:"msg"`
		ExitCode int    `json:"exit_code"`
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"acquire", "json-key", "--wait", "0", "-o", "json"}, exitTimeout},
		{[]string{"run", "json-key", "--wait", "0", "-o", "json", "--", "true"}, exitTimeout},
		{[]string{"release", "json-key", "notatoken", "-o", "json"}, exitUsage},
		{[]string{"status", "a", "b", "-o", "json"}, exitUsage},
	} {
		out, errs, code := ctl(t, env, tc.args...)
		var m msg
		decode(strings.Join(tc.args, " "), errs, &m)
		if code != tc.code || m.ExitCode != tc.code || m.Level != "error" || m.Msg == "" || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %+v; want %d", tc.args, code, out, m, tc.code)
		}
	}
	out, _, code = ctl(t, env, "release", "json-key", l.Token, "-o", "json")
	var rel releasedJSON
	decode("release", out, &rel)
	if code != 0 || !rel.Released || rel.Token != l.Token {
		t.Fatalf("release: %d %+v", code, rel)
	}
	if _, errs, code := ctl(t, env, "ping", "-o", "yaml"); code != exitUsage || !strings.Contains(errs, "-o") {
		t.Fatalf("-o yaml: %d %s", code, errs)
	}
}

// TestRunJSONMessages: run's own messages (here: the lock lost) are JSON
// lines on stderr with -o json.
func TestRunJSONMessages(t *testing.T) {
	s := startLockd(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	cmd := exec.Command(lockctlBin, "run", "stolen-json", "--addr", s.addr, "--lease", "9s", "--renew-every", "300ms",
		"--margin", "1s", "--grace", "1s", "-o", "json", "--", "sh", "-c", `echo "$LOCKD_TOKEN" > `+tokFile+`; sleep 60`)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var tok string
	for deadline := time.Now().Add(10 * time.Second); tok == ""; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(tokFile); err == nil {
			tok = strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("command did not start: %s", errb.String())
		}
	}
	if _, errs, code := ctl(t, nil, "release", "stolen-json", tok, "--addr", s.addr); code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("run did not stop: %s", errb.String())
	}
	if cmd.ProcessState.ExitCode() != exitLockLost {
		t.Fatalf("exit %d: %s", cmd.ProcessState.ExitCode(), errb.String())
	}
	levels := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(errb.String()), "\n") {
		var m struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("stderr line %q is not JSON: %v", line, err)
		}
		levels[m.Level]++
		if m.Level == "warning" && !strings.Contains(m.Msg, "lost") {
			t.Errorf("warning %q", m.Msg)
		}
	}
	if levels["warning"] != 1 || levels["error"] != 1 {
		t.Fatalf("stderr: %v\n%s", levels, errb.String())
	}
}

// TestCredentialFlags: the secret comes only from a file (flag or
// environment), both halves of the credentials are required together, and
// neither the secret nor its file's content is printed.
func TestCredentialFlags(t *testing.T) {
	s := startLockd(t)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "orders.secret")
	const secret = "s3cr3t-value"
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "two-lines")
	_ = os.WriteFile(junk, []byte("a\nb\n"), 0o600)
	addr := []string{"LOCKD_ADDRS=" + s.addr}
	cases := []struct {
		name string
		env  []string
		args []string
		code int
		want string // in stderr
	}{
		{"flags", addr, []string{"ping", "--identity", "orders", "--secret-file", secretFile}, 0, ""},
		{"environment", append(addr, "LOCKD_IDENTITY=orders", "LOCKD_SECRET_FILE="+secretFile), []string{"ping"}, 0, ""},
		{"flag wins", append(addr, "LOCKD_IDENTITY=bad identity"), []string{"ping", "--identity", "orders", "--secret-file", secretFile}, 0, ""},
		{"no --secret flag", addr, []string{"ping", "--identity", "orders", "--secret", secret}, exitUsage, "--secret-file"},
		{"identity without secret", addr, []string{"ping", "--identity", "orders"}, exitUsage, "--secret-file"},
		{"secret without identity", addr, []string{"ping", "--secret-file", secretFile}, exitUsage, "--identity"},
		{"missing file", addr, []string{"ping", "--identity", "orders", "--secret-file", filepath.Join(dir, "none")}, exitUsage, "--secret-file"},
		{"two lines", addr, []string{"ping", "--identity", "orders", "--secret-file", junk}, exitUsage, "--secret-file"},
		{"bad identity", addr, []string{"ping", "--identity", "a b", "--secret-file", secretFile}, exitUsage, "--identity"},
		{"unreachable", nil, []string{"ping", "--addr", "127.0.0.1:1", "--identity", "orders", "--secret-file", secretFile}, exitError, "no connection"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := ctl(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errs, tc.code, tc.want)
			}
			if strings.Contains(out+errs, "s3cr3t") {
				t.Fatalf("the secret was printed: %s %s", out, errs)
			}
		})
	}
	// A lock taken with credentials (the server has no --acl: the hello is
	// answered and checks nothing).
	env := append(addr, "LOCKD_IDENTITY=orders", "LOCKD_SECRET_FILE="+secretFile)
	out, errs, code := ctl(t, env, "acquire", "cred-key")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, env, "release", "cred-key", strings.TrimSpace(out)); code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	if _, err := fmt.Sscan(strings.TrimSpace(out), new(uint64)); err != nil {
		t.Fatalf("acquire printed %q", out)
	}
}
