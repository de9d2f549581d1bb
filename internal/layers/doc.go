// Package layers holds no code: its test enforces the import rules between
// lockd's packages (see each package's doc.go), over `go list -deps`, so a
// forbidden dependency fails the build's tests, however indirect it is.
package layers
