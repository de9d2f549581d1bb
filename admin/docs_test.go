package admin

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestEveryMetricDocumented: docs/ADMIN.md has a table row for every
// metric the collector describes, and no doc of the repository names a
// lockd_ metric (or a family, lockd_raft_*) the collector does not export.
func TestEveryMetricDocumented(t *testing.T) {
	ch := make(chan *prometheus.Desc, 128)
	newCollector(nil, Build{}, nil).Describe(ch)
	newHTTPCollector(nil).Describe(ch)
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var exported []string
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no fqName in %s", d)
		}
		exported = append(exported, m[1])
	}
	if len(exported) < 40 {
		t.Fatalf("only %d metrics described: %v", len(exported), exported)
	}
	page, err := os.ReadFile("../docs/ADMIN.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range exported {
		if !strings.Contains(string(page), "\n| `"+name+"` |") {
			t.Errorf("docs/ADMIN.md has no row for %s", name)
		}
	}
	// A histogram's series are its name with _bucket, _sum and _count
	// (those documented as histograms).
	for _, m := range regexp.MustCompile("\n\\| `(lockd_[a-z0-9_]+)` \\| histogram \\|").FindAllStringSubmatch(string(page), -1) {
		if slices.Contains(exported, m[1]) {
			exported = append(exported, m[1]+"_bucket", m[1]+"_sum", m[1]+"_count")
		}
	}
	docs, _ := filepath.Glob("../docs/*.md")
	notes, _ := filepath.Glob("../docs/benchmarks/*.md") // BENCHMARKS.md's lab notes
	docs = append(append(docs, notes...), "../README.md", "../BENCHMARKS.md")
	named := regexp.MustCompile(`\blockd_[a-z0-9_]+\*?`) // lockd_raft_* names a family
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range named.FindAllString(string(b), -1) {
			prefix, family := strings.CutSuffix(name, "*")
			if family && !slices.ContainsFunc(exported, func(e string) bool { return strings.HasPrefix(e, prefix) }) ||
				!family && !slices.Contains(exported, name) {
				t.Errorf("%s names %s, which lockd does not export", doc, name)
			}
		}
	}
}
