package layers

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestClientConsumerModules builds a throwaway module that imports only
// github.com/lockd-dev/lockd/client and requires, as a released version
// would, the client's module and the lockd modules that one requires (each a
// replace to this checkout: client/, proto/, fence/). `go mod tidy` must
// succeed in it offline (GOPROXY=off: nothing to fetch) — tidy loads the
// tests of the packages a module imports, so an import in the client's
// tests that client/go.mod cannot provide fails it, or, with a proxy,
// brings the root module in. Then what it inherits: its module graph (`go
// list -m all`, what minimal version selection weighs) holds lockd's
// library modules and nothing else — no third-party module, and not the
// root module, whose go.mod carries the server's dependencies — and the
// packages it compiles are the standard library, the client's and proto's.
func TestClientConsumerModules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	lib := libraryModules(t, root)
	dir := t.TempDir()
	gomod := "module example.com/lockdconsumer\n\ngo 1.26.0\n\nrequire " + lib[0].Path + " v0.0.0-00010101000000-000000000000\n"
	for _, m := range lib {
		gomod += "\nreplace " + m.Path + " => " + m.Dir + "\n"
	}
	files := map[string][]byte{
		"go.mod":  []byte(gomod),
		"main.go": []byte("package main\n\nimport _ \"" + mod + "/client\"\n\nfunc main() {}\n"),
	}
	// The client module's go.sum, if it has third-party requirements (it
	// should not): the go command verifies against it instead of asking the
	// checksum database.
	if sum, err := os.ReadFile(filepath.Join(lib[0].Dir, "go.sum")); err == nil {
		files["go.sum"] = sum
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command("go", "mod", "tidy")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy in a module importing only %s/client: %v\n%s\n"+
			"(a consumer's tidy loads the client's tests: whatever they import, client/go.mod must provide)", mod, err, out)
	}
	modules := goOffline(t, dir, "-mod=mod", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	t.Logf("lockd's library modules: %v; a module importing only the client inherits %d modules:\n%s", lib, len(modules)-1, strings.Join(modules, "\n"))
	for _, line := range modules {
		path, _, _ := strings.Cut(line, " ")
		if path != "example.com/lockdconsumer" && !slices.ContainsFunc(lib, func(m module) bool { return m.Path == path }) {
			t.Errorf("a module importing only %s/client requires %s: only lockd's library modules may be in its graph "+
				"(every importer of the client inherits what client/go.mod requires)", mod, line)
		}
	}
	for _, m := range lib {
		if m.Path == mod {
			t.Errorf("the client's module graph holds the root module %s: its go.mod (the server's dependencies) would reach every importer of the client", mod)
		}
	}
	for _, pkg := range goOffline(t, dir, "-mod=mod", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".") {
		if pkg != "" && pkg != "example.com/lockdconsumer" && !strings.HasPrefix(pkg, mod+"/client") && !strings.HasPrefix(pkg, mod+"/proto") {
			t.Errorf("a program importing only %s/client compiles %s", mod, pkg)
		}
	}
}

// module is a module of the build list: its path and its directory.
type module struct{ Path, Dir string }

// libraryModules returns what a program importing the client requires: the
// client's module (first) and the lockd modules of its module graph alone
// (GOWORK=off), each with its directory in this checkout. Third-party
// modules of that graph are left out (TestClientConsumerModules fails on
// them).
func libraryModules(t *testing.T, root string) []module {
	t.Helper()
	var lib []module
	for _, line := range goOffline(t, filepath.Join(root, "client"), "", "list", "-m", "-f", "{{.Path}}|{{.Dir}}", "all") {
		path, dir, _ := strings.Cut(line, "|")
		if path == mod || strings.HasPrefix(path, mod+"/") {
			lib = append(lib, module{path, dir})
		}
	}
	if len(lib) == 0 {
		t.Fatalf("no lockd module in the client's module graph")
	}
	return lib
}

// goOffline runs the go command in the module directory dir, outside any
// workspace, with GOFLAGS=flags, and returns its output's lines. It tries
// the module cache alone first; when that lacks something, the configured
// proxy; when both fail for want of a module it skips (fails under CI=true).
func goOffline(t *testing.T, dir, flags string, args ...string) []string {
	t.Helper()
	return goIn(t, dir, "off", flags, args...)
}

// goIn is goOffline with GOWORK=work: "off", or a go.work file.
func goIn(t *testing.T, dir, work, flags string, args ...string) []string {
	t.Helper()
	run := func(proxy string) ([]byte, []byte, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+work, "GOFLAGS="+flags, "GOPROXY="+proxy)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.Bytes(), stderr.Bytes(), err
	}
	out, stderr, err := run("off")
	if err != nil && bytes.Contains(stderr, []byte("GOPROXY=off")) {
		proxy, perr := exec.Command("go", "env", "GOPROXY").Output()
		if perr != nil {
			t.Fatalf("go env GOPROXY: %v", perr)
		}
		offline := stderr
		if out, stderr, err = run(strings.TrimSpace(string(proxy))); err != nil {
			msg := "go %s: the module cache lacks a module it needs and the proxy did not supply it " +
				"(run `go mod download` in the repository first)\noffline: %s\nwith the proxy: %s"
			if os.Getenv("CI") == "true" {
				t.Fatalf(msg, strings.Join(args, " "), offline, stderr)
			}
			t.Skipf(msg, strings.Join(args, " "), offline, stderr)
		}
	}
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// repoModules returns the repository's root directory and its Go modules'
// directories relative to it ("." first): every go.mod outside testdata and
// outside directories the go command ignores (names starting with . or _).
func repoModules(t *testing.T) (root string, dirs []string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && name == "go.mod" {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs) // "." sorts first
	if len(dirs) == 0 || dirs[0] != "." {
		t.Fatalf("no go.mod at the repository's root %s (found %v)", root, dirs)
	}
	return root, dirs
}

// TestWorkspace checks what lets `go run ./bench` and make test work from
// the root although the bench and the library (client, proto, fence) are
// modules of their own: go.work uses every module of the repository; the Makefile's PKGS
// (what make test, vet and staticcheck cover) names every one; and the
// workspace compiles each module's packages and tests against the same
// versions as the module alone, so that what the repository tests and
// builds is what `go install` and the client's importers get. Alone
// (GOWORK=off) each module must resolve its own tests' imports: the client
// module's tests import nothing of the root module.
func TestWorkspace(t *testing.T) {
	root, dirs := repoModules(t)
	work := filepath.Join(root, "go.work")
	cmd := exec.Command("go", "work", "edit", "-json")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "GOWORK="+work)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go work edit -json: %v", err)
	}
	var w struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &w); err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, u := range w.Use {
		used = append(used, filepath.ToSlash(filepath.Clean(u.DiskPath)))
	}
	slices.Sort(used)
	if !slices.Equal(used, dirs) {
		t.Errorf("go.work uses %v; the repository's modules are %v (go work use DIR)", used, dirs)
	}

	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^PKGS\s*:?=(.*)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no PKGS")
	}
	pkgs := strings.Fields(string(m[1]))
	for _, d := range dirs {
		want := "./" + d + "/..."
		if d == "." {
			want = "./..."
		}
		if !slices.Contains(pkgs, want) {
			t.Errorf("the Makefile's PKGS %v lacks %s: make test, vet and staticcheck would skip that module", pkgs, want)
		}
	}

	const f = "{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{end}}"
	for _, d := range dirs {
		dir := filepath.Join(root, d)
		versions := func(work string) map[string]string {
			v := map[string]string{}
			for _, line := range goIn(t, dir, work, "-mod=readonly", "list", "-deps", "-test", "-f", f, "./...") {
				// version: the module's version, and its replacement's
				// (a replace in one workspace module's go.mod applies to
				// the whole workspace).
				path, version, _ := strings.Cut(line, " ")
				if path != "" && path != mod && !strings.HasPrefix(path, mod+"/") {
					v[path] = version
				}
			}
			return v
		}
		alone, inWork := versions("off"), versions(work)
		for path, v := range inWork {
			if alone[path] != v {
				t.Errorf("module %s: the workspace compiles %s's packages with %s %s, the module alone with %q: "+
					"make the module alone select the same (its go.mod's require or replace)", d, d, path, v, alone[path])
			}
		}
		for path, v := range alone {
			if _, ok := inWork[path]; !ok {
				t.Errorf("module %s: %s %s is compiled outside the workspace only", d, path, v)
			}
		}
	}
}
