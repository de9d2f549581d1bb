// Package repltest holds the helpers the tests of repl and its
// subpackages share: in-process cluster plumbing (free port pairs, a test
// clock; internal/wait is the bounded wait), a record workload like bench/'s, and the round
// trips and seed corpus of the fuzz targets, member TLS material and
// secrets. Only _test.go files import it (internal/layers); it may import
// repl/records, shard, internal/testcerts and the standard library.
package repltest
