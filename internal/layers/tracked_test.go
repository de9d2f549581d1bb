package layers

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckTracked runs .ci/check-tracked (what `make lint` runs) in a
// scratch repository: it passes on source files and on a large file under
// testdata/, and fails naming the file on a tracked ELF binary and on a
// file over 1 MiB outside testdata/.
func TestCheckTracked(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	script, err := filepath.Abs("../../.ci/check-tracked")
	if err != nil {
		t.Fatal(err)
	}
	elf, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		fail  string // "" = passes; else the path the failure names
	}{
		{"source only", map[string][]byte{"main.go": []byte("package main\n")}, ""},
		{"large testdata", map[string][]byte{"a/testdata/big.bin": big}, ""},
		{"exactly 1 MiB", map[string][]byte{"data.txt": big[:1<<20]}, ""},
		{"elf at the root", map[string][]byte{"lockd": elf[:4096]}, "lockd"},
		{"elf under testdata", map[string][]byte{"x/testdata/bin": elf[:4096]}, "x/testdata/bin"},
		{"large file", map[string][]byte{"docs/big.txt": big}, "docs/big.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			git := func(args ...string) {
				t.Helper()
				cmd := exec.Command("git", args...)
				cmd.Dir = dir
				cmd.Env = isolatedGit(dir)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			git("init", "-q")
			for name, data := range tc.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			git("add", "-A")
			cmd := exec.Command(script)
			cmd.Dir = dir
			cmd.Env = isolatedGit(dir)
			out, err := cmd.CombinedOutput()
			switch {
			case tc.fail == "" && err != nil:
				t.Fatalf("check-tracked failed on a clean tree: %v\n%s", err, out)
			case tc.fail != "" && err == nil:
				t.Fatalf("check-tracked passed with %s tracked:\n%s", tc.fail, out)
			case tc.fail != "" && !strings.Contains(string(out), tc.fail):
				t.Fatalf("check-tracked's failure does not name %s:\n%s", tc.fail, out)
			}
		})
	}
}

// isolatedGit is the environment for a git command on the scratch
// repository dir: without the GIT_* variables that point git elsewhere (a
// test run from a hook or `git rebase --exec` inherits GIT_DIR and
// GIT_INDEX_FILE, and git init/add would then act on the real repository),
// and without the user's or system's git config.
func isolatedGit(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir),
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
}
