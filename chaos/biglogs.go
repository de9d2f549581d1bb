package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// What the large-state phase reads in the members' logs: stalls (ticks
// that stopped for half a failover timeout or more), promotions and the
// contests of two actives, which tell an allowed change of active from a
// false promotion.

// keepLogs writes every member's whole log (its state and the proxies',
// as Dump writes them) to bigstate-members.log in the artifacts directory:
// the phase's cluster is closed when it ends, and its logs with it.
func (b *bigPhase) keepLogs() {
	if b.out == "" {
		return
	}
	path := filepath.Join(b.out, "bigstate-members.log")
	f, err := os.Create(path)
	if err == nil {
		b.c.Dump(f, 1<<30)
		err = f.Close()
	}
	if err != nil {
		b.note("the members' logs: %v", err)
		return
	}
	b.note("the members' logs: %s", path)
}

// stalledAny reports whether a member's log says that it was frozen or
// stalled, around at (an event seen then), for at least half a failover
// timeout (its ticker's gap: it sent no heartbeat meanwhile) — a stall of
// the machine (the run shares two cores with whatever else runs) after
// which the others may rightly have found it silent. A member logs a stall
// when it resumes, which may come after the event: the logs are read again
// for up to five failover timeouts. Any member's counts: a change of
// active follows the stall of whichever member was found silent — the
// active, or a standby that then took its own stall for the active's
// silence — and the rules that resolve two actives follow that.
func (b *bigPhase) stalledAny(at time.Time) (string, bool) {
	for deadline := at.Add(5 * b.cfg.BigFailover); ; {
		for m := range b.c.Members() {
			if why, ok := b.stallIn(m, at); ok {
				return fmt.Sprintf("member %d: %s", m, why), true
			}
		}
		if time.Now().After(deadline) {
			return "", false
		}
		time.Sleep(b.cfg.BigFailover / 2)
	}
}

// calm waits until no stall has changed the active for five failover
// timeouts (bounded by bigStepWithin): two actives resolve within two, so
// a table read after it is the one that stays.
func (b *bigPhase) calm() {
	for deadline := time.Now().Add(bigStepWithin); time.Now().Before(deadline); {
		b.mu.Lock()
		since := time.Since(b.changed)
		b.mu.Unlock()
		if since >= 5*b.cfg.BigFailover {
			return
		}
		time.Sleep(b.cfg.BigFailover)
	}
}

// stallIn is stalled on member m's log as it is now.
func (b *bigPhase) stallIn(m int, at time.Time) (string, bool) {
	return stallInLog(b.c.Member(m).Logs(), at, b.cfg.BigFailover)
}

// stallInLog finds, in a member's log, a stall of at least half the
// failover timeout that began within ten failover timeouts before at: the
// line the member logs when it notices its ticks stopped, at its time and
// with the gap. (Ten: a promotion follows a failover timeout of silence,
// then a reservation, and the stalls of a loaded machine come in runs.)
func stallInLog(logs string, at time.Time, failover time.Duration) (string, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "frozen or stalled") {
			continue
		}
		var rec struct {
			Time time.Time `json:"time"`
			Gap  int64     `json:"gap"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		gap := time.Duration(rec.Gap)
		began := rec.Time.Add(-gap) // the stall's start
		if gap >= failover/2 && began.Before(at) && began.After(at.Add(-10*failover)) {
			return fmt.Sprintf("a %v gap in its ticks at %s", gap.Round(time.Millisecond), rec.Time.Format("15:04:05.000")), true
		}
	}
	return "", false
}

// promotedAt is when member m logged that it serves as the active at
// epoch (its promotion's end: the line "active" with that epoch), or
// seen when its log does not say (yet).
func (b *bigPhase) promotedAt(m int, epoch uint64, seen time.Time) time.Time {
	if t, ok := activeLineAt(b.c.Member(m).Logs(), epoch); ok {
		return t
	}
	return seen
}

// activeLineAt finds, in a member's log, the time of its line "active" at
// epoch.
func activeLineAt(logs string, epoch uint64) (time.Time, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"msg":"active"`) {
			continue
		}
		var rec struct {
			Time  time.Time `json:"time"`
			Epoch uint64    `json:"epoch"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Epoch == epoch {
			return rec.Time, true
		}
	}
	return time.Time{}, false
}

// contestLines counts, in the members' logs, the step-downs that resolved
// two actives by what each would lose: the later active yielding to an
// earlier one that held more (an empty or partial promotion after a
// stall), and an earlier one yielding to a later one that had served
// since.
func contestLines(logs string) (laterYielded, earlierYielded int) {
	for _, line := range strings.Split(logs, "\n") {
		switch {
		case strings.Contains(line, "stepping down: another member became active earlier and would lose more"):
			laterYielded++
		case strings.Contains(line, "stepping down: another member became active later and would lose more"):
			earlierYielded++
		}
	}
	return laterYielded, earlierYielded
}
