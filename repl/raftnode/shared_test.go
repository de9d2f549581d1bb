package raftnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// Shared holders (PROTOCOL.md §9.2) in a raft cluster: Grant commands
// carry the key's limit, Release and Expire the token of the one holder
// they end; the FSM applies them holder by holder, snapshots carry every
// holder, and whatever a member is rebuilt, restored or recovered from
// holds exactly the committed holders.

// TestEntryFormatFollowsRecords: the entries' format version is the
// version of repl/records' formats they carry, so a change of those
// formats raises it (and a member of the version before refuses the new
// entries whole instead of misreading them).
func TestEntryFormatFollowsRecords(t *testing.T) {
	if entryFormat != records.Version {
		t.Fatalf("raft entries say format version %d, repl/records writes %d: raise entryFormat with records.Version", entryFormat, records.Version)
	}
	if entryFormat > 15 {
		t.Fatalf("format version %d does not fit the entry's 4 bits", entryFormat)
	}
}

// sharedRecords drives a table with repltest.SharedLoad and returns its
// records in the batch format, and the table.
func sharedRecords(t *testing.T, steps int) (*records.BatchWriter, *shard.Table) {
	t.Helper()
	w := &records.BatchWriter{}
	src, err := shard.New(shard.Config{Shards: 4, Sink: func(r shard.Record) {
		if err := w.Add(&r); err != nil {
			t.Error(err)
		}
	}}, shard.NewTokens(100, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	now := int64(0)
	load := repltest.NewSharedLoad(src, func() int64 { now += 1e6; return now }, 3)
	for range steps {
		load.Step()
	}
	return w, src
}

// TestRaftEntryVersions: entries carry their format version beside the
// proposer; this member reads entries of its version and those written
// before versions (the byte was the proposer alone), and refuses a newer
// version whole with an error that names both versions. A records entry
// of shared grants applies on another table holder by holder.
func TestRaftEntryVersions(t *testing.T) {
	w, src := sharedRecords(t, 3000)
	rec := appendRecordsEntry(nil, 2, 7, 5e18, 1, uint64(w.Count()), w.Count(), w.Bytes())
	res := appendReserveEntry(nil, 6, 3, 1<<40)
	if rec[1] != 0x32 || res[1] != 0x36 {
		t.Fatalf("version and proposer bytes %#x and %#x, want 0x32 and 0x36", rec[1], res[1])
	}
	withVP := func(p []byte, vp byte) []byte {
		q := bytes.Clone(p)
		q[1] = vp
		return q
	}
	for _, tc := range []struct {
		name     string
		data     []byte
		proposer int
		newer    int // the version refused, 0: read
	}{
		{"records", rec, 2, 0},
		{"reserve", res, 6, 0},
		{"records-before-versions", withVP(rec, 2), 2, 0},
		{"reserve-before-versions", withVP(res, 6), 6, 0},
		{"records-version-4", withVP(rec, 0x42), 0, 4},
		{"reserve-version-4", withVP(res, 0x46), 0, 4},
		{"records-version-15", withVP(rec, 0xf0), 0, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e logEntry
			var buf []byte
			err := decodeLogEntry(tc.data, &e, &buf)
			if tc.newer != 0 {
				if !errors.Is(err, errEntryVersion) || !strings.Contains(err.Error(), fmt.Sprintf("format version %d, this member reads versions up to %d", tc.newer, entryFormat)) {
					t.Fatalf("decode: %v, want a refusal naming versions %d and %d", err, tc.newer, entryFormat)
				}
				return
			}
			if err != nil || e.proposer != tc.proposer {
				t.Fatalf("decode: proposer %d, %v; want proposer %d", e.proposer, err, tc.proposer)
			}
		})
	}
	var e logEntry
	var buf []byte
	if err := decodeLogEntry(rec, &e, &buf); err != nil {
		t.Fatal(err)
	}
	dst, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	st := &applyState{table: dst}
	st.applyEntry(&e, 0, false)
	want := repltest.Holders(src)
	if holders, multi := repltest.SharedCount(want); st.errs != 0 || holders == 0 || multi == 0 {
		t.Fatalf("%d errors (%v); %d holders of shared keys, %d with several", st.errs, st.lastErr, holders, multi)
	}
	if d := repltest.HoldersDiff(repltest.Holders(dst), want); d != "" {
		t.Fatalf("applied entry: %s", d)
	}
}

// TestRaftSnapshotShared: a snapshot (format version 3) restores every
// holder of every shared key with its token, identity, limit and deadline;
// snapshots of the versions before (exclusive keys; version 1 without
// identities) still load; a snapshot of a newer version is refused whole,
// naming both versions, and nothing of it is restored.
func TestRaftSnapshotShared(t *testing.T) {
	_, src := sharedRecords(t, 3000)
	var b bytes.Buffer
	now, wall := int64(4e9), int64(1.7e18)
	if _, err := writeSnapshot(&b, src, 1<<35, 42, now, wall); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b.Bytes(), []byte("LKRAFT3\n")) {
		t.Fatalf("magic %q", b.Bytes()[:8])
	}
	dst, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	if _, err := readSnapshot(bytes.NewReader(b.Bytes()), dst, wall+2e9); err != nil {
		t.Fatal(err)
	}
	want, got := repltest.Holders(src), repltest.Holders(dst)
	if holders, multi := repltest.SharedCount(want); holders == 0 || multi == 0 {
		t.Fatalf("%d holders of shared keys, %d with several: not a test of them", holders, multi)
	}
	if d := repltest.HoldersDiff(got, want); d != "" {
		t.Fatalf("restored: %s", d)
	}
	for key, hs := range want {
		for i, h := range hs {
			if d := got[key][i].Deadline; d != max(h.Deadline, now)-2e9 {
				t.Fatalf("%s holder %d: deadline %d, want %d", key, h.Token, d, max(h.Deadline, now)-2e9)
			}
		}
	}
	for i := range src.Shards() {
		if dst.Seq(i) != src.Seq(i) {
			t.Fatalf("shard %d at seq %d, want %d", i, dst.Seq(i), src.Seq(i))
		}
	}

	newer := bytes.Clone(b.Bytes())
	newer[6] = '4'
	empty, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	_, err := readSnapshot(bytes.NewReader(newer), empty, wall)
	if !errors.Is(err, errEntryVersion) || !strings.Contains(err.Error(), "raft snapshot in format version 4, this member reads versions up to 3") {
		t.Fatalf("a version-4 snapshot: %v, want a refusal naming both versions", err)
	}
	if empty.Stats().Keys != 0 {
		t.Fatalf("%d keys restored from a version-4 snapshot", empty.Stats().Keys)
	}
	for _, magic := range []string{"LKRAFT0\n", "LKRAFTx\n", "LKRAFT3 ", "XKRAFT3\n"} {
		bad := append([]byte(magic), b.Bytes()[8:]...)
		if _, err := readSnapshot(bytes.NewReader(bad), empty, wall); !errors.Is(err, errBadLogEntry) {
			t.Fatalf("magic %q: %v, want not a lockd snapshot", magic, err)
		}
	}

	// Version 2: exclusive keys with identities, as written before shared
	// holders.
	ex, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(1000, 1<<30))
	var out shard.Out
	for i := range 100 {
		ex.AcquireAs(0, fmt.Appendf(nil, "v2/%d", i), 0, 30, 0, ex.Ident([]byte(testIdents[i%len(testIdents)])), nil, &out)
	}
	v2 := writeSnapshotV2(ex, 1<<20, 9, 1e9, wall)
	back, _ := shard.New(shard.Config{Shards: 4}, shard.NewTokens(0, 0))
	if h, err := readSnapshot(bytes.NewReader(v2), back, wall); err != nil || h.index != 9 {
		t.Fatalf("version 2: %+v %v", h, err)
	}
	if d := repltest.HoldersDiff(repltest.Holders(back), repltest.Holders(ex)); d != "" {
		t.Fatalf("version 2 restored: %s", d)
	}
}

// writeSnapshotV2 writes t as the code before shared holders did (magic
// "LKRAFT2\n", entries in the format version 2, raw; t holds no shared
// key).
func writeSnapshotV2(t *shard.Table, reserved, index uint64, now, wallAtZero int64) []byte {
	b := append([]byte(nil), snapMagicV2...)
	b = binary.BigEndian.AppendUint64(b, index)
	b = binary.BigEndian.AppendUint64(b, uint64(now+wallAtZero))
	b = binary.BigEndian.AppendUint64(b, t.Tokens().Last())
	b = binary.BigEndian.AppendUint64(b, reserved)
	b = binary.BigEndian.AppendUint32(b, uint32(t.Shards()))
	for i := range t.Shards() {
		var raw []byte
		count := 0
		seq := t.Dump(i, func(h *shard.HeldLock) {
			raw, _ = records.AppendSnapEntryIdent(raw, &records.SnapEntry{Key: h.Key, Token: h.Token, Left: time.Duration(h.Deadline - now), Lease: h.Lease, Ident: h.Ident})
			count++
		})
		b = binary.AppendUvarint(b, seq)
		b = binary.AppendUvarint(b, uint64(count))
		b = append(b, byte(records.CodecRaw))
		b = binary.AppendUvarint(b, uint64(len(raw)))
		b = binary.AppendUvarint(b, uint64(len(raw)))
		b = append(b, raw...)
	}
	return b
}

// servesHolders checks that m serves every holder of want: each validates,
// another identity's release of a named holder is refused and its own
// works, another limit beside a shared key's holders is a mismatch, and a
// key with room grants another holder above last.
func servesHolders(t *testing.T, m *raftMember, want map[string][]repltest.Holder) {
	t.Helper()
	last := uint64(0)
	for _, hs := range want {
		for _, h := range hs {
			last = max(last, h.Token)
		}
	}
	var out shard.Out
	now := m.clock()
	var refused, granted, mismatched int
	for key, hs := range want {
		for _, h := range hs {
			if _, ok := m.table.Validate(now, []byte(key), h.Token, &out); !ok {
				t.Fatalf("%s: holder %d not valid", key, h.Token)
			}
		}
		if hs[0].Limit == 0 {
			continue
		}
		h := hs[len(hs)-1]
		if h.Ident != "" {
			other := repltest.SharedIdents[0]
			if h.Ident == other {
				other = repltest.SharedIdents[1]
			}
			if r, _ := m.table.ReleaseAs(now, []byte(key), h.Token, shard.Who{Ident: m.table.Ident([]byte(other))}, &out); r != shard.ResultRefused {
				t.Fatalf("%s: %s's release of %s's holder %d: %v, want refused", key, other, h.Ident, h.Token, r)
			}
			refused++
		}
		if r, _ := m.table.ReleaseAs(now, []byte(key), h.Token, shard.Who{Ident: m.table.Ident([]byte(h.Ident))}, &out); r != shard.ResultOK {
			t.Fatalf("%s: the owner's release of holder %d: %v", key, h.Token, r)
		}
		if len(hs) > 1 {
			if st, _ := m.table.AcquireShared(now, []byte(key), 0, 30, 1, h.Limit%65535+1, shard.NoIdent, nil, &out); st != shard.Mismatch {
				t.Fatalf("%s: an acquire with limit %d beside holders of limit %d: %v, want mismatch", key, h.Limit%65535+1, h.Limit, st)
			}
			mismatched++
		}
		if d := m.table.Detail([]byte(key)); len(d.Waiters) == 0 && len(d.Holders) < int(h.Limit) {
			st, tok := m.table.AcquireShared(now, []byte(key), 0, 30, 1, h.Limit, shard.NoIdent, nil, &out)
			if st != shard.Granted || tok <= last {
				t.Fatalf("%s: a holder more: %v, token %d, want granted above %d", key, st, tok, last)
			}
			granted++
		}
	}
	if refused == 0 || granted == 0 || mismatched == 0 {
		t.Fatalf("%d refusals, %d new holders, %d mismatches checked: want some of each", refused, granted, mismatched)
	}
}

// TestRaftSharedHolders: shared holders made on the leader — grants,
// handoffs to queued acquires, renewals and releases of one holder at a
// time — commit to every follower holder by holder, through the log and
// through snapshots cut while the load went on (raft's own, and one a
// follower that was down receives). Whatever takes over holds exactly the
// committed holders and serves them: a new leader after the leader is
// killed or hands over (with no lease ending earlier than on the old
// leader, nor before its election + T: PROTOCOL.md §6.4), all three
// members restarted on their snapshots and logs, and a member recovered
// alone (--force-new-cluster).
func TestRaftSharedHolders(t *testing.T) {
	for _, tc := range []string{"kill-leader", "transfer", "restart-all", "catch-up", "force-new-cluster"} {
		t.Run(tc, func(t *testing.T) {
			c := &raftCluster{t: t, T: 400 * time.Millisecond}
			if tc == "catch-up" {
				c.tune = func(rc *raft.Config) { rc.TrailingLogs, rc.SnapshotThreshold = 4, 1<<20 }
				c.segSize = 4 << 10
			}
			c.startAll(3)
			l := c.leader()
			lm := c.ms[l]
			f := (l + 1) % 3
			var fLast uint64
			if tc == "catch-up" {
				c.settle(l)
				fLast, _ = c.ms[f].n.logs.LastIndex()
				c.kill(f) // down while the log is compacted past it
			}
			load := repltest.NewSharedLoad(lm.table, lm.clock, uint64(len(tc)))
			for i := range 2000 {
				load.Step()
				if i%100 == 99 { // entries of their own
					wait.For(t, "the load to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
				}
			}
			// Snapshots cut on every member while the leader goes on.
			var wg sync.WaitGroup
			stop := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					load.Step()
					time.Sleep(50 * time.Microsecond)
				}
			}()
			for i, m := range c.ms {
				if m == nil {
					continue
				}
				if err := m.n.r.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
					t.Errorf("snapshot on member %d: %v", i, err)
				}
			}
			close(stop)
			wg.Wait()
			for range 1000 {
				load.Step()
			}
			if tc == "catch-up" {
				wait.For(t, "the load to commit", func() bool { return lm.host.lastCommit() == lm.n.Barrier() })
				if err := lm.n.r.Snapshot().Error(); err != nil {
					t.Fatalf("snapshot on the leader: %v", err)
				}
				if first, _ := lm.n.logs.FirstIndex(); first <= fLast+1 {
					t.Fatalf("the leader's log starts at %d: not compacted past the follower's %d", first, fLast)
				}
				for range 200 { // after the snapshot: entries for the follower
					load.Step()
				}
				c.start(f)
			}
			c.settle(l)
			want := repltest.Holders(lm.table)
			if holders, multi := repltest.SharedCount(want); holders < 20 || multi < 5 {
				t.Fatalf("the load left %d holders of shared keys, %d keys with several: not a test of them", holders, multi)
			}
			if tc == "catch-up" {
				if metas, err := c.ms[f].n.snaps.List(); err != nil || len(metas) == 0 {
					t.Fatalf("the follower received no snapshot: %v", err)
				}
				c.kill(l) // the follower that caught up by snapshot may lead
				servesHolders(t, c.ms[c.leader()], want)
				return
			}
			before := repltest.WallDeadlines(lm.table, lm.clock())
			killed := time.Now()
			var nm *raftMember
			switch tc {
			case "kill-leader":
				c.kill(l)
				nm = c.ms[c.leader()]
			case "transfer":
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if succ := lm.n.Stop(ctx); succ == "" {
					t.Fatal("Stop handed over to no one")
				}
				wait.For(t, "the successor to serve", func() bool {
					for i, m := range c.ms {
						if i != l && m.serving() {
							nm = m
							return true
						}
					}
					return false
				})
			case "restart-all":
				for i := range c.ms {
					c.kill(i)
				}
				for i := range c.ms {
					c.start(i)
				}
				nm = c.ms[c.leader()]
			case "force-new-cluster":
				for i := range c.ms {
					c.kill(i)
				}
				c.cfgs = map[int]repl.ClusterConfig{f: {Peers: c.peers, Self: f, Listen: c.peers[f], PeerOffset: raftTestOffset,
					FailoverTimeout: c.T, DataDir: c.dirs[f], TokenBlock: 1 << 20, ForceNewCluster: true}}
				nm = c.start(f)
				wait.For(t, "the recovered member to serve alone", nm.serving)
			}
			if d := repltest.HoldersDiff(repltest.Holders(nm.table), want); d != "" {
				t.Fatalf("after %s: %s", tc, d)
			}
			if tc == "kill-leader" || tc == "transfer" {
				for tok, w := range repltest.WallDeadlines(nm.table, nm.clock()) {
					if b := before[tok]; w.Before(b.Add(-time.Millisecond)) {
						t.Fatalf("holder %d ends %v earlier on the new leader", tok, b.Sub(w))
					}
					if w.Before(killed.Add(c.T - time.Millisecond)) {
						t.Fatalf("holder %d ends %v after the old leader went, before the failover timeout %v", tok, w.Sub(killed), c.T)
					}
				}
			}
			servesHolders(t, nm, want)
		})
	}
}

// TestRaftRefusesNewerEntries: a committed entry in a newer format (a
// member of a newer lockd proposed it) is applied by no member that
// cannot read it: its records never reach the followers' tables, each
// follower says why it does not serve (its health names both versions),
// and none cuts a snapshot over it (raft would then compact it away for
// good). The code before versions misread such an entry as one of
// another proposer and applied it.
func TestRaftRefusesNewerEntries(t *testing.T) {
	c := newRaftCluster(t, 3, func(rc *raft.Config) { rc.SnapshotThreshold, rc.SnapshotInterval = 1<<20, time.Hour })
	l := c.leader()
	lm := c.ms[l]
	lm.grant(t, "before", 60)
	c.settle(l)
	// A grant that every table would take (its shard's next Seq), so only
	// the version stops it.
	var w records.BatchWriter
	rec := shard.Record{Kind: shard.RecordGrant, Key: []byte("future"), Token: 1 << 62, Lease: 60}
	rec.Shard = shardOf(t, lm.table, rec.Key)
	rec.Seq = lm.table.Seq(int(rec.Shard)) + 1
	if err := w.Add(&rec); err != nil {
		t.Fatal(err)
	}
	data := appendRecordsEntry(nil, (l+1)%3, 1, time.Now().UnixNano(), 1, 1, 1, w.Bytes())
	data[1] = 4<<4 | data[1]&0x0f // a version-4 member's entry
	fut := lm.n.r.Apply(data, 5*time.Second)
	if err := fut.Error(); err != nil {
		t.Fatalf("committing a version-4 entry: %v", err)
	}
	for i, m := range c.ms {
		if i == l {
			continue
		}
		wait.For(t, fmt.Sprintf("member %d to reach the entry", i), func() bool {
			m.n.fsmMu.Lock()
			defer m.n.fsmMu.Unlock()
			return m.n.applied >= fut.Index()
		})
		if m.table.Lookup([]byte("future")).Held {
			t.Fatalf("member %d applied a version-4 entry", i)
		}
		wait.For(t, fmt.Sprintf("member %d to say it cannot read its log", i), func() bool {
			err := m.n.Health()
			return err != nil && strings.Contains(err.Error(), "format version 4, this member reads versions up to 3")
		})
		if !m.table.Lookup([]byte("before")).Held {
			t.Fatalf("member %d lost what it applied before", i)
		}
		err := m.n.r.Snapshot().Error()
		if err == nil || !strings.Contains(err.Error(), "format version 4") {
			t.Fatalf("member %d cut a snapshot over an entry it cannot read: %v", i, err)
		}
	}
}

// shardOf is the shard of tab that key hashes to: the one whose record an
// empty table of the same shape applies.
func shardOf(t *testing.T, tab *shard.Table, key []byte) uint32 {
	t.Helper()
	probe, _ := shard.New(shard.Config{Shards: tab.Shards()}, shard.NewTokens(0, 0))
	for i := range tab.Shards() {
		r := shard.Record{Kind: shard.RecordGrant, Shard: uint32(i), Seq: 1, Key: key, Token: 1, Lease: 1}
		if _, err := probe.Apply(0, &r, &shard.Out{}); err == nil {
			return uint32(i)
		}
	}
	t.Fatalf("no shard takes %q", key)
	return 0
}
