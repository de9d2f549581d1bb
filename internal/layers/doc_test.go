package layers

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A package's doc.go says what it may import directly in one sentence of a
// fixed shape, and what it must not import in another:
//
//	<name> may import lockd/a, lockd/b (why), github.com/x/y and the standard library.
//	<name> may import only the standard library.
//	It must not import net, lockd/c, lockd/cmd/... or github.com/x/... (why).
//
// <name> is the last element of the package's import path (cmd/lockd's is
// lockd). A name is a path: lockd/P is the package github.com/lockd-dev/lockd/P,
// a path whose first element holds a dot is a third-party module (its
// module path, not one of its packages: github.com/hashicorp/raft-wal
// covers raft-wal/fs), any other path a standard-library package. The
// "may import" sentence names lockd packages and third-party modules only,
// each exactly (the standard library is allowed whole; what of it a layer
// forbids is the rules map's noStd and the other sentence's business); the
// "must not import" sentence names any kind, and a name ending in "/..."
// covers that path and everything below it, as the go command reads it.
// Either list may end at a period, a colon or a semicolon, so the sentence
// can go on with its reason; a name may be followed by a parenthesis that
// says why, which the parser skips.
//
// Why the allow list lives in the doc and not in the rules map: a reader
// of the package finds its layer where they read about the package, and
// one list cannot disagree with a copy of it. The test takes the sentence
// as the package's allow list, and holds it to the truth both ways: every
// lockd package and third-party module the package imports is named, and
// every name is one the package imports (a name it no longer imports is a
// permission nothing uses, which is how a rule drifts from the code). The
// map keeps what a sentence states badly and a test must compute: what
// must not appear in the transitive dependencies (noDeps), the standard
// packages a layer forbids (noStd), the calls a pure state machine must
// not make (noCalls), and which package alone may import a library
// (owners); a name in the "may import" sentence that those forbid fails.
// "Must not import" is about direct imports, as "may import" is: the
// transitive prohibitions are noDeps'. Test files are outside both, as
// they are outside the map's rules: a package's tests import what they
// need (internal/e2e and ops hold nothing else).

// docImports is what a package's doc.go says of its imports.
type docImports struct {
	// may holds the lockd packages (full import paths) and third-party
	// modules (module paths) the package may import directly.
	may []string
	// mustNot holds import paths (lockd packages, standard packages) and
	// module paths (third-party), or patterns ending in "/...".
	mustNot []string
}

// The shapes, for messages.
const (
	mayShape     = "«NAME may import lockd/a, github.com/x/y and the standard library.» or «NAME may import only the standard library.»"
	mustNotShape = "«It must not import lockd/a, net or github.com/x/... .»"
)

// readDocImports reads the package comment of dir/doc.go and returns its
// import sentences.
func readDocImports(dir, name string) (docImports, error) {
	path := filepath.Join(dir, "doc.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		return docImports{}, fmt.Errorf("a package states its layer in its doc.go: %w", err)
	}
	if f.Doc == nil {
		return docImports{}, fmt.Errorf("%s has no package comment, so no %s", path, strings.ReplaceAll(mayShape, "NAME", name))
	}
	d, err := parseDocImports(name, f.Doc.Text())
	if err != nil {
		return docImports{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// parseDocImports finds the two sentences of the package name in the text
// of its package comment.
func parseDocImports(name, text string) (docImports, error) {
	text = strings.Join(strings.Fields(text), " ")
	var d docImports
	shape := strings.ReplaceAll(mayShape, "NAME", name)

	body, err := sentence(text, name+" may import ", shape)
	if err != nil {
		return d, err
	}
	list, ok := strings.CutSuffix(body, " and the standard library")
	if !ok {
		if body != "only the standard library" {
			return d, fmt.Errorf("the «may import» sentence lists %q: it ends with «and the standard library», or reads %s", body, shape)
		}
		list = ""
	}
	names, err := split(strings.TrimSuffix(list, ","), "and")
	if err != nil {
		return d, fmt.Errorf("the «may import» sentence: %w (%s)", err, shape)
	}
	for _, n := range names {
		switch {
		case strings.HasSuffix(n, "/..."):
			return d, fmt.Errorf("the «may import» sentence names %s: name each package or module it imports", n)
		case !strings.HasPrefix(n, "lockd/") && !thirdParty(n):
			return d, fmt.Errorf("the «may import» sentence names %s, neither lockd/PACKAGE nor a module path (whose first element holds a dot), so a standard package: "+
				"the standard library is allowed whole (what of it the package must not import goes in the other sentence)", n)
		}
		d.may = append(d.may, fullPath(n))
	}

	body, err = sentence(text, "It must not import ", mustNotShape)
	if err != nil {
		return d, err
	}
	names, err = split(body, "or")
	if err != nil {
		return d, fmt.Errorf("the «must not import» sentence: %w (%s)", err, mustNotShape)
	}
	if len(names) == 0 {
		return d, fmt.Errorf("the «must not import» sentence names nothing (%s)", mustNotShape)
	}
	for _, n := range names {
		d.mustNot = append(d.mustNot, fullPath(n))
	}
	return d, nil
}

// sentence returns what follows the one occurrence of start in text, up to
// the end of its list: a period, colon or semicolon outside parentheses and
// followed by a space or the end; the parentheses are left out.
func sentence(text, start, shape string) (string, error) {
	var at []int
	for i := 0; ; {
		j := strings.Index(text[i:], start)
		if j < 0 {
			break
		}
		if i+j == 0 || text[i+j-1] == ' ' {
			at = append(at, i+j)
		}
		i += j + len(start)
	}
	switch len(at) {
	case 0:
		return "", fmt.Errorf("no sentence %s", shape)
	case 1:
	default:
		return "", fmt.Errorf("%d sentences start «%s»: one says it all", len(at), strings.TrimSpace(start))
	}
	s := text[at[0]+len(start):]
	var b strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '(':
			depth++
			continue
		case c == ')' && depth > 0:
			depth--
			continue
		case depth > 0:
			continue
		case c == '.' && i > 0 && s[i-1] == '/' && strings.HasPrefix(s[i:], "..."):
			// A pattern's "...", not the sentence's end.
			b.WriteString("...")
			i += 2
			continue
		case strings.IndexByte(".:;", c) >= 0 && (i+1 == len(s) || s[i+1] == ' '):
			return strings.ReplaceAll(strings.Join(strings.Fields(b.String()), " "), " ,", ","), nil
		}
		b.WriteByte(c)
	}
	return "", fmt.Errorf("the sentence starting «%s» does not end (a period, colon or semicolon after its last name)", strings.TrimSpace(start))
}

// split cuts a list of paths, "a, b, c <conj> d", into its paths.
func split(list, conj string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	var names []string
	list = strings.ReplaceAll(list, ", "+conj+" ", ", ") // "a, b, or c"
	for _, n := range strings.Split(strings.ReplaceAll(list, " "+conj+" ", ", "), ",") {
		n = strings.TrimSpace(n)
		if n == "" || strings.ContainsAny(n, " \t") || strings.HasPrefix(n, "/") || strings.HasSuffix(n, "/") {
			return nil, fmt.Errorf("%q is not a list of import paths (or module paths): %q is not one", list, n)
		}
		names = append(names, n)
	}
	return names, nil
}

// thirdParty reports whether path (an import or module path) is outside
// the standard library: its first element holds a dot.
func thirdParty(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return strings.Contains(first, ".")
}

// fullPath turns a name of the sentences into the path it stands for.
func fullPath(name string) string {
	if rest, ok := strings.CutPrefix(name, "lockd/"); ok {
		return mod + "/" + rest
	}
	return name
}

// shortName is fullPath's inverse, for messages.
func shortName(path string) string {
	if rest, ok := strings.CutPrefix(path, mod+"/"); ok {
		return "lockd/" + rest
	}
	return path
}

// matches reports whether the pattern names path: the same path, or, for a
// pattern ending in "/...", the path before it or any path below it.
func matches(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// docProblems checks a package's direct imports (non-test) against what
// its doc.go says and against its rule r: what the package imports that
// the «may import» sentence does not name, a name it does not import, a
// name r (noDeps) or owners forbid, a name in both sentences, and an
// import the «must not import» sentence names. moduleOf maps a
// third-party import to its module's path.
func docProblems(name string, d docImports, imports []string, moduleOf map[string]string, r rule) []string {
	var out []string
	used := map[string]bool{}
	for _, imp := range imports {
		key := imp // what the sentences call it
		switch {
		case imp == mod || strings.HasPrefix(imp, mod+"/"):
		case thirdParty(imp):
			m := moduleOf[imp]
			if m == "" {
				out = append(out, fmt.Sprintf("%s imports %s, whose module go list does not tell", name, imp))
				continue
			}
			key = m
		default: // the standard library
			for _, p := range d.mustNot {
				if matches(p, imp) {
					out = append(out, fmt.Sprintf("%s imports %s, which its doc.go says it must not import", name, imp))
				}
			}
			continue
		}
		what := shortName(key)
		if key != imp {
			what = fmt.Sprintf("%s (module %s)", imp, key)
		}
		if !slices.Contains(d.may, key) {
			out = append(out, fmt.Sprintf("%s imports %s, which its doc.go's «may import» sentence does not name: name %s there if its layer allows it", name, what, shortName(key)))
		}
		used[key] = true
		for _, p := range d.mustNot {
			if matches(p, key) || matches(p, imp) {
				out = append(out, fmt.Sprintf("%s imports %s, which its doc.go says it must not import", name, what))
			}
		}
	}
	for _, m := range d.may {
		if !used[m] {
			out = append(out, fmt.Sprintf("%s's doc.go names %s in its «may import» sentence, but %s does not import it: the sentence lists what the package imports, so drop it", name, shortName(m), name))
		}
		if hasPrefix(m, r.noDeps) {
			out = append(out, fmt.Sprintf("%s's doc.go says it may import %s, which its rule in internal/layers forbids (noDeps)", name, shortName(m)))
		}
		for lib, owner := range owners {
			if name != owner && hasPrefix(m, []string{lib}) {
				out = append(out, fmt.Sprintf("%s's doc.go says it may import %s: only %s may", name, m, owner))
			}
		}
		for _, p := range d.mustNot {
			if matches(p, m) {
				out = append(out, fmt.Sprintf("%s's doc.go says both that it may import %s and that it must not import %s", name, shortName(m), shortName(p)))
			}
		}
	}
	slices.Sort(out)
	return out
}

func TestParseDocImports(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       docImports
		err        string // a part of the error; "" = none
	}{
		{name: "repl", text: `Package repl is the seam.

# What it must not import

repl may import lockd/api, lockd/shard (the table), lockd/store and the standard library. It
must not import lockd/repl/... (its subpackages: they import it), github.com/hashicorp/...,
lockd/engine or lockd/cmd/...: the engine depends on repl.`,
			want: docImports{may: []string{mod + "/api", mod + "/shard", mod + "/store"},
				mustNot: []string{mod + "/repl/...", "github.com/hashicorp/...", mod + "/engine", mod + "/cmd/..."}}},
		{name: "api", text: "api may import only the standard library. It must not import lockd/... .",
			want: docImports{mustNot: []string{mod + "/..."}}},
		{name: "api", text: "api may import only the standard library. It must not import lockd/....",
			want: docImports{mustNot: []string{mod + "/..."}}},
		{name: "raftnode", text: "raftnode may import github.com/hashicorp/raft, lockd/repl, and the standard library (crypto/tls included); no other. It must not import net, os, or lockd/proto; it is the only one.",
			want: docImports{may: []string{"github.com/hashicorp/raft", mod + "/repl"}, mustNot: []string{"net", "os", mod + "/proto"}}},
		{name: "x", text: "Package x. It must not import net.", err: "no sentence «x may import"},
		{name: "x", text: "Package x. x may import only the standard library.", err: "no sentence «It must not import"},
		{name: "x", text: "x may import only the standard library. It must not import net. It must not import os.", err: "2 sentences start «It must not import»"},
		{name: "x", text: "x may import lockd/a and the standard library. x may import lockd/b and the standard library. It must not import net.", err: "2 sentences start «x may import»"},
		{name: "x", text: "x may import lockd/a. It must not import net.", err: "ends with «and the standard library»"},
		{name: "x", text: "x may import lockd/internal/... and the standard library. It must not import net.", err: "name each package"},
		{name: "x", text: "x may import net/http and the standard library. It must not import os.", err: "a standard package"},
		{name: "x", text: "x may import the wire codec and the standard library. It must not import os.", err: "not a list of import paths"},
		{name: "x", text: "x may import only the standard library. It must not import the server packages.", err: "not a list of import paths"},
		{name: "x", text: "x may import only the standard library. It must not import anything under cmd/.", err: "not a list of import paths"},
		{name: "x", text: "x may import only the standard library. It must not import net", err: "does not end"},
		{name: "lockd", text: "The daemon. lockd may import lockd/engine and the standard library. It must not import lockd/client.",
			want: docImports{may: []string{mod + "/engine"}, mustNot: []string{mod + "/client"}}},
	} {
		got, err := parseDocImports(tc.name, tc.text)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %q: error %v, want one containing %q", tc.name, tc.text, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %q: %v", tc.name, tc.text, err)
		case tc.err == "" && (!slices.Equal(got.may, tc.want.may) || !slices.Equal(got.mustNot, tc.want.mustNot)):
			t.Errorf("%s: %q:\n got %+v\nwant %+v", tc.name, tc.text, got, tc.want)
		}
	}
}

func TestDocProblems(t *testing.T) {
	lockd := func(p string) string { return mod + "/" + p }
	moduleOf := map[string]string{
		"github.com/hashicorp/raft-wal/fs":   "github.com/hashicorp/raft-wal",
		"github.com/hashicorp/raft":          "github.com/hashicorp/raft",
		"github.com/panjf2000/gnet/v2":       "github.com/panjf2000/gnet/v2",
		"github.com/klauspost/compress/s2":   "github.com/klauspost/compress",
		"github.com/cespare/xxhash/v2":       "github.com/cespare/xxhash/v2",
		"github.com/prometheus/common/model": "github.com/prometheus/common",
	}
	repl := rule{noDeps: []string{"github.com/hashicorp/", lockd("engine")}}
	for _, tc := range []struct {
		what    string
		name    string
		doc     docImports
		imports []string
		r       rule
		want    []string // a part of each problem, in order
	}{
		{what: "true", name: "repl",
			doc:     docImports{may: []string{lockd("shard"), lockd("store")}, mustNot: []string{lockd("engine"), "net"}},
			imports: []string{"fmt", lockd("shard"), lockd("store")}, r: repl},
		{what: "an import the sentence does not name", name: "repl",
			doc:     docImports{may: []string{lockd("shard"), lockd("store")}, mustNot: []string{lockd("engine")}},
			imports: []string{lockd("api"), lockd("shard"), lockd("store")}, r: repl,
			want: []string{"repl imports lockd/api, which its doc.go's «may import» sentence does not name"}},
		{what: "a name nothing imports", name: "repl",
			doc:     docImports{may: []string{lockd("shard"), lockd("store")}, mustNot: []string{lockd("engine")}},
			imports: []string{lockd("shard")}, r: repl,
			want: []string{"names lockd/store in its «may import» sentence, but repl does not import it"}},
		{what: "a name the rule forbids", name: "repl",
			doc:     docImports{may: []string{lockd("engine"), "github.com/hashicorp/raft"}, mustNot: []string{"net"}},
			imports: []string{lockd("engine"), "github.com/hashicorp/raft"}, r: repl,
			want: []string{"may import github.com/hashicorp/raft, which its rule in internal/layers forbids", "may import github.com/hashicorp/raft: only repl/raftnode may",
				"may import lockd/engine, which its rule in internal/layers forbids"}},
		{what: "an import the other sentence forbids", name: "shard",
			doc:     docImports{may: []string{"github.com/cespare/xxhash/v2"}, mustNot: []string{"net", "os/...", "github.com/panjf2000/..."}},
			imports: []string{"os/exec", "github.com/cespare/xxhash/v2", "net/http"}, r: rule{},
			want: []string{"shard imports os/exec, which its doc.go says it must not import"}},
		{what: "both sentences", name: "shard",
			doc:     docImports{may: []string{"github.com/panjf2000/gnet/v2"}, mustNot: []string{"github.com/panjf2000/..."}},
			imports: []string{"github.com/panjf2000/gnet/v2"}, r: rule{},
			want: []string{"shard imports github.com/panjf2000/gnet/v2, which its doc.go says it must not import",
				"says both that it may import github.com/panjf2000/gnet/v2 and that it must not import github.com/panjf2000/..."}},
		{what: "a module, not its package", name: "repl/raftnode",
			doc:     docImports{may: []string{"github.com/hashicorp/raft-wal", "github.com/hashicorp/raft"}, mustNot: []string{lockd("engine")}},
			imports: []string{"github.com/hashicorp/raft-wal/fs", "github.com/hashicorp/raft"}, r: rule{}},
		{what: "a package named instead of its module", name: "repl/records",
			doc:     docImports{may: []string{"github.com/klauspost/compress/s2"}, mustNot: []string{"net"}},
			imports: []string{"github.com/klauspost/compress/s2"}, r: rule{},
			want: []string{"repl/records imports github.com/klauspost/compress/s2 (module github.com/klauspost/compress), which its doc.go's «may import» sentence does not name",
				"github.com/klauspost/compress/s2 in its «may import» sentence, but repl/records does not import it"}},
		{what: "an import of unknown module", name: "x",
			doc: docImports{mustNot: []string{"net"}}, imports: []string{"example.com/y"}, r: rule{},
			want: []string{"x imports example.com/y, whose module go list does not tell"}},
	} {
		got := docProblems(tc.name, tc.doc, tc.imports, moduleOf, tc.r)
		ok := len(got) == len(tc.want)
		for i := 0; ok && i < len(got); i++ {
			ok = strings.Contains(got[i], tc.want[i])
		}
		if !ok {
			t.Errorf("%s: got %d problems:\n%s\nwant %d, containing:\n%s", tc.what, len(got), strings.Join(got, "\n"), len(tc.want), strings.Join(tc.want, "\n"))
		}
	}
}

func TestReadDocImports(t *testing.T) {
	for _, tc := range []struct {
		what, file string // file "" = no doc.go
		err        string
	}{
		{what: "no doc.go", err: "a package states its layer in its doc.go"},
		{what: "no package comment", file: "package x\n", err: "has no package comment"},
		{what: "a comment without the sentences", file: "// Package x does things.\npackage x\n", err: "no sentence «x may import"},
		{what: "a build constraint", file: "//go:build linux\n\n// Package x.\n//\n// x may import lockd/proto and the\n// standard library. It must not import\n// net.\npackage x\n"},
	} {
		dir := t.TempDir()
		if tc.file != "" {
			if err := os.WriteFile(filepath.Join(dir, "doc.go"), []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		d, err := readDocImports(dir, "x")
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.what, err)
		case tc.err == "" && (!slices.Equal(d.may, []string{mod + "/proto"}) || !slices.Equal(d.mustNot, []string{"net"})):
			t.Errorf("%s: got %+v", tc.what, d)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.what, err, tc.err)
		}
	}
}
