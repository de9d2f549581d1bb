package layers

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/lockd-dev/lockd/"

// rule: pkg's transitive dependencies must not include any of forbidden
// (a prefix match: "net" also forbids "net/http"), and, if stdOnly, nothing
// outside the standard library but the listed allowed modules.
type rule struct {
	pkg       string
	forbidden []string
	allowed   []string // non-stdlib import path prefixes allowed
}

var rules = []rule{
	{pkg: "proto", forbidden: []string{"net", "os", "syscall", "time"}, allowed: nil},
	{pkg: "shard", forbidden: []string{"net", "os", mod + "proto", mod + "engine", "github.com/panjf2000"},
		allowed: []string{"github.com/cespare/xxhash/v2"}},
	{pkg: "store", forbidden: []string{"net", mod + "proto", mod + "shard", mod + "engine"}, allowed: nil},
	{pkg: "engine", forbidden: []string{mod + "client", mod + "cmd", mod + "bench"},
		allowed: []string{"github.com/panjf2000/", "github.com/cespare/xxhash/v2", "github.com/valyala/bytebufferpool",
			"golang.org/x/", "go.uber.org/", "gopkg.in/natefinch/lumberjack.v2", mod}},
	{pkg: "client", forbidden: []string{"github.com/panjf2000", mod + "engine", mod + "shard", mod + "store"},
		allowed: []string{mod + "proto"}},
	{pkg: "fence", forbidden: []string{"net"}, allowed: nil},
	{pkg: "cmd/lockd", forbidden: []string{mod + "client"}, allowed: []string{"github.com/", "golang.org/x/", "go.uber.org/",
		"gopkg.in/", "google.golang.org/protobuf", "go.yaml.in/", mod}},
	{pkg: "cmd/lockctl", forbidden: []string{mod + "engine", mod + "shard", mod + "store", "github.com/panjf2000"},
		allowed: []string{mod}},
	{pkg: "internal/lockdtest", forbidden: []string{mod + "client", mod + "cmd", mod + "bench"},
		allowed: []string{"github.com/", "golang.org/x/", "go.uber.org/", "gopkg.in/", mod}},
	{pkg: "admin", forbidden: []string{mod + "client", mod + "cmd", mod + "bench"},
		allowed: []string{"github.com/panjf2000/", "github.com/cespare/xxhash/v2", "github.com/valyala/bytebufferpool",
			"golang.org/x/", "go.uber.org/", "gopkg.in/", "github.com/prometheus/", "github.com/beorn7/perks",
			"github.com/munnerz/goautoneg", "google.golang.org/protobuf", "go.yaml.in/", mod}},
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}X {{end}}{{.ImportPath}}", mod+pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func TestImportRules(t *testing.T) {
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			for _, line := range deps(t, r.pkg) {
				path, nonStd := strings.CutPrefix(line, "X ")
				if path == mod+r.pkg {
					continue
				}
				for _, f := range r.forbidden {
					if path == f || strings.HasPrefix(path, f+"/") {
						t.Errorf("%s depends on %s, which it must not", r.pkg, path)
					}
				}
				if nonStd {
					ok := false
					for _, a := range r.allowed {
						if strings.HasPrefix(path, a) {
							ok = true
						}
					}
					if !ok {
						t.Errorf("%s depends on %s, outside the standard library and its allowed modules", r.pkg, path)
					}
				}
			}
		})
	}
}
