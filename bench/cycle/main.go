//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/lockd-dev/lockd/proto"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cycle:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	addr    string
	key     string
	hops    int           // handoffs measured
	warm    int           // handoffs before them, not measured
	timeout time.Duration // the whole run's bound
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("cycle", flag.ContinueOnError)
	var c config
	fs.StringVar(&c.addr, "addr", "", "a running lockd's client address, host:port (required)")
	fs.StringVar(&c.key, "key", "cycle/hot", "the key the two connections take turns on")
	fs.IntVar(&c.hops, "hops", 50000, "handoffs measured (1..10,000,000)")
	fs.IntVar(&c.warm, "warm", 2000, "handoffs before the measured ones (0..10,000,000)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case c.addr == "":
		return errors.New("-addr is required: the client address of a running lockd")
	case c.hops < 1 || c.hops > 10_000_000:
		return fmt.Errorf("-hops %d: want 1..10,000,000", c.hops)
	case c.warm < 0 || c.warm > 10_000_000:
		return fmt.Errorf("-warm %d: want 0..10,000,000", c.warm)
	case c.key == "" || len(c.key) > proto.MaxKey:
		return fmt.Errorf("-key: want 1..%d bytes", proto.MaxKey)
	case c.timeout <= 0:
		return errors.New("-timeout must be positive")
	}
	hs, err := measure(c)
	if err != nil {
		return err
	}
	report(out, c, split(hs))
	return nil
}

// hop is one grant as its receiver saw it, and the release it answered
// with (unix ns on CLOCK_REALTIME).
type hop struct {
	conn       int
	rx, read   int64
	send, sent int64
}

// measure runs the two connections until warm+hops grants arrived and
// returns every hop in the order of the grants.
func measure(c config) ([]hop, error) {
	total := c.warm + c.hops // grants; with the first release, total hops
	var (
		count atomic.Int64
		mu    sync.Mutex
		hops  = make([]hop, 0, total)
		wg    sync.WaitGroup
		errs  = make([]error, 2)
	)
	deadline := time.Now().Add(c.timeout)
	conns := make([]*net.TCPConn, 2)
	defer func() { // also on an early error; the turns close theirs too
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
	}()
	for i := range conns {
		nc, err := net.DialTimeout("tcp", c.addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		conns[i] = nc.(*net.TCPConn)
		_ = conns[i].SetDeadline(deadline)
		if err := setTimestamps(conns[i]); err != nil {
			return nil, err
		}
	}
	// The first connection takes the key, then the second queues behind
	// it: every later grant is a handoff.
	if _, err := conns[0].Write(proto.AppendAcquire(nil, 255, 60, 0, c.key)); err != nil {
		return nil, err
	}
	r, err := firstAnswer(conns[0])
	if err != nil {
		return nil, err
	}
	if r.Op != proto.OpAcquire {
		return nil, fmt.Errorf("the first acquire of %q was not granted: answer %q", c.key, r.Op)
	}
	if _, err := conns[1].Write(proto.AppendAcquire(nil, 255, 60, 1, c.key)); err != nil {
		return nil, err
	}
	// Give the second acquire time to queue, then hand the key over.
	time.Sleep(20 * time.Millisecond)
	rel := proto.AppendAcquire(proto.AppendRelease(nil, r.Token, c.key), 255, 60, 0, c.key)
	send := time.Now().UnixNano()
	if _, err := conns[0].Write(rel); err != nil {
		return nil, err
	}
	hops = append(hops, hop{conn: 0, send: send, sent: time.Now().UnixNano()})
	for i, nc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = turns(nc, i, c.key, total, &count, func(h hop) {
				mu.Lock()
				hops = append(hops, h)
				mu.Unlock()
			})
			nc.Close()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	slices.SortFunc(hops, func(a, b hop) int {
		switch {
		case a.rx < b.rx:
			return -1
		case a.rx > b.rx:
			return 1
		}
		return 0
	})
	return hops, nil
}

// firstAnswer reads one whole answer from nc.
func firstAnswer(nc net.Conn) (proto.Response, error) {
	var (
		buf [256]byte
		n   int
		r   proto.Response
	)
	for {
		m, err := nc.Read(buf[n:])
		n += m
		if _, perr := proto.ParseResponse(buf[:n], &r); !errors.Is(perr, proto.ErrIncomplete) || n == len(buf) {
			return r, perr
		}
		if err != nil {
			return r, err
		}
	}
}

// turns reads grants on nc; each one is answered at once with its
// release and a new acquire in one write, until total grants arrived
// between the connections.
func turns(nc *net.TCPConn, id int, key string, total int, count *atomic.Int64, record func(hop)) error {
	rc, err := nc.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, 128)
	var out []byte
	have := 0
	for {
		var n, oobn int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), buf[have:], oob, 0)
			return !errors.Is(rerr, syscall.EAGAIN)
		}); err != nil {
			return endOrErr(err, count, total)
		}
		read := time.Now().UnixNano()
		if rerr != nil {
			return endOrErr(rerr, count, total)
		}
		if n == 0 {
			return endOrErr(io.EOF, count, total)
		}
		rx, err := rxStamp(oob[:oobn])
		if err != nil {
			return err
		}
		have += n
		off := 0
		for {
			var r proto.Response
			m, err := proto.ParseResponse(buf[off:have], &r)
			if errors.Is(err, proto.ErrIncomplete) {
				break
			}
			if err != nil {
				return fmt.Errorf("connection %d: %w", id, err)
			}
			off += m
			switch r.Op {
			case proto.OpRelease:
				continue // the answer to this connection's own release
			case proto.OpAcquire:
			default:
				return fmt.Errorf("connection %d: answer %q, want grants and releases only", id, buf[off-m:off])
			}
			if count.Add(1) > int64(total) {
				// Done: give the key back without queueing again, so
				// the other connection's last wait ends too.
				_, err := nc.Write(proto.AppendRelease(out[:0], r.Token, key))
				return endOrErr(err, count, total)
			}
			out = proto.AppendRelease(out[:0], r.Token, key)
			out = proto.AppendAcquire(out, 255, 60, uint64(id), key)
			send := time.Now().UnixNano()
			if _, err := nc.Write(out); err != nil {
				return endOrErr(err, count, total)
			}
			record(hop{conn: id, rx: rx, read: read, send: send, sent: time.Now().UnixNano()})
		}
		have = copy(buf, buf[off:have])
	}
}

// endOrErr is nil for an error that only says the run is over (the other
// connection closed after the last grant), err otherwise.
func endOrErr(err error, count *atomic.Int64, total int) error {
	if count.Load() >= int64(total) {
		return nil
	}
	return err
}

// setTimestamps asks the kernel for a receive timestamp with every read.
func setTimestamps(nc *net.TCPConn) error {
	rc, err := nc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// rxStamp is the receive timestamp in a recvmsg's control messages.
func rxStamp(oob []byte) (int64, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&m.Data[0]))
			return ts.Nano(), nil
		}
	}
	return 0, errors.New("the kernel gave no receive timestamp (SO_TIMESTAMPNS) with a read")
}

// parts are the per-hop durations of the measured hops (ns).
type parts struct {
	server, wake, work, write, cycle []int64
	skipped                          int // hops that did not follow the other connection's release
}

// split attributes every grant to the release before it (the other
// connection's) and returns the measured hops' parts, the warm-up
// dropped by the caller's count.
func split(hs []hop) parts {
	var p parts
	for i := 1; i < len(hs); i++ {
		prev, h := hs[i-1], hs[i]
		if h.conn == prev.conn || h.rx < prev.send {
			p.skipped++
			continue
		}
		p.server = append(p.server, h.rx-prev.send)
		p.wake = append(p.wake, h.read-h.rx)
		p.work = append(p.work, h.send-h.read)
		p.write = append(p.write, h.sent-h.send)
		p.cycle = append(p.cycle, h.send-prev.send)
	}
	return p
}

// warmCut drops the first n values.
func warmCut(v []int64, n int) []int64 {
	if n >= len(v) {
		return nil
	}
	return v[n:]
}

func report(out io.Writer, c config, p parts) {
	rows := []struct {
		name string
		v    []int64
	}{
		{"server: release written → grant in the waiter's socket", p.server},
		{"client: grant in the socket → read returned (wake-up)", p.wake},
		{"client: read returned → next release written (parse, encode)", p.work},
		{"cycle: one release → the next", p.cycle},
		{"  the release's write(2) (overlaps the server's part)", p.write},
	}
	fmt.Fprintf(out, "%d handoffs measured on %q at %s (%d warm-up, %d skipped)\n", min(len(warmCut(p.cycle, c.warm)), c.hops), c.key, c.addr, c.warm, p.skipped)
	fmt.Fprintf(out, "%-64s %9s %9s %9s %9s\n", "step", "p50", "p90", "p99", "mean")
	for _, r := range rows {
		v := warmCut(r.v, c.warm)
		v = slices.Clone(v[:min(len(v), c.hops)])
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		var sum int64
		for _, x := range v {
			sum += x
		}
		q := func(f float64) string { return us(v[min(int(f*float64(len(v))), len(v)-1)]) }
		fmt.Fprintf(out, "%-64s %9s %9s %9s %9s\n", r.name, q(0.50), q(0.90), q(0.99), us(sum/int64(len(v))))
	}
}

func us(ns int64) string { return fmt.Sprintf("%.1fµs", float64(ns)/1e3) }
