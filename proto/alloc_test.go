//go:build !race

package proto

import (
	"strings"
	"testing"
)

// The race detector's instrumentation allocates, so these run without it.

func TestParseAllocs(t *testing.T) {
	reqs := []struct{ name, in string }{
		{"acquire", rawAcquire(5, 30, 7, k16)},
		{"release", rawRelease(7, k16)},
		{"renew", rawRenew(5, 7, k16)},
		{"ping", rawPing(7)},
		{"bad-key", rawRelease(7, "\xff")},
		{"bad-lease", rawRenew(0, 7, k16)},
		{"bad-frame", "Z"},
		{"bad-frame-long", rawRelease(7, k1025)},
		{"incomplete", "A\x01"},
		{"shared", rawShared(5, 30, 7, 4, k16)},
		{"shared-bad-limit", rawShared(5, 30, 7, 0, k16)},
		{"validate", rawIDTail('V', 7, k16)},
		{"watch", rawIDTail('W', 7, k16)},
		{"inspect", rawIDTail('I', 7, k16)},
	}
	for _, c := range reqs {
		t.Run("request/"+c.name, func(t *testing.T) {
			in := []byte(c.in)
			var r Request
			if n := testing.AllocsPerRun(100, func() { _, _ = ParseRequest(in, MaxKey, &r) }); n != 0 {
				t.Fatalf("ParseRequest: %v allocs per frame, want 0", n)
			}
		})
	}
	resps := []struct{ name, in string }{
		{"acquired", rawAcquired(7, 8, k16)},
		{"timeout", rawIDTail('T', 7, k16)},
		{"not-held", rawOpIDTail('N', 'R', 7, k16)},
		{"pong", rawPing(7)},
		{"moved", rawOpIDTail('M', 'A', 7, "10.0.0.1:7000")},
		{"error", rawError('A', 7, 2, "bad key")},
		{"bad-frame", "\n"},
		{"incomplete", "A"},
		{"valid", rawValid(7, 100, k16)},
		{"watching", rawIDTail('W', 7, k16)},
		{"lost", rawLost(7, ReasonExpired, k16)},
		{"inspection", rawInspection(7, 3, 4, 5, 8, 100, k16)},
	}
	for _, c := range resps {
		t.Run("response/"+c.name, func(t *testing.T) {
			in := []byte(c.in)
			var r Response
			if n := testing.AllocsPerRun(100, func() { _, _ = ParseResponse(in, &r) }); n != 0 {
				t.Fatalf("ParseResponse: %v allocs per frame, want 0", n)
			}
		})
	}
}

func TestEncodeAllocs(t *testing.T) {
	key, keyB := k16, []byte(k16)
	long := strings.Repeat("x\n", 1500)
	dst := make([]byte, 0, 4096)
	encs := []struct {
		name string
		f    func()
	}{
		{"acquire/string", func() { dst = AppendAcquire(dst[:0], 5, 30, 7, key) }},
		{"acquire/bytes", func() { dst = AppendAcquire(dst[:0], 5, 30, 7, keyB) }},
		{"release/string", func() { dst = AppendRelease(dst[:0], 7, key) }},
		{"release/bytes", func() { dst = AppendRelease(dst[:0], 7, keyB) }},
		{"renew/string", func() { dst = AppendRenew(dst[:0], 5, 7, key) }},
		{"renew/bytes", func() { dst = AppendRenew(dst[:0], 5, 7, keyB) }},
		{"ping", func() { dst = AppendPing(dst[:0], 7) }},
		{"acquired/string", func() { dst = AppendAcquired(dst[:0], 7, 8, key) }},
		{"acquired/bytes", func() { dst = AppendAcquired(dst[:0], 7, 8, keyB) }},
		{"timeout", func() { dst = AppendTimeout(dst[:0], 7, key) }},
		{"busy", func() { dst = AppendBusy(dst[:0], 7, keyB) }},
		{"released", func() { dst = AppendReleased(dst[:0], 7, key) }},
		{"renewed", func() { dst = AppendRenewed(dst[:0], 7, keyB) }},
		{"not-held", func() { dst = AppendNotHeld(dst[:0], OpRelease, 7, key) }},
		{"pong", func() { dst = AppendPong(dst[:0], 7) }},
		{"moved/string", func() { dst = AppendMoved(dst[:0], OpAcquire, 7, "10.0.0.1:7000") }},
		{"moved/bytes", func() { dst = AppendMoved(dst[:0], OpAcquire, 7, keyB) }},
		{"error/string", func() { dst = AppendError(dst[:0], OpAcquire, 7, CodeBadKey, "bad key") }},
		{"error/bytes", func() { dst = AppendError(dst[:0], OpAcquire, 7, CodeBadKey, keyB) }},
		{"error/long-with-newlines", func() { dst = AppendError(dst[:0], OpAcquire, 7, CodeBadKey, long) }},
		{"shared/string", func() { dst = AppendShared(dst[:0], 5, 30, 7, 4, key) }},
		{"shared/bytes", func() { dst = AppendShared(dst[:0], 5, 30, 7, 4, keyB) }},
		{"validate", func() { dst = AppendValidate(dst[:0], 7, keyB) }},
		{"watch", func() { dst = AppendWatch(dst[:0], 7, key) }},
		{"inspect", func() { dst = AppendInspect(dst[:0], 7, keyB) }},
		{"valid", func() { dst = AppendValid(dst[:0], 7, 100, keyB) }},
		{"watching", func() { dst = AppendWatching(dst[:0], 7, keyB) }},
		{"lost", func() { dst = AppendLost(dst[:0], 7, ReasonForced, keyB) }},
		{"inspection", func() { dst = AppendInspection(dst[:0], 7, 3, 4, 5, 8, 100, keyB) }},
		{"error/limit", func() { dst = AppendError(dst[:0], OpShared, 7, CodeLimitMismatch, "limit mismatch") }},
	}
	for _, c := range encs {
		t.Run(c.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, c.f); n != 0 {
				t.Fatalf("%v allocs per frame, want 0", n)
			}
		})
	}
}
