package layers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const mod = "github.com/lockd-dev/lockd"

// rule is one package's place in the layers (docs/DESIGN.md "Layers"),
// stated by kind of import rather than by listing what a dependency happens
// to pull in, so a dependency's upgrade cannot break it. What a package may
// import directly is not here: its doc.go says it in a sentence the test
// reads (doc_test.go, which says why); the rule holds the rest:
//
//   - noStd: standard-library packages (and their subpackages) it must not
//     import directly;
//   - noDeps: path prefixes that must not appear anywhere in its transitive
//     dependencies (nor in its doc.go's «may import» sentence);
//   - noCalls: texts that must not appear in its non-test source (a clock
//     read, a goroutine) for packages that are pure state machines.
type rule struct {
	noStd, noDeps, noCalls []string
}

// Layer groups, for readability.
var (
	lockd = func(pkgs ...string) []string {
		out := make([]string, len(pkgs))
		for i, p := range pkgs {
			out[i] = mod + "/" + p
		}
		return out
	}
	gnet      = "github.com/panjf2000/"
	hashicorp = "github.com/hashicorp/"
	cmds      = mod + "/cmd"
	noNetOrOS = []string{"net", "os", "syscall"}
)

// rules has one entry per package of the repository's modules (a package
// without a rule fails the test: a new package states its layer when it is
// added; a rule without a package fails too).
var rules = map[string]rule{
	"proto": {noStd: []string{"net", "os", "syscall", "io/fs", "time", "sync", "runtime", "unsafe", "fmt"}, noDeps: noNetOrOS},
	"shard": {noStd: []string{"net", "os", "syscall", "io"},
		noDeps:  append([]string{gnet, "net", "os"}, lockd("proto", "engine", "repl")...),
		noCalls: []string{"time.Now(", "time.Since(", "time.Sleep(", "time.After", "time.NewTimer", "time.Tick", "go func"}},
	// The identity file: the standard library (crypto included) only.
	"acl": {noStd: []string{"net", "syscall", "unsafe"},
		noDeps: append([]string{gnet, "net"}, lockd("proto", "shard", "store", "engine", "repl", "admin", "client")...)},
	"store": {noStd: []string{"net"}, noDeps: append([]string{"net"}, lockd("proto", "shard", "engine", "repl")...)},
	// The seam, the single node and the kernel both cluster modes share.
	"repl": {noDeps: append([]string{gnet, cmds, hashicorp}, lockd("engine", "proto", "client", "admin", "repl/raftnode", "repl/internal")...)},
	// The priority mode: never the raft mode nor hashicorp's libraries.
	"repl/priority": {noDeps: append([]string{gnet, cmds, hashicorp}, lockd("engine", "proto", "client", "admin", "repl/raftnode", "repl/internal")...)},
	// The priority member's decisions as a pure state machine: the api's
	// names, ratelog and the standard library; no I/O, no clock, no lock, no
	// goroutine (its driver, repl/priority, does all of that).
	"repl/priority/machine": {noStd: append(noNetOrOS, "io", "sync", "time/tzdata", "math/rand"),
		noDeps:  append([]string{gnet, cmds, hashicorp}, lockd("shard", "store", "engine", "proto", "client", "admin", "repl", "repl/records", "repl/memberauth", "repl/raftnode")...),
		noCalls: []string{"time.Now(", "time.Since(", "time.Until(", "time.Sleep(", "time.After", "time.NewTimer", "time.NewTicker", "time.Tick", "go func", "sync.Mutex", "sync.RWMutex", "atomic."}},
	// The raft mode: the only importer of hashicorp's libraries.
	"repl/raftnode": {noDeps: append([]string{gnet, cmds}, lockd("engine", "proto", "client", "admin", "repl/priority", "repl/internal")...)},
	// Members that prove who they are (§8.4), for both modes: the
	// cluster configuration and the standard library, nothing of either
	// mode.
	"repl/memberauth": {noDeps: append([]string{gnet, cmds, hashicorp}, lockd("engine", "proto", "client", "admin", "repl/priority", "repl/raftnode", "repl/records", "repl/internal")...)},
	// The format both cluster modes replicate: the table's records and
	// the compressor, no I/O.
	"repl/records": {noStd: append(noNetOrOS, "io"),
		noDeps: append([]string{gnet, "net"}, lockd("proto", "store", "engine", "repl")...)},
	// Helpers for the tests of repl and its subpackages (only _test.go
	// files import it).
	"repl/internal/repltest": {noDeps: append([]string{gnet, cmds}, lockd("engine", "proto", "store")...)},
	"engine":                 {noDeps: append([]string{cmds}, lockd("client", "bench", "admin")...)},
	// The HTTP/JSON API: requests go through the engine's in-process
	// connection as frames (proto), so no lock semantics live here; not
	// a gateway over the client.
	"httpapi": {noDeps: append([]string{cmds}, lockd("client", "bench", "admin")...)},
	"admin":   {noDeps: append([]string{cmds}, lockd("client", "bench")...)},
	"client":  {noDeps: append([]string{gnet}, lockd("engine", "shard", "store", "repl")...)},
	"fence":   {noStd: []string{"net", "os"}, noDeps: []string{"net"}},
	// The admin endpoint's JSON types and names: the standard library
	// only, nothing of the module, so any consumer can import them.
	"api": {noDeps: []string{mod + "/"}},
	// TLS material: the standard library only, nothing of the module
	// (the engine, admin, repl and cmd/lockd all use it).
	"tlsconf":   {noDeps: []string{mod + "/"}},
	"cmd/lockd": {noDeps: lockd("client", "bench")},
	// The CLI: the client, the admin endpoint's types, cobra for the
	// command line; never a server package.
	"cmd/lockctl": {noDeps: append([]string{gnet}, lockd("engine", "shard", "store", "repl", "admin")...)},
	// The binaries' version line: the standard library only, so every
	// command may import it.
	"internal/version": {noStd: []string{"net", "os", "syscall"}, noDeps: []string{mod + "/"}},
	// The bench, a module of its own (bench/go.mod) so that its peers'
	// clients (etcd, gRPC) and its plots (gonum) stay out of the root
	// go.mod.
	"bench": {noDeps: []string{cmds}},
	// The handoff cycle's breakdown: raw frames against a lockd
	// started apart; its test serves one in process (lockdtest).
	"bench/cycle":        {noDeps: append([]string{cmds}, lockd("client", "bench", "admin")...)},
	"internal/lockdtest": {noDeps: append([]string{cmds}, lockd("client", "bench")...)},
	"internal/layers":    {},
	// One log line per interval for a flood of like events: the standard
	// library only, time an input (no clock read, no goroutine), so the
	// pure priority machine may use it too.
	"internal/ratelog": {noStd: append(noNetOrOS, "io", "log"), noDeps: []string{mod + "/"},
		noCalls: []string{"time.Now(", "time.Since(", "time.Until(", "time.Sleep(", "time.After", "time.NewTimer", "time.Tick", "go func"}},
	// The operator's assets (unit, rules, dashboard): no code; its tests
	// drive the binary from outside.
	"ops": {noDeps: []string{mod + "/"}},
	// The tests' bounded wait: the standard library only, so that every
	// test and harness may use it.
	"internal/wait": {noStd: noNetOrOS, noDeps: []string{mod + "/"}},
	// Throwaway certificates for tests and bench: the standard library only.
	"internal/testcerts": {noDeps: []string{mod + "/"}},
	"internal/e2e":       {noDeps: []string{cmds}},
	// The OpenAPI validator of the HTTP API's tests: the standard
	// library only.
	"internal/openapitest": {noDeps: []string{mod + "/"}},
	// Test tools: the standard library only, and nothing of the module
	// for the proxy; the cluster harness drives the lockd binary from
	// outside, so it imports no server package (nor client: the tests
	// that use it bring their own).
	"internal/faultproxy": {noDeps: []string{mod + "/"}},
	// Ports for tests and harnesses: the standard library only.
	"internal/freeport":    {noDeps: []string{mod + "/"}},
	"internal/clustertest": {noDeps: append([]string{gnet, cmds}, lockd("engine", "shard", "store", "repl", "admin", "client", "bench")...)},
	// The history checkers know nothing of the wire or the server: the
	// standard library and porcupine only.
	"internal/history": {noDeps: append([]string{gnet, cmds}, lockd("proto", "engine", "shard", "store", "repl", "admin", "client", "bench", "internal/")...)},
	// The chaos command drives real lockd processes from outside, as a
	// user would: the client library, raw frames of the wire protocol
	// (proto: what the members answer, byte for byte, around a freeze or a
	// handover), the fence, the harness and the checkers; never a server
	// package.
	"chaos": {noDeps: append([]string{gnet, cmds}, lockd("engine", "shard", "store", "repl", "admin", "bench")...)},
}

// owners names, for some third-party libraries, the one package of the
// module that may import them directly, whatever another package's doc.go
// says.
var owners = map[string]string{
	hashicorp:                        "repl/raftnode",
	"github.com/klauspost/compress/": "repl/records",
}

// goList runs go list with format f over pkgs in the module directory dir
// (in the workspace when go.work is present, as make test runs it).
func goList(t *testing.T, dir, f string, pkgs ...string) []string {
	t.Helper()
	args := append([]string{"list", "-f", f}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %v in %s: %v\n%s", pkgs, dir, err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// hasPrefix reports whether path is one of prefixes or inside one of them
// (a prefix ending in "/" matches anything that starts with it).
func hasPrefix(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") ||
			(strings.HasSuffix(p, "/") && strings.HasPrefix(path, p)) {
			return true
		}
	}
	return false
}

// TestImportRules checks every package of the repository's modules (the
// root module and the bench's, see repoModules) against its doc.go's
// import sentences (doc_test.go) and its rule, and that every rule still
// names a package.
func TestImportRules(t *testing.T) {
	root, dirs := repoModules(t)
	seen := map[string]bool{}
	for _, d := range dirs {
		modDir := filepath.Join(root, d)
		// The module of every third-party package the module's packages
		// depend on: a doc.go names modules, a package imports packages.
		moduleOf := map[string]string{}
		for _, line := range goList(t, modDir, "{{if not .Standard}}{{.ImportPath}}|{{with .Module}}{{.Path}}{{end}}{{end}}", "-deps", "./...") {
			if path, m, ok := strings.Cut(line, "|"); ok {
				moduleOf[path] = m
			}
		}
		for _, line := range goList(t, modDir, "{{.ImportPath}}|{{.Dir}}|{{join .Imports \" \"}}|{{join .GoFiles \" \"}}", "./...") {
			f := strings.Split(line, "|")
			path, dir, imports, files := f[0], f[1], strings.Fields(f[2]), strings.Fields(f[3])
			name := strings.TrimPrefix(strings.TrimPrefix(path, mod), "/")
			seen[name] = true
			r, ok := rules[name]
			if !ok {
				t.Errorf("package %s has no layering rule: add one to internal/layers", name)
				continue
			}
			t.Run(name, func(t *testing.T) {
				doc, err := readDocImports(dir, filepath.Base(path))
				if err != nil {
					t.Errorf("package %s: %v", name, err)
				} else {
					for _, p := range docProblems(name, doc, imports, moduleOf, r) {
						t.Error(p)
					}
				}
				check(t, name, modDir, dir, imports, files, r)
			})
		}
	}
	for name := range rules {
		if !seen[name] {
			t.Errorf("the rule for %s names no package of the modules %v: remove it, or list the module that holds it", name, dirs)
		}
	}
}

// check holds the package to its rule r: no forbidden standard package and
// no library another package owns among its imports, nothing of noDeps in
// its dependencies, nothing of noCalls in its source.
func check(t *testing.T, name, modDir, dir string, imports, files []string, r rule) {
	for _, imp := range imports {
		first, _, _ := strings.Cut(imp, "/")
		if std := !strings.Contains(first, "."); std && hasPrefix(imp, r.noStd) {
			t.Errorf("%s imports %s, which its layer forbids", name, imp)
		}
		for lib, owner := range owners {
			if name != owner && hasPrefix(imp, []string{lib}) {
				t.Errorf("%s imports %s: only %s may", name, imp, owner)
			}
		}
	}
	if len(r.noDeps) > 0 {
		for _, dep := range goList(t, modDir, "{{.ImportPath}}", "-deps", mod+"/"+name) {
			if dep != mod+"/"+name && hasPrefix(dep, r.noDeps) {
				t.Errorf("%s depends on %s, which its layer forbids", name, dep)
			}
		}
	}
	for _, file := range files {
		if len(r.noCalls) == 0 {
			break
		}
		src, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range r.noCalls {
			if strings.Contains(string(src), bad) {
				t.Errorf("%s/%s uses %s: the package is a pure state machine", name, file, bad)
			}
		}
	}
}
