package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// File names inside the data directory.
const (
	markFile  = "tokens"     // the reserved token limit, decimal text
	epochFile = "epoch"      // a cluster member's highest epoch as active, decimal text
	snapFile  = "locks.snap" // the shutdown snapshot
	lockFile  = "LOCK"       // flock'ed while a daemon owns the directory
)

// ErrLocked means another process holds the data directory.
var ErrLocked = errors.New("store: data directory is in use by another process")

// ErrCorrupt means the snapshot failed its checks.
var ErrCorrupt = errors.New("store: snapshot is corrupt")

// Dir is an open data directory.
type Dir struct {
	path string
	lock *os.File
}

// Open creates path if needed and takes its lock.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(path, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, err
	}
	return &Dir{path: path, lock: f}, nil
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// Close releases the directory's lock.
func (d *Dir) Close() error {
	if d.lock == nil {
		return nil
	}
	err := d.lock.Close() // closing drops the flock
	d.lock = nil
	return err
}

// Mark returns the reserved token limit: no token above it was ever handed
// out. 0 when none was recorded (a new or lost directory).
func (d *Dir) Mark() (uint64, error) { return d.readUint(markFile, "token mark") }

// Epoch returns the highest epoch this member was active in (a cluster
// member), 0 when none was recorded.
func (d *Dir) Epoch() (uint64, error) { return d.readUint(epochFile, "epoch") }

// SetEpoch durably records e as the member's epoch.
func (d *Dir) SetEpoch(e uint64) error {
	return d.writeAtomic(epochFile, strconv.AppendUint(nil, e, 10))
}

// readUint reads a file holding one decimal number; 0 if it does not exist.
func (d *Dir) readUint(name, what string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.path, name))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("store: %s %s: %w", what, filepath.Join(d.path, name), err)
	}
	return v, nil
}

// Reserve durably records limit as the reserved token mark. Only after it
// returns nil may tokens up to limit be handed out.
func (d *Dir) Reserve(limit uint64) error {
	return d.writeAtomic(markFile, strconv.AppendUint(nil, limit, 10))
}

// Lock is one held lock in a snapshot.
type Lock struct {
	Key      []byte
	Token    uint64
	Deadline time.Time // wall-clock end of the lease
	// Ident is the name of the identity the grant was made to
	// (PROTOCOL.md §8.3; "" for none), at most MaxIdent bytes.
	Ident string
	// Limit is the key's holder limit when the lock is one holder of a
	// shared key (PROTOCOL.md §9.2, 1..65535; a shared key has one Lock
	// per holder, each with the limit), 0 for an exclusive lock.
	Limit uint16
}

// MaxIdent is the longest identity name a snapshot stores.
const MaxIdent = 255

// Snapshot is what a graceful shutdown leaves for the next start.
type Snapshot struct {
	Mark  uint64 // the highest token issued
	Locks []Lock
}

// Snapshot formats: versions 1 (before identities) and 2 (before shared
// holders) are still read; version 3 is written.
var (
	snapMagicV1 = []byte("LOCKDSNAP1\n")
	snapMagicV2 = []byte("LOCKDSNAP2\n")
	snapMagic   = []byte("LOCKDSNAP3\n")
)

// WriteSnapshot durably writes s, replacing any earlier snapshot.
//
// Layout (version 3): magic "LOCKDSNAP3\n", u64 mark, u32 count, then per
// lock u16 key length, key, u64 token, i64 deadline (Unix ns), u8 identity
// length, identity, u16 limit (0: exclusive); then a CRC-32C of everything
// before it. Integers are big-endian. Version 2 ("LOCKDSNAP2\n", written
// before shared holders) is the same without the limit, version 1
// ("LOCKDSNAP1\n", before identities) without the identity fields too;
// ReadSnapshot reads all three (their locks are exclusive, a version 1
// lock has no identity).
func (d *Dir) WriteSnapshot(s Snapshot) error {
	b, err := encodeSnapshot(s)
	if err != nil {
		return err
	}
	return d.writeAtomic(snapFile, b)
}

// encodeSnapshot lays s out as WriteSnapshot documents.
func encodeSnapshot(s Snapshot) ([]byte, error) {
	var b []byte
	b = append(b, snapMagic...)
	b = binary.BigEndian.AppendUint64(b, s.Mark)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Locks)))
	for _, l := range s.Locks {
		if len(l.Key) > 0xFFFF {
			return nil, fmt.Errorf("store: key of %d bytes cannot be snapshotted", len(l.Key))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(l.Key)))
		b = append(b, l.Key...)
		b = binary.BigEndian.AppendUint64(b, l.Token)
		b = binary.BigEndian.AppendUint64(b, uint64(l.Deadline.UnixNano()))
		if len(l.Ident) > MaxIdent {
			return nil, fmt.Errorf("store: identity of %d bytes cannot be snapshotted", len(l.Ident))
		}
		b = append(b, byte(len(l.Ident)))
		b = append(b, l.Ident...)
		b = binary.BigEndian.AppendUint16(b, l.Limit)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ReadSnapshot reads the snapshot, if any, and leaves it in place: the
// caller removes it with RemoveSnapshot once it is sure to serve, and
// before it serves anything, so that a start that fails keeps it and a
// later crash cannot bring back locks released meanwhile. ok is false when
// there was none. A corrupt snapshot is renamed aside to locks.snap.corrupt
// and reported with ErrCorrupt (its locks are lost, its tokens are not: the
// mark file covers them).
func (d *Dir) ReadSnapshot() (s Snapshot, ok bool, err error) {
	p := filepath.Join(d.path, snapFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, err
	}
	s, perr := parseSnapshot(b)
	if perr != nil {
		if err := os.Rename(p, p+".corrupt"); err != nil {
			return Snapshot{}, false, err
		}
		return Snapshot{}, false, errors.Join(perr, syncDir(d.path))
	}
	return s, true, nil
}

// RemoveSnapshot removes the snapshot durably (directory synced). A missing
// snapshot is not an error.
func (d *Dir) RemoveSnapshot() error {
	if err := os.Remove(filepath.Join(d.path, snapFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(d.path)
}

func parseSnapshot(b []byte) (Snapshot, error) {
	var s Snapshot
	if len(b) < len(snapMagic)+8+4+4 {
		return s, ErrCorrupt
	}
	var idents, limits bool
	switch {
	case bytes.Equal(b[:len(snapMagic)], snapMagic):
		idents, limits = true, true
	case bytes.Equal(b[:len(snapMagicV2)], snapMagicV2):
		idents = true
	case bytes.Equal(b[:len(snapMagicV1)], snapMagicV1):
	default:
		return s, ErrCorrupt
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return s, ErrCorrupt
	}
	r := bufio.NewReader(bytes.NewReader(body[len(snapMagic):]))
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return s, ErrCorrupt
	}
	s.Mark = binary.BigEndian.Uint64(hdr[:8])
	n := binary.BigEndian.Uint32(hdr[8:])
	for i := uint32(0); i < n; i++ {
		var kl [2]byte
		if _, err := io.ReadFull(r, kl[:]); err != nil {
			return s, ErrCorrupt
		}
		key := make([]byte, binary.BigEndian.Uint16(kl[:]))
		var rest [16]byte
		if _, err := io.ReadFull(r, key); err != nil {
			return s, ErrCorrupt
		}
		if _, err := io.ReadFull(r, rest[:]); err != nil {
			return s, ErrCorrupt
		}
		l := Lock{
			Key:      key,
			Token:    binary.BigEndian.Uint64(rest[:8]),
			Deadline: time.Unix(0, int64(binary.BigEndian.Uint64(rest[8:]))),
		}
		if idents {
			il, err := r.ReadByte()
			if err != nil {
				return s, ErrCorrupt
			}
			id := make([]byte, il)
			if _, err := io.ReadFull(r, id); err != nil {
				return s, ErrCorrupt
			}
			l.Ident = string(id)
		}
		if limits {
			var lim [2]byte
			if _, err := io.ReadFull(r, lim[:]); err != nil {
				return s, ErrCorrupt
			}
			l.Limit = binary.BigEndian.Uint16(lim[:])
		}
		s.Locks = append(s.Locks, l)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		return s, ErrCorrupt
	}
	return s, nil
}

// writeAtomic writes name via a synced temporary file, a rename and a
// directory sync.
func (d *Dir) writeAtomic(name string, data []byte) error {
	tmp := filepath.Join(d.path, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(d.path, name)); err != nil {
		return err
	}
	return syncDir(d.path)
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
