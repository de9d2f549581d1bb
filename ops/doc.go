// Package ops holds what an operator installs beside the lockd binary, and
// the tests that keep it true; it has no code of its own.
//
//   - lockd.service and lockd.env: a hardened systemd unit configured
//     through LOCKD_<FLAG> variables in an EnvironmentFile;
//   - prometheus/lockd-rules.yml: recording rules (request rates, the
//     commit latency quantiles from the histogram) and alerts (no active
//     or leader, raft without quorum, two actives, a member down, lag
//     above the bound, token reservations failing, descriptors near the
//     limit), with promtool unit tests in lockd-rules.test.yml;
//   - grafana/lockd.json: a dashboard.
//
// Its tests (make test-ops, part of make test) run `systemd-analyze
// verify` and `systemd-analyze security` on the unit with a freshly built
// lockd, `promtool check rules` and `promtool test rules`, and check that
// every metric the dashboard and the rules name is one that a running
// lockd exports — a TLS and --acl single node, and the members of a
// priority and a raft cluster — with promtool's parser for every
// dashboard query. A missing tool skips its test with the package to
// install, except under CI=true, where it fails.
//
// ops may import only the standard library (it has no code); its tests
// start lockd from outside, as an operator would. It must not import
// lockd/... (internal/layers).
package ops
