package layers

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks checks every relative link of the repository's Markdown
// files (the root's, docs/ and below, clients/ …): the file or directory it
// names exists, and a #fragment into a Markdown file names one of its
// headings, as GitHub makes their anchors. A page that moves, a heading
// that is reworded or a section split off into another file then fails
// here, naming the file and line of each link it broke, instead of
// leaving a reader at a dead end. Links to other sites are not fetched.
func TestDocLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("only %d Markdown files under %s: is the walk wrong?", len(files), root)
	}
	for _, bad := range brokenLinks(files, root) {
		t.Error(bad)
	}
}

// TestDocLinksFindsBrokenOnes runs the checker on pages written for it:
// each kind of break is reported once, with its file and line, and what
// resolves (a file, a directory, a heading with code and punctuation in
// it, a repeated heading, an anchor in the same page, a link inside code
// that is not a link) is not.
func TestDocLinksFindsBrokenOnes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/B.md", "# B\n\n## Identities and key ACLs: `--acl FILE`\n\n## Notes\n\n## Notes\n")
	write("docs/sub/c.go", "package c\n")
	write("A.md", strings.Join([]string{
		"# A",
		"[ok](docs/B.md) [ok](docs/B.md#identities-and-key-acls---acl-file) [ok](docs/B.md#notes-1)",
		"[ok](docs/sub/) [ok](#a) [ok](https://example.com/nowhere) ![ok](docs/sub/c.go)",
		"`[not a link](nowhere.md)`",
		"",
		"    [not a link either](nowhere.md)",
		"",
		"```",
		"[nor this](nowhere.md)",
		"```",
		"[missing file](docs/C.md)",
		"[a link whose text",
		"runs over a line](docs/B.md#no-such-heading)",
		"[missing here](#nowhere) [bad repeat](docs/B.md#notes-2)",
	}, "\n"))
	got := brokenLinks([]string{filepath.Join(dir, "A.md"), filepath.Join(dir, "docs/B.md")}, dir)
	want := []string{
		"A.md:11: docs/C.md: no such file or directory",
		"A.md:13: docs/B.md#no-such-heading: docs/B.md has no heading with that anchor",
		"A.md:14: #nowhere: A.md has no heading with that anchor",
		"A.md:14: docs/B.md#notes-2: docs/B.md has no heading with that anchor",
	}
	if !slices.Equal(got, want) {
		t.Errorf("broken links:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAnchor: GitHub's anchors, for headings of the repository's own kind.
func TestAnchor(t *testing.T) {
	for _, tc := range []struct{ heading, anchor string }{
		{"Identities and key ACLs: `--acl FILE`", "identities-and-key-acls---acl-file"},
		{"8.5 The admin endpoint with `--acl`", "85-the-admin-endpoint-with---acl"},
		{"lockd-priority ÷ one node: CPU", "lockd-priority--one-node-cpu"},
		{"The Python client against redis-py's Lock (issue 21)", "the-python-client-against-redis-pys-lock-issue-21"},
		{"Writes per grant, and why coalescing will not reach 10×", "writes-per-grant-and-why-coalescing-will-not-reach-10"},
		{"The proposer's linger (issue 22), 2026-12-01 23:14–23:44 UTC", "the-proposers-linger-issue-22-2026-12-01-23142344-utc"},
		{"**Bold** and [a link](x.md)", "bold-and-a-link"},
		{"The seam: engine ↔ node (package repl)", "the-seam-engine--node-package-repl"},
	} {
		if got := anchor(tc.heading); got != tc.anchor {
			t.Errorf("anchor(%q) = %q, want %q", tc.heading, got, tc.anchor)
		}
	}
}

// markdownFiles lists the .md files under root, leaving out hidden
// directories (.git, caches), testdata and vendored or installed trees.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// linkRE matches an inline link or image, [text](target) or
// [text](target "title"): the text may hold one level of brackets and
// run over lines; the target has no space.
var linkRE = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(<?([^()\s<>]+)>?(?:\s+"[^"]*")?\)`)

// brokenLinks returns one line per broken relative link of files: the
// file (relative to root), the line, the target and what is wrong.
func brokenLinks(files []string, root string) []string {
	anchors := map[string]map[string]bool{} // by absolute path
	anchorsOf := func(p string) (map[string]bool, error) {
		if a, ok := anchors[p]; ok {
			return a, nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[p] = a
		return a, nil
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		rel, _ := filepath.Rel(root, f)
		text := proseOnly(string(b))
		for _, m := range linkRE.FindAllStringSubmatchIndex(text, -1) {
			target := text[m[2]:m[3]]
			line := 1 + strings.Count(text[:m[2]], "\n")
			if u, err := url.Parse(target); err == nil && u.Scheme != "" {
				continue // another site, mailto:
			}
			path, frag, _ := strings.Cut(target, "#")
			if p, err := url.PathUnescape(path); err == nil {
				path = p
			}
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				if _, err := os.Stat(dest); err != nil {
					out = append(out, fmt.Sprintf("%s:%d: %s: no such file or directory", rel, line, target))
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			a, err := anchorsOf(dest)
			if err != nil {
				out = append(out, fmt.Sprintf("%s:%d: %s: %v", rel, line, target, err))
				continue
			}
			if !a[frag] {
				drel, _ := filepath.Rel(root, dest)
				out = append(out, fmt.Sprintf("%s:%d: %s: %s has no heading with that anchor", rel, line, target, filepath.ToSlash(drel)))
			}
		}
	}
	return out
}

// proseOnly blanks what Markdown does not read as links — fenced code
// blocks, indented code blocks (after a blank line), code spans — keeping
// every line where it was, so that line numbers still count.
func proseOnly(text string) string {
	lines := strings.Split(text, "\n")
	fence, indented := "", false
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
			lines[i] = ""
		case (strings.HasPrefix(l, "    ") || strings.HasPrefix(l, "\t")) && (indented || i == 0 || strings.TrimSpace(lines[i-1]) == ""):
			indented = true
			lines[i] = ""
		default:
			indented = indented && strings.TrimSpace(l) == ""
			lines[i] = blankCodeSpans(l)
		}
	}
	return strings.Join(lines, "\n")
}

// blankCodeSpans replaces each code span of a line — a run of backticks,
// up to the next run of as many — with spaces; a run left open is text.
func blankCodeSpans(l string) string {
	b := []byte(l)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		for k := i; k < end; k++ {
			b[k] = ' '
		}
		i = end
	}
	return string(b)
}

// headingRE matches an ATX heading, its text in group 1.
var headingRE = regexp.MustCompile(`^#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$`)

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown text: anchor(heading), and for the second heading with the same
// anchor "-1", the third "-2", and so on. Headings in code are not ones.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for l := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// inlineLinkRE matches a link in a heading, whose text alone counts.
var inlineLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// anchor is the anchor GitHub gives a heading: its text as rendered (no
// link targets, backticks or emphasis marks), in lower case, with every
// character but letters, digits, marks, '_', '-' and spaces removed and
// each space made a '-'.
func anchor(heading string) string {
	h := inlineLinkRE.ReplaceAllString(heading, "$1")
	h = strings.NewReplacer("`", "", "*", "").Replace(h)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
