// Command bench is lockd's benchmark harness: `go run ./bench` starts lockd
// on loopback and runs the standard suite — uncontended acquire/release
// pairs, contended hand-offs on a few hot keys, and fan-in of 10,000
// connections each renewing one lock — then prints a table. The same load
// generator drives lockd, an echo ceiling (a bare gnet server answering each
// frame with a frame of the size lockd would send), Redis (SET NX PX with a
// compare-and-delete script; no wait queue, so waiting is retry with
// back-off as redsync does) and etcd (driven by its Go client: a txn
// acquire with a lease, the put's revision being the fencing token, and for
// the contended workload concurrency.Mutex, the recipe etcd users run for a
// blocking lock). Three targets run the lockd binary itself (started with
// internal/clustertest, built from this tree without the race detector):
// lockd-priority, an active and one standby in separate processes, driven
// at the active, with the replication lag, compressed bytes per record and
// records per batch of each run; lockd-raft, three members in raft mode,
// driven at the leader (skipped, with the binary's message, while the
// binary refuses --cluster raft); and lockd-bin, one single node, the
// baseline that separates a cluster's cost from the binary's (lockd-base,
// lockd-priority-base and lockd-raft-base, the same with the -base-bin
// binary: two builds in one interleaved run). Two targets
// speak TLS (PROTOCOL.md §8.1): lockd-tls, the lockd child with its client
// port behind TLS, and redis-tls, redis-server with --tls-port; the load
// generator then does a full crypto/tls handshake per connection, and the
// handshakes workload measures the TLS listener (dial, handshake, one
// ping, close; plaintext targets skip it). The held workload, outside the
// standard suite (-workloads held, held.go), fills the server with -held
// distinct 16-byte keys held at once and reads its memory per lock and in
// all. The semaphore workload, also outside the suite (-workloads
// semaphore, semaphore.go), has -waiters slots take permits of -hot
// semaphores of -sem-limit permits each, hold them -sem-hold and release
// them: lockd's S, Redisson's expirable-permit semaphore as Lua scripts on
// Redis (semaphore_redis.go), and a FIFO semaphore built like
// concurrency.Mutex on etcd (semaphore_etcd.go); it reports grants/s, the
// wait, and the most holders of one key the load generator saw at once
// beside the limit. Three targets, outside "all", measure the HTTP API (docs/HTTP.md;
// http.go): lockd-http, a lockd child serving httpapi's front (what
// --http serves); lockd-gw, the same routes through a gateway over the
// bundled client (gateway.go), the design httpapi did not take; and
// etcd-gw, etcd through its JSON gateway (/v3/lock/lock and unlock, a
// lease per slot). Their load generator is a hand-written HTTP/1.1
// keep-alive client, one connection per slot, the same for the three; the
// single workload (outside the suite) is one client with one request at a
// time, for the latency of an acquire without load. With several
// rounds the targets are interleaved (A B A B …) and the report gives
// medians and the per-round ratios of lockd to each other target (and of
// lockd-bin to lockd-base, a build against its baseline). See
// BENCHMARKS.md for the method and the numbers.
//
// `go run ./bench -failover N` measures failover instead of the suite: a
// priority (or, -failover-mode raft, a raft) cluster of lockd processes
// under load from the client library and from raw probes that know which
// member answers, its active (leader) killed (kill -9) and stopped
// (SIGTERM) N times each, alternately: the time until the successor's first
// grant, the longest time without an answer, and the same for the rejoin
// when the victim, restarted, comes back. failover.go holds its
// configuration and the trials, failover_record.go the record of answers
// and non-answers, failover_load.go the clients, failover_report.go the
// summaries, goals and tables.
//
// The lockd and echo servers run in a child process (this binary re-executed
// with LOCKD_BENCH_SERVE set), so their memory and CPU profiles are their
// own, as Redis's and etcd's are.
//
// bench is a Go module of its own (bench/go.mod) so that etcd's client,
// gRPC, gonum/plot and hdrhistogram-go stay out of the root module's
// go.mod; the root's go.work joins them all, so `go run ./bench` works
// from the root. Its go.mod replaces the root module and the library's
// (client, proto, fence) with their directories, so this checkout is what
// it measures, in the workspace or not (GOWORK=off).
//
// What bench owns: bench/, BENCHMARKS.md (the figures) and
// docs/benchmarks/ (the lab notes). bench may import lockd/proto
// (the wire codec), lockd/engine (to start a server), lockd/httpapi (the
// lockd-http child's front), lockd/acl (the lockd-acl target's identity
// file), lockd/client (see below), lockd/internal/clustertest (the lockd
// processes of the cluster targets, and their waits), lockd/internal/freeport
// (the ports of the children it starts), lockd/api (the admin
// endpoint's documents), lockd/tlsconf (the lockd-tls child loads its
// certificate as the daemon does), lockd/internal/testcerts (the TLS
// targets' throwaway certificates), github.com/panjf2000/gnet/v2 (the echo
// server), github.com/HdrHistogram/hdrhistogram-go (latency histograms),
// go.etcd.io/etcd/client/v3 and go.etcd.io/etcd/api/v3 (etcd's client, its
// concurrency package and the lease keep-alive stream),
// google.golang.org/grpc and go.uber.org/zap (the etcd client's dial
// options and logger), github.com/prometheus/common and
// github.com/prometheus/client_model (etcd's and lockd's /metrics),
// gonum.org/v1/plot (the latency plot, -svg) and the standard library. It
// must not import lockd/cmd/... (it runs the binaries). It imports
// lockd/client in the failover mode, whose question is what an application
// sees, and in the lockd-gw child, which is a gateway over it by
// definition; the suite's load generator must not use it: it speaks
// lockd's protocol itself, so a client library's costs or bugs cannot hide
// in the server's numbers.
package main
