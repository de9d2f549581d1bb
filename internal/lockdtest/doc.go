// Package lockdtest starts in-process lockd servers for the tests and
// benchmarks of other packages, and drives them with the raw pipelined load
// generator those benchmarks compare against. Only _test.go files import
// it. It may import engine, proto and goleak; it must not import client.
// The client module's tests do not use it: they import nothing of the root
// module, whose dependencies client/go.mod would otherwise carry to every
// importer of the client.
package lockdtest
