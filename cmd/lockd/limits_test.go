package main

import (
	"errors"
	"net"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// TestHostilePeersOfTheBinary drives hostile peers (too many waiters, partial frames) against the
// daemon as an operator runs it, with the new flags: a connection beyond
// --max-waiters-per-conn gets B while another still queues; a partial frame
// older than --frame-timeout closes its connection, an idle one stays; and
// a flood of connects past --max-conns logs a line a second with a count,
// not a line per connect.
func TestHostilePeersOfTheBinary(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--max-waiters-per-conn", "2", "--frame-timeout", "200ms", "--max-conns", "4")
	holder, x, y := dial(t, d.addr), dial(t, d.addr), dial(t, d.addr)
	holder.grant("held", 60, 1)
	var req []byte
	for i := range 3 {
		req = proto.AppendAcquire(req, 30, 10, uint64(10+i), "held")
	}
	x.send(req)
	x.expect(proto.OpBusy, 12) // the third: x already has two queued
	y.send(proto.AppendAcquire(nil, 30, 10, 20, "held"))
	y.send(proto.AppendPing(nil, 21))
	y.expect(proto.OpPing, 21) // queued, not B

	// A partial frame: closed after --frame-timeout.
	frame := proto.AppendAcquire(nil, 0, 10, 30, "partial")
	stuck := dial(t, d.addr)
	stuck.send(frame[:len(frame)-1])
	_ = stuck.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := stuck.c.Read(make([]byte, 64)); err == nil || isTimeout(err) {
		t.Fatalf("a connection with a partial frame still open after 5 s (read %d, %v)", n, err)
	}

	// Connects past --max-conns (holder, x, y are open; one more fits).
	const refused = 300
	began := time.Now()
	extra := dial(t, d.addr)
	extra.send(proto.AppendPing(nil, 40))
	extra.expect(proto.OpPing, 40)
	for range refused {
		c, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); isTimeout(err) {
			t.Fatal("a connection past --max-conns was not closed")
		}
		c.Close()
	}
	took := time.Since(began)
	lineRE := regexp.MustCompile(`msg="connections refused: --max-conns reached" refused=(\d+)`)
	count := func() (lines, total int) {
		for _, m := range lineRE.FindAllStringSubmatch(d.logs.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			lines, total = lines+1, total+n
		}
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, total := count(); total < refused && time.Now().Before(deadline); _, total = count() {
		time.Sleep(50 * time.Millisecond)
	}
	lines, total := count()
	if total != refused || lines > 2+int(took/time.Second) {
		t.Fatalf("%d refusals in %v logged as %d refusals on %d lines; logs:\n%s", refused, took, total, lines, d.logs)
	}
	// The idle connections lived through all of it.
	x.send(proto.AppendPing(nil, 50))
	x.expect(proto.OpPing, 50)
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestClusterProcs(t *testing.T) {
	for _, tc := range []struct {
		cluster string
		loops   int
		env     string
		cur     int
		want    int
	}{
		{"", 2, "", 2, 0},          // a single node keeps the default
		{"priority", 2, "", 2, 3},  // one more than the loops
		{"raft", 2, "", 2, 3},      //
		{"priority", 4, "", 2, 5},  // --loops above the cores
		{"priority", 2, "", 3, 0},  // already more processors than loops
		{"priority", 2, "2", 2, 0}, // GOMAXPROCS set by the operator wins
		{"raft", 1, "", 1, 2},      //
		{"priority", 8, "", 8, 9},  //
	} {
		if got := clusterProcs(tc.cluster, tc.loops, tc.env, tc.cur); got != tc.want {
			t.Errorf("clusterProcs(%q, loops %d, env %q, cur %d) = %d, want %d", tc.cluster, tc.loops, tc.env, tc.cur, got, tc.want)
		}
	}
}
