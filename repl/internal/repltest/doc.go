// Package repltest holds the helpers the tests of repl and its
// subpackages share: in-process cluster plumbing (free port pairs, a test
// clock; internal/wait is the bounded wait), a record workload like
// bench/'s, and the round trips and seed corpus of the fuzz targets,
// member TLS material and secrets. Only _test.go files import it
// (internal/layers). repltest may import lockd/repl/records, lockd/shard,
// lockd/internal/testcerts, lockd/internal/freeport and the standard
// library. It must not import lockd/engine, lockd/proto or lockd/store.
package repltest
