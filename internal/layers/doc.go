// Package layers holds no code: its tests keep the repository's rules.
// The import rules between lockd's packages (see each package's doc.go),
// over `go list -deps`, so a forbidden dependency fails the build's tests,
// however indirect it is. What a package may import directly, its doc.go
// says in one sentence of a fixed shape, and what it must not import in
// another; the test reads both (doc_test.go). Beside them: the modules'
// split (module_test.go), what may be tracked (tracked_test.go), and the
// relative links of every Markdown file (doclinks_test.go), so a moved
// page or a reworded heading cannot leave a dead link behind.
//
// layers may import only the standard library. It must not import
// lockd/... (it reads the packages through the go command).
package layers
