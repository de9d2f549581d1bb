package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Kind is what an operation did.
type Kind uint8

// The kinds of operation.
const (
	Acquire Kind = iota + 1 // take a lock: Token is the token granted (OK only)
	Release                 // release the lock of Token
	Renew                   // renew the lease of Token
	Write                   // a write to the fenced resource under Token
	// Leave: the holder of Token told a counted resource it is done
	// (CheckCountedFenced), just before its release; Seq orders it among
	// the resource's decisions.
	Leave
)

var kindNames = [...]string{Acquire: "acquire", Release: "release", Renew: "renew", Write: "write", Leave: "leave"}

// String is the kind's name.
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MarshalText implements encoding.TextMarshaler.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, n := range kindNames {
		if n != "" && n == string(b) {
			*k = Kind(i)
			return nil
		}
	}
	return fmt.Errorf("%w: kind %q", ErrBadHistory, b)
}

// Outcome is what became of an operation.
type Outcome uint8

// The outcomes.
const (
	// OK: executed with the expected answer (A, R, K; a write accepted).
	OK Outcome = iota + 1
	// Fail: definitively not done (T, B, N; not sent; a write rejected).
	// Detail says which.
	Fail
	// Unknown: it may or may not have been executed (the client's
	// ErrIndeterminate).
	Unknown
)

var outcomeNames = [...]string{OK: "ok", Fail: "fail", Unknown: "unknown"}

// String is the outcome's name.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// MarshalText implements encoding.TextMarshaler.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (o *Outcome) UnmarshalText(b []byte) error {
	for i, n := range outcomeNames {
		if n != "" && n == string(b) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("%w: outcome %q", ErrBadHistory, b)
}

// Details of a Fail (Op.Detail); other texts are kept as they come.
const (
	DetailTimeout = "timeout"       // T, or the wait ended unexecuted: no effect
	DetailBusy    = "busy"          // B: no effect
	DetailNotHeld = "not held"      // N: the token was not the key's current grant
	DetailNoConn  = "no connection" // nothing was sent
	DetailStale   = "stale"         // the fenced resource rejected the token
)

// Op is one operation of one client, as the client saw it. Times are
// offsets from the run's start on the monotonic clock.
type Op struct {
	ID     int    `json:"id"`     // its index in History.Ops
	Worker int    `json:"worker"` // the client that made it, from 0
	Kind   Kind   `json:"kind"`
	Key    string `json:"key"`
	Token  uint64 `json:"token,omitempty"` // acquire: granted (OK only); else: the token sent
	// Limit is, for an acquire of a shared key (a semaphore's permit,
	// PROTOCOL.md §9.2), the key's limit; 0 for an exclusive acquire.
	Limit   int           `json:"limit,omitempty"`
	Lease   time.Duration `json:"lease,omitempty"` // acquire, renew: the lease asked for
	Wait    time.Duration `json:"wait,omitempty"`  // acquire: how long it could queue
	Call    time.Duration `json:"call"`            // invoked
	Return  time.Duration `json:"return"`          // completed (for Unknown: when the client gave up)
	Outcome Outcome       `json:"outcome"`
	Detail  string        `json:"detail,omitempty"` // why it failed (Detail* constants) or the error's text
	// Expires is, for an OK acquire or renew, the client's conservative
	// end of the lease; for a write to a counted resource, the end the
	// holder declared with it (its lease's, as it knew it then).
	Expires time.Duration `json:"expires,omitempty"`
	// Grant is, for a release, renew or write, the ID of the acquire that
	// granted Token; -1 if there is none. Acquires have -1.
	Grant int    `json:"grant"`
	Seq   uint64 `json:"seq,omitempty"` // write, leave: the fenced resource's decision order, from 1
	// Late marks a write made on purpose after the holder's lease had
	// ended (a paused holder that wakes up): fencing must reject it once a
	// successor has written.
	Late bool `json:"late,omitempty"`

	// src is, for an op of a history History.Select made, its ID in the
	// history it was selected from, plus one (0: not selected): what the
	// checkers name, so that a report points into the recorded history.
	src int
}

// ref is the ID that names o in a report: its ID in the recorded history.
func (o Op) ref() int {
	if o.src > 0 {
		return o.src - 1
	}
	return o.ID
}

// ref names op id of h in a report (ref of that op; id itself when h has
// no such op).
func (h History) ref(id int) int {
	if id >= 0 && id < len(h.Ops) {
		return h.Ops[id].ref()
	}
	return id
}

// String describes the operation in one line.
func (o Op) String() string {
	s := fmt.Sprintf("op %d: worker %d %s %q", o.ref(), o.Worker, o.Kind, o.Key)
	if o.Token != 0 {
		s += fmt.Sprintf(" token %d", o.Token)
	}
	s += fmt.Sprintf(" [%v, %v] %s", o.Call.Round(time.Microsecond), o.Return.Round(time.Microsecond), o.Outcome)
	if o.Detail != "" {
		s += " (" + o.Detail + ")"
	}
	if o.Late {
		s += " late"
	}
	return s
}

// Fault is one fault a nemesis injected, from Start until End (equal for
// an instant fault such as dropping connections).
type Fault struct {
	Kind   string        `json:"kind"`   // kill, stop, partition, handover, drop, ...
	Target string        `json:"target"` // which members or links
	Start  time.Duration `json:"start"`
	End    time.Duration `json:"end"`
	Note   string        `json:"note,omitempty"` // what the nemesis saw (the member was the active, the exit code, an error)
}

// History is everything recorded in a run.
type History struct {
	Ops    []Op    `json:"ops"`
	Faults []Fault `json:"faults,omitempty"`
}

// ErrBadHistory reports a history that is not well formed.
var ErrBadHistory = errors.New("history: malformed history")

// Validate reports the first way in which h is not well formed: IDs that
// are not indexes, an unknown kind or outcome, a completion before its
// invocation, a grant reference to something other than an earlier
// acquire of the same key, a write or leave without a decision order or
// two with the same one, a leave that is not an OK step of a grant.
func (h History) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadHistory, fmt.Sprintf(format, args...))
	}
	seqs := map[uint64]int{}
	for i, o := range h.Ops {
		switch {
		case o.ID != i:
			return bad("op at index %d has ID %d", i, o.ID)
		case o.Kind < Acquire || o.Kind > Leave:
			return bad("op %d: kind %d", i, o.Kind)
		case o.Outcome < OK || o.Outcome > Unknown:
			return bad("op %d: outcome %d", i, o.Outcome)
		case o.Return < o.Call:
			return bad("op %d returns (%v) before its call (%v)", i, o.Return, o.Call)
		case o.Worker < 0:
			return bad("op %d: worker %d", i, o.Worker)
		}
		if o.Kind == Acquire {
			if o.Grant != -1 {
				return bad("op %d: an acquire with grant %d (want -1)", i, o.Grant)
			}
			continue
		}
		if o.Grant != -1 {
			if o.Grant < 0 || o.Grant >= i || h.Ops[o.Grant].Kind != Acquire || h.Ops[o.Grant].Key != o.Key {
				return bad("op %d: grant %d is not an earlier acquire of %q", i, o.Grant, o.Key)
			}
		}
		if o.Kind == Leave && (o.Outcome != OK || o.Grant < 0) {
			return bad("op %d: a leave is an OK step of a grant", i)
		}
		if o.Kind == Write || o.Kind == Leave {
			if o.Outcome == Unknown {
				return bad("op %d: a write's outcome is always known", i)
			}
			if o.Seq == 0 {
				return bad("op %d: a %s without a decision order", i, o.Kind)
			}
			if j, dup := seqs[o.Seq]; dup {
				return bad("ops %d and %d: the same decision order %d", j, i, o.Seq)
			}
			seqs[o.Seq] = i
		}
	}
	for i, f := range h.Faults {
		if f.End < f.Start {
			return bad("fault %d (%s) ends before it starts", i, f.Kind)
		}
	}
	return nil
}

// WriteJSON writes h as one JSON document.
func (h History) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(h)
}

// ReadJSON reads a history written by WriteJSON and validates it.
func ReadJSON(r io.Reader) (History, error) {
	var h History
	if err := json.NewDecoder(r).Decode(&h); err != nil {
		return History{}, fmt.Errorf("%w: %w", ErrBadHistory, err)
	}
	return h, h.Validate()
}

// Recorder collects a history from concurrent clients. Its zero value is
// not usable: use NewRecorder.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	h     History
}

// NewRecorder returns a Recorder whose times count from start (which
// should carry a monotonic clock reading: time.Now()).
func NewRecorder(start time.Time) *Recorder { return &Recorder{start: start} }

// Now is the time since the start.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// At converts an instant (with a monotonic reading) to the history's
// time.
func (r *Recorder) At(t time.Time) time.Duration { return t.Sub(r.start) }

// Add appends op, giving it the next ID, which it returns.
func (r *Recorder) Add(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.h.Ops)
	r.h.Ops = append(r.h.Ops, op)
	return op.ID
}

// AddFault appends f and returns its index, for EndFault.
func (r *Recorder) AddFault(f Fault) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults = append(r.h.Faults, f)
	return len(r.h.Faults) - 1
}

// EndFault records that fault i ended at end, with a note added to its own.
func (r *Recorder) EndFault(i int, end time.Duration, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := &r.h.Faults[i]
	f.End = max(end, f.Start)
	if note != "" {
		if f.Note != "" {
			f.Note += "; "
		}
		f.Note += note
	}
}

// History returns a copy of what was recorded so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History{
		Ops:    append([]Op(nil), r.h.Ops...),
		Faults: append([]Fault(nil), r.h.Faults...),
	}
}
