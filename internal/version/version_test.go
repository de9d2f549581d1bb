package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	full := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/lockd-dev/lockd", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-08-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	cases := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"release", full, "v1.2.3 (rev 0123456789ab, 2026-08-01T10:00:00Z, modified) go1.99.1"},
		{"clean checkout", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}},
			"(devel) (rev abc) go1.99.1"},
		{"nothing stamped", &debug.BuildInfo{GoVersion: "go1.99.1"}, "(devel) go1.99.1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBuildInfo(tc.bi).String(); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if i := FromBuildInfo(nil); i.Version != "(devel)" || !strings.HasPrefix(i.GoVersion, "go") {
		t.Fatalf("nil build info: %+v", i)
	}
}

func TestLine(t *testing.T) {
	l := Line("lockctl", "v9.9.9")
	if !strings.HasPrefix(l, "lockctl v9.9.9 ") || !strings.Contains(l, " go") {
		t.Fatalf("Line = %q", l)
	}
}
