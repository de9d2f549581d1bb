package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/api"
	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/repl"
)

// collector turns one engine.Metrics snapshot per scrape into Prometheus
// metrics, so the hot path keeps plain per-loop counters.
type collector struct {
	srv   *engine.Server
	build Build
	auth  *authStats

	requests, errors, grants, handoffs, expiries, timeouts, releases, renews *prometheus.Desc
	keys, waiters, conns, tokenHeadroom, wait, role, buildInfo, up           *prometheus.Desc
	localConns                                                               *prometheus.Desc
	noToken, reserveErrs, reserveFailing, moved, otherIdent                  *prometheus.Desc
	authFailures, aclClosed, aclReloads, adminReleases, adminAuth            *prometheus.Desc
	tlsHandshakes, tlsFailures                                               *prometheus.Desc
	sharedHolders, watches, lost                                             *prometheus.Desc

	// cluster
	epoch, failovers, handovers, demotions, snapshots, batches, records, rawBytes, wireBytes *prometheus.Desc
	cancelled                                                                                *prometheus.Desc
	lagSecs, lagRecords, lagBytes, memberLive, memberRole                                    *prometheus.Desc
	memberRefused                                                                            *prometheus.Desc

	// raft
	raftTerm, raftCommit, raftApplied, raftEntries, raftEntryRecords, raftCommitLatency *prometheus.Desc
	raftSnapshots, raftSnapshotBytes, raftElections, raftRebuilds                       *prometheus.Desc
	raftMembers                                                                         *prometheus.Desc
}

func newCollector(srv *engine.Server, build Build, auth *authStats) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("lockd_"+name, help, labels, nil)
	}
	return &collector{
		srv: srv, build: build, auth: auth,
		requests:          d("requests_total", "Requests by op and result.", "op", "result"),
		errors:            d("errors_total", "E frames sent, by code (1 bad frame, 2 bad key, 3 bad lease, 4 shutting down, 5 unauthenticated, 6 permission denied, 7 limit mismatch, 8 watch limit reached).", "code"),
		grants:            d("grants_total", "Grants, immediate or handoff."),
		handoffs:          d("handoffs_total", "Grants to a queued acquire, on release or lease expiry."),
		expiries:          d("expiries_total", "Leases that ended without a release."),
		timeouts:          d("wait_timeouts_total", "Queued acquires whose wait passed (T)."),
		releases:          d("releases_total", "Successful releases."),
		renews:            d("renews_total", "Successful renews."),
		keys:              d("held_keys", "Keys held now."),
		waiters:           d("waiters", "Acquires queued now."),
		conns:             d("connections", "Open client connections."),
		localConns:        d("local_connections", "Open in-process connections: the HTTP API's (pooled, and one per request being served; --http)."),
		tokenHeadroom:     d("token_headroom", "Tokens this node may still issue below its durable reservation mark (the mark less the highest token issued; exact: the tokens themselves exceed float64's 53 bits and are in /status)."),
		wait:              d("acquire_wait_seconds", "Time from acquire to grant (0 for immediate grants)."),
		role:              d("role", "1 for the node's current role, 0 for every other role of its mode (one series per role, always).", "role"),
		buildInfo:         d("build_info", "1, with the build's module version and VCS revision (\"\" when the build stamped none).", "version", "revision"),
		up:                d("uptime_seconds", "Seconds since the server started."),
		noToken:           d("busy_no_token_total", "Acquires and handoffs answered B because no token was reserved (the data dir failing)."),
		reserveErrs:       d("token_reserve_failures_total", "Failed token reservation attempts."),
		reserveFailing:    d("token_reserve_failing", "1 while token reservations are failing (the node is unhealthy), else 0."),
		moved:             d("waiters_moved_total", "Queued acquires answered M because this node stopped executing."),
		epoch:             d("cluster_epoch", "The active's epoch (priority) or the term (raft)."),
		failovers:         d("cluster_failovers_total", "Times this member promoted itself after the active went silent."),
		handovers:         d("cluster_handovers_total", "Planned handovers this member took part in (giving or taking)."),
		demotions:         d("cluster_demotions_total", "Times this member stepped down for an active that became active later."),
		snapshots:         d("cluster_snapshot_transfers_total", "Snapshots of the whole table sent or received.", "direction"),
		batches:           d("replication_batches_total", "Replication batches sent (active) or applied (standby)."),
		records:           d("replication_records_total", "State changes in those batches (a skip record counts as the changes it stands for)."),
		cancelled:         d("replication_cancelled_records_total", "Of those, the changes that cancelled out within their batch (a grant ended in it, with its end and renewals) and went as skip records."),
		rawBytes:          d("replication_raw_bytes_total", "Bytes of those records before compression."),
		wireBytes:         d("replication_wire_bytes_total", "Bytes of those batches on the member link (compressed, framed); sent by the active."),
		lagSecs:           d("replication_lag_seconds", "Age of the oldest batch a standby has not acknowledged, as the active measures it: per standby on the active, and member=\"self\" on a standby (its active's last figure).", "member"),
		lagRecords:        d("replication_lag_records", "Records sent or queued to a standby and not acknowledged.", "member"),
		lagBytes:          d("replication_lag_bytes", "Raw bytes sent or queued to a standby and not acknowledged.", "member"),
		memberLive:        d("cluster_member_live", "1 while a member has been heard from within the failover timeout.", "member"),
		memberRole:        d("cluster_member_role", "1 for the role a member was last heard in, 0 for every other role of the mode (all 0 while unknown).", "member", "role"),
		memberRefused:     d("member_link_refused_total", "Member connections refused by the checks of PROTOCOL.md §8.4 or the member port's limits, closed before anything was read from them, by reason (limit, handshake, config, tls, name, secret, peer).", "reason"),
		raftTerm:          d("raft_term", "The current raft term."),
		raftCommit:        d("raft_commit_index", "Raft's commit index."),
		raftApplied:       d("raft_applied_index", "The last log index applied to the lock table."),
		raftEntries:       d("raft_entries_total", "Log entries of lock changes this member proposed as leader and saw committed."),
		raftEntryRecords:  d("raft_entry_records_total", "Lock changes in those entries (records per entry = this / raft_entries_total)."),
		raftCommitLatency: d("raft_commit_latency_seconds", "Time from proposing a log entry of lock changes to its commit, on the leader that proposed it.", nil...),
		raftSnapshots:     d("raft_snapshots_total", "Raft snapshots this member wrote."),
		raftSnapshotBytes: d("raft_snapshot_bytes", "The size of the last raft snapshot."),
		raftElections:     d("raft_elections_total", "Times this member became a serving leader."),
		raftRebuilds:      d("raft_rebuilds_total", "Times the table was rebuilt from the log (leadership lost, a change outside the log)."),
		raftMembers:       d("raft_members", "Servers of the raft configuration as this member knows it, by suffrage: voter, or nonvoter (a member add catching up).", "suffrage"),
		tlsHandshakes:     d("tls_handshakes_total", "TLS handshakes completed on the client port (with --tls-cert)."),
		tlsFailures:       d("tls_handshake_failures_total", "TLS handshakes on the client port that failed (a plaintext client, a missing or untrusted client certificate, a timeout): the connection was closed."),
		authFailures:      d("auth_failures_total", "Refusals of --acl on the client port: failed hellos and lock requests before authentication (E 5, reason hello and unauthenticated), requests outside an identity's keys or from a monitor (E 6, permission_denied).", "reason"),
		aclClosed:         d("acl_closed_connections_total", "Connections closed because an ACL reload removed their identity."),
		aclReloads:        d("acl_reloads_total", "ACL reloads (SIGHUP): ok put a new file in force, failed kept the old one.", "result"),
		adminReleases:     d("admin_releases_total", "Grants released through the admin endpoint (DELETE /keys/{key}; each holder of a shared key counts)."),
		adminAuth:         d("admin_auth_failures_total", "Admin endpoint requests refused by --acl: 401 without valid credentials, 403 for a client identity or a change without admin.", "code"),
		sharedHolders:     d("shared_holders", "Holders of shared keys beyond each key's first, now (what --max-holders bounds; a key's first holder counts in lockd_held_keys)."),
		watches:           d("watches", "Watches registered now (W), over every connection."),
		lost:              d("lost_total", "L frames pushed to watches, by reason: released, expired, forced (an admin's release, or a lease an admin renewed), cannot_tell (shutdown, or this node stopped executing).", "reason"),
		otherIdent:        d("other_identity_ops_total", "Releases and renews carrying the current token of a grant made to another identity (--acl): forced (by an admin, done) or refused (answered N).", "op", "result"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.errors, c.grants, c.handoffs, c.expiries, c.timeouts,
		c.releases, c.renews, c.keys, c.waiters, c.conns, c.localConns, c.tokenHeadroom, c.wait, c.role, c.buildInfo, c.up,
		c.noToken, c.reserveErrs, c.reserveFailing, c.moved, c.otherIdent, c.tlsHandshakes, c.tlsFailures,
		c.authFailures, c.aclClosed, c.aclReloads, c.adminReleases, c.adminAuth, c.sharedHolders, c.watches, c.lost,
		c.epoch, c.failovers, c.handovers, c.demotions, c.snapshots, c.batches, c.records, c.rawBytes, c.wireBytes,
		c.cancelled, c.lagSecs, c.lagRecords, c.lagBytes, c.memberLive, c.memberRole, c.memberRefused,
		c.raftTerm, c.raftCommit, c.raftApplied, c.raftEntries, c.raftEntryRecords, c.raftCommitLatency,
		c.raftSnapshots, c.raftSnapshotBytes, c.raftElections, c.raftRebuilds, c.raftMembers} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.srv.Metrics()
	counter, gauge := emitters(ch)
	for _, r := range m.Requests {
		counter(c.requests, r.N, r.Op, r.Result)
	}
	for code := 1; code < len(m.Errors); code++ {
		counter(c.errors, m.Errors[code], string(rune('0'+code)))
	}
	counter(c.grants, m.Table.Grants)
	counter(c.handoffs, m.Table.Handoffs)
	counter(c.expiries, m.Table.Expiries)
	counter(c.timeouts, m.Table.Timeouts)
	counter(c.releases, m.Table.Releases)
	counter(c.renews, m.Table.Renews)
	gauge(c.keys, float64(m.Keys))
	gauge(c.waiters, float64(m.Waiters))
	gauge(c.conns, float64(m.Conns))
	gauge(c.localConns, float64(m.LocalConns))
	gauge(c.sharedHolders, float64(m.Holders))
	gauge(c.watches, float64(m.Watches))
	for r, name := range lostReasons {
		if name != "" {
			counter(c.lost, m.Lost[r], name)
		}
	}
	if m.TokenReserved >= m.TokenLast {
		gauge(c.tokenHeadroom, float64(m.TokenReserved-m.TokenLast))
	} else {
		gauge(c.tokenHeadroom, 0)
	}
	gauge(c.up, m.Uptime.Seconds())
	node := c.srv.NodeStatus()
	roles(gauge, c.role, node.Mode, node.Role)
	counter(c.noToken, m.Table.NoToken)
	counter(c.reserveErrs, node.ReserveErrors)
	failing := 0.0
	if node.ReserveError != "" {
		failing = 1
	}
	gauge(c.reserveFailing, failing)
	counter(c.moved, m.Moved)
	counter(c.otherIdent, m.Table.ForcedReleases, "release", "forced")
	counter(c.otherIdent, m.Table.ForcedRenews, "renew", "forced")
	counter(c.otherIdent, m.Table.RefusedReleases, "release", "refused")
	counter(c.otherIdent, m.Table.RefusedRenews, "renew", "refused")
	counter(c.authFailures, m.Auth.Hello, "hello")
	counter(c.authFailures, m.Auth.Unauthenticated, "unauthenticated")
	counter(c.authFailures, m.Auth.Denied, "permission_denied")
	counter(c.aclClosed, m.Auth.Removed)
	counter(c.aclReloads, m.ACLReloads, "ok")
	counter(c.aclReloads, m.ACLReloadErrs, "failed")
	counter(c.adminReleases, m.AdminReleases)
	counter(c.adminAuth, c.auth.unauthorized.Load(), "401")
	counter(c.adminAuth, c.auth.forbidden.Load(), "403")
	if c.srv.Config().TLS != nil {
		counter(c.tlsHandshakes, m.TLSHandshakes)
		counter(c.tlsFailures, m.TLSHandshakeFailures)
	}
	buckets := make(map[float64]uint64, len(engine.WaitBuckets))
	var cum uint64
	for i, ub := range engine.WaitBuckets {
		cum += m.WaitCounts[i]
		buckets[ub] = cum
	}
	cum += m.WaitCounts[len(engine.WaitBuckets)]
	ch <- prometheus.MustNewConstHistogram(c.wait, cum, m.WaitSum, buckets)
	gauge(c.buildInfo, 1, c.build.Version, c.build.Revision)
	if node.Mode != api.ModeSingle {
		c.collectCluster(ch, node)
	}
	if node.Raft != nil {
		c.collectRaft(ch, node)
	}
}

// lostReasons are the reason labels of lockd_lost_total, by the L
// frame's reason byte (PROTOCOL.md §9.4).
var lostReasons = [len(engine.Metrics{}.Lost)]string{1: "released", 2: "expired", 3: "forced", 4: "cannot_tell"}

// roles sends d's series for every role of mode (api.Roles), labelled
// with lead (a member's address) and the role: 1 for current, 0 for the
// others. A role the list does not know yet is sent too (1), rather than
// hidden.
func roles(gauge func(*prometheus.Desc, float64, ...string), d *prometheus.Desc, mode, current string, lead ...string) {
	known := false
	for _, r := range api.Roles(mode) {
		v := 0.0
		if r == current {
			v, known = 1, true
		}
		gauge(d, v, append(lead, r)...)
	}
	if !known && current != "" {
		gauge(d, 1, append(lead, current)...)
	}
}

// emitters returns functions that send a counter and a gauge to ch.
func emitters(ch chan<- prometheus.Metric) (counter func(*prometheus.Desc, uint64, ...string), gauge func(*prometheus.Desc, float64, ...string)) {
	counter = func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge = func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	return counter, gauge
}

// collectCluster adds a cluster member's metrics.
func (c *collector) collectCluster(ch chan<- prometheus.Metric, node repl.Status) {
	counter, gauge := emitters(ch)
	gauge(c.epoch, float64(epoch(node)))
	p := priorityPart(node) // zero in raft mode: the series are there in both modes
	counter(c.failovers, p.Failovers)
	counter(c.handovers, p.Handovers)
	counter(c.demotions, p.Demotions)
	counter(c.snapshots, p.SnapshotsSent, "sent")
	counter(c.snapshots, p.SnapshotsReceived, "received")
	counter(c.batches, p.Batches)
	counter(c.records, p.Records)
	counter(c.cancelled, p.Cancelled)
	counter(c.rawBytes, p.RawBytes)
	counter(c.wireBytes, p.WireBytes)
	gauge(c.lagSecs, p.LagSeconds, "self")
	for _, r := range node.MemberRefused {
		counter(c.memberRefused, r.N, r.Reason)
	}
	for _, mb := range node.Members {
		live := 0.0
		if mb.Live {
			live = 1
		}
		gauge(c.memberLive, live, mb.Addr)
		roles(gauge, c.memberRole, node.Mode, mb.Role, mb.Addr)
		gauge(c.lagSecs, mb.LagSeconds, mb.Addr)
		gauge(c.lagRecords, float64(mb.LagRecords), mb.Addr)
		gauge(c.lagBytes, float64(mb.LagBytes), mb.Addr)
	}
}

// collectRaft adds a raft member's metrics.
func (c *collector) collectRaft(ch chan<- prometheus.Metric, node repl.Status) {
	counter, gauge := emitters(ch)
	rs := node.Raft
	gauge(c.raftTerm, float64(rs.Term))
	gauge(c.raftCommit, float64(rs.CommitIndex))
	gauge(c.raftApplied, float64(rs.AppliedIndex))
	counter(c.raftEntries, rs.Entries)
	counter(c.raftEntryRecords, rs.EntryRecords)
	buckets := make(map[float64]uint64, len(repl.CommitBuckets))
	var cum uint64
	for i, ub := range repl.CommitBuckets {
		cum += rs.CommitCounts[i]
		buckets[ub] = cum
	}
	cum += rs.CommitCounts[len(repl.CommitBuckets)]
	ch <- prometheus.MustNewConstHistogram(c.raftCommitLatency, cum, rs.CommitSum, buckets)
	counter(c.raftSnapshots, rs.Snapshots)
	gauge(c.raftSnapshotBytes, float64(rs.SnapshotBytes))
	counter(c.raftElections, rs.Elections)
	counter(c.raftRebuilds, rs.Rebuilds)
	var voters, nonvoters float64
	for _, m := range rs.Configuration {
		if m.Voter {
			voters++
		} else {
			nonvoters++
		}
	}
	gauge(c.raftMembers, voters, "voter")
	gauge(c.raftMembers, nonvoters, "nonvoter")
}
