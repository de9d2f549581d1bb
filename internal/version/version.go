package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Info is what the build recorded about the binary.
type Info struct {
	Version   string // the main module's version, e.g. "v1.2.3"; "(devel)" when unknown
	Revision  string // the VCS revision (vcs.revision), "" when not stamped
	Time      string // the revision's commit time (vcs.time, RFC 3339), "" when not stamped
	Modified  bool   // the work tree had uncommitted changes (vcs.modified)
	GoVersion string // the toolchain, e.g. "go1.26.8"
}

// Read returns the running binary's Info. override, when not empty,
// replaces the module version (a release build's -ldflags "-X …").
func Read(override string) Info {
	bi, _ := debug.ReadBuildInfo()
	i := FromBuildInfo(bi)
	if override != "" {
		i.Version = override
	}
	return i
}

// FromBuildInfo extracts Info from bi (nil: nothing is known but the
// running toolchain).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	i := Info{Version: "(devel)", GoVersion: runtime.Version()}
	if bi == nil {
		return i
	}
	if v := bi.Main.Version; v != "" {
		i.Version = v
	}
	if bi.GoVersion != "" {
		i.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.time":
			i.Time = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// String is the version line without the program's name:
// "v1.2.3 (rev 0123456789ab, 2026-08-01T10:00:00Z, modified) go1.26.8";
// the part in parentheses only when a revision was stamped.
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	if i.Revision != "" {
		b.WriteString(" (rev ")
		b.WriteString(short(i.Revision))
		if i.Time != "" {
			b.WriteString(", ")
			b.WriteString(i.Time)
		}
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	b.WriteString(" ")
	b.WriteString(i.GoVersion)
	return b.String()
}

// Line is "name " + Read(override).String(): what --version prints.
func Line(name, override string) string {
	return name + " " + Read(override).String()
}

// short cuts a revision to 12 characters, as `go version -m` readers and
// git's abbreviations commonly show.
func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
