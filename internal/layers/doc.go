// Package layers holds no code: its test enforces the import rules between
// lockd's packages (see each package's doc.go), over `go list -deps`, so a
// forbidden dependency fails the build's tests, however indirect it is.
// What a package may import directly, its doc.go says in one sentence of a
// fixed shape, and what it must not import in another; the test reads
// both (doc_test.go).
//
// layers may import only the standard library. It must not import
// lockd/... (it reads the packages through the go command).
package layers
