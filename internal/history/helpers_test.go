package history

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ms is a duration in milliseconds, the unit of the hand-made histories.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// builder writes hand-made histories: times in milliseconds, leases of 3 s
// unless set, writes ordered as they are added.
type builder struct {
	h     History
	seq   uint64
	lease time.Duration
}

func newBuilder() *builder { return &builder{lease: 3 * time.Second} }

func (b *builder) add(o Op) int {
	o.ID = len(b.h.Ops)
	b.h.Ops = append(b.h.Ops, o)
	return o.ID
}

// grant: worker w acquired key with token, invoked at call, answered at ret.
func (b *builder) grant(w int, key string, token uint64, call, ret int) int {
	return b.add(Op{Worker: w, Kind: Acquire, Key: key, Token: token, Lease: b.lease, Wait: time.Second,
		Call: ms(call), Return: ms(ret), Outcome: OK, Expires: ms(call) + b.lease, Grant: -1})
}

// acquire: an acquire with another outcome.
func (b *builder) acquire(w int, key string, out Outcome, detail string, call, ret int) int {
	return b.add(Op{Worker: w, Kind: Acquire, Key: key, Lease: b.lease, Call: ms(call), Return: ms(ret),
		Outcome: out, Detail: detail, Grant: -1})
}

// op: a release or renew of grant g's token.
func (b *builder) op(kind Kind, g int, out Outcome, detail string, call, ret int) int {
	gr := b.h.Ops[g]
	o := Op{Worker: gr.Worker, Kind: kind, Key: gr.Key, Token: gr.Token, Call: ms(call), Return: ms(ret),
		Outcome: out, Detail: detail, Grant: g}
	if kind == Renew {
		o.Lease = b.lease
		if out == OK {
			o.Expires = ms(call) + b.lease
		}
	}
	return b.add(o)
}

func (b *builder) release(g, call, ret int) int { return b.op(Release, g, OK, "", call, ret) }

// fault: a network fault in force from start to end.
func (b *builder) fault(start, end int) {
	b.h.Faults = append(b.h.Faults, Fault{Kind: "partition", Target: "clients", Start: ms(start), End: ms(end)})
}

// write: grant g's holder wrote at t, accepted or not.
func (b *builder) write(g int, accepted bool, t int) int {
	gr := b.h.Ops[g]
	b.seq++
	o := Op{Worker: gr.Worker, Kind: Write, Key: gr.Key, Token: gr.Token, Call: ms(t), Return: ms(t),
		Outcome: OK, Grant: g, Seq: b.seq}
	if !accepted {
		o.Outcome, o.Detail = Fail, DetailStale
	}
	return b.add(o)
}

func (b *builder) history(t *testing.T) History {
	t.Helper()
	if err := b.h.Validate(); err != nil {
		t.Fatalf("hand-made history: %v", err)
	}
	return b.h
}

// expect checks a result's verdict and, for a failure, its count.
func expect(t *testing.T, r Result, want Verdict, count int) {
	t.Helper()
	if r.Verdict != want || r.Count != count {
		t.Fatalf("%s: verdict %s with %d violations, want %s with %d\n%s", r.Name, r.Verdict, r.Count, want, count, r)
	}
	if want == Violated && len(r.Violations) == 0 {
		t.Fatalf("%s failed without naming a violation", r.Name)
	}
}
