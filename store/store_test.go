package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMarkRoundTrip(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if m, err := d.Mark(); err != nil || m != 0 {
		t.Fatalf("empty dir mark = %d, %v; want 0, nil", m, err)
	}
	for _, v := range []uint64{1, 1 << 40, ^uint64(0)} {
		if err := d.Reserve(v); err != nil {
			t.Fatal(err)
		}
		if m, err := d.Mark(); err != nil || m != v {
			t.Fatalf("mark = %d, %v; want %d", m, err, v)
		}
	}
}

func TestMarkGarbage(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.WriteFile(filepath.Join(dir, markFile), []byte("zz"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Mark(); err == nil {
		t.Fatal("garbage mark accepted")
	}
}

func TestLockExcludesSecondOpen(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	d.Close()
	d2, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	d2.Close()
}

// TestSnapshotReadThenRemoved: ReadSnapshot leaves the snapshot in place
// (a start that fails must keep it); RemoveSnapshot consumes it, and
// removing a missing one is not an error.
func TestSnapshotReadThenRemoved(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, ok, err := d.ReadSnapshot(); ok || err != nil {
		t.Fatalf("no snapshot: ok=%v err=%v", ok, err)
	}
	dl := time.Unix(1700000000, 123456789)
	in := Snapshot{Mark: 99, Locks: []Lock{
		{Key: []byte("a"), Token: 7, Deadline: dl},
		{Key: []byte("\x00ключ\x01"), Token: 99, Deadline: dl.Add(time.Second)},
	}}
	if err := d.WriteSnapshot(in); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.ReadSnapshot(); !ok || err != nil {
		t.Fatalf("ReadSnapshot: ok=%v err=%v", ok, err)
	}
	out, ok, err := d.ReadSnapshot() // still there
	if !ok || err != nil {
		t.Fatalf("second ReadSnapshot: ok=%v err=%v", ok, err)
	}
	if out.Mark != 99 || len(out.Locks) != 2 {
		t.Fatalf("got %+v", out)
	}
	for i := range in.Locks {
		a, b := in.Locks[i], out.Locks[i]
		if !bytes.Equal(a.Key, b.Key) || a.Token != b.Token || !a.Deadline.Equal(b.Deadline) {
			t.Fatalf("lock %d: got %+v want %+v", i, b, a)
		}
	}
	if err := d.RemoveSnapshot(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.ReadSnapshot(); ok || err != nil {
		t.Fatalf("snapshot not consumed: ok=%v err=%v", ok, err)
	}
	if err := d.RemoveSnapshot(); err != nil {
		t.Fatalf("removing a missing snapshot: %v", err)
	}
}

func TestSnapshotCorruptMovedAside(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteSnapshot(Snapshot{Mark: 5, Locks: []Lock{{Key: []byte("k"), Token: 5, Deadline: time.Now()}}}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, snapFile)
	b, _ := os.ReadFile(p)
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x40
		if _, err := parseSnapshot(c); err == nil {
			t.Fatalf("flip at byte %d not detected", i)
		}
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.ReadSnapshot(); ok || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt snapshot: ok=%v err=%v", ok, err)
	}
	if _, err := os.Stat(p + ".corrupt"); err != nil {
		t.Fatalf("corrupt snapshot not moved aside: %v", err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("corrupt snapshot still in place: %v", err)
	}
}

func TestEpoch(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if e, err := d.Epoch(); err != nil || e != 0 {
		t.Fatalf("new dir: epoch %d, %v", e, err)
	}
	if err := d.SetEpoch(7); err != nil {
		t.Fatal(err)
	}
	if e, err := d.Epoch(); err != nil || e != 7 {
		t.Fatalf("epoch %d, %v after SetEpoch(7)", e, err)
	}
}

// TestSnapshotIdentities: every lock keeps the identity its grant was made
// to (PROTOCOL.md §8.3), none included; an identity too long to store is
// an error, not a truncation.
func TestSnapshotIdentities(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dl := time.Unix(1700000000, 5)
	in := Snapshot{Mark: 9, Locks: []Lock{
		{Key: []byte("a"), Token: 7, Deadline: dl, Ident: "orders"},
		{Key: []byte("b"), Token: 8, Deadline: dl},
		{Key: []byte("c"), Token: 9, Deadline: dl, Ident: strings.Repeat("x", MaxIdent)},
	}}
	if err := d.WriteSnapshot(in); err != nil {
		t.Fatal(err)
	}
	out, ok, err := d.ReadSnapshot()
	if !ok || err != nil || len(out.Locks) != len(in.Locks) {
		t.Fatalf("ReadSnapshot: %+v ok=%v err=%v", out, ok, err)
	}
	for i, a := range in.Locks {
		b := out.Locks[i]
		if !bytes.Equal(a.Key, b.Key) || a.Token != b.Token || !a.Deadline.Equal(b.Deadline) || a.Ident != b.Ident {
			t.Fatalf("lock %d: got %+v want %+v", i, b, a)
		}
	}
	long := Snapshot{Locks: []Lock{{Key: []byte("k"), Ident: strings.Repeat("x", MaxIdent+1)}}}
	if err := d.WriteSnapshot(long); err == nil {
		t.Fatal("an identity over MaxIdent was written")
	}
}

// TestSnapshotVersion1Loads: a snapshot written before identities existed
// (testdata/locks-v1.snap, made by the code of that time) still loads; its
// locks have no identity.
func TestSnapshotVersion1Loads(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/locks-v1.snap")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, snapFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, ok, err := d.ReadSnapshot()
	if !ok || err != nil {
		t.Fatalf("ReadSnapshot: ok=%v err=%v", ok, err)
	}
	dl := time.Unix(4102444800, 123456789)
	want := []Lock{
		{Key: []byte("orders/1"), Token: 4241, Deadline: dl},
		{Key: []byte("\x00ключ"), Token: 4242, Deadline: dl.Add(time.Second)},
	}
	if s.Mark != 4242 || len(s.Locks) != len(want) {
		t.Fatalf("got %+v", s)
	}
	for i, w := range want {
		g := s.Locks[i]
		if !bytes.Equal(g.Key, w.Key) || g.Token != w.Token || !g.Deadline.Equal(w.Deadline) || g.Ident != "" {
			t.Fatalf("lock %d: got %+v want %+v", i, g, w)
		}
	}
	if !bytes.HasPrefix(b, snapMagicV1) {
		t.Fatal("the golden file is not version 1")
	}
}

// TestSnapshotLimits: every holder of a shared key keeps its key's limit
// (PROTOCOL.md §9.2), beside its token, deadline and identity; an
// exclusive lock has limit 0.
func TestSnapshotLimits(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dl := time.Unix(1700000000, 5)
	in := Snapshot{Mark: 12, Locks: []Lock{
		{Key: []byte("sem"), Token: 7, Deadline: dl, Ident: "orders", Limit: 3},
		{Key: []byte("sem"), Token: 9, Deadline: dl.Add(time.Second), Ident: "ops", Limit: 3},
		{Key: []byte("excl"), Token: 10, Deadline: dl, Ident: "orders"},
		{Key: []byte("rw"), Token: 12, Deadline: dl, Limit: 65535},
	}}
	if err := d.WriteSnapshot(in); err != nil {
		t.Fatal(err)
	}
	out, ok, err := d.ReadSnapshot()
	if !ok || err != nil || out.Mark != in.Mark || len(out.Locks) != len(in.Locks) {
		t.Fatalf("ReadSnapshot: %+v ok=%v err=%v", out, ok, err)
	}
	for i, a := range in.Locks {
		b := out.Locks[i]
		if !bytes.Equal(a.Key, b.Key) || a.Token != b.Token || !a.Deadline.Equal(b.Deadline) || a.Ident != b.Ident || a.Limit != b.Limit {
			t.Fatalf("lock %d: got %+v want %+v", i, b, a)
		}
	}
}

// TestSnapshotVersion2Loads: a snapshot written before shared holders
// (testdata/locks-v2.snap, made by the code of that time: main at 8178baa)
// still loads, identities included; its locks are exclusive (limit 0).
func TestSnapshotVersion2Loads(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/locks-v2.snap")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, snapMagicV2) {
		t.Fatal("the golden file is not version 2")
	}
	if err := os.WriteFile(filepath.Join(dir, snapFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, ok, err := d.ReadSnapshot()
	if !ok || err != nil {
		t.Fatalf("ReadSnapshot: ok=%v err=%v", ok, err)
	}
	dl := time.Unix(4102444800, 123456789)
	want := []Lock{
		{Key: []byte("orders/1"), Token: 4241, Deadline: dl, Ident: "orders"},
		{Key: []byte("\x00ключ"), Token: 4242, Deadline: dl.Add(time.Second)},
		{Key: []byte("jobs/x"), Token: 4243, Deadline: dl.Add(2 * time.Second), Ident: "ops"},
	}
	if s.Mark != 4243 || len(s.Locks) != len(want) {
		t.Fatalf("got %+v", s)
	}
	for i, w := range want {
		g := s.Locks[i]
		if !bytes.Equal(g.Key, w.Key) || g.Token != w.Token || !g.Deadline.Equal(w.Deadline) || g.Ident != w.Ident || g.Limit != 0 {
			t.Fatalf("lock %d: got %+v want %+v", i, g, w)
		}
	}
}
