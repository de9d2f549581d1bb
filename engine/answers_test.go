package engine

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/shard"
)

// checkAnswers fails unless a.grants lists exactly the A frames of a.out,
// in order, each with its token, key and end.
func checkAnswers(t *testing.T, what string, a *answers) {
	t.Helper()
	var want []string
	for off := 0; off < len(a.out); {
		var r proto.Response
		n, err := proto.ParseResponse(a.out[off:], &r)
		if err != nil {
			t.Fatalf("%s: frame at %d: %v", what, off, err)
		}
		off += n
		if r.Op == proto.OpAcquire {
			want = append(want, fmt.Sprintf("%d %s end %d", r.Token, r.Tail, off))
		}
	}
	var got []string
	for _, g := range a.grants {
		got = append(got, fmt.Sprintf("%d %s end %d", g.token, a.key(g), g.end))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: grants %q, want the A frames of out %q", what, got, want)
	}
}

// TestAnswersKeepGrants: whatever answers go through (frames appended
// directly, grants, effects, answers appended, a front cut moved), grants
// index the A frames of out.
func TestAnswersKeepGrants(t *testing.T) {
	// frames appends to a: T, A, L, A, B, M.
	frames := func(a *answers, tok uint64, prefix string) []int {
		var ends []int
		a.out = proto.AppendTimeout(a.out, 1, prefix+"t")
		ends = append(ends, len(a.out))
		a.addGrant(2, tok, []byte(prefix+"granted"))
		ends = append(ends, len(a.out))
		a.addEffect(&shard.Effect{Kind: shard.EffectLost, Token: tok + 1, Reason: shard.ReasonReleased, Key: []byte(prefix + "lost")}, "")
		ends = append(ends, len(a.out))
		a.addEffect(&shard.Effect{Kind: shard.EffectGrant, Owner: 3, Token: tok + 2, Key: []byte(prefix + "handed")}, "")
		ends = append(ends, len(a.out))
		a.addEffect(&shard.Effect{Kind: shard.EffectBusy, Owner: 4, Key: []byte(prefix + "busy")}, "")
		ends = append(ends, len(a.out))
		a.addEffect(&shard.Effect{Kind: shard.EffectMoved, Owner: 5, Key: []byte(prefix + "moved")}, "127.0.0.1:7071")
		ends = append(ends, len(a.out))
		return ends
	}
	var one answers
	ends := frames(&one, 10, "a/")
	checkAnswers(t, "built", &one)
	if len(one.grants) != 2 {
		t.Fatalf("%d grants recorded, want 2", len(one.grants))
	}
	for _, cut := range append([]int{0}, ends...) {
		t.Run(fmt.Sprintf("move the first %d bytes", cut), func(t *testing.T) {
			var src, dst answers
			frames(&src, 10, "a/")
			frames(&dst, 20, "b/")
			dst.addAll(&answers{})
			checkAnswers(t, "after adding nothing", &dst)
			before := len(src.out)
			src.moveFront(&dst, cut)
			checkAnswers(t, "the rest", &src)
			checkAnswers(t, "the front moved", &dst)
			if len(src.out) != before-cut {
				t.Fatalf("%d bytes left, want %d", len(src.out), before-cut)
			}
			dst.addAll(&src)
			checkAnswers(t, "the rest appended after", &dst)
			src.reset()
			if !src.empty() || len(src.grants) != 0 {
				t.Fatalf("reset left %d bytes, %d grants", len(src.out), len(src.grants))
			}
		})
	}
}
