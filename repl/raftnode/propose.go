package raftnode

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/lockd-dev/lockd/repl"
	"github.com/lockd-dev/lockd/repl/records"
	"github.com/lockd-dev/lockd/shard"
)

// Raft tuning.
const (
	// raftMaxEntry is the raw size at which the proposer cuts a log entry
	// (about 30,000 records): a burst larger than that goes out as several
	// entries in the pipeline.
	raftMaxEntry = 1 << 20
	// raftPipeline is how many entries of records may be in flight
	// (proposed, not yet committed) at once: one, by measurement
	// (BENCHMARKS.md, "Why one entry in flight", and "The raft leader's
	// log write in parallel"). Once the leader's own fsync left the
	// critical path (durable.go), two in flight still lost: every entry
	// costs each follower an fsync of its own on the members' shared
	// disk, so commit p50 rose from 0.92 to 1.33 ms with handoffs.
	raftPipeline = 1
	// raftLatencies is how many commit latencies Status summarises.
	raftLatencies = 1024
	// lingerFor bounds how long after a commit the proposer waits for
	// the records that commit's answers bring back (linger): 200 µs, by
	// measurement (BENCHMARKS.md, "The proposer's linger"; 150 and 300 µs
	// did as well with handoffs, 600 µs lost everywhere).
	lingerFor = 200 * time.Microsecond
	// lingerMax: the proposer never waits for more records than this (a
	// buffer this full goes at once).
	lingerMax = 64
)

// errClosed: the raft node closed while a token reservation waited for a
// leader.
var errClosed = errors.New("raftnode: raft node closed")

// raftStats are the counters Status shows.
type raftStats struct {
	entries, records, elections, rebuilds, snapshots atomic.Uint64
	snapshotBytes                                    atomic.Int64
	latMu                                            sync.Mutex
	lat                                              []time.Duration // ring of commit latencies
	latNext                                          int
	// Every commit latency by repl.CommitBuckets, and their sum (ns).
	latCounts [len(repl.CommitBuckets) + 1]atomic.Uint64
	latSum    atomic.Int64
}

// histogram copies the commit latency histogram into st.
func (s *raftStats) histogram(st *repl.RaftStatus) {
	for i := range s.latCounts {
		st.CommitCounts[i] = s.latCounts[i].Load()
	}
	st.CommitSum = float64(s.latSum.Load()) / 1e9
}

func (s *raftStats) addLatency(d time.Duration) {
	b := 0
	for b < len(repl.CommitBuckets) && d.Seconds() > repl.CommitBuckets[b] {
		b++
	}
	s.latCounts[b].Add(1)
	s.latSum.Add(int64(d))
	s.latMu.Lock()
	if len(s.lat) < raftLatencies {
		s.lat = append(s.lat, d)
	} else {
		s.lat[s.latNext] = d
		s.latNext = (s.latNext + 1) % raftLatencies
	}
	s.latMu.Unlock()
}

// percentiles returns the p50 and p99 of the latencies kept, in seconds.
func (s *raftStats) percentiles() (p50, p99 float64) {
	s.latMu.Lock()
	l := slices.Clone(s.lat)
	s.latMu.Unlock()
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	at := func(q float64) float64 { return l[min(int(q*float64(len(l))), len(l)-1)].Seconds() }
	return at(0.50), at(0.99)
}

// sealed is an entry's records cut at raftMaxEntry before the proposer
// took them.
type sealed struct {
	w           records.BatchWriter
	first, last uint64
}

// proposal is an entry in flight.
type proposal struct {
	f        raft.ApplyFuture
	last     uint64 // the number of its last record (0: a reservation)
	records  int
	proposed time.Time
	term     uint64 // the leadership it was proposed in
	sent     int64  // when, on the table's clock (the lease, lease.go)
}

// sink receives every change of the table, under its shard lock.
func (n *node) sink(r shard.Record) {
	n.mu.Lock()
	if !n.proposing {
		// Only FSM.Apply may change a table that does not lead, and it
		// emits nothing: this change (a closing connection giving back a
		// grant on a deposed leader) is not in the log. Rebuild.
		n.dirty = true
		n.mu.Unlock()
		n.poke()
		return
	}
	if err := n.buf.Add(&r); err != nil {
		n.mu.Unlock()
		n.log.Error("a change of the table cannot go into the raft log; it will be lost at the next leader change", "err", err, "key_len", len(r.Key))
		return
	}
	n.num++
	n.barrier.Store(n.num)
	// The proposer takes everything buffered when it wakes: wake it for
	// the first record after it took the buffer, and for a sealed entry.
	wake := n.buf.Count() == 1
	if n.lingerWant > 0 && n.buf.Count() >= n.lingerWant {
		n.lingerWant = 0
		select {
		case n.lingered <- struct{}{}:
		default:
		}
	}
	if n.buf.Len() >= raftMaxEntry {
		n.full = append(n.full, sealed{w: n.buf, first: n.first, last: n.num})
		n.buf = records.BatchWriter{}
		n.first = n.num + 1
		wake = true
	}
	n.mu.Unlock()
	if wake {
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// poke wakes the actor (raftnode.go): the Sink, the committer and the FSM
// call it when the table or the leadership needs its look.
func (n *node) poke() {
	select {
	case n.actKick <- struct{}{}:
	default:
	}
}

// proposer cuts the records buffered since the last entry into one entry
// and proposes it, while a pipeline slot is free: the records that arrive
// meanwhile go together into the next.
func (n *node) proposer() {
	defer n.wg.Done()
	var spare records.BatchWriter
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-n.kick:
		}
		for {
			select {
			case n.slots <- struct{}{}:
			case <-n.quit:
				return
			}
			n.mu.Lock()
			// A linger releases mu: look again after one.
			if n.idleLocked() || (n.lingerLocked(linger) && n.idleLocked()) {
				n.mu.Unlock()
				<-n.slots
				break
			}
			var first, last uint64
			if len(n.full) > 0 {
				spare, first, last = n.full[0].w, n.full[0].first, n.full[0].last
				n.full = slices.Delete(n.full, 0, 1)
			} else {
				n.buf, spare = spare, n.buf
				first, last = n.first, n.num
				n.first = n.num + 1
			}
			term := n.term
			n.busy.Add(1)
			n.mu.Unlock()
			count := spare.Count()
			raw := spare.Bytes()
			data := appendRecordsEntry(make([]byte, 0, entryHeader+32+len(raw)), n.cfg.Self, term,
				time.Now().UnixNano(), first, last, count, raw)
			spare.Reset()
			p := &proposal{last: last, records: count, proposed: time.Now(), term: term, sent: n.clock()}
			p.f = n.r.Apply(data, 0)
			n.inflight <- p
		}
	}
}

// idleLocked (under mu) reports whether there is nothing to propose: this
// member does not propose, or nothing is buffered.
func (n *node) idleLocked() bool {
	return !n.proposing || (n.buf.Count() == 0 && len(n.full) == 0)
}

// lingerLocked (under mu, which it may release and take again) waits,
// right after a commit, for the records that commit's answers bring back:
// until the buffer holds as many more records than it held at the commit
// as the committed entry carried (lingerTo, at most lingerMax), or
// lingerFor after the commit. A client whose
// answer just left sends its next request within a round trip; without
// the wait the first one to arrive goes out alone and the rest wait a
// whole commit for the next entry, so a chain of handoffs on a hot key
// moved only every other entry. A buffer already that full, a sealed
// entry, or a request arriving later than lingerFor after the commit goes
// at once: a lone sequential client (one record per entry) never waits.
// It reports whether it waited (the caller looks at the buffer again).
func (n *node) lingerLocked(t *time.Timer) bool {
	want := n.lingerTo
	if len(n.full) > 0 || n.buf.Count() >= want {
		return false
	}
	wait := time.Duration(n.lastCommit.Load() + int64(n.lingerFor) - time.Now().UnixNano())
	if wait <= 0 {
		return false
	}
	n.lingerWant = want
	n.mu.Unlock()
	t.Reset(wait) // Go 1.23+ timers: no stale tick survives Stop or Reset
	select {
	case <-t.C:
	case <-n.lingered:
		t.Stop()
	case <-n.quit:
		t.Stop()
	}
	n.mu.Lock()
	n.lingerWant = 0
	select { // a signal that came after the timer fired
	case <-n.lingered:
	default:
	}
	return true
}

// committer waits for the entries in flight, in order: a committed entry
// lets its answers leave (Host.Committed); a failed one means the
// leadership is gone (the actor takes it from there).
func (n *node) committer() {
	defer n.wg.Done()
	defer close(n.committerDone)
	for {
		var p *proposal
		select {
		case <-n.quit:
			return
		case p = <-n.inflight:
		}
		err := applied(p.f)
		if err == nil {
			n.mu.Lock()
			n.lingerTo = min(n.buf.Count()+p.records, lingerMax)
			n.mu.Unlock()
			n.lastCommit.Store(time.Now().UnixNano())
			n.committedIn(p.term, p.sent)
			n.stats.addLatency(time.Since(p.proposed))
			n.stats.entries.Add(1)
			n.stats.records.Add(uint64(p.records))
			n.committed.Store(p.last)
			if n.host != nil {
				n.host.Committed(p.last)
			}
		} else {
			n.log.Debug("a proposed entry failed", "err", err, "last", p.last)
			n.poke()
		}
		n.busy.Add(-1)
		<-n.slots
		// Records that arrived while every slot was taken wait for a kick.
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// reserve makes tokens up to limit safe: a committed reservation entry.
// On a member that does not lead it waits until one does or the node
// closes (a reserver never extends the allocator of a follower).
func (n *node) reserve(limit uint64) error {
	for {
		term := n.leadTerm.Load()
		if term != 0 {
			err := n.applyReserve(term, limit)
			if err == nil && n.leadTerm.Load() == term {
				return nil
			}
			if err != nil && !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost) {
				return err
			}
		}
		select {
		case <-n.quit:
			return errClosed
		case <-time.After(n.cfg.FailoverTimeout / 10):
		}
	}
}

// applyReserve commits a reservation of tokens up to limit for term.
func (n *node) applyReserve(term, limit uint64) error {
	sent := n.clock()
	err := applied(n.r.Apply(appendReserveEntry(nil, n.cfg.Self, term, limit), n.cfg.FailoverTimeout))
	if err == nil {
		n.committedIn(term, sent)
	}
	return err
}

// applied waits for f and returns its error, or the error FSM.Apply
// answered it with (the entry was not made durable here: fsm.go).
func applied(f raft.ApplyFuture) error {
	if err := f.Error(); err != nil {
		return err
	}
	if err, ok := f.Response().(error); ok {
		return err
	}
	return nil
}

// committedIn renews the lease of term with an entry proposed at sent
// that committed (lease.go). Only while raft is still in term: the term
// never goes back, so the entry was then proposed and committed in that
// leadership, not in a later one of this member.
func (n *node) committedIn(term uint64, sent int64) {
	if n.r.CurrentTerm() != term {
		return
	}
	n.lease.committed(term, sent)
	n.renew(term)
}
