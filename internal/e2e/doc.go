// Package e2e holds end-to-end tests that start real lockd processes as
// clusters on 127.0.0.1 (internal/clustertest) and hurt them for real:
// kill -9, SIGSTOP/SIGCONT, SIGTERM, restarts on the same data dir and
// partitions of the member link through fault proxies. It has no code
// outside its tests: e2e may import only the standard library; its tests
// import the client, proto and the test harnesses, and nothing imports it.
// It must not import lockd/cmd/... (it runs the binaries).
package e2e
