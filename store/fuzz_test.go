package store

import (
	"bytes"
	"testing"
	"time"
)

// FuzzParseSnapshot: the snapshot parser never panics on arbitrary bytes,
// and whatever it accepts encodes back to exactly the same bytes.
func FuzzParseSnapshot(f *testing.F) {
	dl := time.Unix(1800000000, 5)
	for _, s := range []Snapshot{
		{},
		{Mark: 7, Locks: []Lock{{Key: []byte("k"), Token: 7, Deadline: dl}}},
		{Mark: 1 << 60, Locks: []Lock{{Key: []byte("\x00\n"), Token: 1, Deadline: dl}, {Key: []byte("ключ"), Token: 2, Deadline: dl}}},
	} {
		b, err := encodeSnapshot(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte("LOCKDSNAP1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSnapshot(b)
		if err != nil {
			return
		}
		again, err := encodeSnapshot(s)
		if err != nil {
			t.Fatalf("accepted snapshot does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip changed the bytes:\n%x\n%x", b, again)
		}
	})
}
