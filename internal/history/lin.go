package history

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// LockInput is a lock operation as the model sees it: porcupine's
// Operation carries it as Input (and the op's times as Call and Return).
type LockInput struct {
	ID      int // the op's ID in the history
	Kind    Kind
	Token   uint64 // release, renew: the token sent
	Lease   int64  // acquire, renew: nanoseconds
	Call    int64  // nanoseconds, as the Operation's
	Return  int64  // nanoseconds; math.MaxInt64 for an unknown outcome
	Unknown bool   // the outcome is unknown: it may or may not have taken effect
}

// LockOutput is an operation's answer as the model sees it.
type LockOutput struct {
	Outcome Outcome
	NotHeld bool   // a Fail that is the server's N
	Token   uint64 // an acquire's granted token
}

// unknownHolder is the holder of a key granted by an acquire whose outcome
// is unknown: nobody knows its token (tokens are never this large).
const unknownHolder = math.MaxUint64

// lockState is one key's state in the model. Times are nanoseconds.
type lockState struct {
	Holder  uint64 // 0: free; unknownHolder; else the current token
	Avail   int64  // held: the earliest its lease can end; free: when it became free, at the earliest
	Largest uint64 // the largest token known to have been granted for the key
	Now     int64  // a lower bound of the instant of the last operation linearized
}

// LockModel is the porcupine model of one key of a lock service with
// leases and fencing tokens (the history is partitioned by key first:
// per-key tokens are checked here, the order across keys by CheckTokens).
// Its state is the holder's token, the earliest instant its lease can
// end, the largest token granted, and a lower bound of the current
// instant.
//
//   - acquire → A t: the key is free, or its lease can have ended by the
//     acquire's return; t is above every token granted for the key. The
//     lease then lasts until (the grant's instant, at the earliest) + lease.
//   - release → R: t is the holder (→ free); t not the holder leaves the
//     state as it is (the client reports a retried release answered N as
//     done: an earlier attempt may have executed).
//   - release/renew → N: t is not the holder, or its lease can have ended
//     by the return (→ free). An N while the lease surely runs is a lost
//     grant: no linearization.
//   - renew → K: t is the holder; the lease restarts.
//   - an unknown outcome: both the state before and the state after the
//     operation (an unknown acquire's grant has an unknown token and can
//     end at any moment: the client's compensating release, the server's
//     release of an undelivered grant).
//
// Acquires that definitively got nothing (T, B, not sent) change nothing
// and are left out of the partitions (a T after a wait is legal whatever
// the state, since waiters ahead may have taken the key).
var LockModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		return stepLock(state.(lockState), input.(LockInput), output.(LockOutput))
	},
	Equal: func(a, b any) bool { return a.(lockState) == b.(lockState) },
	Hash: func(s any) uint64 {
		st := s.(lockState)
		h := st.Holder*0x9e3779b97f4a7c15 ^ uint64(st.Avail)*0xbf58476d1ce4e5b9
		return h ^ st.Largest*0x94d049bb133111eb ^ uint64(st.Now)
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(LockInput), output.(LockOutput)
		s := fmt.Sprintf("op %d %s", in.ID, in.Kind)
		if in.Kind != Acquire {
			s += fmt.Sprintf(" %d", in.Token)
		}
		switch {
		case in.Unknown:
			return s + " → ?"
		case out.Outcome == OK && in.Kind == Acquire:
			return s + fmt.Sprintf(" → A %d", out.Token)
		case out.Outcome == OK:
			return s + " → ok"
		case out.NotHeld:
			return s + " → N"
		}
		return s + " → fail"
	},
	DescribeState: func(s any) string {
		st := s.(lockState)
		switch st.Holder {
		case 0:
			return fmt.Sprintf("free (largest %d)", st.Largest)
		case unknownHolder:
			return fmt.Sprintf("held by an unknown grant (largest %d)", st.Largest)
		}
		return fmt.Sprintf("held by %d until ≥ %v (largest %d)", st.Holder, time.Duration(st.Avail), st.Largest)
	},
}

// stepLock is LockModel's step.
func stepLock(st lockState, in LockInput, out LockOutput) []any {
	if in.Return < st.Now {
		return nil // it must have taken effect before an instant already passed
	}
	now := max(st.Now, in.Call)
	switch in.Kind {
	case Acquire:
		took := now // the grant's instant, at the earliest
		if st.Holder != 0 {
			if in.Return < st.Avail {
				return nil // granted while the holder's lease surely ran
			}
			took = max(took, st.Avail)
		}
		if in.Unknown {
			granted := lockState{Holder: unknownHolder, Avail: took, Largest: st.Largest, Now: took}
			return []any{st, granted}
		}
		if out.Outcome != OK || out.Token <= st.Largest {
			return nil // a token not above every earlier one
		}
		return []any{lockState{Holder: out.Token, Avail: took + in.Lease, Largest: out.Token, Now: took}}
	case Release, Renew:
		held := st.Holder == in.Token
		if in.Unknown {
			if !held {
				return []any{st}
			}
			done := lockState{Avail: now, Largest: st.Largest, Now: now} // released
			if in.Kind == Renew {
				done = lockState{Holder: in.Token, Avail: now + in.Lease, Largest: st.Largest, Now: now}
			}
			return []any{st, done}
		}
		switch {
		case out.Outcome == OK && !held && in.Kind == Release:
			return []any{st}
		case out.Outcome == OK && !held:
			return nil // K for a token that is not the holder's
		case out.Outcome == OK && in.Kind == Release:
			return []any{lockState{Avail: now, Largest: st.Largest, Now: now}}
		case out.Outcome == OK:
			return []any{lockState{Holder: in.Token, Avail: now + in.Lease, Largest: st.Largest, Now: now}}
		case !held:
			return []any{st} // N for a token that is not the holder's
		case in.Return < st.Avail:
			return nil // N while the holder's lease surely ran: a lost grant
		}
		at := max(now, st.Avail) // the lease ended (expiry), then the N
		return []any{lockState{Avail: at, Largest: st.Largest, Now: at}}
	}
	return nil
}

// LockOperations turns h into porcupine operations, one slice per key
// (keys sorted), with the operations the model checks: acquires granted
// or unknown, releases and renews answered or unknown (an N is kept, but
// a Release's N during a fault is unknown: resend.go; other
// failures are left out: nothing was executed). An unknown outcome gets
// the return time math.MaxInt64: it may take effect at any time after its
// call.
func LockOperations(h History) (keys []string, parts [][]porcupine.Operation) {
	byKey := map[string][]porcupine.Operation{}
	for _, o := range h.Ops {
		if o.Kind == Write || o.Kind == Leave {
			continue
		}
		notHeld := o.Outcome == Fail && o.Detail == DetailNotHeld
		if o.Outcome == Fail && (o.Kind == Acquire || !notHeld) {
			continue
		}
		resent := h.resent(o) // unknown: an earlier attempt may have released it
		if resent {
			notHeld = false
		}
		in := LockInput{ID: o.ref(), Kind: o.Kind, Token: o.Token, Lease: int64(o.Lease),
			Call: int64(o.Call), Return: int64(o.Return), Unknown: o.Outcome == Unknown || resent}
		if o.Kind == Acquire {
			in.Token = 0
		}
		if in.Unknown {
			in.Return = math.MaxInt64
		}
		out := LockOutput{Outcome: o.Outcome, NotHeld: notHeld}
		if resent {
			out.Outcome = Unknown
		}
		if o.Kind == Acquire && o.Outcome == OK {
			out.Token = o.Token
		}
		byKey[o.Key] = append(byKey[o.Key], porcupine.Operation{
			ClientId: o.Worker, Input: in, Call: in.Call, Output: out, Return: in.Return, Metadata: o.ref(),
		})
	}
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return keys, parts
}

// LinOptions configure CheckLinearizable.
type LinOptions struct {
	// Timeout bounds porcupine's search per key (0: 2 minutes); a key
	// that times out makes the result Inconclusive.
	Timeout time.Duration
	// Dir receives the visualization of each key whose history is not
	// linearizable (porcupine's HTML), named lin-<n>.html; "" writes
	// none.
	Dir string
}

// CheckLinearizable checks that h is linearizable with respect to
// LockModel, key by key, with porcupine. For each key that is not, it
// writes porcupine's visualization into opts.Dir and names it in the
// result.
func CheckLinearizable(h History, opts LinOptions) Result {
	r := Result{Name: "linearizability"}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	model := LockModel.ToModel()
	keys, parts := LockOperations(h)
	ops, timedOut := 0, 0
	began := time.Now()
	for i, k := range keys {
		ops += len(parts[i])
		res, info := porcupine.CheckOperationsVerbose(model, parts[i], opts.Timeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			timedOut++
			continue
		}
		msg := fmt.Sprintf("key %q: no linearization of its %d operations", k, len(parts[i]))
		if longest := longestPrefix(info); longest != "" {
			msg += "; " + longest
		}
		if opts.Dir != "" {
			path := filepath.Join(opts.Dir, fmt.Sprintf("lin-%d.html", i))
			if err := writeVisualization(model, info, path); err != nil {
				msg += fmt.Sprintf(" (visualization not written: %v)", err)
			} else {
				r.Artifacts = append(r.Artifacts, path)
				msg += " (visualization: " + path + ")"
			}
		}
		r.violate("%s", msg)
	}
	r.figure("keys", float64(len(keys)))
	r.figure("operations", float64(ops))
	r.figure("check_seconds", time.Since(began).Seconds())
	r.settle(Pass)
	if r.Count == 0 && timedOut > 0 {
		r.Verdict = Inconclusive
	}
	r.Summary = fmt.Sprintf("%d operations on %d keys: %d keys not linearizable, %d timed out after %v",
		ops, len(keys), r.Count, timedOut, opts.Timeout)
	return r
}

// longestPrefix names the operation at which the longest linearizable
// prefix of the (only) partition stops.
func longestPrefix(info porcupine.LinearizationInfo) string {
	parts := info.PartialLinearizationsOperations()
	if len(parts) == 0 || len(parts[0]) == 0 {
		return ""
	}
	var longest []porcupine.Operation
	for _, p := range parts[0] {
		if len(p) > len(longest) {
			longest = p
		}
	}
	if len(longest) == 0 {
		return ""
	}
	var ids []string
	for _, o := range longest[max(0, len(longest)-3):] {
		ids = append(ids, fmt.Sprint(o.Metadata))
	}
	return fmt.Sprintf("the longest linearizable prefix has %d operations, ending with ops %s", len(longest), strings.Join(ids, ", "))
}

func writeVisualization(model porcupine.Model, info porcupine.LinearizationInfo, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return porcupine.VisualizePath(model, info, path)
}
