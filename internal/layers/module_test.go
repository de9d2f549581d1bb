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

// benchOnly names, by path prefix, the modules that only the bench module
// needs: etcd's client and what it brings (gRPC, zap, the old and new etcd
// trees), the plots (gonum, their fonts and image libraries) and the
// histograms. A program that imports the client must not inherit any of
// them through the root go.mod, where minimal version selection would
// raise its own versions of them.
var benchOnly = []string{
	"go.etcd.io/", "github.com/coreos/", "google.golang.org/grpc", "google.golang.org/genproto/",
	"github.com/grpc-ecosystem/", "github.com/golang/protobuf", "go.opentelemetry.io/", "go.uber.org/zap",
	"gonum.org/", "codeberg.org/", "git.sr.ht/~sbinet/", "github.com/ajstarks/", "github.com/golang/freetype",
	"golang.org/x/image", "github.com/HdrHistogram/",
}

// serverNeeds lets through the modules of benchOnly that the server itself
// needs, each brought in by the library named (the first package outside
// lockd on the path `go mod why -m` prints in the root module), which the
// test checks is still so: a module the server stops needing, or comes to
// need another way, is forbidden again.
var serverNeeds = map[string]string{
	"go.uber.org/zap":              "github.com/panjf2000/gnet/v2",        // gnet's default logger (engine)
	"github.com/coreos/etcd":       "github.com/hashicorp/raft-wal/",      // pkg/fileutil, for the raft log's files
	"github.com/coreos/pkg":        "github.com/hashicorp/raft-wal/",      // capnslog, which fileutil logs with
	"github.com/coreos/go-systemd": "github.com/hashicorp/raft-wal/",      // capnslog's journal writer
	"go.etcd.io/bbolt":             "github.com/hashicorp/raft-boltdb/v2", // the raft stable store
}

// TestClientConsumerModules builds a throwaway module that imports only
// github.com/lockd-dev/lockd/client (a replace to this checkout, as a
// released version would be required) and checks what it inherits: its
// module graph (`go list -m all`, what minimal version selection weighs)
// holds none of the bench's modules, and the packages it compiles are the
// standard library and lockd's own, nothing third-party. It runs offline
// from the module cache (GOPROXY=off) and asks the proxy only when the cache
// lacks a go.mod; without either it skips, except under CI=true.
func TestClientConsumerModules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/lockdconsumer\n\ngo 1.26.0\n\n" +
		"require " + mod + " v0.0.0-00010101000000-000000000000\n\n" +
		"replace " + mod + " => " + root + "\n"
	// The root's go.sum covers the consumer's graph, a subset of the
	// root's: the go command verifies against it instead of asking the
	// checksum database.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"go.mod":  []byte(gomod),
		"go.sum":  sum,
		"main.go": []byte("package main\n\nimport _ \"" + mod + "/client\"\n\nfunc main() {}\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	modules := goOffline(t, dir, "-mod=mod", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	t.Logf("a module importing only the client inherits %d modules:\n%s", len(modules), strings.Join(modules, "\n"))
	for _, line := range modules {
		path, _, _ := strings.Cut(line, " ")
		if hasPrefix(path, benchOnly) && serverNeeds[path] == "" {
			t.Errorf("a module importing only %s/client requires %s: only the bench module needs it (keep it out of the root go.mod)", mod, line)
		}
	}
	for path, via := range serverNeeds {
		why := goOffline(t, root, "-mod=readonly", "mod", "why", "-vendor", "-m", path)
		if len(why) < 3 || !strings.HasPrefix(why[1], mod+"/") || !hasPrefix(why[2], []string{via}) {
			t.Errorf("%s is let through only as what %s brings into the server, and `go mod why -m` shows another path or none:\n%s\n"+
				"no lockd package may import it itself; if the server no longer needs it, drop it from serverNeeds",
				path, via, strings.Join(why, "\n"))
		}
	}
	for _, pkg := range goOffline(t, dir, "-mod=mod", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".") {
		if pkg != "" && pkg != "example.com/lockdconsumer" && !strings.HasPrefix(pkg, mod+"/") {
			t.Errorf("a program importing only %s/client compiles %s", mod, pkg)
		}
	}
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
// the root although the bench is a module of its own: go.work uses every
// module of the repository; the Makefile's PKGS (what make test, vet and
// staticcheck cover) names every one; and the workspace compiles each
// module's packages and tests against the same versions as the module
// alone, so that what the repository tests and builds is what `go install`
// and the client's importers get.
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
