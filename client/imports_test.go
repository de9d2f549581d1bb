package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports enforces the layering rule of doc.go over the transitive
// dependencies (go list -deps): client depends on proto and the standard
// library only — never gnet, never engine.
func TestImports(t *testing.T) {
	const mod = "github.com/lockd-dev/lockd/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", mod+"client", mod+"fence").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case mod + "client", mod + "fence", mod + "proto":
		default:
			t.Errorf("client or fence depends on %s: only proto and the standard library are allowed", p)
		}
	}
}
