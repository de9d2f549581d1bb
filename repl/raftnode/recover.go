package raftnode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/repl"
)

// Disaster recovery (as etcd's --force-new-cluster): when a
// majority of the members is lost for good, one survivor restarts with
// ForceNewCluster. raft.RecoverCluster replays its own snapshot and log
// into a new snapshot whose configuration has this member alone, and
// empties the log; raft then starts as a one-member cluster, elects it,
// and the other members are added back with member add (fresh data
// directories, --join).
//
// What it keeps: every entry this member's log holds, committed or not
// (RecoverCluster commits them all): every lock the cluster had told a
// client it holds, if this member had the entry — a majority had it, and
// this member may not have been part of that majority; then the grants
// that the lost members committed after this member's last entry are
// lost, as they would be on any member that never received them. A grant
// whose entry this member had but the cluster never committed was never
// answered: it stays held, by nobody who knows, until its lease ends.
//
// Tokens never go back (PROTOCOL.md §5). A leader hands out tokens only
// below a committed reservation, and the lost members may have committed
// reservations this member never saw. Every reservation is at most a few
// blocks above the wall clock of the moment it was made: a new leader
// starts at max(everything it saw, the wall clock) and reserves one block
// above that, and the reserver raises the reservation by two blocks only
// after about a block of grants, at most a few million a second against
// the clock's 10^9 ns. So before the first token, the recovered member
// raises its floor to the wall clock + the failover timeout + 4 blocks,
// durably in its data directory (it survives a crash before it serves):
// above every reservation the lost members made while their clocks were
// within the failover timeout of this one's (the condition of
// PROTOCOL.md §6.2), whatever reached this member.
//
// A recovery is recorded in --data-dir/raft/recovered: the index of the
// snapshot it made and the members it left behind. A later start with
// ForceNewCluster is refused once the log has moved past that index (the
// flag left on would throw away the members added back since); and none
// of the left-behind members' requests reaches raft while they are not in
// the configuration, so one that comes back on its old data directory
// cannot depose the recovered cluster's leader with an old, higher term
// (they must never be started again on those directories).

// recoveredFile records a forced recovery in --data-dir/raft.
const recoveredFile = "recovered"

// forcedFloorBlocks: the token floor of a forced recovery is the wall
// clock + the failover timeout + this many token blocks.
const forcedFloorBlocks = 4

// forcedFloor is the token floor of a forced recovery now.
func (n *node) forcedFloor() uint64 {
	return repl.WallFloor() + uint64(n.cfg.FailoverTimeout) + forcedFloorBlocks*n.cfg.TokenBlock
}

// recovery is what recoveredFile holds.
type recovery struct {
	index uint64
	gone  []string
}

func readRecovery(base string) (recovery, bool, error) {
	b, err := os.ReadFile(filepath.Join(base, recoveredFile))
	if errors.Is(err, fs.ErrNotExist) {
		return recovery{}, false, nil
	}
	if err != nil {
		return recovery{}, false, err
	}
	var r recovery
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "index":
			if r.index, err = strconv.ParseUint(v, 10, 64); err != nil {
				return r, false, fmt.Errorf("raftnode: %s: bad index %q", recoveredFile, v)
			}
		case "gone":
			r.gone = append(r.gone, v)
		}
	}
	return r, true, nil
}

func writeRecovery(base string, r recovery) error {
	var b strings.Builder
	fmt.Fprintf(&b, "index %d\n", r.index)
	for _, id := range r.gone {
		fmt.Fprintf(&b, "gone %s\n", id)
	}
	return writeFileSynced(filepath.Join(base, recoveredFile), []byte(b.String()))
}

// loadGone reads the members a forced recovery left behind, for admit.
func (n *node) loadGone(base string) error {
	r, ok, err := readRecovery(base)
	if err != nil || !ok || len(r.gone) == 0 {
		return err
	}
	gone := map[string]bool{}
	for _, id := range r.gone {
		gone[id] = true
	}
	n.ms.gone.Store(&gone)
	return nil
}

// fromGone reports whether rpc comes from a member a forced recovery left
// behind that is not in the configuration again (memberTransport.admit).
func (n *node) fromGone(rpc raft.RPC) bool {
	gone := n.ms.gone.Load()
	if gone == nil {
		return false
	}
	h, ok := rpc.Command.(raft.WithRPCHeader)
	if !ok {
		return false
	}
	id := h.GetRPCHeader().ID
	if !(*gone)[string(id)] {
		return false
	}
	if v := n.ms.view.Load(); v != nil {
		if _, in := v.server(raft.ServerID(id)); in {
			return false
		}
	}
	return true
}

// errGoneMember answers a member that a forced recovery left behind.
var errGoneMember = errors.New("raftnode: this member was left behind by a forced recovery (--force-new-cluster): refused; start it only on an empty data directory, with --join")

// refusedGone logs (at most every 10 s) a request of a member left
// behind.
func (n *node) refusedGone(rpc raft.RPC) {
	now := time.Now().UnixNano()
	last := n.ms.goneLog.Load()
	if now-last < int64(10*time.Second) || !n.ms.goneLog.CompareAndSwap(last, now) {
		return
	}
	var id []byte
	if h, ok := rpc.Command.(raft.WithRPCHeader); ok {
		id = h.GetRPCHeader().ID
	}
	n.log.Error("a member that the forced recovery left behind is talking to this cluster: refused (it must never start again on its old data directory)",
		"id", string(id))
}

// lastIndex is the highest index of the log or the newest snapshot.
func lastIndex(logs raft.LogStore, snaps raft.SnapshotStore) (uint64, error) {
	last, err := logs.LastIndex()
	if err != nil {
		return 0, err
	}
	metas, err := snaps.List()
	if err != nil {
		return 0, err
	}
	if len(metas) > 0 {
		last = max(last, metas[0].Index)
	}
	return last, nil
}

// lastConfiguration is the latest configuration of the snapshots and the
// log.
func lastConfiguration(logs raft.LogStore, snaps raft.SnapshotStore) (raft.Configuration, error) {
	var conf raft.Configuration
	from := uint64(1)
	metas, err := snaps.List()
	if err != nil {
		return conf, err
	}
	if len(metas) > 0 {
		conf, from = metas[0].Configuration, metas[0].Index+1
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return conf, err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return conf, err
	}
	var l raft.Log
	for i := max(first, from); i <= last && i > 0; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return conf, fmt.Errorf("raft log entry %d: %w", i, err)
		}
		if l.Type == raft.LogConfiguration {
			conf = raft.DecodeConfiguration(l.Data)
		}
	}
	return conf, nil
}

// forceNewCluster turns this member's raft state into a one-member
// cluster (RecoverCluster), unless an earlier recovery's cluster has
// moved on since.
func (n *node) forceNewCluster(conf *raft.Config, base string, self raft.ServerAddress) error {
	flag := func(why string, args ...any) error {
		return &repl.FieldError{Field: "ForceNewCluster", Value: true, Want: fmt.Sprintf(why, args...)}
	}
	last, err := lastIndex(n.logs, n.snaps)
	if err != nil {
		return err
	}
	prev, ok, err := readRecovery(base)
	if err != nil {
		return err
	}
	if ok && last > prev.index {
		return flag("this member already recovered as a new cluster (raft index %d) and that cluster has changed since (index %d): "+
			"remove the flag (forcing again would drop every member added back since); to force a second recovery anyway, delete %s",
			prev.index, last, filepath.Join(base, recoveredFile))
	}
	old, err := lastConfiguration(n.logs, n.snaps)
	if err != nil {
		return err
	}
	gone := prev.gone
	for _, s := range old.Servers {
		if s.ID != n.id && !slices.Contains(gone, string(s.ID)) {
			gone = append(gone, string(s.ID))
		}
	}
	alone := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: n.id, Address: self}}}
	if err := raft.RecoverCluster(conf, (*raftFSM)(n), n.logs, n.stable, n.snaps, n.mt, alone); err != nil {
		return fmt.Errorf("raftnode: recovering as a new cluster: %w", err)
	}
	at, err := lastIndex(n.logs, n.snaps)
	if err != nil {
		return err
	}
	if err := writeRecovery(base, recovery{index: at, gone: gone}); err != nil {
		return fmt.Errorf("raftnode: recording the recovery: %w", err)
	}
	n.log.Warn("forced a new cluster of this member alone from its own log and snapshots (--force-new-cluster): "+
		"add members back with member add; the members left behind must never start again on their old data directories",
		"index", at, "left_behind", gone, "locks", n.table.Stats().Keys)
	return nil
}

// writeFileSynced writes path through a synced temporary file, a rename
// and a sync of its directory.
func writeFileSynced(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
