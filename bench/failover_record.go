package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/client"
	"github.com/lockd-dev/lockd/proto"
)

// The failover mode's record: every answered request with when it was sent
// and answered (recorder), the longest gap without an answer in a window,
// and the non-answers counted by kind (outcomes) — what a trial's figures
// are computed from.

// event kinds.
const (
	evGrant uint8 = iota + 1
	evRelease
)

// event is one answered request: sent at start, answered at end
// (nanoseconds since the recorder's base), by member (-1: a library
// worker, which does not say which member answered).
type event struct {
	start, end int64
	member     int8
	kind       uint8
}

// recorder keeps the answered requests of the current trial.
type recorder struct {
	base time.Time
	mu   sync.Mutex
	ev   []event
	max  int
	over bool
}

func newRecorder(maxEvents int) *recorder {
	return &recorder{base: time.Now(), max: maxEvents}
}

func (r *recorder) now() int64 { return int64(time.Since(r.base)) }

func (r *recorder) add(e event) {
	r.mu.Lock()
	if len(r.ev) < r.max {
		r.ev = append(r.ev, e)
	} else {
		r.over = true
	}
	r.mu.Unlock()
}

// reset starts a new trial's record.
func (r *recorder) reset() {
	r.mu.Lock()
	r.ev, r.over = r.ev[:0], false
	r.mu.Unlock()
}

// snapshot returns a copy of the record so far.
func (r *recorder) snapshot() ([]event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ev), r.over
}

// longestGap is the longest interval without an answer that starts at or
// before to and ends at or after from, given the sorted answer times: an
// interval that overlaps the window counts in full. One still open at the
// last answer (nothing answered after it) lasts until now, when the record
// was taken: a lower bound. It returns the gap and where it starts.
func longestGap(ends []int64, from, to, now int64) (gap, at int64) {
	prev := from
	i, _ := slices.BinarySearch(ends, from)
	if i > 0 {
		prev = ends[i-1]
	}
	for ; i < len(ends) && prev <= to; i++ {
		if d := ends[i] - prev; d > gap {
			gap, at = d, prev
		}
		prev = ends[i]
	}
	if i == len(ends) && prev <= to && now-prev > gap {
		gap, at = now-prev, prev
	}
	return gap, at
}

// answerTimes returns the sorted answer times of the events keep selects.
func answerTimes(evs []event, keep func(event) bool) []int64 {
	var out []int64
	for _, e := range evs {
		if keep(e) {
			out = append(out, e.end)
		}
	}
	slices.Sort(out)
	return out
}

// Outcome is how often one kind of non-answer happened in a phase of a
// trial, and when the first and the last happened (ms from the phase's
// start: the signal, or the restart).
type Outcome struct {
	N     int64   `json:"n"`
	First float64 `json:"first_ms"`
	Last  float64 `json:"last_ms"`
}

// outcomes counts non-answers by kind, with when they happened
// (recorder time).
type outcomes struct {
	mu sync.Mutex
	m  map[string]*[3]int64 // count, first, last
}

func (o *outcomes) add(kind string, at int64) {
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*[3]int64{}
	}
	c := o.m[kind]
	if c == nil {
		c = &[3]int64{0, at, at}
		o.m[kind] = c
	}
	c[0]++
	c[1], c[2] = min(c[1], at), max(c[2], at)
	o.mu.Unlock()
}

// take returns the counts since the last take, times relative to since.
func (o *outcomes) take(since int64) map[string]Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.m) == 0 {
		return nil
	}
	out := make(map[string]Outcome, len(o.m))
	for k, c := range o.m {
		out[k] = Outcome{N: c[0], First: ms(c[1] - since), Last: ms(c[2] - since)}
	}
	o.m = nil
	return out
}

// Outcome names the summary counts.
const (
	outIndeterminate  = "library indeterminate"
	outProbeE4        = "probe E4"         // an acquire answered E 4
	outProbeReleaseE4 = "probe release E4" // a release answered E 4
)

// probeErrorOutcome names a probe's acquire or release answered E code.
func probeErrorOutcome(release bool, code uint8) string {
	switch {
	case code == proto.CodeShutdown && release:
		return outProbeReleaseE4
	case code == proto.CodeShutdown:
		return outProbeE4
	case release:
		return "probe release E" + strconv.Itoa(int(code))
	}
	return "probe E" + strconv.Itoa(int(code))
}

// e4Answers counts the answers E 4 (shutting down) among a phase's
// non-answers: the probes see every E; the library resends after an E 4
// without telling its caller.
func e4Answers(m map[string]Outcome) int64 {
	return m[outProbeE4].N + m[outProbeReleaseE4].N
}

// clientOutcome names a library error.
func clientOutcome(err error) string {
	var se *client.ServerError
	switch {
	case errors.Is(err, client.ErrIndeterminate):
		return outIndeterminate
	case errors.Is(err, client.ErrNoConnection):
		return "library no connection"
	case errors.Is(err, client.ErrNotHeld):
		return "library not held"
	case errors.Is(err, client.ErrTimeout):
		return "library timeout"
	case errors.Is(err, client.ErrBusy):
		return "library busy"
	case errors.As(err, &se):
		return "library E" + strconv.Itoa(int(se.Code))
	case errors.Is(err, context.Canceled):
		return ""
	}
	return "library other"
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }
