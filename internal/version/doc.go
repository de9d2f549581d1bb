// Package version builds the version line of lockd's binaries (`lockd
// --version`, `lockctl --version`) from what the Go toolchain records in
// the binary: the main module's version (set by `go install …@v1.2.3`,
// "(devel)" for a build from a checkout) and the VCS revision, time and
// modified flag that `go build` stamps inside a repository.
//
// # What it owns
//
// Reading runtime/debug.ReadBuildInfo and formatting it; nothing else.
//
// # Concurrency
//
// Its functions are pure or read the immutable build information; safe
// from any goroutine.
//
// # What it must not import
//
// version may import only the standard library. It must not import
// lockd/... (nothing of the module): every command may import it
// (internal/layers enforces both).
package version
