package engine

import (
	"bytes"
	"testing"

	"github.com/lockd-dev/lockd/proto"
)

// A direct write that the socket cut short leaves the rest of the mail in
// the mailbox: the grants in the bytes written are delivered, the one cut
// inside its key or newline is kept whole (its key and token) as the torn
// grant, and the later ones (and one cut before its key) move to the front
// with their offsets.
func TestDirectWriteCut(t *testing.T) {
	frames := func() ([]byte, []grantRef) {
		var out []byte
		var gs []grantRef
		out = appendGrant(out, &gs, 1, 11, []byte("alpha"))
		out = proto.AppendTimeout(out, 2, []byte("beta"))
		out = appendGrant(out, &gs, 3, 33, []byte("gamma"))
		return out, gs
	}
	full, gs := frames()
	tests := []struct {
		name     string
		n        int
		torn     bool
		tornKey  string
		tornTok  uint64
		keepKeys []string
	}{
		{"before the first key: kept whole", 1, false, "", 0, []string{"alpha", "gamma"}},
		{"inside the first key", gs[0].koff + 2, true, "alpha", 11, []string{"gamma"}},
		{"just before the first newline", gs[0].end - 1, true, "alpha", 11, []string{"gamma"}},
		{"first frame whole", gs[0].end, false, "", 0, []string{"gamma"}},
		{"before the second grant's key", gs[1].koff, false, "", 0, []string{"gamma"}},
		{"inside the second grant's key", gs[1].koff + 1, true, "gamma", 33, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ss := &session{}
			ss.mbox, ss.mgrants = frames()
			ss.cut(tc.n)
			if !bytes.Equal(ss.mbox, full[tc.n:]) {
				t.Fatalf("mailbox %q, want %q", ss.mbox, full[tc.n:])
			}
			if ss.torn != tc.torn || tc.torn && (string(ss.tkey) != tc.tornKey || ss.tornTok != tc.tornTok) {
				t.Fatalf("torn %v %q %d, want %v %q %d", ss.torn, ss.tkey, ss.tornTok, tc.torn, tc.tornKey, tc.tornTok)
			}
			if tc.torn && ss.tornEnd != bytes.IndexByte(ss.mbox, '\n')+1 {
				t.Fatalf("torn grant ends at %d, its frame at %d", ss.tornEnd, bytes.IndexByte(ss.mbox, '\n')+1)
			}
			if len(ss.mgrants) != len(tc.keepKeys) {
				t.Fatalf("%d grants kept, want %d", len(ss.mgrants), len(tc.keepKeys))
			}
			for i, g := range ss.mgrants {
				if string(g.key(ss.mbox)) != tc.keepKeys[i] {
					t.Fatalf("grant %d key %q, want %q", i, g.key(ss.mbox), tc.keepKeys[i])
				}
			}
			// The loop takes the rest: the torn grant is tracked with it.
			b := &scratch{}
			ss.woken = true
			ss.takeMail(b)
			if b.torn != tc.torn || tc.torn && (string(b.tkey) != tc.tornKey || b.tornEnd != ss.tornEnd) || ss.torn {
				t.Fatalf("takeMail: scratch torn %v %q end %d, session torn %v", b.torn, b.tkey, b.tornEnd, ss.torn)
			}
		})
	}
}
