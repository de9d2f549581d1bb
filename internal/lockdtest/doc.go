// Package lockdtest starts in-process lockd servers for the tests and
// benchmarks of other packages, and drives them with the raw pipelined load
// generator those benchmarks compare against. Only _test.go files import
// it. lockdtest may import lockd/engine, lockd/proto, lockd/internal/wait,
// go.uber.org/goleak and the standard library. It must not import
// lockd/client.
// The client module's tests do not use it: they import nothing of the root
// module, whose dependencies client/go.mod would otherwise carry to every
// importer of the client.
package lockdtest
