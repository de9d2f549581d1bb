package store

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// FuzzParseSnapshot: the snapshot parser never panics on arbitrary bytes;
// whatever it accepts encodes back (as version 3) to a snapshot that parses
// to the same locks, and a version 3 snapshot to exactly the same bytes.
func FuzzParseSnapshot(f *testing.F) {
	dl := time.Unix(1800000000, 5)
	for _, s := range []Snapshot{
		{},
		{Mark: 7, Locks: []Lock{{Key: []byte("k"), Token: 7, Deadline: dl}}},
		{Mark: 1 << 60, Locks: []Lock{{Key: []byte("\x00\n"), Token: 1, Deadline: dl}, {Key: []byte("ключ"), Token: 2, Deadline: dl}}},
		{Mark: 3, Locks: []Lock{{Key: []byte("o/1"), Token: 3, Deadline: dl, Ident: "orders"}, {Key: []byte("x"), Token: 2, Deadline: dl}}},
		{Mark: 9, Locks: []Lock{{Key: []byte("sem"), Token: 8, Deadline: dl, Ident: "a", Limit: 3}, {Key: []byte("sem"), Token: 9, Deadline: dl, Limit: 3},
			{Key: []byte("rw"), Token: 7, Deadline: dl, Limit: 65535}}},
	} {
		b, err := encodeSnapshot(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte("LOCKDSNAP1\n"))
	f.Add([]byte("LOCKDSNAP2\n"))
	f.Add([]byte("LOCKDSNAP3\n"))
	for _, golden := range []string{"testdata/locks-v1.snap", "testdata/locks-v2.snap"} {
		if b, err := os.ReadFile(golden); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSnapshot(b)
		if err != nil {
			return
		}
		again, err := encodeSnapshot(s)
		if err != nil {
			t.Fatalf("accepted snapshot does not encode: %v", err)
		}
		if bytes.HasPrefix(b, snapMagic) && !bytes.Equal(again, b) {
			t.Fatalf("round trip changed the bytes:\n%x\n%x", b, again)
		}
		s2, err := parseSnapshot(again)
		if err != nil || s2.Mark != s.Mark || len(s2.Locks) != len(s.Locks) {
			t.Fatalf("re-encoded snapshot: %+v, %v", s2, err)
		}
		for i, l := range s.Locks {
			m := s2.Locks[i]
			if !bytes.Equal(l.Key, m.Key) || l.Token != m.Token || !l.Deadline.Equal(m.Deadline) || l.Ident != m.Ident || l.Limit != m.Limit {
				t.Fatalf("lock %d: %+v became %+v", i, l, m)
			}
		}
	})
}
