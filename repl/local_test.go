package repl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/repl/internal/repltest"
	"github.com/lockd-dev/lockd/shard"
)

// Tokens beyond the first reserved block are handed out only after the
// reserver has durably raised the mark: the mark on disk never falls behind
// the last token, so a crash cannot make tokens go back. While the reserver
// is behind, acquires are answered Busy rather than waiting.
func TestTokenReservationStaysAhead(t *testing.T) {
	n := NewLocal(LocalConfig{DataDir: t.TempDir(), TokenBlock: 8})
	now := repltest.Clock()
	tab, err := n.Open(shard.Config{}, now, repltest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background(), Discard)
	first := tab.Tokens().Last()
	var out shard.Out
	deadline := time.Now().Add(20 * time.Second)
	busy := 0
	for i := 0; i < 200; {
		if time.Now().After(deadline) {
			t.Fatalf("grants stalled at %d: the reserver did not extend the token range", i)
		}
		st, tok := tab.Acquire(now(), []byte("k"+strconv.Itoa(i)), 0, 30, 1, nil, &out)
		if st == shard.Busy {
			busy++
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if st != shard.Granted {
			t.Fatalf("acquire %d: %v", i, st)
		}
		if mark, err := n.dir.Mark(); err != nil || mark < tok {
			t.Fatalf("token %d handed out above the durable mark %d (%v)", tok, mark, err)
		}
		i++
	}
	if got := tab.Tokens().Last() - first; got != 200 {
		t.Fatalf("%d tokens issued, want 200", got)
	}
	t.Logf("%d busy answers while the reserver caught up", busy)
}

// A reservation that fails leaves the allocator where it was: acquires get
// Busy once the reserved range is used up (nothing waits), Health says why,
// the reserver retries with back-off, and grants resume once it succeeds.
func TestReserverFailureAndRecovery(t *testing.T) {
	var fail atomic.Bool
	var calls atomic.Int64
	fail.Store(true)
	errDisk := errors.New("no space left on device")
	reserve := func(uint64) error {
		calls.Add(1)
		if fail.Load() {
			return errDisk
		}
		return nil
	}
	tokens := shard.NewTokens(100, 104)
	tab, err := shard.New(shard.Config{}, tokens)
	if err != nil {
		t.Fatal(err)
	}
	var r Reserver
	r.Start(tokens, 4, reserve, repltest.Quiet())
	defer r.Stop(context.Background())

	var out shard.Out
	for i := range 4 {
		if st, _ := tab.Acquire(0, []byte(fmt.Sprint("a", i)), 0, 5, 0, nil, &out); st != shard.Granted {
			t.Fatalf("acquire %d within the reserved range: %v", i, st)
		}
	}
	begin := time.Now()
	if st, _ := tab.Acquire(0, []byte("over"), 0, 5, 0, nil, &out); st != shard.Busy {
		t.Fatalf("acquire beyond the reserved range: %v, want busy", st)
	}
	if d := time.Since(begin); d > time.Second {
		t.Fatalf("acquire beyond the range took %v: it waited", d)
	}
	wait.For(t, "health to report the failure", func() bool { return r.Health() != nil })
	if !errors.Is(r.Health(), errDisk) {
		t.Fatalf("health = %v, want it to wrap the disk error", r.Health())
	}
	var st Status
	r.Status(&st)
	if st.ReserveErrors == 0 || st.ReserveError == "" {
		t.Fatalf("status while failing: %+v", st)
	}
	// Back-off: 10 ms doubling, so a few hundred ms see only a handful of
	// attempts, not a busy loop.
	time.Sleep(300 * time.Millisecond)
	if c := calls.Load(); c < 2 || c > 12 {
		t.Fatalf("%d reservation attempts in ~300 ms: want a few (back-off)", c)
	}
	fail.Store(false)
	wait.For(t, "the reservation to succeed", func() bool { return r.Health() == nil && tokens.Limit() > 104 })
	if st, tok := tab.Acquire(0, []byte("after"), 0, 5, 0, nil, &out); st != shard.Granted || tok != 105 {
		t.Fatalf("acquire after recovery: %v %d, want granted 105", st, tok)
	}
}

// A start that fails leaves no data directory it created; a directory
// that existed is kept with its contents.
func TestFailedStartRemovesCreatedDir(t *testing.T) {
	parent := t.TempDir()
	fresh := filepath.Join(parent, "new")
	n := NewLocal(LocalConfig{DataDir: fresh})
	if _, err := n.Open(shard.Config{}, repltest.Clock(), repltest.Quiet()); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(context.Background(), FailedStart); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed start left %s behind (%v)", fresh, err)
	}

	old := filepath.Join(parent, "old")
	if err := os.Mkdir(old, 0o755); err != nil {
		t.Fatal(err)
	}
	n = NewLocal(LocalConfig{DataDir: old})
	if _, err := n.Open(shard.Config{}, repltest.Clock(), repltest.Quiet()); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(context.Background(), FailedStart); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(old, "tokens")); err != nil {
		t.Fatalf("the failed start removed an existing directory's token mark: %v", err)
	}
}

// A shutdown writes the held locks; the next Open reloads them with the
// same token and a deadline no earlier than the wall-clock one, and its
// tokens start above them.
func TestSnapshotAcrossOpen(t *testing.T) {
	dir := t.TempDir()
	n := NewLocal(LocalConfig{DataDir: dir})
	now := repltest.Clock()
	tab, err := n.Open(shard.Config{}, now, repltest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	var out shard.Out
	_, tok := tab.Acquire(now(), []byte("held"), 0, 30, 0, nil, &out)
	if err := n.Start("127.0.0.1:1", nil); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(context.Background(), Shutdown); err != nil {
		t.Fatal(err)
	}
	n2 := NewLocal(LocalConfig{DataDir: dir})
	now2 := repltest.Clock()
	tab2, err := n2.Open(shard.Config{}, now2, repltest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close(context.Background(), Discard)
	info := tab2.Lookup([]byte("held"))
	if !info.Held || info.Token != tok {
		t.Fatalf("reloaded %+v, want held by %d", info, tok)
	}
	if left := time.Duration(info.Deadline - now2()); left < 29*time.Second || left > 30*time.Second {
		t.Fatalf("lease left %v after the restart, want just under 30s", left)
	}
	if _, tok2 := tab2.Acquire(now2(), []byte("new"), 0, 30, 0, nil, &out); tok2 <= tok {
		t.Fatalf("token %d after the restart, not above %d", tok2, tok)
	}
	if n2.restored != 1 {
		t.Fatalf("Restored = %d", n2.restored)
	}
}

// TestSharedSnapshotAcrossOpen: a shutdown writes every holder of a shared
// key with its token, identity and the key's limit (PROTOCOL.md §9.2), and
// the next Open reloads them all: the key is shared with the same limit,
// each holder valid with its lease, and an acquire shared with another
// limit is still a mismatch.
func TestSharedSnapshotAcrossOpen(t *testing.T) {
	dir := t.TempDir()
	n := NewLocal(LocalConfig{DataDir: dir})
	now := repltest.Clock()
	tab, err := n.Open(shard.Config{}, now, repltest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	var out shard.Out
	ids := []string{"orders", "", "ops"}
	var toks []uint64
	for i, id := range ids {
		st, tok := tab.AcquireShared(now(), []byte("sem"), 0, uint8(20+i), uint64(i), 3, tab.Ident([]byte(id)), nil, &out)
		if st != shard.Granted {
			t.Fatalf("holder %d: %v", i, st)
		}
		toks = append(toks, tok)
	}
	_, excl := tab.Acquire(now(), []byte("excl"), 0, 30, 9, nil, &out)
	if err := n.Start("127.0.0.1:1", nil); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(context.Background(), Shutdown); err != nil {
		t.Fatal(err)
	}
	n2 := NewLocal(LocalConfig{DataDir: dir})
	now2 := repltest.Clock()
	tab2, err := n2.Open(shard.Config{}, now2, repltest.Quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close(context.Background(), Discard)
	d := tab2.Detail([]byte("sem"))
	if !d.Shared || d.Limit != 3 || len(d.Holders) != 3 {
		t.Fatalf("reloaded shared key: %+v, want 3 holders of limit 3", d)
	}
	for i, h := range d.Holders {
		if h.Token != toks[i] || h.Ident != ids[i] {
			t.Fatalf("holder %d: %+v, want token %d identity %q", i, h, toks[i], ids[i])
		}
		if left := time.Duration(h.Deadline - now2()); left < time.Duration(19+i)*time.Second || left > time.Duration(20+i)*time.Second {
			t.Fatalf("holder %d: lease left %v, want just under %ds", i, left, 20+i)
		}
	}
	if st, _ := tab2.AcquireShared(now2(), []byte("sem"), 0, 30, 5, 4, shard.NoIdent, nil, &out); st != shard.Mismatch {
		t.Fatalf("an acquire shared with another limit after the restart: %v", st)
	}
	if e := tab2.Detail([]byte("excl")); e.Shared || len(e.Holders) != 1 || e.Holders[0].Token != excl {
		t.Fatalf("the exclusive key after the restart: %+v", e)
	}
	if n2.restored != 4 {
		t.Fatalf("restored %d holders, want 4", n2.restored)
	}
}
