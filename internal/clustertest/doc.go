// Package clustertest runs real lockd processes on 127.0.0.1 — a cluster in
// priority or raft mode, or independent single nodes — for multi-process
// tests and the chaos command, in the manner of etcd's tests/framework/e2e.
//
// # What it owns
//
//   - Build: the lockd binary, built once per process (-race when
//     available) or taken from $LOCKD_BIN; Main wraps a TestMain's m so the
//     binary is built first and removed last.
//   - Start (for tests) and New (for programs): pick ports such that every
//     member's client port and client port + --peer-offset are free (both
//     outside the kernel's ephemeral range), make a data dir per member and
//     start each with --listen, --data-dir, --admin 127.0.0.1:0 (the port
//     read back from the log), --log-format json and, in a cluster mode,
//     exactly the flags of PROTOCOL.md §6.1: --cluster, --peers (priority
//     order), --self, --peer-offset, --failover-timeout; then, for a
//     Secure cluster, §8's --tls-cert, --tls-key, --tls-peer-ca and
//     --cluster-secret (a CA, a certificate per member naming 127.0.0.1
//     and a secret made for the cluster); --http at the client port +
//     Options.HTTPOffset when it is set (Member.HTTPAddr; that port is
//     picked free too); then Options.ExtraArgs. A
//     member is ready when it logs msg=ready with its address.
//     Options.Deferred members wait for Member.Start. Members run with
//     --acl (in ExtraArgs) need Options.AdminUser and AdminPassword: the
//     harness's admin requests then carry them (basic authentication).
//   - Secure clusters: the harness reads /status over HTTPS;
//     Cluster.Dial, Cluster.HTTPClient and Cluster.ClientTLS give tests
//     and chaos connections that trust the cluster's CA (plain ones for
//     another cluster).
//   - Proxied clusters: for every ordered pair of members (j, k) a
//     faultproxy pair — one on k's entry in j's --peers forwarding to k's
//     client port, one on that entry's port + offset forwarding to k's
//     member port, since a member dials an entry's port + offset — so each
//     member's --peers names the others through proxies of its own (§6.1
//     allows a member to be written differently on different nodes) and
//     its own entry, --self, as it listens. Partition(groups...) blackholes
//     the member links between groups, Cut(from, to) one way only, Heal
//     lifts every fault, Link gives the proxies of one ordered pair for
//     finer faults (delay, pause).
//   - Member: Kill (SIGKILL), Stop/Cont (SIGSTOP/SIGCONT, returning once
//     the kernel reports the state), Term (SIGTERM, exit code, bounded),
//     Signal, Wait, Restart (same flags, same data dir), RestartWith (a
//     flag for one start), SetPeers (--peers for the next start: a rolling
//     change), WipeData, Addr, AdminURL, Status (/status decoded into
//     package api's types), Admin (a JSON request of its admin endpoint),
//     WaitStatus, Logs, WaitLog, Alive.
//   - Membership changes (members.go): AddMember and NewMember start (or
//     prepare) one more member on a fresh port pair and data dir, with the
//     cluster's flags and --peers of the test's choosing.
//   - Cluster-level reads and waits, as hashicorp/raft's testing.go has
//     them: Statuses reads the members an Among chooses (Every, or
//     Running except the frozen ones), Agreed tells the member they all
//     agree serves (one active or leader, named by every other), Leader
//     reads and tells, WaitStatuses polls until a predicate accepts a
//     reading and WaitLeader until they agree. The tests, the benchmark's
//     cluster targets and chaos use these instead of polling loops of
//     their own.
//   - Proc (NewProc, StartProc): one lockd started with exactly the
//     command line, environment, binary and prefix command (prlimit) a
//     test gives, for the tests of the binary itself (cmd/lockd,
//     cmd/lockctl, ops): ready on its msg=ready line in either log format,
//     Addr and AdminAddr from its log, Signal, Term, Kill, Stop/Cont,
//     Wait, Logs (its output exactly) and WaitLog. A Member runs on the
//     same process handling.
//   - Conn: a raw protocol connection (frames from proto's AppendX, parsed
//     responses, deadlines) to check the wire, such as the address of an M.
//
// # Processes
//
// Every member runs in a process group of its own; a kill goes to the
// group and the process is always reaped. Start closes the cluster with
// t.Cleanup (after logging the tail of every member's log and the proxies'
// state when the test failed), so a t.Fatal leaves nothing running; on
// Linux the kernel also kills a member whose starting thread dies (a test
// binary killed by its -timeout). Every wait is bounded (StartTimeout,
// StopTimeout, 10 s for a SIGKILL, 5 s for a stop or a continue).
//
// # Concurrency
//
// Cluster and Member methods are safe for concurrent use (a chaos nemesis
// and a checker may share a cluster); Conn is not.
//
// # Who uses it, what it must not import
//
// Only tests, the chaos command and the benchmark's cluster targets; lockd
// itself never imports it. It drives the binary from outside: clustertest
// may import lockd/api, lockd/proto, lockd/internal/faultproxy,
// lockd/internal/freeport, lockd/internal/testcerts, lockd/internal/wait
// and the standard library.
// It must not import lockd/engine, lockd/shard, lockd/store, lockd/repl,
// lockd/admin, lockd/client, lockd/bench or lockd/cmd/... (internal/layers
// enforces both; tests that want the client library import it
// themselves).
package clustertest
